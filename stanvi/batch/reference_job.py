"""Batch fits by Stan's own algorithms (issue P2-3): ``stan-advi``, ``pathfinder`` and ``nuts``
as batch methods, run in-process by :mod:`stanvi.reference` on the batch's compiled model.

Their records have the fields of stanvi's fit records where the quantity exists, in the same
units, so the report puts them side by side:

* costs: ``draw_evaluations`` = every model evaluation the algorithm made (gradients and log
  densities, counted in C++), ``oracle`` = the same split by kind; ``run_time`` = the algorithm;
  ``setup_time`` = building the services library (first use of a model only).
* ``stan-advi`` (profile = nothing; family meanfield / fullrank): status ``converged`` when Stan
  says the relative ELBO change converged, else ``max_iters``.  Its Gaussian is recovered exactly
  from the output (:func:`stanvi.reference.advi.stan_advi_gaussian`), so ``elbo`` and
  ``final_elbo`` (the batch's 10,000 common draws, one evaluation) are computed as for
  stanvi's fits.
* ``pathfinder`` (profile ``multi``, CmdStan's default of 4 paths, or ``single``): status
  ``converged``; ``elbo`` = the mean of lp − lp_approx over its draws (single path: draws from the
  approximation; for multi-path, PSIS-resampled draws, so this is not an ELBO and is left out).
* ``nuts`` (profile ``diag`` or ``dense``): status ``sampled``; no ELBO; R-hat, ESS and
  divergences in ``info``.

Accuracy against reference draws is computed for all three as for stanvi's fits.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from stanvi.methods import STAN_METHODS

REFERENCE_METHODS = STAN_METHODS   # the catalogue's (stanvi.methods.METHOD_KINDS)
PROFILES = {"stan-advi": (None,), "pathfinder": (None, "multi", "single"),
            "nuts": (None, "diag", "dense")}
# A pathfinder or NUTS run has no variational family; the batch plans it once per seed.
NO_FAMILY = "none"


def check_reference_method(method: str, profile: str | None, options: dict) -> None:
    """Raise ValueError / TypeError for a profile or option the method does not have."""
    from stanvi.reference import ADVI_DEFAULTS, NUTS_DEFAULTS, PATHFINDER_DEFAULTS  # noqa: PLC0415
    from stanvi.reference.services_lib import check_settings  # noqa: PLC0415

    if profile not in PROFILES[method]:
        raise ValueError(f"method {method!r} has no profile {profile!r}; profiles: "
                         f"{', '.join(p for p in PROFILES[method] if p) or 'none'}")
    defaults = {"stan-advi": ADVI_DEFAULTS, "pathfinder": PATHFINDER_DEFAULTS,
                "nuts": {**NUTS_DEFAULTS, "num_warmup": 1000, "num_samples": 1000,
                         "chains": 4}}[method]
    check_settings(options, defaults, method)


def reference_fit_job(job: dict, data, partial=None, start: float | None = None
                      ) -> dict[str, Any]:
    """Run one reference method for a batch fit job and build its record, in stages reported
    through ``partial`` as :func:`stanvi.batch.child.fit_job` reports its own: the run with its
    accuracy against the reference draws (``fit``), the ELBO (``elbo``), then the k̂ verdict
    (``verdict``), each one's seconds in ``stage_seconds`` (``start``: when the job began)."""
    from stanvi.batch.fit_figures import (ELBO_DRAWS, RecordStages,  # noqa: PLC0415
                                          common_draws, fit_accuracy)
    from stanvi.reference import nuts, pathfinder, stan_advi  # noqa: PLC0415
    from stanvi.reference.advi import stan_advi_elbo  # noqa: PLC0415
    from stanvi.reference.diagnostics import recovery_options, stan_diagnostics  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.stan.services_build import services_library  # noqa: PLC0415
    from stanvi.targets.labelled import labelled_draws, mapped_unconstrained  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    method, profile, seed = job["method"], job.get("profile"), int(job["seed"])
    options = dict(job.get("options") or {})
    compiled = compile_model(job["stan"], progress=False)
    t0 = time.perf_counter()
    services_library(compiled, progress=False)
    setup = time.perf_counter() - t0
    target = StanTarget(compiled, data, progress=False)
    # enough output draws to recover q, for its ELBO and verdict (ADVI full rank from D = 45,
    # single-path Pathfinder from D = 44); the extra ones are the evaluation's, in neither the
    # costs nor the accuracy
    form = job["family"] if method == "stan-advi" else "quadratic" if profile == "single" else None
    options, extra = recovery_options(form, target.dim, options)
    if method == "stan-advi":
        fit = stan_advi(compiled, data, algorithm=job["family"], seed=seed, **options)
    elif method == "pathfinder":
        if profile == "single":
            options["num_paths"] = 1
        fit = pathfinder(compiled, data, seed=seed, **options)
    else:
        fit = nuts(compiled, data, seed=seed, metric="dense_e" if profile == "dense" else "diag_e",
                   **options)
    density = fit.density_evaluations - extra
    record: dict[str, Any] = {
        "status": fit.status, "message": "", "dim": int(target.dim), "elbo": None, "elbo_se": None,
        "final_elbo": None, "iterations": None, "trace": [], "trace_thinned": False,
        "oracle": {"gradient": fit.gradient_evaluations, "density": density},
        "draw_evaluations": fit.gradient_evaluations + density,
        "model_evaluations": {"gradient": fit.gradient_evaluations, "log_density": density},
        "wall_time": fit.wall_time + setup, "compile_time": 0.0, "run_time": fit.wall_time,
        "setup_time": setup, "khat": None, "khat_se": None, "verdict": None, "ess": None,
        "info": {"algorithm": fit.algorithm, **({"recovery_draws": extra} if extra else {})}}
    draws_by_label = labelled_draws(fit.stan_variables())
    unconstrained, why = mapped_unconstrained(fit, target)   # kept on the fit: mapped once
    kept = fit.num_draws - extra   # the default run's draws

    def first(draws: dict | None) -> dict | None:
        return None if draws is None else {k: v[:kept] for k, v in draws.items()}

    accuracy = fit_accuracy(job, first(draws_by_label), first(unconstrained))
    if accuracy is not None:
        record["accuracy"] = accuracy
    if method == "stan-advi":
        trace = fit.elbo_trace
        record["iterations"] = int(trace[-1, 0]) if trace.size else 0
        record["trace"] = [{"iteration": int(i), "run_time": float(t), "elbo": float(e)}
                           for i, t, e in trace]
    stages = RecordStages(record, partial, start)
    stages.done("fit")
    if method == "stan-advi":
        common = common_draws(ELBO_DRAWS, target.dim)
        try:
            if unconstrained is None:
                raise ValueError(why)
            ((elbo, elbo_se),) = stan_advi_elbo(fit, target, [common], unconstrained)
            record.update(elbo=elbo, elbo_se=elbo_se, final_elbo=elbo)
        except ValueError as exc:
            record["message"] = f"ELBO not computed: {exc}"
    if fit.algorithm == "pathfinder":
        ratio = (fit.log_p - fit.log_q)[:kept]   # the default run's draws
        ratio = ratio[np.isfinite(ratio)]
        if ratio.size > 1:
            record["elbo"] = record["final_elbo"] = float(ratio.mean())
            record["elbo_se"] = float(ratio.std(ddof=1) / math.sqrt(ratio.size))
    stages.done("elbo")
    if method == "nuts":
        record["info"].update({k: v for k, v in fit.diagnostics().items()
                               if isinstance(v, (int, float))})
        record["info"]["divergences"] = int(sum(fit.sampler_diagnostics["divergences"]))
    elif fit.has_proposal_density:
        diag = (fit.diagnostics() if unconstrained is None
                else stan_diagnostics(fit, target, unconstrained))
        record.update(khat=diag.khat, khat_se=diag.khat_se, verdict=diag.verdict, ess=diag.ess,
                      verdict_figures=diag.verdict_figures())
    stages.done("verdict", report=False)
    return record
