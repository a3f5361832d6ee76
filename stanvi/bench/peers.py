"""``stanvi bench peers``: stanvi's TrustVI beside Stan's own algorithms on the same compiled
models, in one process and one run (issue P2-3, "Benchmark").

For every model of the stan_models set with data: Stan's NUTS (4 chains × 1000 draws, seed 0) is
the reference posterior; then, for each seed, stanvi TrustVI (profile ``default``, mean-field),
Stan's C++ ADVI (mean-field, CmdStan's defaults), single-path Pathfinder and multi-path Pathfinder
(4 paths, CmdStan's defaults).  Per method and model, medians over the seeds of:

* wall time (stanvi: the fit's run time plus its JAX compile time; Stan: the algorithm's);
* model evaluations (every log density / gradient / HVP evaluated at one point counts one; HVPs
  are counted apart for TrustVI, and the total is what is compared);
* the final ELBO's gap to the best method's median on the model, ELBOs computed the same way for
  every method where the approximation is a known density: stanvi's and Stan ADVI's Gaussians on
  10,000 common base draws (Stan ADVI's Gaussian recovered exactly from its output,
  :func:`stanvi.reference.advi.stan_advi_gaussian`); single-path Pathfinder's mean of
  lp − lp_approx over its own 1,000 draws; none for multi-path Pathfinder (its PSIS-resampled
  draws have no density);
* accuracy against NUTS: median over marginals of |mean − mean_NUTS| / sd_NUTS and of the
  1-Wasserstein distance / sd_NUTS (:mod:`stanvi.batch.accuracy`), and Pareto k̂.

Each model's rows are printed when it is done and, with ``--output``, written as JSON.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

COMMON_SEED = 20261124
ELBO_DRAWS = 10_000
METHODS = ("trustvi", "stan-advi", "pathfinder", "pathfinder-multi")


def _accuracy(draws: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, Any]:
    from stanvi.batch.accuracy import labelled_draws, marginal_accuracy  # noqa: PLC0415

    acc = marginal_accuracy(labelled_draws(draws), reference)
    return {"mean_error_sd": acc["mean_error_sd_median"], "w1_sd": acc["w1_sd_median"]}


def _run_method(method: str, compiled, data, target, seed: int, common: np.ndarray
                ) -> dict[str, Any]:
    """One run: its costs, ELBO, k̂ and draws."""
    from stanvi.bench.methods_bench import summarize_run  # noqa: PLC0415
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.reference import pathfinder, stan_advi  # noqa: PLC0415
    from stanvi.reference.advi import stan_advi_elbo  # noqa: PLC0415

    if method == "trustvi":
        result = fit(compiled, data, method="trustvi", seed=seed, progress=False)
        evaluations = result.info.get("model_evaluations") or {}
        # the paper protocol's final ELBO: the family's ELBO on the common draws
        elbo = summarize_run(result, "", common, common[:2000], 2).final_elbo
        return {"status": result.status, "wall": result.run_time + result.compile_time,
                "evaluations": int(sum(evaluations.values())),
                "hvp": int(evaluations.get("hvp", 0)), "elbo": elbo,
                "khat": result.diagnostics().khat, "draws": result.stan_variables()}
    if method == "stan-advi":
        ref = stan_advi(compiled, data, seed=seed)
        try:
            elbo = stan_advi_elbo(ref, target, [common])[0][0]
        except ValueError:
            elbo = math.nan
        status = "converged" if "CONVERGED" in ref.messages[0] else "max_iters"
    else:
        ref = pathfinder(compiled, data, seed=seed,
                         num_paths=1 if method == "pathfinder" else 4)
        ratio = ref.log_p - ref.log_q
        elbo = float(np.mean(ratio)) if method == "pathfinder" else math.nan
        status = "converged"
    return {"status": status, "wall": ref.wall_time,
            "evaluations": ref.gradient_evaluations + ref.density_evaluations, "hvp": 0,
            "elbo": elbo, "khat": ref.diagnostics().khat if ref.has_proposal_density else None,
            "draws": ref.stan_variables()}


def run_model(name: str, stan: Path, data: Path | None, seeds: int) -> dict[str, Any]:
    """Every method on one model: per-run figures and their medians."""
    import jax  # noqa: PLC0415

    from stanvi.targets.labelled import labelled_draws  # noqa: PLC0415
    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415
    from stanvi.reference import nuts  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    compiled = compile_model(stan, progress=False)
    target = StanTarget(compiled, data, progress=False)
    common = standard_normal(jax.random.PRNGKey(COMMON_SEED), ELBO_DRAWS, target.dim)
    t0 = time.perf_counter()
    reference = nuts(compiled, data, chains=4, seed=0)
    ref_draws = labelled_draws(reference.stan_variables())
    out: dict[str, Any] = {
        "model": name, "dim": int(target.dim),
        "nuts": {"wall": reference.wall_time,
                 "gradient_evaluations": reference.gradient_evaluations,
                 "divergences": int(sum(reference.sampler_diagnostics["divergences"])),
                 **{k: v for k, v in reference.diagnostics().items()
                    if isinstance(v, (int, float))}},
        "runs": {}, "medians": {}}
    for method in METHODS:
        runs = []
        for seed in range(seeds):
            try:
                run = _run_method(method, compiled, data, target, seed, common)
                run.update(_accuracy(run.pop("draws"), ref_draws))
            except Exception as exc:  # noqa: BLE001 — a method failing is a result
                run = {"status": "failed", "message": f"{type(exc).__name__}: {exc}"[:500]}
            runs.append(run)
        out["runs"][method] = runs
    for method, runs in out["runs"].items():
        ok = [r for r in runs if r.get("status") != "failed"]
        med = {k: (float(np.median([r[k] for r in ok if r.get(k) is not None]))
                   if ok and any(r.get(k) is not None for r in ok) else None)
               for k in ("wall", "evaluations", "elbo", "mean_error_sd", "w1_sd", "khat")}
        med["failed"] = len(runs) - len(ok)
        out["medians"][method] = med
    elbos = [m["elbo"] for m in out["medians"].values()
             if m["elbo"] is not None and math.isfinite(m["elbo"])]
    best = max(elbos) if elbos else None
    for med in out["medians"].values():
        med["elbo_gap"] = (best - med["elbo"] if best is not None and med["elbo"] is not None
                           and math.isfinite(med["elbo"]) else None)
    out["seconds"] = time.perf_counter() - t0
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def print_model(res: dict[str, Any]) -> None:
    nuts_ = res["nuts"]
    print(f"\n{res['model']} (D = {res['dim']}): NUTS {nuts_['wall']:.2f} s, "
          f"{nuts_['gradient_evaluations']} gradients, max R-hat "
          f"{_fmt(nuts_.get('max_r_hat'), '.3f')}, divergences {nuts_['divergences']}")
    print(f"  {'method':18s} {'wall s':>8s} {'evals':>9s} {'ELBO gap':>9s} {'mean err/sd':>11s} "
          f"{'W1/sd':>7s} {'k-hat':>6s} failed")
    for method, m in res["medians"].items():
        print(f"  {method:18s} {_fmt(m['wall'], '8.3f')} {_fmt(m['evaluations'], '9.0f')} "
              f"{_fmt(m['elbo_gap'], '9.2f')} {_fmt(m['mean_error_sd'], '11.3f')} "
              f"{_fmt(m['w1_sd'], '7.3f')} {_fmt(m['khat'], '6.2f')} {m['failed']}")


def print_overall(results: list[dict[str, Any]]) -> None:
    """Medians over models of each method's per-model medians, and who wins where."""
    print("\nOver all models (median of per-model medians):")
    for method in METHODS:
        meds = [r["medians"][method] for r in results]
        col = lambda k: [m[k] for m in meds if m.get(k) is not None]  # noqa: E731
        print(f"  {method:18s} wall {_fmt(np.median(col('wall')) if col('wall') else None, '.3f')} s"
              f"  evals {_fmt(np.median(col('evaluations')) if col('evaluations') else None, '.0f')}"
              f"  ELBO gap {_fmt(np.median(col('elbo_gap')) if col('elbo_gap') else None, '.2f')}"
              f"  mean err/sd {_fmt(np.median(col('mean_error_sd')) if col('mean_error_sd') else None, '.3f')}")
    for figure, better in (("wall", min), ("evaluations", min), ("mean_error_sd", min)):
        wins = {m: 0 for m in METHODS}
        for r in results:
            vals = {m: r["medians"][m][figure] for m in METHODS
                    if r["medians"][m][figure] is not None}
            if vals:
                wins[better(vals, key=vals.get)] += 1
        print(f"  best {figure:14s}: " + ", ".join(f"{m} {n}" for m, n in wins.items()))


def run(models_dir: Path, *, models: list[str] | None = None, seeds: int = 5,
        output: Path | None = None) -> list[dict[str, Any]]:
    """Run the benchmark on the stan_models set (or the named models) and print its figures."""
    from stanvi.bench.methods_bench import discover_models  # noqa: PLC0415

    found = [(n, s, d) for n, s, d in discover_models(models_dir) if d is not None]
    if models:
        found = [m for m in found if m[0] in models]
    results = []
    for name, stan, data in found:
        try:
            res = run_model(name, stan, data, seeds)
        except Exception as exc:  # noqa: BLE001 — e.g. NUTS cannot initialize
            print(f"\n{name}: skipped ({type(exc).__name__}: {str(exc)[:300]})")
            continue
        results.append(res)
        print_model(res)
        if output is not None:
            output.write_text(json.dumps(results, indent=1, default=float))
    if results:
        print_overall(results)
    return results
