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
``diverging``).  Statuses: 'converged', 'max_iters', 'budget', 'failed'.  "MAY BE DIVERGING"
issues one :class:`ADVIWarning` per run.

Shape (as TrustVI's and HFSGVI's): one :class:`State` step per gradient step (trace row); the
eta trials and the SGD phase are :func:`_adapt_step` / :func:`_sgd_step` driven by the shared loop
:func:`~stanvi.methods.base.iterate` (trace rows, progress line, budget check after every step).
A step reads its iterate from the compiled chunk in its state and runs the next chunk when that is
used up: up to the next ELBO check, the trial's end or the step that spends the budget.
"""

from __future__ import annotations

import math
import warnings
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from stanvi.errors import VIError
from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.stan_advi import GRAD_NAN, ElboFailure, calc_elbo
from stanvi.lazy_jax import jax
from stanvi.methods.base import (MethodResult, OracleLedger, StepOutcome, Trace, compile_clock,
                                 iterate, purpose_key)
from stanvi.methods.advi_options import DEFAULT_PROFILE, PROFILES, Options  # noqa: F401
from stanvi.methods.advi_rules import DBL_MAX, RelativeTolerance, rel_difference, select_eta
from stanvi.methods.advi_output import runaway_message as _runaway_message, sgd_end
from stanvi.methods.advi_sgd import (ChunkResult, chunk_for, advance, gradient_failure_message,
                                     steps_within_budget)

# Hard-coded in [S] advi.hpp / the families.

_PRELOOP_ITERATION = 2**32 - 1   # key index of [R]'s pre-loop ELBO (owned by no trace row)


class ADVIWarning(UserWarning):
    """Stan ADVI's "MAY BE DIVERGING... INSPECT ELBO" note."""


ESTIMATOR = "reparameterization"   # stanvi.estimators.registry.ESTIMATORS: what run() gets in context.estimator
SUPPORTS_MIXTURE = True   # family='mixture': Stan's SGD on the mixture's RB gradient (stanvi.discrete)


def _gradient_draws(s) -> int:
    """Log-density gradients per SGD gradient: the family's count for ``grad_samples``
    (``grad_samples`` itself for the Gaussian families; M components × S draws for the
    mixture; stanvi.families.protocol)."""
    return s.family.draws_per_gradient(s.opt.grad_samples)


# --------------------------------------------------------------------------------- state
class State(NamedTuple):
    """ADVI's state between gradient steps (one trace row each): the iterate, Stan's step index k
    in the phase (an eta trial or SGD), η, the compiled chunk being read (the next one starts from
    its ``params`` and step-size history ``s``) and how many of its steps were read, the phase's
    last ELBOs (a trial's one; SGD's last three checks) and whether "MAY BE DIVERGING" was
    warned."""

    params: np.ndarray
    k: int
    eta: float
    chunk: ChunkResult | None = None
    read: int = 0
    elbos: tuple[float, ...] = ()
    warned: bool = False


class _Setup(NamedTuple):
    """What every step reads and never rebinds (and the ledger, trace, info and SGD's
    :class:`RelativeTolerance` it updates)."""

    target: Any
    family: Any
    est: ElboEstimator
    key: jax.Array
    opt: Options
    context: Any
    ledger: OracleLedger
    trace: Trace
    info: dict[str, Any]
    params0: np.ndarray
    monitor: RelativeTolerance | None = None


class _BudgetSpent(Exception):
    """Internal: the oracle budget ran out inside an adaptation trial (args: its iterate)."""


def _result(s: _Setup, status: str, message: str, params) -> MethodResult:
    return MethodResult(np.array(params, dtype=float), s.trace, s.ledger, status, message, s.info)


def _elbo(s: _Setup, params, t: int) -> float:
    """``calc_ELBO`` at ``params`` with the key of trace row t, charged."""
    s.ledger.elbo_estimate(s.opt.elbo_samples)
    return calc_elbo(s.est, params, purpose_key(s.key, t, "elbo"), s.opt.elbo_samples, s.ledger)


