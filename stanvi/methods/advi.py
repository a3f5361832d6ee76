"""Stan's ADVI, exactly as Stan implements it (Kucukelbir, Tran, Ranganath, Gelman & Blei 2017,
"Automatic Differentiation Variational Inference", JMLR 18(14), Algorithm 1; Stan's
``advi.hpp``; docs/algorithms.md#advi, its line-by-line audit in docs/methods.md).

Sources: [S] ``stan-dev/stan`` ``src/stan/variational/advi.hpp`` and the families
``normal_meanfield.hpp`` / ``normal_fullrank.hpp``; [R] the TrustVI authors' fork
(``jeff-regier/stan`` branch ``trustvi``, commit ``fd32b6c``), which changed ω₀ and added one ELBO
before the SGD loop; [C] stanvi's choice where both are silent.

1. ``elbo_init = calc_ELBO(q₀)``; its failure ends the run.
2. Eta adaptation (:func:`~stanvi.methods.advi_rules.select_eta`,
   docs/algorithms.md#advi-eta): for η in (100, 10, 1, 0.1, 0.01), ``adapt_iter`` SGD steps from
   q₀ with a fresh step-size history; a failed gradient is a zero gradient and a thrown ELBO is
   −DBL_MAX; q is reset to q₀ after every trial.
3. SGD (docs/algorithms.md#advi-step-size): Stan's gradient and step size in compiled chunks
   (:mod:`stanvi.methods.advi_sgd`); every ``eval_elbo`` iterations ``calc_ELBO`` and the
   relative-tolerance test (:class:`~stanvi.methods.advi_rules.RelativeTolerance`,
   docs/algorithms.md#advi-convergence).  A failed gradient or ELBO ends the run ('failed', the
   last iterate kept), as Stan's uncaught exception does.
4. Stan's unguarded ``log_prob`` at the output draws
   (:func:`~stanvi.methods.advi_output.output_failure`); stanvi's one addition, the
   improper-posterior check (``improper_check``).

The estimators are Stan's own arithmetic (:mod:`stanvi.estimators.stan_advi`: draws consumed in
order, the 10·n-th dropped gradient draw fails, sums in draw order, overflow is not a drop).
Keys: global iteration t counts every gradient step, adaptation included; step t uses
``purpose_key(key, t, 'gradient')``, the ELBO of trace row t ``purpose_key(key, t, 'elbo')``
(elbo_init: t = 0), [R]'s pre-loop ELBO ``purpose_key(key, 2**32 − 1, 'elbo')``.  Oracle units
(docs/algorithms.md#oracle-calls): ``grad_samples/256`` per gradient (a failed SGD gradient too),
``elbo_samples/128`` per ``calc_ELBO``; redrawn and screening draws are counted as draws.  The
trace has row 0 = q₀ and one row per gradient step (``phase`` 'adapt' | 'sgd', ``eta``, ``step``;
``elbo``, ``rel_change``, ``rel_mean``, ``rel_median`` at checks; ``grad_failed``,
``diverging``).  The budget is checked after every iteration.  Statuses: 'converged',
'max_iters', 'budget', 'failed'.  "MAY BE DIVERGING" issues one :class:`ADVIWarning` per run.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from stanvi.errors import VIError
from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.estimators.stan_advi import GRAD_NAN, ElboFailure, calc_elbo
from stanvi.methods.base import (MethodResult, OracleLedger, Trace, compile_clock,
                                 purpose_key)
from stanvi.methods.advi_rules import DBL_MAX, RelativeTolerance, rel_difference, select_eta
from stanvi.methods.advi_output import output_failure
from stanvi.methods.advi_sgd import _chunk_for, advance, gradient_failure_message
from stanvi.methods.checks import (PROBE_DRAWS, divergence, improper_direction,
                                   runaway_coordinates)

# Hard-coded in [S] advi.hpp / the families.

_PRELOOP_ITERATION = 2**32 - 1   # key index of [R]'s pre-loop ELBO (owned by no trace row)


class ADVIWarning(UserWarning):
    """Stan ADVI's "MAY BE DIVERGING... INSPECT ELBO" note."""


