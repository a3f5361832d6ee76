"""``stanvi bench peers``: stanvi's TrustVI beside Stan's own algorithms on the same compiled
models, in one process and one run (issues P2-3 and T3-1, "Must show").

Models: the stan_models set with data (the reference posterior: Stan's NUTS, 4 chains × 1000
draws, seed 0, run here), or with ``--posteriordb PATH`` the posteriordb posteriors that have
reference draws (the reference: posteriordb's draws; ``--posteriors`` names some, ``--max-dim``
caps D).  For each seed: stanvi TrustVI (profile ``default``, mean-field, and full-rank where
D ≤ 100), Stan's C++ ADVI (mean-field, CmdStan's defaults), single-path Pathfinder and
multi-path Pathfinder (4 paths, CmdStan's defaults).  Per method and model, medians over the
seeds of (:mod:`stanvi.bench.peers_report` prints them, the ratios and the plot):

* ``evaluations``: every log density / gradient / HVP the algorithm evaluated at one point.
  stanvi: everything the fit evaluates (warm start, iterations, certification, screening;
  ``fit.info["model_evaluations"]``); its output and k̂ draws are reported apart
  (``diagnostic_evaluations``).  Stan: counted in C++ around every call, Pathfinder's log
  densities at its output draws included;
* ``wall``: warm wall time — stanvi's ``fit.wall_time`` (the method, JAX compilation included)
  in a process that has fitted other models already; Stan's the algorithm's;
* ``new_process`` (``--new-process``, seed 0): a fresh ``python`` that imports stanvi and runs
  the method on the already compiled model, timed end to end from outside
  (:func:`stanvi.bench.coldstart.run_child`); stanvi's fit with ``progress=False``, whose k̂
  verdict is computed on demand (docs/diagnostics.md#on-demand), as single-path Pathfinder
  computes none; ``new_process_verdict``: the same process calling ``fit.diagnostics()`` too;
* ``verdict_wall``: the warm time of stanvi's first ``fit.diagnostics()`` call (the verdict's
  draws, their log densities and PSIS), reported apart from ``wall``;
* ``elbo``: stanvi's and Stan ADVI's Gaussians on 10,000 common base draws; single-path
  Pathfinder's mean of lp − lp_approx over its draws; none for multi-path;
* ``mean_error_sd``, ``w1_sd``: medians over marginals of |mean − mean_ref| / sd_ref and of the
  1-Wasserstein distance / sd_ref (:mod:`stanvi.evaluation.accuracy`), and k̂.

Each model's rows are printed when it is done and, with ``--output``, written as JSON.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

COMMON_SEED = 20261124
ELBO_DRAWS = 10_000
OUTPUT_DRAWS = 2000          # stanvi's output draws, as the batch runs use (Pathfinder: 1,000)
FULLRANK_MAX_DIM = 100
METHODS = ("trustvi", "trustvi-fullrank", "stan-advi", "pathfinder", "pathfinder-multi")
NEW_PROCESS = {"trustvi": ("trustvi", "meanfield"), "trustvi-fullrank": ("trustvi", "fullrank"),
               "pathfinder": ("pathfinder", "none")}


class PeerCase(NamedTuple):
    """A model of the benchmark: its program, data (a dict or a JSON path) and reference draws
    by element label (None: NUTS is run here)."""

    name: str
    stan: Path
    data: Any
    reference: dict[str, np.ndarray] | None = None


def _accuracy(draws: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, Any]:
    from stanvi.evaluation.accuracy import labelled_draws, marginal_accuracy  # noqa: PLC0415

    acc = marginal_accuracy(labelled_draws(draws), reference)
    return {"mean_error_sd": acc["mean_error_sd_median"], "w1_sd": acc["w1_sd_median"]}


def _fit_method(method: str, compiled, data, seed: int, options: dict):
    """One run of ``method``, nothing else: the object it returns (a stanvi ``Fit`` or Stan's
    ``ReferenceFit``).  The bench runs every seed of a method back to back before it evaluates
    any (:func:`_figures`), so that the evaluations' own batched calls (10,000 draws on all
    threads) and their aftermath do not land inside the timed fits."""
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.reference import pathfinder, stan_advi  # noqa: PLC0415

    if method.startswith("trustvi"):
        family = "fullrank" if method == "trustvi-fullrank" else "meanfield"
        return fit(compiled, data, method="trustvi", family=family, seed=seed, progress=False,
                   draws=OUTPUT_DRAWS, **options)
    if method == "stan-advi":
        return stan_advi(compiled, data, seed=seed)
    return pathfinder(compiled, data, seed=seed, num_paths=1 if method == "pathfinder" else 4)


def _figures(method: str, result, target, common: np.ndarray) -> dict[str, Any]:
    """A run's costs, ELBO, k̂ and draws."""
    from stanvi.evaluation.protocol import summarize_run  # noqa: PLC0415
    from stanvi.reference.advi import stan_advi_elbo  # noqa: PLC0415

    if method.startswith("trustvi"):
        evaluations = result.info.get("model_evaluations") or {}
        t0 = time.perf_counter()
        diagnostics = result.diagnostics()     # on demand: the fit was run with progress=False
        verdict_wall = time.perf_counter() - t0
        # the paper protocol's final ELBO: the family's ELBO on the common draws
        elbo = summarize_run(result, "", common, common[:2000], 2).final_elbo
        return {"status": result.status, "wall": result.wall_time,
                "compile": result.compile_time, "verdict_wall": verdict_wall,
                "evaluations": int(sum(evaluations.values())),
                "hvp": int(evaluations.get("hvp", 0)),
                # the output draws and every draw of the verdict's sample (its first S_diag
                # and those it added while k-hat's band was undecided)
                "diagnostic_evaluations": OUTPUT_DRAWS + int(diagnostics.n_draws),
                "elbo": elbo, "khat": diagnostics.khat,
                "draws": result.stan_variables(), "message": str(result.message)[:300]}
    if method == "stan-advi":
        try:
            elbo = stan_advi_elbo(result, target, [common])[0][0]
        except ValueError:
            elbo = math.nan
    else:
        ratio = result.log_p - result.log_q
        ratio = ratio[np.isfinite(ratio)]
        elbo = float(np.mean(ratio)) if method == "pathfinder" and ratio.size else math.nan
    return {"status": result.status, "wall": result.wall_time,
            "evaluations": result.gradient_evaluations + result.density_evaluations, "hvp": 0,
            "elbo": elbo,
            "khat": result.diagnostics().khat if result.has_proposal_density else None,
            "draws": result.stan_variables()}


