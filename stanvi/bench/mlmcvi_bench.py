"""``stanvi bench mlmcvi``: MLMCVI against plain Monte Carlo and randomized QMC at equal cost
(issue 12; docs/mlmcvi.md#baselines, docs/mlmcvi.md#bench-problems).

Problems: the paper's models, simulated — hierarchical linear regression "HLR" (I = 100,
k = 10, D = 1012) and Bayesian logistic regression "BLR" (286 × 9 simulated in place of the
Ljubljana data, D = 11) — as JAX targets, and two ``stan_models`` models through the Stan
library (``logistic_regression``, D = 6, N = 1000; ``hierarchical_radon``, D = 101, N = 900).

Protocol (the paper's §5.2, all methods with the same optimizer): SGD with step decay
(β = 0.5, r = 100), T = 1000 levels (1001 updates), N_0 = 100; MLMC against MC and RQMC with
the equal-cost draws per iteration (41 for this schedule: 41,041 against 40,900 gradient
evaluations), plus MLMC with restarts every 100 ([EXT] R1, not in the paper).  α_0 is tuned
per problem for MLMC and for MC on a grid (:func:`tune_lr`, :data:`TUNED_WITH`).  Mean-field, log scale (stanvi's
default), m_0 = 0, ω_0 = 0.

Printed per problem:

1. gradient variance (trace of the covariance over R replicates of this iteration's estimate,
   history fixed) and SNR (‖mean‖/√var, dimensionless, and the paper's ‖mean‖²/√var) at every
   100th iteration.  For MLMC the replicate mean is E[G_t | history] = ∇F + e_{t−1}, which
   includes the frozen error (docs/mlmcvi.md#diagnostics): a high MLMC SNR does not mean a small
   error.
2. ELBO (fixed common draws) against draw-level gradient evaluations and against run time
   (wall time minus the ELBO/variance evaluations; JAX compilation included), mean over seeds.
3. the final ELBO, mean ± s.e. over seeds, and the difference to the best estimator.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.fit import fit as stanvi_fit
from stanvi.targets.jax_target import JaxTarget

_LOG_2PI = math.log(2 * math.pi)


def _normal_lpdf(x, mu, sd):
    return -0.5 * ((x - mu) / sd) ** 2 - jnp.log(sd) - 0.5 * _LOG_2PI


def _lognormal_lpdf(x, mu, sd):
    return _normal_lpdf(jnp.log(x), mu, sd) - jnp.log(x)


def hlr_target(seed: int = 0, I: int = 100, K: int = 10) -> JaxTarget:  # noqa: E741
    """HLR (docs/mlmcvi.md#bench-problems), simulated from the model (x_i ~ N(0, I_k)):
    μ' ~ N(0, 10²), σ' ~ LogNormal(0, 0.5), ε ~ LogNormal(0, 0.5), b_i ~ N(μ', σ'),
    y_i ~ N(x_iᵀ b_i, ε).
    Unconstrained z = (μ' (k), log σ', log ε, B (I·k)), Jacobian included; D = I·k + k + 2."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((I, K))
    mu = rng.normal(0, 1.0, K)          # a moderate draw (the N(0, 10²) prior is vague)
    sb, sy = np.exp(rng.normal(0, 0.5)), np.exp(rng.normal(0, 0.5))
    B = mu + sb * rng.standard_normal((I, K))
    y = np.sum(X * B, axis=1) + sy * rng.standard_normal(I)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def lp(z):
        m, lsb, lsy = z[:K], z[K], z[K + 1]
        Bz = z[K + 2:].reshape(I, K)
        sb_, sy_ = jnp.exp(lsb), jnp.exp(lsy)
        out = jnp.sum(_normal_lpdf(m, 0.0, 10.0))
        out += _lognormal_lpdf(sb_, 0.0, 0.5) + lsb + _lognormal_lpdf(sy_, 0.0, 0.5) + lsy
        out += jnp.sum(_normal_lpdf(Bz, m, sb_))
        return out + jnp.sum(_normal_lpdf(yj, jnp.sum(Xj * Bz, axis=1), sy_))

    names = ([f"mu.{i + 1}" for i in range(K)] + ["log_sigma_b", "log_sigma_y"]
             + [f"B.{i + 1}.{j + 1}" for i in range(I) for j in range(K)])
    return JaxTarget(lp, I * K + K + 2, names=names, name="hlr")


def blr_target(seed: int = 0, N: int = 286, K: int = 9) -> JaxTarget:
    """BLR (binary; docs/mlmcvi.md#bench-problems), simulated 286 × 9 in place of UCI Ljubljana:
    standardized X ~ N(0, I), y ~ Bern(sigmoid(X z*)) with z* ~ N(0, 1); the model
    τ ~ Gamma(0.5, 0.5) (a precision), μ ~ N(0, 1), z_j ~ N(μ, τ^{−1/2}), y ~ Bern(sigmoid(Xz)).
    Unconstrained (log τ, μ, z), Jacobian included; D = K + 2 = 11."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, K))
    X = (X - X.mean(0)) / X.std(0)
    zt = rng.standard_normal(K)
    y = (rng.random(N) < 1 / (1 + np.exp(-X @ zt))).astype(float)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def lp(z):
        ltau, mu, w = z[0], z[1], z[2:]
        tau = jnp.exp(ltau)
        out = 0.5 * jnp.log(0.5) - jax.scipy.special.gammaln(0.5) - 0.5 * ltau - 0.5 * tau
        out += ltau                                             # Jacobian of τ = e^{log τ}
        out += _normal_lpdf(mu, 0.0, 1.0)
        out += jnp.sum(_normal_lpdf(w, mu, 1.0 / jnp.sqrt(tau)))
        eta = Xj @ w
        return out + jnp.sum(yj * eta - jnp.logaddexp(0.0, eta))

    return JaxTarget(lp, K + 2, names=["log_tau", "mu"] + [f"z.{j + 1}" for j in range(K)],
                     name="blr")


def stan_target(name: str, models_dir: Path):
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    d = Path(models_dir) / name
    return StanTarget(d / f"{name}.stan", d / f"{name}.data.json", progress=False)


# problem -> (target factory (models_dir -> Target), α_0 grid).  The grids bracket the range
# where pilot runs (T = 1000, MLMC and MC) neither diverged nor stalled: SGD on raw model
# gradients is scale-sensitive (docs/mlmcvi.md#step-size), e.g. hierarchical_radon fails at 1e-3.
PROBLEMS: dict[str, tuple[Any, tuple[float, ...]]] = {
    "hlr": (lambda models_dir: hlr_target(), (1e-3, 3e-4, 1e-4, 3e-5)),
    "blr": (lambda models_dir: blr_target(), (1e-2, 3e-3, 1e-3, 3e-4)),
    "logistic_regression": (lambda models_dir: stan_target("logistic_regression", models_dir),
                            (1e-2, 3e-3, 1e-3, 3e-4)),
    "hierarchical_radon": (lambda models_dir: stan_target("hierarchical_radon", models_dir),
                           (3e-4, 1e-4, 3e-5, 1e-5)),
}
TUNED_WITH = {"mlmc": "mlmc", "mc": "mc", "rqmc": "mc", "mlmc+restart": "mlmc"}
"""α_0 is tuned per problem on its grid by the final ELBO of one pilot run (seed 100; the paper
tuned every method separately, §5.1; docs/mlmcvi.md#resolutions), for MLMC and for MC; RQMC
uses MC's α_0 (the paper's Table 3 has nearly the same rates for both) and MLMC with restarts
uses MLMC's."""
CONFIGS = {"mlmc": {"estimator": "mlmc"}, "mc": {"estimator": "mc"},
           "rqmc": {"estimator": "rqmc"}, "mlmc+restart": {"estimator": "mlmc",
                                                           "restart_every": 100}}


def one_run(target, label: str, *, lr0: float, seed: int, iters: int, snr_reps: int,
            elbo_draws: int) -> dict[str, Any]:
    """One fit; its trace as lists (ELBO rows and variance rows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi_fit(target, method="mlmcvi", lr0=lr0, max_iters=iters, seed=seed,
                         elbo_every=100, elbo_draws=elbo_draws, snr_every=100,
                         snr_reps=snr_reps, progress=False, draws=100, **CONFIGS[label])
    t = fit.trace
    evals = np.maximum.accumulate(np.nan_to_num(t.column("eval_time")))
    run_time = t.column("wall_time") - evals
    elbo = t.column("elbo")
    rows = np.flatnonzero(np.isfinite(elbo) | np.isneginf(elbo))
    var_rows = [r for r in t.rows if "grad_var" in r]
    return {"status": fit.status, "message": fit.message,
            "elbo": {"iteration": t.column("iteration")[rows].astype(int).tolist(),
                     "elbo": elbo[rows].tolist(),
                     "gradient_draws": t.column("gradient_draws")[rows].astype(int).tolist(),
                     "run_time": run_time[rows].tolist()},
            "variance": [{"t": r["t"], "N": r.get("N"), "grad_var": r["grad_var"],
                          "snr": r["snr"], "snr_paper": r["snr_paper"]} for r in var_rows],
            "compile_time": fit.compile_time, "wall_time": fit.wall_time,
            "gradient_draws": fit.oracle["gradient_draws"],
            "final_acc_var": fit.info.get("accumulated_error_var")}


def tune_lr(target, label: str, *, iters: int, grid: tuple[float, ...], seed: int = 100
            ) -> tuple[float, dict[float, float]]:
    """The α_0 of ``grid`` with the highest final ELBO (500 fixed draws) in one run of
    ``label``; failed runs count as −inf.  Returns (α_0, {α_0: final ELBO})."""
    scores = {}
    for lr in grid:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = stanvi_fit(target, method="mlmcvi", lr0=lr, max_iters=iters, seed=seed,
                             elbo_every=iters + 1, elbo_draws=500, progress=False, draws=10,
                             **CONFIGS[label])
        last = fit.trace.rows[-1].get("elbo", -np.inf)
        scores[lr] = float(last) if fit.status != "failed" and np.isfinite(last) else -np.inf
    best = max(scores, key=lambda k: scores[k])
    return best, scores


def _mean(values: list[float]) -> float:
    v = np.asarray(values, dtype=float)
    return float(np.mean(v)) if np.all(np.isfinite(v)) else float("nan")


def report(runs: dict[str, list[dict[str, Any]]], *, seeds: int, snr_reps: int,
           print_fn=print) -> dict[str, tuple[float, float]]:
    """Print one problem's figures from its runs (also from a saved ``--output`` JSON:
    ``report(json.load(f)[name]["runs"], ...)``); returns the final ELBO mean and s.e. per
    configuration over the runs that did not fail."""
    failed = {lbl: [r["message"] for r in rs if r["status"] == "failed"]
              for lbl, rs in runs.items()}
    for lbl, msgs in failed.items():
        if msgs:
            print_fn(f"  {lbl}: {len(msgs)} of {seeds} runs failed: {msgs[0]}")
    # 1. variance and SNR at each 100th iteration (seed 0)
    print_fn(f"gradient variance (trace, {snr_reps} replicates, history fixed) and SNR "
             f"||mean||/sqrt(var) [paper's ||mean||^2/sqrt(var)], seed 0")
    print_fn(f"{'t':>5} " + " ".join(f"{lbl:>30}" for lbl in CONFIGS))
    var0 = {lbl: rs[0]["variance"] for lbl, rs in runs.items()}
    for i, row in enumerate(max(var0.values(), key=len)):
        cells = []
        for lbl in CONFIGS:
            if i < len(var0[lbl]):
                r = var0[lbl][i]
                cells.append(f"N={r['N']:>3} {r['grad_var']:9.3g} {r['snr']:6.3g} "
                             f"[{r['snr_paper']:7.3g}]")
            else:
                cells.append("-")
        print_fn(f"{row['t']:5d} " + " ".join(f"{c:>30}" for c in cells))
    # 2. ELBO vs gradient evaluations and run time (mean over the runs that did not fail)
    done = {lbl: [r for r in rs if r["status"] != "failed"] for lbl, rs in runs.items()}
    print_fn("ELBO (mean over the seeds whose run did not fail) vs iteration: ELBO / "
             "gradient evaluations / run time s (JAX compile included, evaluations "
             "excluded)")
    print_fn(f"{'iter':>5} " + " ".join(f"{lbl:>30}" for lbl in CONFIGS))
    its = max((r["elbo"]["iteration"] for rs in runs.values() for r in rs), key=len)
    for i, it in enumerate(its):
        cells = []
        for lbl, rs in done.items():
            if rs and all(i < len(r["elbo"]["elbo"]) for r in rs):
                e = _mean([r["elbo"]["elbo"][i] for r in rs])
                g = int(np.mean([r["elbo"]["gradient_draws"][i] for r in rs]))
                w = _mean([r["elbo"]["run_time"][i] for r in rs])
                cells.append(f"{e:10.2f} {g:8d} {w:6.1f}")
            else:
                cells.append("-")
        print_fn(f"{it:5d} " + " ".join(f"{c:>30}" for c in cells))
    # 3. final ELBO
    finals = {}
    for lbl, rs in done.items():
        v = np.array([r["elbo"]["elbo"][-1] for r in rs], dtype=float)
        finals[lbl] = (float(v.mean()) if len(v) else float("nan"),
                       float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1
                       else float("nan"))
    best = max((m for m, _ in finals.values() if np.isfinite(m)), default=float("nan"))
    print_fn("final ELBO, mean ± s.e. over the runs that did not fail (difference to the "
             "best; failed runs): " + "; ".join(
                 f"{lbl} {m:.3f} ± {s:.3f} ({m - best:+.3f}; "
                 f"{len(runs[lbl]) - len(done[lbl])} failed)"
                 for lbl, (m, s) in finals.items())
             + "; per seed: " + "; ".join(
                 f"{lbl} " + " ".join("failed" if r["status"] == "failed"
                                      else f"{r['elbo']['elbo'][-1]:.2f}" for r in rs)
                 for lbl, rs in runs.items())
             + "; gradient evaluations " + ", ".join(
                 f"{lbl} {rs[0]['gradient_draws']}" for lbl, rs in runs.items()))
    return finals


def run(problems: list[str], *, models_dir: Path, seeds: int = 3, iters: int = 1000,
        snr_reps: int = 30, elbo_draws: int = 1000, output: str | None = None,
        print_fn=print) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in problems:
        factory, grid = PROBLEMS[name]
        target = factory(models_dir)
        print_fn(f"\n=== {name}: D = {target.dim}; SGD, step decay beta 0.5 / r 100, "
                 f"T = {iters}, N_0 = 100 (MC/RQMC: equal-cost N); {seeds} seeds ===")
        t0 = time.perf_counter()
        tuning = {lbl: tune_lr(target, lbl, iters=iters, grid=grid) for lbl in ("mlmc", "mc")}
        lrs = {lbl: tuning[TUNED_WITH[lbl]][0] for lbl in CONFIGS}
        print_fn("tuned lr0 (grid " + ", ".join(f"{g:g}" for g in grid) + "; pilot final "
                 "ELBO at each, -inf = failed): " + "; ".join(
                     f"{lbl} {best:g} [" + " ".join(f"{v:.1f}" for v in scores.values()) + "]"
                     for lbl, (best, scores) in tuning.items())
                 + "; rqmc uses mc's, mlmc+restart mlmc's")
        runs = {label: [one_run(target, label, lr0=lrs[label], seed=s, iters=iters,
                                snr_reps=snr_reps, elbo_draws=elbo_draws)
                        for s in range(seeds)] for label in CONFIGS}
        print_fn(f"({time.perf_counter() - t0:.0f} s)")
        finals = report(runs, seeds=seeds, snr_reps=snr_reps, print_fn=print_fn)
        results[name] = {"dim": target.dim, "lr0": lrs,
                         "tuning": {k: v[1] for k, v in tuning.items()}, "runs": runs,
                         "final": finals}
        if output:
            with open(output, "w") as fh:
                json.dump(results, fh, indent=1, default=float)
    return results
