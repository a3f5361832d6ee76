"""``stanvi.fit``: one fit orchestrated (issue P1-2, "stanvi.fit and the Fit object";
docs/architecture.md#data-flow): the inputs checked (:mod:`stanvi.fit_inputs`), the family and
the estimator built, the method run, its ledger compared with the target's counter, and the
:class:`~stanvi.fit_result.Fit` made (:mod:`stanvi.fit_result`, re-exported here).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from stanvi.errors import DivergedError, NotConvergedError, NotConvergedWarning, VIError
from stanvi.estimators.registry import estimator_for
from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.estimators.keys import make_key
from stanvi.fit_inputs import (ModelLike, check_arguments, check_init, check_memory,
                               initial_mu, as_target, check_seed, describe_data,
                               lowrank_rank, single_gaussian_mixture)
from stanvi.families import make_family
from stanvi.fit_result import Fit, FitTrace
from stanvi.lazy_jax import jax
from stanvi.methods import GP_METHODS, STAN_METHODS, get_method, make_options
from stanvi.methods.base import MethodResult, RunContext, purpose_key
from stanvi.methods.blas_threads import blas_limited
from stanvi.progress import IterationProgress
from stanvi.targets.base import Target
from stanvi.targets.jax_target import JaxTarget

__all__ = ["Fit", "FitTrace", "fit", "make_fit", "not_converged_text"]


def fit(model: ModelLike, data=None, *, method: str = "trustvi", family: str = "meanfield",
        seed: int | None = None, init=None, max_oracle_calls: float | None = None,
        progress: bool = True, draws: int = 1000, profile: str | None = None,
        dim: int | None = None, hvp_method: str | None = None, require_converged: bool = False,
        family_options: Mapping[str, Any] | None = None, **options) -> Fit:
    """Fit a variational approximation.

    Args:
        model: a `.stan` path, a compiled library, a Target, or a JAX log-density function of an
            unconstrained vector (then give ``dim``).
        data: the Stan data (dict, JSON path or JSON string).
        method: 'trustvi' (default), 'advi', 'hfsgvi', 'jointcv', 'mlmcvi', or 'bam' and
            'gsm' (family 'fullrank'; 'bam' also 'lowrank', docs/methods.md#pbam; see
            ``stanvi.methods.available()``); for a ``stanvi.gp`` model 'qsgp', 'exact' or
            'svi' (docs/gp.md; the result is a ``stanvi.gp.GPFit``); Stan's own 'nuts',
            'pathfinder' or 'stan-advi' on a Stan model (the result is a
            :class:`stanvi.reference.ReferenceFit`; their settings under Stan's names,
            docs/stan_reference.md#through-fit).
        family: 'meanfield' (default), 'fullrank', 'lowrank' (N(μ, diag(d²) + BBᵀ) with B of
            rank k, docs/algorithms.md#lowrank), or 'mixture' (a Gaussian mixture whose
            weights' gradient is Rao-Blackwellized, docs/discrete.md; methods 'advi' and 'mlmcvi',
            the others refuse it with the reason).
        family_options: the family's settings, e.g. for 'mixture' ``{"n_components": 3,
            "component_budget": 2}`` (:class:`stanvi.families.GaussianMixture`), for 'lowrank'
            ``{"rank": 5}`` (default min(10, max(1, D // 2)); ``"laplace_fit": "ppca"`` for
            the PPCA Laplace start alone instead of the reverse-KL start with its PPCA
            fallback, docs/algorithms.md#lowrank-start;
            :class:`stanvi.families.LowRank`).
        seed: integer seed from 0 to 2**32 - 1 (default 0); the same seed gives the same
            result.
        init: None (the method's rule), 'zero', 'random' (Stan's uniform(−2, 2)), a dict of
            constrained parameter values, or an unconstrained array (D,).
        max_oracle_calls: budget in scaled oracle units (docs/algorithms.md#oracle-calls); the
            fit stops with status 'budget' when it is spent.
        progress: show progress on a terminal.
        draws: number of output draws from the approximation.
        profile: the method's named option set (e.g. 'paper'); see ``docs/methods.md``.
        hvp_method: for a Stan model loaded here, 'auto' (default: decided once per compiled
            library and data, and stored), 'exact' or 'finite_difference'; the method used is in
            ``fit.info["hvp_method"]``.
        require_converged: raise :class:`~stanvi.errors.NotConvergedError` (carrying the fit
            as ``exc.fit``) when the method stops for another reason than its convergence rule;
            by default a :class:`~stanvi.errors.NotConvergedWarning` is issued instead, whatever
            ``progress`` says.
        **options: the method's options, overriding the profile's.

    Warns:
        NotConvergedWarning: the fit stopped on 'max_iters', 'budget' or 'failed'.
    """
    t0 = time.perf_counter()
    check_arguments(draws, max_oracle_calls)
    seed = check_seed(seed)
    if method in STAN_METHODS:
        # Stan's own algorithm on the same model: a stanvi.reference.ReferenceFit
        from stanvi.reference.as_fit import run_stan_method  # noqa: PLC0415

        given = dict(draws=draws, max_oracle_calls=max_oracle_calls, profile=profile, dim=dim,
                     family_options=family_options, require_converged=require_converged,
                     hvp_method=hvp_method)
        return run_stan_method(method, model, data, family=family, seed=seed, init=init,
                               progress=progress, given=given, **options)
    if method in GP_METHODS or getattr(model, "__stanvi_gp__", False):
        # stanvi.gp models and methods (docs/gp.md); imported only when used
        from stanvi.gp.dispatch import fit_gp  # noqa: PLC0415

        return fit_gp(model, data, method=method, family=family, seed=seed, progress=progress,
                      **options)
    target = as_target(model, data, dim=dim, seed=seed, progress=progress, hvp_method=hvp_method)
    if target.dim == 0:
        raise VIError(f"{target!r} has no parameters: there is nothing to approximate (use "
                      "Stan's fixed_param sampler for its generated quantities)")
    module = get_method(method)
    opts = make_options(module, profile, options)
    fam_kwargs = dict(family_options or {})
    family, fam_kwargs, family_note = single_gaussian_mixture(family, fam_kwargs)
    if family == "fullrank" and hasattr(opts, "fullrank_diagonal"):
        fam_kwargs["diagonal"] = opts.fullrank_diagonal
    if family == "mixture" and not getattr(module, "SUPPORTS_MIXTURE", False):
        from stanvi.estimators.mixture_rb import unsupported_message  # noqa: PLC0415

        raise VIError(unsupported_message(method))
    init_mu, random_mu = initial_mu(target, init, seed)
    check_init(target, init_mu)
    counter = getattr(target, "counter", None)
    model_before = getattr(counter, "seconds", 0.0)
    evaluations_before = counter.snapshot() if counter is not None else None
    t_rank, cpu_rank = time.perf_counter(), time.thread_time()
    # the low-rank family's rank from the Laplace Gaussian: the method's warm start, computed
    # before the family is made, is part of the run (its time and evaluations)
    fam_kwargs, point, rank_note = lowrank_rank(target, family, fam_kwargs, opts, init_mu,
                                                random_mu)
    t_rank, cpu_rank = time.perf_counter() - t_rank, time.thread_time() - cpu_rank
    fam = make_family(family, target.dim, **fam_kwargs)
    check_memory(fam, draws)
    estimator = estimator_for(target, fam, module.ESTIMATOR,
                              host=getattr(module, "HOST_PATH", False))
    bar = IterationProgress(method, enabled=progress)
    context = RunContext(init_mu=init_mu, random_init_mu=random_mu,
                         max_oracle_calls=max_oracle_calls, estimator=estimator, progress=bar,
                         laplace_point=point)
    key = make_key(seed, host=bool(getattr(estimator, "host", False)))
    setup_time = time.perf_counter() - t0 - t_rank
    t1 = time.perf_counter()
    compile_before = estimator.compile_seconds
    cpu0 = time.thread_time() - cpu_rank
    try:
        with blas_limited(fam.dim):
            result: MethodResult = module.run(target, fam, key=key, options=opts,
                                              context=context)
    finally:
        bar.close()
    wall = time.perf_counter() - t1 + t_rank
    # the calling thread's CPU in the method (the model's worker threads not included): a
    # figure that other load on the machine disturbs less than wall time
    # (stanvi bench run-cpu, docs/benchmarks.md#run-cpu)
    result.info["run_cpu_seconds"] = time.thread_time() - cpu0
    compile_time = estimator.compile_seconds - compile_before   # within the run, as wall is
    if getattr(counter, "seconds", 0.0) > model_before:  # StanTarget times its batched calls
        result.info["model_seconds"] = counter.seconds - model_before
    if evaluations_before is not None and not isinstance(target, JaxTarget):
        # the target counts every model evaluation (docs/architecture.md#data-flow); the method's ledger must agree
        # (OracleLedger.model_evaluations; tests/methods/test_oracle_accounting.py).  A JaxTarget's
        # log density is traced into the method's JAX programs, so it counts direct calls only.
        result.info["model_evaluations"] = {
            kind: count - evaluations_before[kind] for kind, count in counter.snapshot().items()}
    fit_result = make_fit(target, fam, result, method=method, profile=profile or module.DEFAULT_PROFILE,
                          options=opts, seed=seed, key=key, n_draws=draws, wall_time=wall,
                          setup_time=setup_time, estimator=estimator)
    fit_result.compile_time = compile_time
    fit_result.info["data_source"] = describe_data(data)
    if family_note:
        fit_result.info["family_note"] = family_note
    if rank_note:
        fit_result.info["lowrank_rank"] = rank_note
    _report_diagnostics(fit_result, progress)
    if not fit_result.converged:
        text = not_converged_text(fit_result, as_error=require_converged)
        if require_converged:
            raise NotConvergedError(text, fit=fit_result)
        warnings.warn(text, NotConvergedWarning, stacklevel=2)
    return fit_result


def not_converged_text(fit_result: Fit, *, as_error: bool = False) -> str:
    """What a fit that did not converge says to its user: the warning's text, or with
    ``as_error`` the :class:`NotConvergedError`'s (raised because the caller asked for
    ``require_converged``, so it does not suggest passing it; the fit is the error's ``.fit``)."""
    how = {"max_iters": "reached its iteration limit",
           "budget": "spent its oracle budget (max_oracle_calls)",
           "failed": "failed"}.get(fit_result.status, f"stopped with status {fit_result.status!r}")
    if fit_result.status == "failed":
        advice = "see fit.message and fit.diagnostics()"
    elif as_error:
        advice = ("raise the limit, or look at the approximation as it stood (the error's .fit, "
                  "its diagnostics())")
    else:
        advice = ("the approximation may be far from the optimum: raise the limit, check "
                  "fit.diagnostics(), or pass require_converged=True to make this an error")
    if as_error and fit_result.status == "failed":
        advice = "see the error's .fit: its message and diagnostics()"
    message = " ".join(str(fit_result.message or "").split())
    return (f"{fit_result.method} {how} before converging"
            + (f" ({message})" if message else "") + f"; {advice}")


def _report_diagnostics(fit_result: Fit, progress: bool) -> None:
    """With ``progress``, compute the diagnostics and log the one-line verdict (issue P1-3) at
    INFO on the ``stanvi.fit`` logger (:mod:`stanvi.log`: shown on stderr as ``stanvi: ...`` by
    default).  Without it nothing is shown, so nothing is computed here: ``fit.diagnostics()``
    computes the verdict when it is first asked for, as do ``summary`` printing, ``save``,
    ``to_arviz`` and the CLI, with the same draws and the same result
    (docs/diagnostics.md#on-demand)."""
    if not progress:
        return
    from stanvi.log import get_logger  # noqa: PLC0415

    get_logger("fit").info(fit_result.diagnostics(progress=True).one_line())


def make_fit(target: Target, family, result: MethodResult, *, method: str, profile: str, options,
             seed: int, key: jax.Array, n_draws: int, wall_time: float, setup_time: float,
             estimator: ElboEstimator) -> Fit:
    """Draw from the final approximation and assemble the :class:`Fit`."""
    if not np.all(np.isfinite(result.params)):
        raise DivergedError(method, result.status, str(result.message or ""))
    eps = standard_normal(purpose_key(key, 0, "output"), n_draws, family.base_dim)
    z, log_p, log_q = estimator.log_p_and_q(result.params, eps)
    gq_note: dict = {}
    if hasattr(target, "constrain_reporting"):
        constrained, n_gq_failed, gq_message = target.constrain_reporting(
            z, include_tp=True, include_gq=True, seed=seed)
        if n_gq_failed:
            gq_note = {"gq_failed_draws": n_gq_failed, "gq_failure_message": gq_message}
            warnings.warn(f"generated quantities could not be computed at {n_gq_failed} of "
                          f"{n_draws} draws ({gq_message!r}); they are NaN there, and their "
                          f"summaries use the other draws only (parameters and transformed "
                          f"parameters are kept at every draw)", stacklevel=3)
    else:
        constrained = target.constrain(z, include_tp=True, include_gq=True, seed=seed)
    return Fit(method=method, family_name=family.name, profile=profile, options=options, seed=seed,
               params=np.asarray(result.params, dtype=float), family=family, target=target,
               draws=constrained, unconstrained_draws=z, log_p=log_p, log_q=log_q,
               trace=FitTrace.from_trace(result.trace), oracle=result.ledger.snapshot(),
               status=result.status,
               message=result.message, wall_time=wall_time, setup_time=setup_time,
               info={**result.info, **gq_note,
                     **({"hvp_method": target.hvp_method_used}
                        if getattr(target, "hvp_method_used", None) else {})},
               _estimator=estimator)