def _next_step(s: _Setup, state: State, t: int, limit: int, phase: str):
    """Gradient step t (Stan's k + 1) as (state, trace row), read from the compiled chunk; when
    that is used up, the next chunk runs first: up to ``limit`` steps, fewer where the budget
    runs out (:func:`~stanvi.methods.advi_sgd.steps_within_budget`).  Row None: the step's
    gradient failed in SGD, the step was not taken."""
    o, chunk = s.opt, state.chunk
    if chunk is None or (state.read == chunk.n_done and not chunk.fatal):
        p, h = (s.params0, np.zeros_like(s.params0)) if chunk is None else (chunk.params, chunk.s)
        n = steps_within_budget(s.context, s.ledger.scaled, _gradient_draws(s) / 256.0,
                                min(chunk_for(s.family), limit))
        chunk = advance(s.est, p, h, k0=state.k, n_steps=n, t0=t - 1, eta=state.eta, key=s.key,
                        absorb=phase == "adapt", grad_samples=o.grad_samples)
        # the failed gradient's drops are not in chunk.drops
        s.info["grad_draws_dropped"] += int(chunk.drops.sum()) + chunk.fatal_drops
        s.info["grad_failures"] += int(np.count_nonzero(chunk.grad_failed)) + int(chunk.fatal)
        s.ledger.redrawn(chunk.evaluated - (chunk.n_done + int(chunk.fatal)) * _gradient_draws(s))
        state = state._replace(chunk=chunk, read=0)
    i = state.read
    if i == chunk.n_done:
        return state, None
    s.ledger.gradient(_gradient_draws(s))
    row = {"phase": phase, "eta": state.eta, "step": state.k + 1}
    if chunk.grad_failed[i]:
        row["grad_failed"] = True
        if chunk.grad_failed[i] == GRAD_NAN:
            row["grad_nan"] = True
    return state._replace(params=chunk.history[i], k=state.k + 1, read=i + 1), row


# --------------------------------------------------------------------------------- eta trials
def _adapt_step(s: _Setup, state: State, t: int) -> StepOutcome:
    """Step t of an eta trial; the trial's last step computes its ELBO (−DBL_MAX in
    ``adapt_elbos`` when ``calc_ELBO`` throws, as in [S] ``adapt_eta``)."""
    state, row = _next_step(s, state, t, s.opt.adapt_iter - state.k, "adapt")
    if state.k == s.opt.adapt_iter:
        try:
            elbo = _elbo(s, state.params, t)
            row["elbo"] = elbo
        except ElboFailure:
            elbo = -DBL_MAX
            row.update(elbo=-math.inf, elbo_failed=True)
        s.info["adapt_elbos"].append({"eta": state.eta, "elbo": elbo})
        state = state._replace(elbos=(elbo,))
    s.info["adapt_steps"] = t
    return StepOutcome(state, row)


def _trial(s: _Setup, eta: float) -> float:
    """One trial of [S] ``adapt_eta``: ``adapt_iter`` steps from q₀ with a fresh step-size
    history, failed gradients zero gradients; its ELBO."""
    state, _, status, _ = iterate(partial(_adapt_step, s), State(s.params0, 0, eta),
                                  max_iters=s.opt.adapt_iter, trace=s.trace, ledger=s.ledger,
                                  context=s.context, start=len(s.trace) - 1)
    if status == "budget":
        raise _BudgetSpent(state.params)
    return state.elbos[0]