def _runs(method: str, compiled, data, target, seeds: int, common: np.ndarray,
          reference: dict[str, np.ndarray], options: dict) -> list[dict[str, Any]]:
    """Every seed of ``method``, fitted back to back, then evaluated."""
    fitted = []
    for seed in range(seeds):
        if method == "trustvi-fullrank" and target.dim > FULLRANK_MAX_DIM:
            fitted.append({"status": "skipped", "message": f"D > {FULLRANK_MAX_DIM}"})
            continue
        try:
            fitted.append(_fit_method(method, compiled, data, seed, options))
        except Exception as exc:  # noqa: BLE001 — a method failing is a result
            fitted.append({"status": "failed", "message": f"{type(exc).__name__}: {exc}"[:500]})
    runs = []
    for result in fitted:
        if isinstance(result, dict):
            runs.append(result)
            continue
        try:
            run = _figures(method, result, target, common)
            run.update(_accuracy(run.pop("draws"), reference))
        except Exception as exc:  # noqa: BLE001
            run = {"status": "failed", "message": f"{type(exc).__name__}: {exc}"[:500]}
        runs.append(run)
    return runs


def _new_process_times(case: PeerCase, methods: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """End-to-end seconds of a fresh process running each of ``methods`` once (seed 0) on the
    model, already compiled and cached (:func:`stanvi.bench.coldstart.run_child`):
    ``new_process``, and for stanvi's fits ``new_process_verdict`` (the process also computes
    the k̂ verdict)."""
    from stanvi.bench.coldstart import run_child  # noqa: PLC0415

    out: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data_path = None
        if isinstance(case.data, dict):
            data_path = Path(tmp) / "data.json"
            data_path.write_text(json.dumps(case.data))
        elif case.data is not None:
            data_path = Path(case.data)
        for method in methods:
            if method not in NEW_PROCESS:
                continue
            name, family = NEW_PROCESS[method]
            try:
                out[method] = {"new_process": run_child(case.stan, data_path, name, family)["e2e"]}
                if name == "trustvi":
                    out[method]["new_process_verdict"] = run_child(
                        case.stan, data_path, name, family, verdict=True)["e2e"]
            except Exception as exc:  # noqa: BLE001 — a failing process is a missing figure
                print(f"  {case.name}: new-process {method} failed: {str(exc)[:200]}")
    return out


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("status") not in ("failed", "error", "skipped")]
    med: dict[str, Any] = {}
    for k in ("wall", "verdict_wall", "evaluations", "hvp", "diagnostic_evaluations", "elbo",
              "mean_error_sd", "w1_sd", "khat"):
        vals = [r[k] for r in ok if r.get(k) is not None and np.isfinite(r[k])]
        med[k] = float(np.median(vals)) if vals else None
    med["failed"] = len(runs) - len(ok)
    med["statuses"] = sorted({str(r.get("status")) for r in runs})
    return med


