"""TrustVI on a fixed, growing sample, certified on fresh draws: the ``default`` profile's
iterations (``sample="fixed"``; docs/algorithms.md#trustvi-fixed, issue T3-1).

The paper's TrustVI (Regier, Jordan & McAuliffe 2017, Algorithm 1) draws fresh samples at every
iteration and grows them as the noise demands; near the optimum that is where its cost went
(96 % of a ``default`` fit's model evaluations came after it was within 1 nat, issue T3-1).
Here the same trust-region iteration runs on the sample-average ELBO of a fixed, moment-matched
sample of N draws (:mod:`stanvi.estimators.fixed_sample`; the sample-average approximation,
Shapiro, Dentcheva & Ruszczyński 2009, ch. 5; DADVI, Giordano, Ingram & Broderick 2024, fixes 30
draws), where everything is deterministic:

* the quadratic model's Hessian is, by default, the Stein model
  (:meth:`~stanvi.families.host_math.MeanFieldHostMath.stein_hvp_operator`): every ∇²log p(z_j)
  replaced by E_q[∇²log p] estimated from the draws' gradients by Stein's lemma — no model
  evaluation at all, exact for a Gaussian posterior.  The paper's Condition 3 asks only for
  bounded model Hessians ("the quadratic model's Hessian could even be set to the identity",
  §3); after two poor Newton steps in a row (ρ < 1/4 on an interior step) the model switches
  for good to Hessian-vector products of the first ``fixed_n_hess`` draws (subsampled-Hessian
  Newton, Byrd, Chin, Neveitt & Nocedal 2011);
* the step from GLTR in q's Fisher metric (solved exactly from the eigendecomposition when the
  Stein matrix is formed and small, ``DENSE_SOLVE_MAX_PARAMS``; docs/algorithms.md#dense-tr),
  accepted when the matched-pair change
  ℓ(λ+s; ε) − ℓ(λ; ε) of the whole sample (the paper's Eq. 8 on common draws) is at least a
  tenth of the model's prediction, the radius as in Nocedal & Wright 2006, Algorithm 4.1.  The
  trial point's gradients come with its values, so an accepted step's gradient (and the next
  Stein model) are already paid for.

When the model's Newton gain on the fixed sample falls below a tenth of the certification
tolerance (or after ``fixed_stage_iters`` iterations on one sample: a kinked or very flat
fixed-sample ELBO), the fixed-sample optimum λ_N is *certified on fresh draws* (retrospective
approximation, Pasupathy 2010): a new, independent moment-matched sample F of N draws gives the
gradient g_F at λ_N, and the Newton step s_F = −B⁻¹g_F its gain ``½ g_Fᵀ(−B)⁻¹g_F``.  Its
expectation is the true gap of λ_N plus the expected gap of an N-draw optimum (the gradient's
noise), so a small gain says both that λ_N is near the ELBO's optimum and that N draws determine
it to that precision.  The result is the optimum of the 2N draws E ∪ F, whose expected gap is
half that noise term, so gain/2 estimates it; the test: gain/2 ≤ min(``certify_gap``,
½ P ``certify_rms``²), i.e. within ``certify_gap`` nats and, per variational parameter, about
``certify_rms`` of q's sd from the optimum in the Fisher metric.  Then the fit ends with the Newton step on the 2N draws E ∪ F
(whose mean gradient at λ_N is the average of the two samples', about g_F/2).  Otherwise F joins the sample (the union of two
moment-matched samples is moment matched), N doubles and the iterations go on from λ_N with the
union's gradients, known without a new evaluation — until ``fixed_n_max`` draws: then
``converged`` only if the gain is within ``certify_gap`` nats, else ``max_iters`` with the figures.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from stanvi.estimators.elbo import GradientFailure
from stanvi.estimators.fixed_sample import draw_fixed_sample, finite, values_and_gradients
from stanvi.methods.base import OracleLedger, StepOutcome, purpose_key
from stanvi.methods.checks import divergence
from stanvi.methods.trustvi_options import Options
from stanvi.methods.trustvi_stops import collapsed_message, not_concave_message
from stanvi.optim.gltr import solve_gltr, truncated
from stanvi.optim.norms import norm as _norm
from stanvi.optim.trust_region import NEWTON_RADIUS, MatrixModel, TRResult

#: Accept a step when the fixed-sample ELBO rises by at least this fraction of the prediction.
ACCEPT_RATIO = 0.1
#: The fixed-sample Newton gain that counts as solved, as a fraction of the certification bound.
INNER_FRACTION = 0.1
#: Samples in a row (N, 2N, 4N) at whose optimum the ELBO's model is not concave before the run
#: ends "not certified" (a funnel's may become concave as N grows; a kinked one does not).
NOT_CONCAVE_STAGES = 3
#: Poor model predictions (ρ outside (1/2, 2), or an interior step with ρ < 1/4) after which
#: the Stein model gives way to Hessian-vector products for the rest of the fit.
POOR_MODEL_STEPS = 3
#: Up to this many variational parameters a formed Stein matrix's subproblems are solved
#: exactly from its eigendecomposition (one ``eigh`` shared by the step, or by the
#: certification and its union step) instead of by GLTR (docs/benchmarks.md#dense-model-solve).
DENSE_SOLVE_MAX_PARAMS = 48

#: The radius below which the trust region has collapsed: no step improves the fixed-sample ELBO
COLLAPSED_DELTA = 1e-10


class FixedState(NamedTuple):
    """The iterate λ (``params``), the radius, the fixed sample (draws, ℓ per draw, ∇log p at
    the draws, the mean ELBO gradient at λ), the Hessian model ('stein' or 'hvp' on the first
    ``n_hess`` draws), the counters of rejections and poor model steps, and certifications;
    ``not_concave``: samples in a row certified not concave, ``at_limit`` of the last of them
    certified because they ran out of their iterations, unsolved."""

    params: np.ndarray
    delta: float
    eps: np.ndarray
    values: np.ndarray
    model_grads: np.ndarray
    grad: np.ndarray
    hessian: str
    n_hess: int
    rejections: int = 0
    poor_steps: int = 0
    certifications: int = 0
    stage_iters: int = 0
    not_concave: int = 0
    at_limit: int = 0


#: How an exploratory run (``explore_floor`` set) ends: its problem solved, its iterations
#: spent while it still climbs, or its model predicting it stays below the floor.
EXPLORE_SOLVED = "the exploratory run solved its problem"
EXPLORE_SPENT = "the exploratory run spent its iterations"
EXPLORE_BELOW = "the exploratory run stays below"
EXPLORE_IN_BASIN = "the exploratory run entered the certified optimum's basin"


class FixedSetup(NamedTuple):
    """What every iteration reads; ``explore_floor``: an exploratory run (the second start,
    :mod:`stanvi.methods.trustvi_second_start`), which stops instead of certifying, and as soon
    as its model predicts it cannot rise above this ELBO (−inf: never); ``stein_only``: the
    Stein model never gives way to Hessian-vector products (the cheap exploratory run);
    ``explore_basin``: a test of q's mean that stops the exploratory run (it is heading for the
    optimum already certified)."""

    o: Options
    est: object
    family: object
    key: object
    ledger: OracleLedger
    info: dict
    counts: dict
    explore_floor: float | None = None
    stein_only: bool = False
    explore_basin: Callable[[np.ndarray], bool] | None = None


class RunEnd(NamedTuple):
    """How a certified run ended: its status and message, final parameters, final fixed-sample
    ELBO and last iteration, and whether it stopped stuck (:func:`stuck`)."""

    status: str
    message: str
    params: np.ndarray
    elbo: float
    k: int
    stuck: bool = False


def stuck(state: FixedState) -> bool:
    """Whether a run that ended on ``state`` stopped stuck, uncertified: its trust region
    collapsed (no step improves the fixed-sample ELBO), or the model of the ELBO was not concave
    at the fixed-sample optimum on ``NOT_CONCAVE_STAGES`` samples in a row.  The second-start
    checks run after such a run as after a certified optimum (docs/algorithms.md#second-start)."""
    return state.delta < COLLAPSED_DELTA or state.not_concave >= NOT_CONCAVE_STAGES


def certify_tolerance(o: Options, n_params: int) -> float:
    """The certification test's bound on the fresh-sample Newton gain (nats)."""
    return min(o.certify_gap, 0.5 * n_params * o.certify_rms ** 2)


def stage_iteration_limit(o: Options, n: int) -> int:
    """Iterations on one fixed sample of n draws before it is certified anyway:
    ``fixed_stage_iters`` on the first sample, fewer on larger ones (the same gradient budget,
    ``fixed_stage_iters · fixed_n0`` draws, per stage), at least 5."""
    return max(5, (o.fixed_stage_iters * o.fixed_n0) // max(int(n), 1))


def hessian_subsample(family, n_hess: int, n: int) -> int:
    """Draws for the Hessian-vector products: ``n_hess``, for the full-rank family at least
    2(D + 1) (a full-rank Hessian of m ≤ D draws is singular, docs/algorithms.md#fullrank), at
    most the sample."""
    return int(min(n, max(n_hess, getattr(family, "min_curvature_draws", 1))))


def start(setup: FixedSetup, params: np.ndarray) -> FixedState:
    """The first fixed sample (``fixed_n0`` draws, at least 2(D + 1) for full rank), drawn at the
    warm start.  Raises :class:`GradientFailure` when the model fails too often under q."""
    o, family = setup.o, setup.family
    n = max(o.fixed_n0, getattr(family, "min_curvature_draws", 1))
    sample = draw_fixed_sample(setup.est, params, purpose_key(setup.key, 0, "refine"), n,
                               o.max_gradient_drops_factor * n, setup.ledger)
    return FixedState(params, o.refine_delta0, sample.eps, sample.values, sample.model_grads,
                      sample.gradient, o.fixed_hessian,
                      hessian_subsample(family, o.fixed_n_hess, n))


def _operator(setup: FixedSetup, state: FixedState, scale: np.ndarray):
    """v ↦ −B v in the scaled variables, and the HVP draws each product costs (0: Stein); a
    :class:`~stanvi.optim.trust_region.MatrixModel` when the Stein matrix is formed and has at
    most ``DENSE_SOLVE_MAX_PARAMS`` rows (``_solve`` solves it exactly)."""
    est, family, params = setup.est, setup.family, state.params
    if state.hessian == "stein":
        matrix = family.stein_model_matrix(params, state.eps, state.model_grads)
        if matrix is not None:   # small P: one matrix-vector product per application
            negated = -(matrix / scale[:, None]) / scale[None, :]
            if len(params) <= DENSE_SOLVE_MAX_PARAMS:   # and an exact solve below a few dozen
                return MatrixModel(negated), 0
            return negated.dot, 0
        model = family.stein_hvp_operator(params, state.eps, state.model_grads)
        return (lambda v: -model(v / scale) / scale), 0
    eps_h = state.eps[: state.n_hess]
    return (lambda v: -est.hvp(params, eps_h, v / scale) / scale), state.n_hess


def _solve(op, c: np.ndarray, delta: float, **gltr_options) -> TRResult:
    """The trust-region subproblem: exactly from the eigendecomposition when the model is a
    small matrix (:class:`~stanvi.optim.trust_region.MatrixModel`), else by GLTR."""
    if isinstance(op, MatrixModel):
        return op.solve(c, delta)
    return solve_gltr(op, c, delta, **gltr_options)


def step(setup: FixedSetup, state: FixedState, k: int) -> StepOutcome:
    """One trust-region iteration on the fixed sample, or, once its Newton gain is small, the
    fresh-sample certification (the module docstring)."""
    o, est, family, ledger = setup.o, setup.est, setup.family, setup.ledger
    params, n = state.params, state.eps.shape[0]
    scale = family.metric_scale(params) if o.metric == "fisher" else np.ones_like(params)
    op, hvp_draws = _operator(setup, state, scale)
    c = -state.grad / scale
    tol_cert = certify_tolerance(o, len(params))
    sol = _solve(op, c, state.delta, tol_interior=o.fixed_krylov_tol,
                     tol_boundary=max(o.fixed_krylov_tol, 0.1), max_krylov=len(c))
    if hvp_draws:
        ledger.hvp(hvp_draws, sol.n_hvp)
    m_prime = -float(sol.q_value)
    solved = (sol.status != "non_finite" and np.isfinite(m_prime) and not sol.on_boundary
              and not truncated(sol, len(c)))
    row = dict(phase="fixed", n_fixed=n, hessian=state.hessian, delta=state.delta,
               elbo=float(np.mean(state.values)), m_prime=m_prime, n_hvp=sol.n_hvp,
               grad_norm=_norm(state.grad), solver_status=sol.status)
    stage_over = state.stage_iters + 1 >= stage_iteration_limit(o, n)
    state = state._replace(stage_iters=state.stage_iters + 1)
    if setup.explore_floor is not None:
        if setup.explore_basin is not None and setup.explore_basin(
                np.asarray(family.mean(params), dtype=float)):
            return StepOutcome(state, row, ("converged", EXPLORE_IN_BASIN))
        if solved and m_prime < INNER_FRACTION * tol_cert:
            return StepOutcome(state, row, ("converged", EXPLORE_SOLVED))
        if stage_over:
            return StepOutcome(state, row, ("converged", EXPLORE_SPENT))
        if solved and np.mean(state.values) + 2.0 * m_prime < setup.explore_floor:
            return StepOutcome(state, row, ("converged", EXPLORE_BELOW))
    elif (inner_solved := solved and m_prime < INNER_FRACTION * tol_cert) or stage_over:
        # solved on this sample, or ``fixed_stage_iters`` iterations on it (a kinked or very
        # flat fixed-sample ELBO): the fresh-sample test decides either way
        return certify(setup, state, k, scale, op, hvp_draws, tol_cert, row,
                       at_limit=not inner_solved)
    if sol.status == "non_finite" or not np.isfinite(m_prime) or m_prime <= 0:
        return _rejected(setup, state, row, _norm(sol.s) or state.delta,
                         "non-finite Hessian-vector product or step", poor=True)
    t = np.asarray(sol.s, dtype=float)
    new = params + t / scale
    values, g, grad = values_and_gradients(est, new, state.eps)
    ledger.gradient(n)
    if not finite(values, grad):
        return _rejected(setup, state, row, _norm(t),
                         "the model failed at a draw of the fixed sample", poor=False)
    change = float(np.mean(values) - np.mean(state.values))
    rho = change / m_prime
    row.update(change=change, rho=rho, step_norm=_norm(t))
    delta = state.delta
    if rho < 0.25:
        delta = _norm(t) / 4.0
    elif rho > 0.75 and sol.on_boundary:
        delta = 2.0 * delta
    # the model mispredicts the fixed-sample objective (interior step: the Newton step itself)
    poor = (rho < 0.25 and not sol.on_boundary) or not 0.5 < rho < 2.0
    if rho <= ACCEPT_RATIO:
        return _rejected(setup, state._replace(delta=delta), row, None, "", poor=poor)
    runaway = divergence(family, new)
    state = _count_poor(setup, state._replace(params=new, delta=delta, values=values,
                                              model_grads=g, grad=grad, rejections=0), poor)
    row.update(accepted=True, elbo=float(np.mean(values)))
    setup.counts["accepted"] += 1
    stop = ("failed", f"diverged at iteration {k}: {runaway}") if runaway else None
    return StepOutcome(state, row, stop, _display(row))


def _display(row: dict) -> dict:
    """The progress display's extra fields: the phase and the fixed sample's size."""
    return {"phase": row["phase"], "draws": row["n_fixed"]}


def _count_poor(setup: FixedSetup, state: FixedState, poor: bool) -> FixedState:
    """Count a poor model step; after ``POOR_MODEL_STEPS`` of them the Stein model gives way to
    Hessian-vector products (the draws' Hessians vary too much for one Ĥ to stand for them),
    unless the family says its poor steps are its parameterization's
    (``stein_model_gives_way``: the low-rank family)."""
    poor_steps = state.poor_steps + 1 if poor else state.poor_steps
    # (the cheap exploratory run keeps the Stein model: it costs no model evaluation)
    if (state.hessian == "stein" and poor_steps >= POOR_MODEL_STEPS
            and not setup.stein_only
            and getattr(setup.family, "stein_model_gives_way", True)):
        setup.info["hessian_switch"] = setup.info.get("hessian_switch", 0) + 1
        return state._replace(hessian="hvp", poor_steps=0)
    return state._replace(poor_steps=poor_steps)


def _rejected(setup: FixedSetup, state: FixedState, row: dict, shrink_from: float | None,
              failure: str, *, poor: bool) -> StepOutcome:
    """A rejected step: the radius shrinks (to a quarter of the step when ``shrink_from``);
    with HVPs, after two rejections in a row the Hessian uses twice as many draws (the
    subsample misjudged the fixed-sample objective)."""
    delta = shrink_from / 4.0 if shrink_from is not None else state.delta
    rejections = state.rejections + 1
    n_hess = state.n_hess
    if state.hessian == "hvp" and rejections >= 2 and n_hess < state.eps.shape[0]:
        n_hess, rejections = min(2 * n_hess, state.eps.shape[0]), 0
    row.update(accepted=False, failure=failure)
    setup.counts["rejected_failure" if failure else "rejected_change"] += 1
    state = _count_poor(setup, state._replace(delta=delta, rejections=rejections,
                                              n_hess=n_hess), poor)
    stop = None
    if delta < COLLAPSED_DELTA:
        stop = ("max_iters", collapsed_message(state.eps.shape[0]))
    return StepOutcome(state, row, stop, _display(row))


def _union_step(setup: FixedSetup, op, hvp_draws: int, state: FixedState, fresh, scale,
                fresh_solution) -> np.ndarray:
    """The Newton step on the union E ∪ F of the fixed and the fresh sample, whose mean gradient
    at λ_N is the average of the two (the fixed sample's is ~0 at its optimum, so the step is
    about half the fresh sample's Newton step); the fresh step halved when the solve fails."""
    c = -0.5 * (state.grad + fresh.gradient) / scale
    sol = _solve(op, c, NEWTON_RADIUS, tol_interior=setup.o.certify_krylov_tol,
                     tol_boundary=setup.o.certify_krylov_tol, max_krylov=len(c))
    if hvp_draws:
        setup.ledger.hvp(hvp_draws, sol.n_hvp)
    step = sol.s if sol.status != "non_finite" and not sol.on_boundary else 0.5 * fresh_solution.s
    return np.asarray(step, dtype=float) / scale


def certify(setup: FixedSetup, state: FixedState, k: int, scale: np.ndarray, op,
            hvp_draws: int, tol_cert: float, row: dict, at_limit: bool = False) -> StepOutcome:
    """The fresh-sample certification of the fixed-sample optimum (module docstring);
    ``at_limit``: the sample ran out of its iterations before its problem was solved."""
    o, est, family, ledger = setup.o, setup.est, setup.family, setup.ledger
    params, n = state.params, state.eps.shape[0]
    try:
        fresh = draw_fixed_sample(est, params, purpose_key(setup.key, k, "check"), n,
                                  o.max_gradient_drops_factor * n, ledger)
    except GradientFailure as exc:
        return StepOutcome(state, None, ("failed", f"failed_gradient at the certification of "
                                                   f"iteration {k}: {exc}"))
    c = -fresh.gradient / scale
    sol = _solve(op, c, NEWTON_RADIUS, tol_interior=o.certify_krylov_tol,
                     tol_boundary=o.certify_krylov_tol, max_krylov=len(c))
    if hvp_draws:
        ledger.hvp(hvp_draws, sol.n_hvp)
    concave = (sol.status != "non_finite" and not sol.on_boundary
               and not truncated(sol, len(c)) and np.isfinite(sol.q_value))
    gain = -float(sol.q_value) if concave else float("inf")
    # the result is the optimum of the 2N draws E ∪ F, whose expected gap is half the N-draw
    # optimum's noise term: gain/2 estimates it (and an unsolved part of λ_N's gap, which the
    # Newton step on E ∪ F removes, only makes the estimate larger)
    result_gap = 0.5 * gain
    certifications = state.certifications + 1
    setup.info.update(certify_gain=gain, certify_tol=tol_cert, certify_draws=n,
                      certifications=certifications, hessian_model=state.hessian)
    row.update(phase="certify", certify_gain=gain, certify_tol=tol_cert, n_hvp_certify=sol.n_hvp)
    done = state._replace(certifications=certifications)
    if result_gap <= tol_cert or 2 * n > o.fixed_n_max:
        done = done._replace(params=params + _union_step(setup, op, hvp_draws, state, fresh,
                                                         scale, sol))
    if result_gap <= tol_cert:
        return StepOutcome(done, row, display=_display(row), stop=("converged", (
            f"certified on {n} fresh draws: the Newton step from the optimum of {n} fixed draws "
            f"gains {gain:.2g} nats, so the optimum of all {2 * n} is within about "
            f"{result_gap:.2g} (tolerance {tol_cert:.2g})")))
    not_concave = state.not_concave + 1 if not concave else 0
    limited = state.at_limit + 1 if not concave and at_limit else 0
    if not_concave >= NOT_CONCAVE_STAGES:
        return StepOutcome(state._replace(not_concave=not_concave, at_limit=limited), row, (
            "max_iters", not_concave_message(n >> (NOT_CONCAVE_STAGES - 1), n,
                                             NOT_CONCAVE_STAGES, limited)))
    if 2 * n > o.fixed_n_max:
        if result_gap <= o.certify_gap:
            return StepOutcome(done, row, ("converged", (
                f"within about {result_gap:.2g} nats (Newton gain {gain:.2g} on {n} fresh "
                f"draws); the per-parameter precision {o.certify_rms} was not reached by "
                f"fixed_n_max={o.fixed_n_max} draws")))
        return StepOutcome(state, row, ("max_iters", (
            f"not certified: on {n} fresh draws the Newton step from the fixed-sample optimum "
            f"still gains {gain:.3g} nats (tolerance {2 * tol_cert:.2g}), and fixed_n_max="
            f"{o.fixed_n_max} draws were reached")))
    hessian, n_hess = state.hessian, hessian_subsample(family, state.n_hess, 2 * n)
    if not concave:   # the model, not the ELBO, may be what is not concave: a better one
        hessian, n_hess = "hvp", (n_hess if state.hessian == "stein"
                                  else hessian_subsample(family, 2 * n_hess, 2 * n))
    state = state._replace(
        eps=np.concatenate([state.eps, fresh.eps]),
        values=np.concatenate([state.values, fresh.values]),
        model_grads=np.concatenate([state.model_grads, fresh.model_grads]),
        grad=0.5 * (state.grad + fresh.gradient), certifications=certifications,
        hessian=hessian, n_hess=n_hess, stage_iters=0, not_concave=not_concave,
        at_limit=limited)
    return StepOutcome(state, row, display=_display(row))