# --------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """ADVI settings.  Defaults are Stan's ([S] ``services/experimental/advi/defaults.hpp``,
    CmdStan's ``variational`` method); the ``paper`` profile changes what [R] changed.

    Attributes:
        max_iterations: [S] ``iter`` = 10000, SGD iterations after adaptation.
        grad_samples: [S] 1 draw per gradient ([R]/paper: 256).
        elbo_samples: [S] 100 draws per ``calc_ELBO``.
        eta: [S] 1.0; the step-size scale, used only when ``adapt_engaged`` is False.
        adapt_engaged: [S] True: choose eta by the grid search of ``adapt_eta``.
        adapt_iter: [S] 50 SGD steps per trial eta.
        tol_rel_obj: [S] 0.01 ([R]/paper: 1e-4), relative ELBO tolerance.
        eval_elbo: [S] 100, iterations between ELBO checks.
        output_samples: [S] 1000 approximate-posterior draws (see :func:`output_draws`).
        init: initial mean when the caller gives none: 'random' = Stan's uniform(−2, 2) on the
            unconstrained scale ([S] ``services::util::initialize``, ``init_radius`` 2);
            'zero' = μ₀ = 0 ([R]'s TrustVI, used for all methods in the paper profile, docs/algorithms.md#advi-profiles).
        init_log_scale: [S] 0 (ω₀ = 0 / L₀ = I); [R] −1 (σ₀ = e⁻¹, set in [R]'s
            ``normal_meanfield(cont_params)``; applied to full-rank too as L₀ = e⁻¹ I [C]).
        elbo_before_loop: [S] False; [R] True: one ``calc_ELBO(q)`` before the SGD loop, so the
            first buffered relative change is a real change and a stop at iteration
            ``eval_elbo`` is possible (docs/algorithms.md#advi-profiles).
        output_check: [S] True: after the SGD loop, Stan's ``advi::run`` evaluates
            ``log_prob<false, true>`` at each of the ``output_samples`` output draws outside any
            try block, so one throwing draw ends the run with an error (see :func:`run`).
            False skips this (the draws' failures then only show in the fit's ``log_p__`` and
            diagnostics) [C].
        improper_check: stanvi's addition (issue P2-1c), default True: when the SGD phase ends
            ('converged' or 'max_iters'), or a gradient turns NaN, q is checked for an improper
            posterior (:func:`stanvi.methods.checks.divergence`: non-finite parameters or a
            runaway scale; :func:`stanvi.methods.checks.improper_direction`: the ELBO still rising
            as q is widened along its widest coordinates).  Stan's ADVI reports 'converged' on
            ``parameters { real x; } model { }`` (full-rank: the ELBO grows like log σ, so its
            relative change falls below ``tol_rel_obj``); here that run ends 'failed' with "the
            posterior may be improper" and Stan's status kept in ``info['sgd_status']``.  The
            widening probe runs only when the last three ELBO checks were increasing.
            False gives Stan's status.
    """

    max_iterations: int = 10000
    grad_samples: int = 1
    elbo_samples: int = 100
    eta: float = 1.0
    adapt_engaged: bool = True
    adapt_iter: int = 50
    tol_rel_obj: float = 0.01
    eval_elbo: int = 100
    output_samples: int = 1000
    init: str = "random"
    init_log_scale: float = 0.0
    elbo_before_loop: bool = False
    output_check: bool = True
    improper_check: bool = True

    def __post_init__(self) -> None:
        for name in ("max_iterations", "grad_samples", "elbo_samples", "adapt_iter", "eval_elbo",
                     "output_samples"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"advi option {name} must be a positive integer, got {value!r}")
        for name in ("eta", "tol_rel_obj"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"advi option {name} must be a positive number, got {value!r}")
        if self.init not in ("random", "zero"):
            raise ValueError(f"advi option init must be 'random' or 'zero', got {self.init!r}")
        if not math.isfinite(self.init_log_scale):
            raise ValueError(f"advi option init_log_scale must be finite, "
                             f"got {self.init_log_scale!r}")

    @property
    def cb_size(self) -> int:
        """Circular-buffer capacity ``int(max(0.1·max_iterations/eval_elbo, 2.0))`` [S]."""
        return int(max(0.1 * self.max_iterations / self.eval_elbo, 2.0))


PROFILES: dict[str, dict[str, Any]] = {
    # Stan's defaults (docs/algorithms.md#advi-defaults).
    "stan": {},
    # What [R] changed for the TrustVI paper's experiments (docs/algorithms.md#advi-profiles).
    "paper": {"grad_samples": 256, "tol_rel_obj": 1e-4, "init_log_scale": -1.0, "init": "zero",
              "elbo_before_loop": True},
}
DEFAULT_PROFILE = "stan"
ESTIMATOR = "reparameterization"   # stanvi.estimators.base.ESTIMATORS: what run() gets in context.estimator


# --------------------------------------------------------------------------------- ELBO
class _BudgetSpent(Exception):
    """Internal: the oracle budget ran out inside an adaptation trial."""


def _runaway_message(target, family, params, params0, key: jax.Array, opt: Options, ledger,
                     eta: float, message: str) -> str:
    """The failed gradient's message, explained when q ran away before it (stanvi's addition,
    ``improper_check``).  A runaway alone does not tell an improper posterior from steps that
    diverged (η too large: mesquite from posteriordb ran away at η = 100 with a proper posterior),
    so the improper-direction probe decides, run from the finite q₀ along the coordinates where q
    ran away."""
    runaway = divergence(family, params) if opt.improper_check else None
    if runaway is None:
        return message
    improper = improper_direction(
        target, family, params0,
        standard_normal(purpose_key(key, 0, "check"), PROBE_DRAWS, family.dim), ledger,
        coordinates=runaway_coordinates(family, params))
    if improper is not None:
        return f"{improper}; {runaway.split(':')[0]} ({message})"
    return (f"ADVI's steps diverged: {runaway.split(':')[0]}, although q's ELBO does not keep "
            f"rising as q widens there (so not an improper posterior): the step size "
            f"eta = {eta:g} may be too large for this model ({message})")


def _steps_within_budget(context, scaled: float, per_step: float, n: int) -> int:
    """How many of the next n gradient steps run before the budget is spent (the step that
    spends it included), mirroring the ledger's float accumulation."""
    if context.max_oracle_calls is None:
        return n
    for i in range(1, n + 1):
        scaled += per_step
        if context.over_budget(scaled):
            return i
    return n


def run(target, family, *, key: jax.Array, options: Options, context) -> MethodResult:
    """Stan's ADVI on ``target`` with variational ``family`` (MeanField or FullRank('stan')).

    Returns a :class:`MethodResult`; ``info`` holds ``eta`` (used), ``eta_adapted``,
    ``elbo_init``, ``adapt_elbos`` (list of {eta, elbo} per trial run; a failed trial ELBO is
    −DBL_MAX as in Stan), ``adapt_steps``, ``sgd_iterations``, ``elbo`` (last ELBO check),
    ``elbo_best``, ``rel_mean``/``rel_median`` (last check), ``converged_by``, ``cb_size``,
    ``pre_loop_elbo`` ([R] profile), ``grad_draws_dropped`` (dropped gradient draws),
    ``grad_failures`` (gradients that hit the drop limit), ``init`` and ``messages``.
    """
    est: ElboEstimator = context.estimator
    if est.family != family:
        raise ValueError(f"context.estimator was built for {est.family}, not {family}")
    if getattr(target, "dim", family.dim) != family.dim:
        raise ValueError(f"family dimension {family.dim} != target dimension {target.dim}")
    opt = options
    mu0, init_kind = context.initial_mean(opt.init)
    params0 = np.asarray(family.initial_params(mu0, opt.init_log_scale), dtype=float)
    zeros = np.zeros_like(params0)
    per_grad = opt.grad_samples / 256.0  # for budget look-ahead; the ledger charges the same
    ledger, trace = OracleLedger(), Trace(compile_clock=compile_clock(est))
    info: dict[str, Any] = {"init": init_kind, "cb_size": opt.cb_size, "messages": [],
                            "adapt_elbos": [], "adapt_steps": 0, "sgd_iterations": 0,
                            "grad_draws_dropped": 0, "grad_failures": 0,
                            "eta_adapted": bool(opt.adapt_engaged)}
    state = {"t": 0, "params": params0}

    def result(status: str, message: str = "", params=None) -> MethodResult:
        p = state["params"] if params is None else params
        return MethodResult(np.array(p, dtype=float), trace, ledger, status, message, info)

    def elbo_at(params, t: int) -> float:
        ledger.elbo_estimate(opt.elbo_samples)
        return calc_elbo(est, params, purpose_key(key, t, "elbo"), opt.elbo_samples, ledger)

    def run_steps(params, s, k0, n, eta, absorb, fields):
        """Run n steps, record all but the last row; return (chunk, last row's fields)."""
        chunk = advance(est, params, s, k0=k0, n_steps=n, t0=state["t"], eta=eta, key=key,
                        absorb=absorb, grad_samples=opt.grad_samples)
        info["grad_draws_dropped"] += int(chunk.drops.sum())
        info["grad_failures"] += int(np.count_nonzero(chunk.grad_failed))
        if chunk.fatal:   # the failed gradient (its drops are not in chunk.drops)
            info["grad_draws_dropped"] += chunk.fatal_drops
            info["grad_failures"] += 1
        ledger.redrawn(chunk.evaluated - (chunk.n_done + int(chunk.fatal)) * opt.grad_samples)
        rows = []
        for i in range(chunk.n_done):
            ledger.gradient(opt.grad_samples)
            row = dict(fields, step=k0 + i + 1)
            if chunk.grad_failed[i]:
                row["grad_failed"] = True
                if chunk.grad_failed[i] == GRAD_NAN:
                    row["grad_nan"] = True
            rows.append(row)
            if i < chunk.n_done - 1:
                trace.record(state["t"] + i + 1, chunk.history[i], ledger, **row)
        return chunk, (rows[-1] if rows else None)

    def finish_row(chunk, row):
        state["t"] += chunk.n_done
        state["params"] = chunk.history[-1]
        trace.record(state["t"], chunk.history[-1], ledger, **row)

    # ---- row 0 and elbo_init (charged to iteration 1, docs/algorithms.md#benchmark-protocol)
    trace.record(0, params0, ledger, phase="init")
    if opt.adapt_engaged:
        try:
            elbo_init = elbo_at(params0, 0)
        except ElboFailure as exc:
            info["elbo_init"] = None
            return result("failed", "stan::variational::advi::adapt_eta: Cannot compute ELBO using "
                          "the initial variational distribution. Your model may be either "
                          f"severely ill-conditioned or misspecified. ({exc})")
        info["elbo_init"] = elbo_init
        trace.rows[0]["elbo"] = elbo_init

        # ---- eta adaptation (docs/algorithms.md#advi-eta)
        def run_trial(eta: float) -> float:
            params, s, k = params0, zeros, 0
            while k < opt.adapt_iter:
                n = min(_chunk_for(family), opt.adapt_iter - k)
                n = _steps_within_budget(context, ledger.scaled, per_grad, n)
                chunk, row = run_steps(params, s, k, n, eta, True, {"phase": "adapt", "eta": eta})
                params, s, k = chunk.params, chunk.s, k + n
                if k == opt.adapt_iter:
                    try:
                        elbo = elbo_at(params, state["t"] + chunk.n_done)
                        row["elbo"] = elbo
                    except ElboFailure:
                        elbo = -DBL_MAX
                        row.update(elbo=-math.inf, elbo_failed=True)
                    info["adapt_elbos"].append({"eta": eta, "elbo": elbo})
                finish_row(chunk, row)
                info["adapt_steps"] = state["t"]
                context.progress.update(state["t"], elbo=row.get("elbo", math.nan),
                                        oracle=ledger.scaled)
                if context.over_budget(ledger.scaled):
                    raise _BudgetSpent
            return elbo

        try:
            eta = select_eta(elbo_init, run_trial)
        except _BudgetSpent:
            info["eta"] = None
            return result("budget", "oracle budget spent during eta adaptation")
        except VIError as exc:
            info["eta"] = None
            return result("failed", str(exc), params=params0)
    else:
        eta = float(opt.eta)
    info["eta"] = eta
    if not eta > 0:
        # [S] stochastic_gradient_ascent: check_positive(function, "Eta stepsize", eta) throws
        # std::domain_error, e.g. for adapt_eta's eta_best = 0 (see select_eta)
        return result("failed", f"stan::variational::advi::stochastic_gradient_ascent: Eta "
                      f"stepsize is {eta:g}, but must be positive!", params=params0)
    sgd_start = state["t"]

    # ---- SGD (docs/algorithms.md#advi-step-size), from q₀ again
    monitor = RelativeTolerance(opt.cb_size, opt.tol_rel_obj)
    if opt.elbo_before_loop:
        try:
            monitor.elbo = elbo_at(params0, _PRELOOP_ITERATION)
        except ElboFailure as exc:
            return result("failed", f"{exc} (ELBO before the SGD loop)", params=params0)
        info["pre_loop_elbo"] = monitor.elbo
    params, s, k = params0, zeros, 0
    sgd_elbos: list[float] = []
    warned = False
    status, message = None, ""
    while status is None:
        next_check = (k // opt.eval_elbo + 1) * opt.eval_elbo
        n = min(_chunk_for(family), next_check - k, opt.max_iterations - k)
        n = _steps_within_budget(context, ledger.scaled, per_grad, n)
        chunk, row = run_steps(params, s, k, n, eta, False, {"phase": "sgd", "eta": eta})
        if chunk.fatal:
            if row is not None:
                finish_row(chunk, row)
            ledger.gradient(opt.grad_samples)   # the failed gradient's work was done
            info["sgd_iterations"] = state["t"] - sgd_start
            message = (f"{gradient_failure_message(family, chunk.fatal_kind, opt.grad_samples)} "
                       f"(SGD iteration {k + chunk.n_done + 1})")
            return result("failed", _runaway_message(target, family, state["params"], params0,
                                                     key, opt, ledger, eta, message))
        params, s, k = chunk.params, chunk.s, k + n
        if k % opt.eval_elbo == 0:
            try:
                check = monitor.update(elbo_at(params, state["t"] + n))
                sgd_elbos.append(check.elbo)
            except ElboFailure as exc:
                row["elbo_failed"] = True
                finish_row(chunk, row)
                info["sgd_iterations"] = k
                return result("failed", f"{exc} (SGD iteration {k})")
            row.update(elbo=check.elbo, rel_change=check.rel_change, rel_mean=check.rel_mean,
                       rel_median=check.rel_median)
            info.update(elbo=check.elbo, elbo_best=monitor.elbo_best, rel_mean=check.rel_mean,
                        rel_median=check.rel_median)
            if k > 10 * opt.eval_elbo and (check.rel_median > 0.5 or check.rel_mean > 0.5):
                row["diverging"] = True
                info["messages"].append(f"iteration {k}: MAY BE DIVERGING... INSPECT ELBO")
                if not warned:
                    warned = True
                    warnings.warn(f"ADVI at iteration {k}: relative ELBO change mean "
                                  f"{check.rel_mean:.3g}, median {check.rel_median:.3g}: MAY BE "
                                  f"DIVERGING... INSPECT ELBO", ADVIWarning, stacklevel=2)
            if check.converged:
                status = "converged"
                info["converged_by"] = "+".join(
                    name for name, hit in (("mean", check.converged_mean),
                                           ("median", check.converged_median)) if hit)
                if rel_difference(check.elbo, monitor.elbo_best) > 0.05:
                    info["messages"].append(
                        "Informational Message: The ELBO at a previous iteration is larger than "
                        "the ELBO upon convergence! This variational approximation may not have "
                        "converged to a good optimum.")
        if status is None and k == opt.max_iterations:
            status = "max_iters"
            info["messages"].append("Informational Message: The maximum number of iterations is "
                                    "reached! The algorithm may not have converged.")
        finish_row(chunk, row)
        info["sgd_iterations"] = k
        context.progress.update(state["t"], elbo=monitor.elbo, oracle=ledger.scaled)
        if status is None and context.over_budget(ledger.scaled):
            status, message = "budget", f"oracle budget spent after {k} SGD iterations"
    if opt.improper_check and status in ("converged", "max_iters"):
        # the probe (5,376 log densities) runs only where the ELBO was still climbing at its
        # last three checks, as it does without end on an improper posterior
        climbing = len(sgd_elbos) >= 3 and sgd_elbos[-3] < sgd_elbos[-2] < sgd_elbos[-1]
        improper = divergence(family, state["params"]) or (climbing and improper_direction(
            target, family, state["params"],
            standard_normal(purpose_key(key, 0, "check"), PROBE_DRAWS, family.dim), ledger))
        improper = improper or None
        if improper is not None:
            info["sgd_status"] = status
            return result("failed", f"{improper} (Stan's ADVI would report '{status}')")
    if opt.output_check and status in ("converged", "max_iters"):
        failure = output_failure(target, family, state["params"], key, opt.output_samples, ledger)
        if failure is not None:
            index, why = failure
            info["output_failed_draw"] = index
            info["sgd_status"] = status
            status, message = "failed", (
                f"{why} (output draw {index + 1} of {opt.output_samples}: Stan's advi::run "
                f"evaluates log_prob at every output draw outside any try block, so the run "
                f"ends with an error after the SGD phase ({status}))")
    return result(status, message)