def run_case(case: PeerCase, seeds: int, methods: tuple[str, ...] = METHODS, *,
             new_process: bool = False, options: dict | None = None) -> dict[str, Any]:
    """Every method on one model: per-run figures and their medians."""
    import jax  # noqa: PLC0415

    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415
    from stanvi.reference import nuts  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.labelled import labelled_draws  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    compiled = compile_model(case.stan, progress=False)
    target = StanTarget(compiled, case.data, progress=False)
    common = standard_normal(jax.random.PRNGKey(COMMON_SEED), ELBO_DRAWS, target.dim)
    t0 = time.perf_counter()
    out: dict[str, Any] = {"model": case.name, "dim": int(target.dim), "runs": {},
                           "medians": {}}
    if case.reference is None:
        reference = nuts(compiled, case.data, chains=4, seed=0)
        ref_draws = labelled_draws(reference.stan_variables())
        out["nuts"] = {"wall": reference.wall_time,
                       "gradient_evaluations": reference.gradient_evaluations,
                       "divergences": int(sum(reference.sampler_diagnostics["divergences"])),
                       **{k: v for k, v in reference.diagnostics().items()
                          if isinstance(v, (int, float))}}
    else:
        ref_draws = case.reference
    for method in methods:
        runs = _runs(method, compiled, case.data, target, seeds, common, ref_draws,
                     dict(options or {}))
        out["runs"][method] = runs
        out["medians"][method] = _medians(runs)
    if new_process:
        eligible = tuple(m for m in methods
                         if not (m == "trustvi-fullrank" and target.dim > FULLRANK_MAX_DIM))
        for method, seconds in _new_process_times(case, eligible).items():
            out["medians"][method].update(seconds)
    elbos = [m["elbo"] for m in out["medians"].values()
             if m.get("elbo") is not None and math.isfinite(m["elbo"])]
    best = max(elbos) if elbos else None
    for med in out["medians"].values():
        med["elbo_gap"] = (best - med["elbo"] if best is not None and med.get("elbo") is not None
                           else None)
    out["seconds"] = time.perf_counter() - t0
    return out


def stan_models_cases(models_dir: Path, models: list[str] | None = None) -> list[PeerCase]:
    """The stan_models set with data (NUTS references, run by :func:`run_case`)."""
    from stanvi.evaluation.models import discover_models  # noqa: PLC0415

    found = [PeerCase(n, s, str(d)) for n, s, d in discover_models(models_dir) if d is not None]
    return [c for c in found if not models or c.name in models]


def posteriordb_cases(root: Path, names: list[str] | None = None,
                      max_dim: int | None = None) -> list[PeerCase]:
    """posteriordb's posteriors with reference draws (``names``: only those); data and
    reference draws read here; D is checked by :func:`run` (``max_dim``)."""
    from stanvi.batch.posteriordb import (discover_posteriordb, read_reference_draws,  # noqa: PLC0415
                                          read_zipped_json)

    cases = []
    for case in discover_posteriordb(root, names=names, with_reference=True):
        if case.skip:
            print(f"{case.name}: skipped ({case.skip})")
            continue
        try:
            cases.append(PeerCase(case.name, case.stan, read_zipped_json(case.data),
                                  read_reference_draws(case.reference)))
        except (OSError, ValueError) as exc:   # zipfile.BadZipFile is a ValueError
            print(f"{case.name}: skipped (unreadable data or reference draws: {exc})")
    return cases


def run(cases: list[PeerCase], *, seeds: int = 5, methods: tuple[str, ...] = METHODS,
        output: Path | None = None, plot: Path | None = None, new_process: bool = False,
        max_dim: int | None = None, options: dict | None = None,
        resume: bool = False) -> list[dict[str, Any]]:
    """Run the benchmark on ``cases`` and print its figures (and write ``output``, ``plot``)."""
    from stanvi.bench.peers_report import plot_accuracy, print_model, print_overall  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    results: list[dict[str, Any]] = []
    if resume and output is not None and output.exists():
        results = json.loads(output.read_text())
    done = {r["model"] for r in results}
    for case in cases:
        if case.name in done:
            continue
        try:
            if max_dim is not None:
                dim = StanTarget(compile_model(case.stan, progress=False), case.data,
                                 progress=False).dim
                if dim > max_dim:
                    print(f"\n{case.name}: skipped (D = {dim} > {max_dim})")
                    continue
            res = run_case(case, seeds, methods, new_process=new_process, options=options)
        except Exception as exc:  # noqa: BLE001 — e.g. NUTS cannot initialize, data rejected
            print(f"\n{case.name}: skipped ({type(exc).__name__}: {str(exc)[:300]})")
            continue
        results.append(res)
        print_model(res)
        if output is not None:
            output.write_text(json.dumps(results, indent=1, default=float))
    if results:
        print_overall(results)
        if plot is not None:
            plot_accuracy(results, plot)
            print(f"wrote {plot}")
    return results