# --------------------------------------------------------------------------------- SGD
def _sgd_step(s: _Setup, state: State, t: int) -> StepOutcome:
    """SGD step t ([S] ``stochastic_gradient_ascent``): at every ``eval_elbo``-th step
    ``calc_ELBO``, the relative-tolerance test and Stan's "MAY BE DIVERGING" note; a failed
    gradient or ELBO ends the run; 'max_iters' after ``max_iterations`` steps."""
    o, info, monitor = s.opt, s.info, s.monitor
    next_check = (state.k // o.eval_elbo + 1) * o.eval_elbo
    state, row = _next_step(s, state, t, min(next_check, o.max_iterations) - state.k, "sgd")
    k = state.k
    if row is None:
        s.ledger.gradient(_gradient_draws(s))   # the failed gradient's work was done
        info["sgd_iterations"] = k
        message = (f"{gradient_failure_message(s.family, state.chunk.fatal_kind, o.grad_samples)}"
                   f" (SGD iteration {k + 1})")
        return StepOutcome(state, None, ("failed", _runaway_message(
            s.target, s.family, state.params, s.params0, s.key, o, s.ledger, state.eta, message)))
    stop = None
    if k % o.eval_elbo == 0:
        try:
            check = monitor.update(_elbo(s, state.params, t))
        except ElboFailure as exc:
            row["elbo_failed"] = True
            info["sgd_iterations"] = k
            return StepOutcome(state, row, ("failed", f"{exc} (SGD iteration {k})"),
                               {"elbo": monitor.elbo})
        state = state._replace(elbos=state.elbos[-2:] + (check.elbo,))
        row.update(elbo=check.elbo, rel_change=check.rel_change, rel_mean=check.rel_mean,
                   rel_median=check.rel_median)
        info.update(elbo=check.elbo, elbo_best=monitor.elbo_best, rel_mean=check.rel_mean,
                    rel_median=check.rel_median)
        if k > 10 * o.eval_elbo and (check.rel_median > 0.5 or check.rel_mean > 0.5):
            row["diverging"] = True
            info["messages"].append(f"iteration {k}: MAY BE DIVERGING... INSPECT ELBO")
            if not state.warned:
                state = state._replace(warned=True)
                # stacklevel: this step, iterate, run, run's caller
                warnings.warn(f"ADVI at iteration {k}: relative ELBO change mean "
                              f"{check.rel_mean:.3g}, median {check.rel_median:.3g}: MAY BE "
                              f"DIVERGING... INSPECT ELBO", ADVIWarning, stacklevel=4)
        if check.converged:
            stop = ("converged", "")
            info["converged_by"] = "+".join(
                name for name, hit in (("mean", check.converged_mean),
                                       ("median", check.converged_median)) if hit)
            if rel_difference(check.elbo, monitor.elbo_best) > 0.05:
                info["messages"].append(
                    "Informational Message: The ELBO at a previous iteration is larger than "
                    "the ELBO upon convergence! This variational approximation may not have "
                    "converged to a good optimum.")
    if stop is None and k == o.max_iterations:
        stop = ("max_iters", "")
        info["messages"].append("Informational Message: The maximum number of iterations is "
                                "reached! The algorithm may not have converged.")
    info["sgd_iterations"] = k
    return StepOutcome(state, row, stop, {"elbo": monitor.elbo})


# --------------------------------------------------------------------------------- run
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
    info: dict[str, Any] = {"init": init_kind, "cb_size": opt.cb_size, "messages": [],
                            "adapt_elbos": [], "adapt_steps": 0, "sgd_iterations": 0,
                            "grad_draws_dropped": 0, "grad_failures": 0,
                            "eta_adapted": bool(opt.adapt_engaged)}
    s = _Setup(target, family, est, key, opt, context, OracleLedger(),
               Trace(compile_clock=compile_clock(est)), info, params0)

    # ---- row 0 and elbo_init (charged to iteration 1, docs/algorithms.md#benchmark-protocol)
    s.trace.record(0, params0, s.ledger, phase="init")
    if opt.adapt_engaged:
        try:
            elbo_init = _elbo(s, params0, 0)
        except ElboFailure as exc:
            info["elbo_init"] = None
            return _result(s, "failed", "stan::variational::advi::adapt_eta: Cannot compute ELBO "
                           "using the initial variational distribution. Your model may be either "
                           f"severely ill-conditioned or misspecified. ({exc})", params0)
        info["elbo_init"] = elbo_init
        s.trace.rows[0]["elbo"] = elbo_init
        try:   # ---- eta adaptation (docs/algorithms.md#advi-eta)
            eta = select_eta(elbo_init, partial(_trial, s))
        except _BudgetSpent as spent:
            info["eta"] = None
            return _result(s, "budget", "oracle budget spent during eta adaptation", spent.args[0])
        except VIError as exc:
            info["eta"] = None
            return _result(s, "failed", str(exc), params0)
    else:
        eta = float(opt.eta)
    info["eta"] = eta
    if not eta > 0:
        # [S] stochastic_gradient_ascent: check_positive(function, "Eta stepsize", eta) throws
        # std::domain_error, e.g. for adapt_eta's eta_best = 0 (see select_eta)
        return _result(s, "failed", f"stan::variational::advi::stochastic_gradient_ascent: Eta "
                       f"stepsize is {eta:g}, but must be positive!", params0)

    # ---- SGD (docs/algorithms.md#advi-step-size), from q₀ again
    s = s._replace(monitor=RelativeTolerance(opt.cb_size, opt.tol_rel_obj))
    if opt.elbo_before_loop:
        try:
            s.monitor.elbo = _elbo(s, params0, _PRELOOP_ITERATION)
        except ElboFailure as exc:
            return _result(s, "failed", f"{exc} (ELBO before the SGD loop)", params0)
        info["pre_loop_elbo"] = s.monitor.elbo
    # SGD starts from q₀ ([S] resets q after every trial), so a failure of its first gradient
    # reports q₀, the iterate Stan's SGD held, not the last trial's
    t0 = len(s.trace) - 1
    state, _, status, message = iterate(
        partial(_sgd_step, s), State(params0, 0, eta), max_iters=opt.max_iterations,
        trace=s.trace, ledger=s.ledger, context=context, start=t0)
    if status == "budget":
        message = f"oracle budget spent after {state.k} SGD iterations"
    if status in ("converged", "max_iters"):
        status, message = sgd_end(target, family, state.params, key, opt, s.ledger, info, status,
                                  state.elbos, params0=params0, eta=eta)
    return _result(s, status, message, state.params)
