"""``stanvi bench rb``: the Rao-Blackwellized estimator's figures (docs/discrete.md#toy-problem,
docs/discrete.md#rb-checks).

1. **E1 variance table**: the toy problem (three Bernoullis, K = 8) at η ∈ {−4, 0}, k = 0..8,
   REINFORCE and REINFORCE+ with one shared baseline draw: R vmapped gradients per cell; mean,
   empirical variance, the exact variance for the C_k that ``lax.top_k`` chose, ε_k and
   Var_k/Var_0.
2. **E1 SGD paths**: 20 trials, lr 1, 1000 steps from η = −4: the mean exact loss after
   100/250/500/1000 steps and the final SD, for the exact gradient, REINFORCE (k = 0), RB k = 1,
   REINFORCE+ (k = 0) and RB-RF+ k = 1.
3. **The mixture family on stan_models/bimodal** (½N(μ, I) + ½N(−μ, I), normalized, so the best
   ELBO is 0): ADVI (Stan's SGD, ``grad_samples`` = S draws per component) with a single
   Gaussian and with mixtures (C = 2 exact; C = 8 exact; C = 8 with the RB budget M = 2):
   final ELBO (10,000 fresh draws), Pareto k̂, the share of draws on each side, and the cost in
   Stan gradient calls: in all, and until ADVI's own ELBO check first came within 0.05 nat of 0.
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np

BIMODAL = "bimodal/bimodal.stan"
MIXTURE_CONFIGS = (
    ("meanfield", "meanfield", None),
    ("fullrank", "fullrank", None),
    ("mixture C=2 (exact)", "mixture", {"n_components": 2}),
    ("mixture C=8 (exact)", "mixture", {"n_components": 8, "component_budget": None}),
    ("mixture C=8, RB M=2", "mixture", {"n_components": 8, "component_budget": 2}),
)


def variance_table(n_draws: int = 100_000, seed: int = 0) -> list[dict]:
    """E1 cells (module docstring, item 1)."""
    import jax  # noqa: PLC0415

    from stanvi.discrete import rao_blackwell, reinforce  # noqa: PLC0415
    from stanvi.discrete.toy import (exact_moments, toy_f, toy_grad, toy_log_probs,  # noqa: PLC0415
                                     top_set)

    rows = []
    keys = jax.random.split(jax.random.PRNGKey(seed), n_draws)
    for eta in (-4.0, 0.0):
        eta_j = jax.numpy.asarray(eta)
        lp = toy_log_probs(eta_j)
        q = np.exp(np.asarray(lp))
        for name, base in (("REINFORCE", reinforce()), ("RF+ shared", reinforce("shared_sample"))):
            var0 = None
            for k in range(9):
                fn = jax.jit(jax.vmap(lambda key, k=k, base=base: jax.grad(
                    lambda e: rao_blackwell(key, toy_log_probs(e), toy_f, k=k,
                                            base=base).surrogate)(eta_j)))
                g = np.asarray(fn(keys))
                top = top_set(lp, k)
                _, exact_var = exact_moments(toy_log_probs, toy_f, eta, top, base)
                var0 = exact_var if k == 0 else var0
                rows.append({"eta": eta, "base": name, "k": k,
                             "eps": float(np.delete(q, top).sum()) if k else 1.0,
                             "mean": float(g.mean()), "true_grad": float(toy_grad(eta)),
                             "var": float(g.var(ddof=1)), "exact_var": exact_var,
                             "ratio": exact_var / var0 if var0 else float("nan")})
    return rows


def sgd_table(n_trials: int = 20, seed: int = 0) -> list[dict]:
    """E1 SGD paths (module docstring, item 2)."""
    import jax  # noqa: PLC0415

    from stanvi.discrete import reinforce  # noqa: PLC0415
    from stanvi.discrete.toy import sgd_paths  # noqa: PLC0415

    out = []
    for name, kwargs in (("exact gradient", {"estimator": "exact"}),
                         ("REINFORCE k=0", {"k": 0}), ("RB-REINFORCE k=1", {"k": 1}),
                         ("REINFORCE+ k=0", {"k": 0, "base": reinforce("shared_sample")}),
                         ("RB-RF+ k=1", {"k": 1, "base": reinforce("shared_sample")})):
        t0 = time.perf_counter()
        losses = sgd_paths(jax.random.PRNGKey(seed), n_trials=n_trials, **kwargs)
        out.append({"estimator": name, "steps": [100, 250, 500, 1000],
                    "mean_loss": [float(losses[:, s - 1].mean()) for s in (100, 250, 500, 1000)],
                    "final_sd": float(losses[:, -1].std()), "seconds": time.perf_counter() - t0})
    return out


def mixture_runs(models_dir: Path, seeds: int = 3, grad_samples: int = 8,
                 max_iterations: int = 2000) -> list[dict]:
    """ADVI fits of stan_models/bimodal per family configuration and seed (item 3)."""
    from stanvi.fit import fit as stanvi_fit  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    stan = models_dir / BIMODAL
    data = stan.with_suffix(".data.json")
    mu = np.asarray(json.loads(data.read_text())["mu"])
    target = StanTarget(str(stan), data=str(data), progress=False)
    runs = []
    for label, family, options in MIXTURE_CONFIGS:
        for seed in range(seeds):
            t0 = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fit = stanvi_fit(target, method="advi", family=family, family_options=options,
                                 seed=seed, progress=False, grad_samples=grad_samples,
                                 max_iterations=max_iterations)
            wall = time.perf_counter() - t0
            elbo, se = fit.elbo(10_000)
            trace = fit.trace
            elbos, calls = trace.column("elbo"), trace.column("gradient_draws")
            sgd = np.array([r.get("phase") == "sgd" for r in trace.rows])
            hit = np.flatnonzero(sgd & (elbos >= -0.05))
            side = float(np.mean(np.asarray(fit.unconstrained_draws) @ mu > 0))
            runs.append({"config": label, "seed": seed, "status": fit.status, "elbo": elbo,
                         "elbo_se": se, "khat": float(fit.diagnostics().khat),
                         "positive_side": side, "gradient_calls": int(fit.oracle["gradient_draws"]),
                         "calls_per_step": int(fit.oracle["gradient_draws"] / max(len(trace) - 1, 1)),
                         "calls_to_0.05": int(calls[hit[0]]) if hit.size else None,
                         "wall_time": wall})
    return runs


def _median(values):
    values = [v for v in values if v is not None]
    return float(np.median(values)) if values else None


def report(result: dict) -> str:
    """The figures as text tables."""
    lines = ["E1 toy problem: gradient variance by k (R = "
             f"{result['n_draws']:,} draws per cell; exact = enumeration for the C_k chosen)"]
    lines.append(f"{'eta':>5} {'base':<11} {'k':>2} {'eps_k':>10} {'mean':>11} {'var (MC)':>11} "
                 f"{'var (exact)':>11} {'Var_k/Var_0':>11}")
    for r in result["variance"]:
        lines.append(f"{r['eta']:5.0f} {r['base']:<11} {r['k']:2d} {r['eps']:10.4g} "
                     f"{r['mean']:11.4g} {r['var']:11.4g} {r['exact_var']:11.4g} "
                     f"{r['ratio']:11.3g}")
    lines.append("")
    lines.append("E1 SGD (lr 1, from eta = -4, 20 trials): mean exact loss after 100/250/500/1000 "
                 "steps (optimum 0.6705), final SD")
    for r in result["sgd"]:
        lines.append(f"  {r['estimator']:<18} " + " ".join(f"{v:.4f}" for v in r["mean_loss"])
                     + f"   SD {r['final_sd']:.2g}")
    lines.append("")
    runs = result["mixture"]
    lines.append(f"stan_models/bimodal, ADVI (S = {result['grad_samples']} draws per component, "
                 f"{result['max_iterations']} SGD iterations), medians over {result['seeds']} "
                 f"seeds; ELBO optimum 0, one mode = log 1/2 = -0.693")
    lines.append(f"  {'family':<22} {'ELBO':>8} {'k-hat':>7} {'mode +':>7} {'calls/step':>10} "
                 f"{'calls total':>11} {'calls to 0.05':>13} {'wall s':>7}")
    for label, _, _ in MIXTURE_CONFIGS:
        rs = [r for r in runs if r["config"] == label]
        reached = sum(r["calls_to_0.05"] is not None for r in rs)
        to = _median([r["calls_to_0.05"] for r in rs])
        lines.append(f"  {label:<22} {_median([r['elbo'] for r in rs]):8.3f} "
                     f"{_median([r['khat'] for r in rs]):7.2f} "
                     f"{_median([r['positive_side'] for r in rs]):7.2f} "
                     f"{_median([r['calls_per_step'] for r in rs]):10.0f} "
                     f"{_median([r['gradient_calls'] for r in rs]):11.0f} "
                     + (f"{to:10.0f} ({reached}/{len(rs)})" if to is not None
                        else f"{'never':>10} (0/{len(rs)})")
                     + f" {_median([r['wall_time'] for r in rs]):7.1f}")
    return "\n".join(lines)


def run(models_dir: Path, *, seeds: int = 3, n_draws: int = 100_000, grad_samples: int = 8,
        max_iterations: int = 2000, output: str | None = None) -> dict:
    """All three parts; prints the tables; writes the JSON to ``output`` when given."""
    t0 = time.perf_counter()
    result = {"n_draws": n_draws, "seeds": seeds, "grad_samples": grad_samples,
              "max_iterations": max_iterations}
    result["variance"] = variance_table(n_draws)
    result["sgd"] = sgd_table()
    result["mixture"] = mixture_runs(models_dir, seeds, grad_samples, max_iterations)
    result["seconds"] = time.perf_counter() - t0
    print(report(result))
    print(f"\n({result['seconds']:.0f} s)")
    if output:
        Path(output).write_text(json.dumps(result, indent=1) + "\n")
    return result
