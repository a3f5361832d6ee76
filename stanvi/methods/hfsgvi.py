"""HFSGVI: Hessian-free stochastic Gaussian variational inference (Fan et al., NIPS 2015), as the
TrustVI paper's comparator (Regier, Jordan & McAuliffe 2017, §5.2; docs/algorithms.md#hfsgvi).

Each iteration draws a fresh gradient g_t (256 draws) and a fresh Hessian sample (85 draws, fixed
for the solve), solves the Newton system (−H_t) p = g_t by truncated conjugate gradients
(relative residual ≤ ``cg_tol``, at most ``cg_maxiter`` = P iterations; on non-positive curvature
stop and return the current p, or p = g_t if it happens at the first iteration — Nocedal & Wright
Alg. 7.1) and takes the full step λ ← λ + p: no step size, line search or trust region.

That is the method the TrustVI paper describes as overflowing on 23 of 183 models.  stanvi
reports an overflow as a failed run, never a crash: when the new λ is not finite, the next
gradient exhausts its redraws, or CG produces non-finite values, the run stops with status
'failed', message starting with "overflow", and the last finite iterate and the trace kept.

Options off by default, for ablations: Levenberg–Marquardt damping (B + μ_d I) and a cap on the
step norm.  The TrustVI paper gives HFSGVI no convergence test; stanvi adds an optional one
(``tol_rel_change``: stop when ‖p‖ ≤ tol·(1 + ‖λ‖) on 3 consecutive iterations), off in the
``paper`` profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import numpy as np

from stanvi.estimators.elbo import GradientFailure, gradient_with_redraws, standard_normal
from stanvi.methods.base import (MethodResult, OracleLedger, RunContext, StepOutcome, Trace,
                                 compile_clock, iterate, purpose_key)
from stanvi.methods.checks import divergence
from stanvi.optim.cg import truncated_cg


@dataclass(frozen=True)
class Options:
    """HFSGVI options (docs/algorithms.md#hfsgvi; tags as in #provenance: [P] TrustVI paper,
    [C] stanvi's choice)."""

    n_grad: int = 256                 # gradient draws [P, inferred]
    n_hess: int = 85                  # Hessian draws [P, inferred]
    cg_tol: float = 1e-2              # relative residual, same as TrustVI's interior tol [C]
    cg_maxiter: int | None = None     # default: number of variational parameters [C]
    max_iters: int = 500              # same cap as TrustVI [C]
    damping: float = 0.0              # Levenberg–Marquardt μ_d (off) [C]
    max_step_norm: float | None = None  # step cap (off) [C]
    tol_rel_change: float | None = None  # optional convergence test (off in 'paper') [C]
    init: str = "zero"                # initial mean: 'zero' [R] | 'random'
    log_scale0: float = -1.0          # initial ω [R]
    fullrank_diagonal: str = "log"    # full-rank parameterization (docs/algorithms.md#fullrank) [C]
    max_gradient_drops_factor: int = 10  # as Stan [S]

    def __post_init__(self) -> None:
        # A misspelt choice must not silently select another behaviour ('zeros' used to give
        # the random initialization).
        for name, choices in (("init", ("zero", "random")), ("fullrank_diagonal", ("log", "stan"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"hfsgvi option {name}={getattr(self, name)!r} is not one of "
                                 f"{list(choices)}")


PROFILES: dict[str, dict] = {
    "paper": {},
    "default": {"n_grad": 64, "n_hess": 32, "tol_rel_change": 1e-3},
}
DEFAULT_PROFILE = "paper"
ESTIMATOR = "reparameterization"   # stanvi.estimators.base.ESTIMATORS: what run() gets in context.estimator
HOST_PATH = True   # the loop is Python: the NumPy host estimator serves it on a Stan model


def run(target, family, *, key: jax.Array, options: Options, context: RunContext) -> MethodResult:
    """Hessian-free Newton on the stochastic ELBO (docs/algorithms.md#hfsgvi)."""
    # Overflow is this method's expected failure mode and is detected and reported explicitly
    # (status 'failed', message 'overflow ...'); numpy's floating-point warnings on the way there
    # (e.g. ‖r‖² overflowing in CG) must not leak out, since under ``-W error`` or
    # ``np.seterr(all="raise")`` they would turn a reported failure into an exception.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _run(family, key=key, options=options, context=context)


class State(NamedTuple):
    """HFSGVI's state between iterations: the iterate and the count of consecutive small steps
    (the convergence rule)."""

    params: np.ndarray
    small_steps: int = 0


def step(state: State, t: int, *, o: Options, est, family, key: jax.Array,
         ledger: OracleLedger) -> StepOutcome:
    """Iteration t: a stochastic gradient, truncated CG on the damped Newton system, the step
    (capped at ``max_step_norm``), and the small-step convergence count."""
    params = state.params
    try:
        ge = gradient_with_redraws(est, params, purpose_key(key, t, "gradient"), o.n_grad,
                                   o.max_gradient_drops_factor * o.n_grad)
    except GradientFailure as exc:
        ledger.redrawn(exc.evaluated)
        return StepOutcome(state, None, ("failed",
                                         f"overflow: the gradient failed at iteration {t}: {exc}"))
    ledger.gradient(o.n_grad)
    ledger.redrawn(ge.n_evaluated - o.n_grad)
    eps_h = standard_normal(purpose_key(key, t, "hessian"), o.n_hess, family.dim)

    def neg_hvp(v, _eps=eps_h, _params=params):
        return -est.hvp(_params, _eps, v) + o.damping * v

    maxiter = o.cg_maxiter or family.n_params
    p, n_hvp, cg_status = truncated_cg(neg_hvp, ge.gradient, tol=o.cg_tol, maxiter=maxiter)
    ledger.hvp(o.n_hess, n_hvp)
    if cg_status == "non_finite" or not np.all(np.isfinite(p)):
        return StepOutcome(state, None, (
            "failed", f"overflow: non-finite conjugate-gradient values at iteration {t}"))
    norm = float(np.linalg.norm(p))
    if o.max_step_norm is not None and norm > o.max_step_norm:
        p = p * (o.max_step_norm / norm)
    new = params + p
    if not np.all(np.isfinite(new)) or not np.all(np.isfinite(family.marginal_sd(new))):
        return StepOutcome(state, None, (
            "failed", f"overflow: the Newton step gave non-finite parameters at iteration {t}"))
    if divergence(family, new):  # q ran away: never 'max_iters' with sd = inf (P2-1c)
        sd = float(np.max(family.marginal_sd(new)))
        return StepOutcome(state._replace(params=new), None, ("failed", (
            f"overflow: q's scale grew without bound (sd {sd:.3g}) at iteration {t}: "
            f"HFSGVI's undamped Newton steps are unstable, or the posterior may be improper "
            f"(compare with method='trustvi', which tells the two apart)")))
    row = dict(step_norm=norm, n_hvp=n_hvp, cg_status=cg_status,
               grad_norm=float(np.linalg.norm(ge.gradient)), elbo=float(np.mean(ge.values)))
    small_steps = state.small_steps
    stop = None
    if o.tol_rel_change is not None:
        small_steps = small_steps + 1 if norm <= o.tol_rel_change * (1 + np.linalg.norm(new)) else 0
        if small_steps >= 3:
            stop = ("converged", "Newton steps below tol_rel_change for 3 iterations")
    return StepOutcome(State(new, small_steps), row, stop)


def _run(family, *, key: jax.Array, options: Options, context: RunContext) -> MethodResult:
    o = options
    est = context.estimator
    mu0, _ = context.initial_mean(o.init)
    state = State(np.asarray(family.initial_params(mu0, o.log_scale0), dtype=float))
    ledger = OracleLedger()
    trace = Trace(compile_clock=compile_clock(est))
    trace.record(0, state.params, ledger)
    state, _, status, message = iterate(
        partial(step, o=o, est=est, family=family, key=key, ledger=ledger), state,
        max_iters=o.max_iters, trace=trace, ledger=ledger, context=context)
    return MethodResult(params=state.params, trace=trace, ledger=ledger, status=status,
                        message=message)
