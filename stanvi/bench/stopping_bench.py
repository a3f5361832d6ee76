"""``stanvi bench stopping``: does a ``converged`` TrustVI fit mean converged?  Every model of the
stan_models set that has an independently computed mean-field optimum
(``<name>.optimum.json``, made by ``stan_models/compute_optima.py`` without any stanvi method) is
fitted with each configuration over ``seeds`` seeds, and for each run:

* status, and the gap optimum − final ELBO (final ELBO on 10,000 draws shared by all runs of the
  model, failing draws dropped as Stan does);
* draw-level evaluations and run time (wall less JAX compilation) until the trace is
  consistently within 1 nat of the optimum (methods_bench's trace evaluation,
  docs/algorithms.md#benchmark-protocol);
* where the optimum file gives the exact mean-field optimum (``"exact": true``), the largest
  |mean error| in units of the posterior sd (``posterior_sd``; the optimum's sd if absent) and
  the largest |sd / σ* − 1|.

Printed: a row per (model, configuration) with medians over seeds, then the issue's targets —
share of ``converged`` runs within 1 nat (≥ 95%), median to-1-nat draws ≤ 5,000 and run time
≤ 0.5 s per model, and the exact-model accuracy (mean within 0.05 sd, sd within 5%).

Configurations are ``method:profile`` optionally followed by ``:option=value,...`` (ablations,
e.g. ``trustvi:default:metric=euclidean``).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import jax
import numpy as np

from stanvi.evaluation.models import discover_models
from stanvi.evaluation.protocol import first_consistent, summarize_run

DEFAULT_CONFIGS = ("trustvi:default",)
ABLATIONS = ("trustvi:default", "trustvi:default:metric=euclidean",
             "trustvi:default:warm_start=none", "trustvi:default:refine_draws=None")


@dataclass
class StopRun:
    model: str
    config: str
    seed: int
    status: str
    gap: float
    to_one_nat_draws: float
    to_one_nat_seconds: float
    draw_evals: int
    run_time: float
    mean_error_sd: float
    sd_error: float
    message: str
    untraced_seconds: float = 0.0  # run time before the trace's first row (TrustVI's warm start)


def parse_config(text: str) -> tuple[str, str, dict]:
    """'method:profile[:k=v,...]' → (method, profile, options); values are Python literals or
    strings."""
    import ast  # noqa: PLC0415

    parts = text.split(":", 2)
    if len(parts) < 2:
        raise ValueError(f"configuration {text!r} is not 'method:profile[:option=value,...]'")
    options: dict = {}
    if len(parts) == 3 and parts[2]:
        for item in parts[2].split(","):
            name, _, value = item.partition("=")
            try:
                options[name.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                options[name.strip()] = value.strip()
    return parts[0], parts[1], options


def load_optimum(stan: Path) -> dict | None:
    """The stored optimum next to a model (``<stem>.optimum.json``), or None."""
    path = stan.with_suffix(".optimum.json")
    if not path.exists():
        return None
    return json.loads(path.read_text())


def _accuracy(fit, optimum: dict) -> tuple[float, float]:
    if not optimum.get("exact"):
        return math.nan, math.nan
    mu, sd = np.asarray(optimum["mu"]), np.asarray(optimum["sigma"])
    posterior_sd = np.asarray(optimum.get("posterior_sd", sd))  # the yardstick for means
    fit_sd = np.sqrt(np.diag(fit.covariance))
    return (float(np.max(np.abs(fit.mean - mu) / posterior_sd)),
            float(np.max(np.abs(fit_sd / sd - 1))))


def measure_run(fit, name: str, config: str, optimum: dict, *,
                trace_points: int = 40) -> StopRun:
    """One run's :class:`StopRun` against an optimum record (``elbo``; ``mu``, ``sigma`` and
    ``posterior_sd`` where ``exact``): final ELBO on 10,000 common draws, the gap, the first
    trace point after which the ELBO (2,000 common draws) stays within 1 nat, the exact-model
    accuracy.  Shared by ``stanvi bench stopping`` and ``stanvi bench public-stopping``."""
    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415

    dim = fit.family.dim
    eps_final = standard_normal(jax.random.PRNGKey(20261124), 10_000, dim)
    eps_eval = eps_final[:2000]
    summary = summarize_run(fit, config, eps_final, eps_eval, trace_points)
    gap = optimum["elbo"] - summary.final_elbo
    i = first_consistent(summary, optimum["elbo"] - 1.0)
    mean_err, sd_err = _accuracy(fit, optimum)
    # The trace's clock starts at its first row, after TrustVI's warm start, whose draws row 0
    # does count: add the run time the trace does not cover (the warm start, less its JAX
    # compilation) so that seconds and draws to 1 nat describe the same point.
    last = fit.trace.rows[-1] if len(fit.trace) else {}
    traced = last.get("wall_time", 0.0) - (last.get("compile_time") or 0.0)
    untraced = max(0.0, float(summary.wall - traced))
    return StopRun(
        model=name, config=config, seed=fit.seed, status=fit.status, gap=float(gap),
        to_one_nat_draws=float(summary.trace_draws[i]) if i is not None else math.inf,
        to_one_nat_seconds=(float(summary.trace_wall[i]) + untraced) if i is not None
        else math.inf,
        draw_evals=summary.draw_evals, run_time=summary.wall, mean_error_sd=mean_err,
        sd_error=sd_err, message=fit.message, untraced_seconds=untraced)


def print_run(r: StopRun) -> None:
    """The one-line progress report of a run."""
    print(f"  {r.model:28s} {r.config:40s} seed {r.seed}: {r.status:9s} gap {r.gap:8.3f}  "
          f"to 1 nat {r.to_one_nat_draws:9.0f} draws {r.to_one_nat_seconds:6.2f} s  "
          f"total {r.draw_evals:8d} draws {r.run_time:6.2f} s"
          + (f"  mean err {r.mean_error_sd:.3f} sd, sd err {r.sd_error:.3f}"
             if np.isfinite(r.mean_error_sd) else ""), flush=True)


def run_model(name: str, stan: Path, data, optimum: dict, *, configs, seeds: int,
              trace_points: int = 40, target=None) -> list[StopRun]:
    """Fit the model with every configuration and seed and measure each run (data: a path, a
    dict or None; ``target``: an already loaded target of this model, reused)."""
    from stanvi.fit import fit as stanvi_fit  # noqa: PLC0415

    runs = []
    for config in configs:
        method, profile, options = parse_config(config)
        for seed in range(seeds):
            fit = stanvi_fit(target or str(stan), data=None if target else data, method=method,
                             profile=profile, seed=seed, progress=False, draws=10, **options)
            target = fit.target
            runs.append(measure_run(fit, name, config, optimum, trace_points=trace_points))
            print_run(runs[-1])
    return runs


def run(models_dir: Path, *, models: list[str] | None = None, configs=DEFAULT_CONFIGS,
        seeds: int = 5, output: Path | None = None) -> list[StopRun]:
    """Run the benchmark and print the per-model medians and the targets (module docstring)."""
    runs: list[StopRun] = []
    for name, stan, data in discover_models(models_dir):
        if models and name not in models:
            continue
        optimum = load_optimum(stan)
        if optimum is None or optimum.get("elbo") is None:
            print(f"  {name}: no stored optimum, skipped")
            continue
        runs += run_model(name, stan, data, optimum, configs=configs, seeds=seeds)
        if output is not None:
            output.write_text(json.dumps([asdict(r) for r in runs], indent=1, default=str))
    print_summary(runs)
    return runs


def print_summary(runs: list[StopRun]) -> None:
    """Per (model, configuration) medians and the overall target lines."""
    print(f"\n{'model':28s} {'configuration':40s} {'conv':>4s} {'gap':>7s} {'draws→1nat':>10s} "
          f"{'s→1nat':>7s} {'draws':>8s} {'run s':>6s}")
    for config in dict.fromkeys(r.config for r in runs):
        cruns = [r for r in runs if r.config == config]
        per_model = {}
        for r in cruns:
            per_model.setdefault(r.model, []).append(r)
        for model, rs in per_model.items():
            print(f"{model:28s} {config:40s} {sum(r.status == 'converged' for r in rs):2d}/"
                  f"{len(rs):<2d}{np.median([r.gap for r in rs]):7.3f} "
                  f"{np.median([r.to_one_nat_draws for r in rs]):10.0f} "
                  f"{np.median([r.to_one_nat_seconds for r in rs]):7.2f} "
                  f"{np.median([r.draw_evals for r in rs]):8.0f} "
                  f"{np.median([r.run_time for r in rs]):6.2f}")
        conv = [r for r in cruns if r.status == "converged"]
        ok = [r for r in conv if r.gap <= 1.0]
        print(f"\n[{config}] converged runs within 1 nat of the optimum: {len(ok)}/{len(conv)} "
              f"({100 * len(ok) / max(len(conv), 1):.0f}%; target ≥ 95%); runs reporting "
              f"converged: {len(conv)}/{len(cruns)}")
        meds = {m: (np.median([r.to_one_nat_draws for r in rs]),
                    np.median([r.to_one_nat_seconds for r in rs])) for m, rs in per_model.items()}
        print(f"[{config}] models with median ≤ 5,000 draws to 1 nat: "
              f"{sum(d <= 5000 for d, _ in meds.values())}/{len(meds)}; ≤ 0.5 s: "
              f"{sum(s <= 0.5 for _, s in meds.values())}/{len(meds)}")
        exact = [r for r in conv if np.isfinite(r.mean_error_sd)]
        if exact:
            print(f"[{config}] exact models, converged runs with mean within 0.05 sd and sd within "
                  f"5%: {sum(r.mean_error_sd <= 0.05 and r.sd_error <= 0.05 for r in exact)}/"
                  f"{len(exact)} (worst mean error {max(r.mean_error_sd for r in exact):.3f} sd, "
                  f"worst sd error {max(r.sd_error for r in exact):.3f})")
