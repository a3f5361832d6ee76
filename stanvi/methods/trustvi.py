"""TrustVI: stochastic trust-region optimization of the ELBO (Regier, Jordan & McAuliffe,
NeurIPS 2017, Algorithm 1 and §3; docs/algorithms.md#trustvi — the ``#anchors`` below are
sections of docs/algorithms.md).

Each iteration k:

1. a fresh stochastic gradient g_k from n_g = n_g⁰·r draws (failed draws redrawn), and the
   jackknife signal-to-noise test that doubles or halves the replication factor r (paper §3.2,
   #trustvi-gradient);
2. a Hessian operator H_k: a fresh Monte Carlo sample of n_h = n_h⁰·r draws, or, after a
   rejection, the previous one reused (at most ``hessian_max_reuse`` times, "subspace" reuse
   costing one HVP; paper §3.2, #hessian-reuse);
3. the trust-region subproblem max_{‖s‖≤δ} gᵀs + ½sᵀHs by GLTR/Lanczos (default), Steihaug-CG or
   a dense solve, giving the model improvement m' (Eq. 4, #trust-region-subproblem);
4. the λ-test: if η m' < λ δ², reject at once without sampling (paper §3.3.1, N_k = 0);
5. otherwise N_k matched pairs ℓ(λ+s; e_i) − ℓ(λ; e_i) estimate the ELBO change ℓ'; accept iff
   ℓ' ≥ η m' (Eqs. 8–10); any non-finite value rejects (#non-finite);
6. radius: δ ← min(γδ, δ_max) on acceptance, δ/γ otherwise; N_{k+1} from Inequalities 11 and 13
   with the retrospective policy (#sample-size).

Profiles (``PROFILES``):

* ``paper``: the paper's constants and batch sizes (256-draw gradients, 85-draw Hessians,
  128 initial ELBO-change pairs), δ₀ = 0.1, 500 iterations, stop when δ < 1e-4 — the setting
  whose oracle counts the paper reports (paper §5, Table 1; #trustvi-constants).
* ``default``: the same trust-region iteration on a fixed, growing moment-matched sample, with a
  Stein model of the Hessian, certified on fresh draws (``sample="fixed"``:
  :mod:`stanvi.methods.trustvi_fixed`, #trustvi-fixed), after a Laplace warm start, with the
  second-start check (:mod:`stanvi.methods.trustvi_second_start`; issue T3-1).
* ``stochastic``: the paper's fresh draws at every iteration, tuned for wall time on a CPU
  (issue P1-2, "Beyond the paper"): small starting batches (n_g⁰ = 16, n_h⁰ = 8, N₀ = 16) that
  the paper's own adaptation rules (jackknife, Inequalities 11/13) grow when the noise demands
  it, up to r ≤ 64 and N ≤ 1024, δ₀ = 1, plus the norm test of Byrd, Chin, Nocedal & Wu (2012)
  in the batch rule (``norm_test``, see :func:`~stanvi.optim.jackknife.update_replication`),
  the stopping rule below and the certifying refinement (the ``default`` of issues P2-1 to
  T3-1).
* ``reference_code``: the authors' code's rules (#reference-code), for ablations: ratio acceptance
  ρ = ℓ'/m' ≥ η without the λ-test, a warm-up that accepts nothing until δ has grown and
  shrunk once (with unlimited Hessian reuse meanwhile), δ doubled when ρ ≥ η and ‖s‖ > 0.7δ
  and halved otherwise whether or not the step is accepted, Inequality 11 without its factor 2
  and with λ = 2, Inequality 13 with ν1 = 1 and ζ1 = 2/3, and [R]'s doubling/halving of N
  (floor N₀).  [R]'s trlib iteration caps (10·D Krylov steps) are not reproduced: GLTR here
  stops at D.

Stopping rule (#trustvi-stopping: the paper defines none beyond δ < δ_min and the iteration cap):
``converged`` when δ < δ_min (every step of useful size is being rejected); when ``tol_model``
is set (stochastic profile), when the quadratic model's *Newton step* predicts less than
``tol_model`` nats of gain on ``tol_model_iters`` consecutive iterations — m' for an interior
solve, the Newton gain over the solver's Krylov subspace for a boundary solve
(:func:`~stanvi.optim.trust_region.newton_gain`), never the radius-limited gain, so a radius that collapsed after
rejections cannot fake convergence; or, when ``stall_stop`` is on, when the sample size the
theory asks for, N*, exceeds N_max on ``stall_iters`` consecutive assessed iterations (the
gradient is indistinguishable from Monte Carlo noise at the largest affordable sample,
#sample-size);
``max_iters``; ``budget``; ``failed`` when a gradient fails after Stan's redraw limit (the
message starts with ``failed_gradient``).
"""

from __future__ import annotations

import time
from functools import partial
from typing import NamedTuple

import numpy as np

from stanvi.estimators.elbo import (GradientFailure, gradient_with_redraws, standard_normal,
                                    valid_draws)
from stanvi.lazy_jax import jax
from stanvi.methods.base import (MethodResult, OracleLedger, RunContext, StepOutcome, Trace,
                                 compile_clock, iterate, purpose_key)
from stanvi.methods.checks import divergence, honest_outcome
from stanvi.methods.trustvi_second_start import run_fixed, run_from_fallback
from stanvi.methods.refine import refine_after_stop
from stanvi.methods.trustvi_options import Options
# the method registry (stanvi.methods.make_options) reads a method module's profiles
from stanvi.methods.trustvi_options import DEFAULT_PROFILE, PROFILES  # noqa: F401
from stanvi.methods.warm_start import laplace_start
from stanvi.optim.gltr import certified_newton_gain, solve_gltr, solve_subspace_reuse
from stanvi.optim.jackknife import jackknife_snr, update_replication
from stanvi.optim.sample_size import (n_ineq11, n_ineq13, reference_code_update,
                                      retrospective_update, tau_constants)
from stanvi.optim.steihaug import solve_steihaug
from stanvi.optim.trust_region import (TRResult, newton_gain, scaled_problem,
                                       solve_dense_operator)

ESTIMATOR = "reparameterization"   # stanvi.estimators.registry.ESTIMATORS: what run() gets in context.estimator
HOST_PATH = True   # the loop is Python: the NumPy host estimator serves it on a Stan model


def _solve(options: Options, hvp, c: np.ndarray, delta: float):
    """The trust-region subproblem min cᵀs + ½sᵀBs, ‖s‖ ≤ δ, by the option's solver."""
    if options.solver == "gltr":
        return solve_gltr(hvp, c, delta, tol_interior=options.tol_interior,
                          tol_boundary=options.tol_boundary)
    if options.solver == "steihaug":
        return solve_steihaug(hvp, c, delta, tol=options.tol_interior)
    if options.solver == "dense":
        return solve_dense_operator(hvp, c, delta)
    raise ValueError(f"unknown solver {options.solver!r}; use 'gltr', 'steihaug' or 'dense'")


class State(NamedTuple):
    """TrustVI's state between iterations: Algorithm 1's iterate λ (``params``) and radius δ,
    the gradient replication factor r and the ELBO-change sample size N, the Hessian sample and
    solution kept for reuse after a rejection, [R]'s warm-up flags and the stopping rules'
    counters."""

    params: np.ndarray
    delta: float
    r: int
    n_change: int
    hess_eps: np.ndarray | None = None
    hess_reuses: int = 0
    last_solution: TRResult | None = None
    reuse_next: bool = False
    stall_count: int = 0
    small_model_count: int = 0
    in_warmup: bool = False
    radius_grew: bool = False
    radius_shrank: bool = False


class _Setup(NamedTuple):
    """What every iteration reads and never changes (and the ledger and counts it charges)."""

    o: Options
    est: object
    family: object
    key: jax.Array
    ledger: OracleLedger
    tau1: float
    tau2: float
    counts: dict


def step(setup: _Setup, state: State, k: int) -> StepOutcome:
    """Iteration k of Algorithm 1 (the module docstring's steps 1–6) and the stopping rules."""
    o, est, family, key, ledger, counts = (setup.o, setup.est, setup.family, setup.key,
                                           setup.ledger, setup.counts)
    params, delta, r = state.params, state.delta, state.r
    # 1. gradient, 2. jackknife ------------------------------------------------------
    n_g = o.n_grad * r
    try:
        ge = gradient_with_redraws(est, params, purpose_key(key, k, "gradient"), n_g,
                                   o.max_gradient_drops_factor * n_g)
    except GradientFailure as exc:
        ledger.redrawn(exc.evaluated)
        return StepOutcome(state, None, ("failed", f"failed_gradient at iteration {k}: {exc}"))
    ledger.gradient(n_g)
    ledger.redrawn(ge.n_evaluated - n_g)
    g = ge.gradient
    jk = jackknife_snr(ge.per_draw)
    r_used = r
    r = update_replication(r, jk.theta_hat, jk.sd, r_max=o.r_max, noise=jk.noise,
                           norm_test=o.norm_test)

    # 3. Hessian operator and trust-region subproblem (minimize cᵀs + ½sᵀBs, c = −g, B = −H)
    fresh = not (state.reuse_next and state.hess_eps is not None)
    hess_eps, hess_reuses = state.hess_eps, state.hess_reuses
    if fresh:
        hess_key = purpose_key(key, k, "hessian")
        if ge.n_dropped:
            # the model fails somewhere under q: screen the Hessian draws (every draw of the
            # sample must be usable, docs/algorithms.md#failed-draws), redrawing failed ones
            # with Stan's drop limit
            try:
                hess_eps, screened = valid_draws(est, params, hess_key, o.n_hess * r,
                                                 o.max_gradient_drops_factor * o.n_hess * r)
            except GradientFailure as exc:
                ledger.screening(exc.evaluated)
                return StepOutcome(state._replace(r=r), None,
                                   ("failed", f"failed_hessian at iteration {k}: {exc}"))
            ledger.screening(screened)
        else:
            hess_eps = standard_normal(hess_key, o.n_hess * r, family.base_dim)
        hess_reuses = 0
    else:
        hess_reuses += 1
    n_h = hess_eps.shape[0]
    eps_h = hess_eps

    def neg_hvp(v, _eps=eps_h):
        return -est.hvp(params, _eps, v)

    # the trust region ‖scale ⊙ s‖ ≤ δ: solved in t = scale ⊙ s (scale = 1: the paper's ball;
    # the same after a rejection, since λ has not moved, so reused subspaces stay valid)
    scale = family.metric_scale(params) if o.metric == "fisher" else None
    op, c = scaled_problem(neg_hvp, -g, scale)
    last_solution = state.last_solution
    if not fresh and o.reuse_mode == "subspace" and last_solution is not None \
            and last_solution.Q is not None:
        sol = solve_subspace_reuse(op, c, delta, last_solution.Q, last_solution.T)
    else:
        sol = _solve(o, op, c, delta)
    ledger.hvp(n_h, sol.n_hvp)
    m_prime = -float(sol.q_value)
    s = np.asarray(sol.s, dtype=float)
    step_norm = float(np.linalg.norm(s))
    if scale is not None:
        s = s / scale
    predicted_gain = newton_gain(sol, c, m_prime)
    certified = False
    n_cert = 0
    if (o.tol_model is not None and o.certify_tol is not None and predicted_gain < o.tol_model
            and sol.status != "non_finite"):
        if o.gain_estimate == "split" and ge.per_draw.shape[0] >= 4:
            half = ge.per_draw.shape[0] // 2
            _, c_a = scaled_problem(neg_hvp, -ge.per_draw[:half].mean(axis=0), scale)
            _, c_b = scaled_problem(neg_hvp, -ge.per_draw[half:].mean(axis=0), scale)
            predicted_gain, n_cert = certified_newton_gain(op, c_a, o.certify_tol, c_b)
        else:
            predicted_gain, n_cert = certified_newton_gain(op, c, o.certify_tol)
        ledger.hvp(n_h, n_cert)
        certified = True

    # 4-5. λ-test, ELBO-change estimate, acceptance -------------------------------------
    in_warmup = state.in_warmup
    warming_up = in_warmup
    n_change, stall_count = state.n_change, state.stall_count
    accepted = grew = False
    failure = ""
    n_pairs = 0
    change = sigma_hat = n_star = np.nan
    delta_k = delta
    if sol.status == "non_finite" or not np.isfinite(m_prime) or not np.all(np.isfinite(s)):
        failure = "non-finite Hessian-vector product or step"
        counts["rejected_failure"] += 1
    elif o.acceptance == "paper" and o.eta * m_prime < o.lam * delta * delta:
        counts["rejected_lambda"] += 1
    else:
        n_pairs = n_change
        eps_c = standard_normal(purpose_key(key, k, "change"), n_pairs, family.base_dim)
        diffs = est.pair_differences(params + s, params, eps_c)
        ledger.elbo_change(n_pairs)
        if not np.all(np.isfinite(diffs)):
            failure = "log density failed at a draw of the step assessment"
            counts["rejected_failure"] += 1
        else:
            change = float(diffs.mean())
            sigma2 = float(diffs.var(ddof=1))
            sigma_hat = float(np.sqrt(sigma2))
            # 'paper' (Eq. 10 with the λ-test above): ℓ' ≥ ηm'; 'ratio' [R]: ρ = ℓ'/m' ≥ η
            good = m_prime > 0 and change >= o.eta * m_prime
            grew = good and step_norm > 0.7 * delta  # [R]'s radius-growth condition
            accepted = good and not in_warmup
            counts["accepted" if accepted else "rejected_change"] += 1
            grad_sq = float(g @ g) if o.ineq13_gradient == "plugin" else float(jk.theta_hat)
            n11 = n_ineq11(sigma2, m_prime, delta_k, eta=o.eta, tau1=setup.tau1, tau2=setup.tau2,
                           factor_two=o.ineq11_factor_two)
            n13 = n_ineq13(sigma2, grad_sq, delta_k, zeta1=o.zeta1, nu1=o.nu1)
            n_star = float(max(n11, n13))
            if o.n_change_policy == "reference":
                n_change = reference_code_update(n_pairs, int(min(n_star, 2**62)),
                                                 o.n_change0, o.n_change_max)
            else:
                n_change = retrospective_update(n_pairs, int(min(n_star, 2**62)), n_g,
                                                o.n_change_max)
            stall_count = stall_count + 1 if n_star > o.n_change_max else 0

    # 6. radius, Hessian reuse ----------------------------------------------------------
    stop = None
    if accepted:
        params = params + s
        runaway = divergence(family, params)
        if runaway:
            stop = ("failed", f"diverged at iteration {k}: {runaway}")
    if o.radius_rule == "reference":
        # [R]: the radius moves independently of acceptance (docs/algorithms.md#reference-code)
        delta = min(o.gamma * delta, o.delta_max) if grew else delta / o.gamma
    else:
        delta = min(o.gamma * delta, o.delta_max) if accepted else delta / o.gamma
    radius_grew, radius_shrank = state.radius_grew, state.radius_shrank
    if in_warmup:
        radius_grew = radius_grew or delta > delta_k
        radius_shrank = radius_shrank or delta < delta_k
        in_warmup = not (radius_grew and radius_shrank)
    # Hessian reuse after a rejection; unlimited during [R]'s warm-up
    reuse_next = (not accepted and not failure and o.reuse_mode != "none"
                  and (hess_reuses < o.hessian_max_reuse or warming_up))
    last_solution = sol if sol.status != "non_finite" else None

    row = dict(delta=delta_k, step_norm=step_norm, m_prime=m_prime, change=change,
               sigma_hat=sigma_hat, n_change=n_pairs, n_star=n_star, r=r_used, n_hvp=sol.n_hvp,
               n_hess=n_h, hessian_fresh=fresh, accepted=accepted, failure=failure,
               grad_norm=float(np.linalg.norm(g)), theta_hat=float(jk.theta_hat),
               jackknife_sd=float(jk.sd), elbo=float(np.mean(ge.values)),
               solver_status=sol.status, warmup=warming_up, newton_gain=predicted_gain,
               certified=certified, n_hvp_certify=n_cert)
    # converged-in-model: the quadratic model's Newton step (not the radius-limited step)
    # predicts less than tol_model nats; for a boundary solution that gain is taken in the
    # Krylov subspace already built (a lower bound that never rests on the radius, so a
    # radius collapsing after rejections cannot fake convergence).
    small_model_count = state.small_model_count
    if stop is None:
        small_model_count = small_model_count + 1 if (
            o.tol_model is not None and predicted_gain < o.tol_model) else 0
        stop = _stopping_rule(o, small_model_count, delta, r, stall_count)
    new_state = State(params, delta, r, n_change, hess_eps, hess_reuses, last_solution,
                      reuse_next, stall_count, small_model_count, in_warmup, radius_grew,
                      radius_shrank)
    return StepOutcome(new_state, row, stop, {"delta": delta})


def _stopping_rule(o: Options, small_model_count: int, delta: float, r: int,
                   stall_count: int) -> tuple[str, str] | None:
    """TrustVI's stop after an iteration (the module docstring's stopping rule), or None."""
    if o.tol_model is not None and small_model_count >= o.tol_model_iters:
        return ("converged", f"the quadratic model predicted less than {o.tol_model} nats of "
                f"ELBO gain for its Newton step on {o.tol_model_iters} consecutive iterations")
    if delta < o.delta_min:
        return "converged", f"trust-region radius below delta_min={o.delta_min}"
    if o.refine_draws and o.handover_batch and o.n_grad * r >= o.handover_batch:
        # the batch rules ask for gradients as large as the refinement's first stage: the
        # stochastic phase is at its noise floor, where an iteration on fixed draws is
        # cheaper and deterministic (on a raw-unit regression the stochastic phase spent
        # 270,000 draws creeping 0.1 nat along a ridge the refinement then climbed)
        return ("converged", f"the gradient batch grew to {o.n_grad * r} draws "
                f"(handover_batch={o.handover_batch})")
    if o.stall_stop and stall_count >= o.stall_iters:
        return ("converged", f"ELBO gradient indistinguishable from Monte Carlo noise at "
                f"N_max={o.n_change_max} for {o.stall_iters} iterations")
    return None


def run(target, family, *, key: jax.Array, options: Options, context: RunContext) -> MethodResult:
    """Algorithm 1 of the TrustVI paper (see the module docstring): the warm start, the shared
    loop (:func:`stanvi.methods.base.iterate`) over :func:`step`, the certifying refinement and
    the honest-outcome checks."""
    o = options
    clock_start = time.perf_counter()   # the trace's clock counts the warm start too
    est = context.estimator
    tau1, tau2 = tau_constants(alpha=o.alpha, gamma=o.gamma, lam=o.lam)
    mu0, _ = context.initial_mean(o.init)
    params = np.asarray(family.initial_params(mu0, o.log_scale0), dtype=float)
    ledger = OracleLedger()
    start_info: dict = {}
    alternatives: list = []   # the start the warm start did not choose (second-start check)
    fallbacks: list = []      # the low-rank reverse-KL start's PPCA fallback (run_from_fallback)
    if o.warm_start == "laplace" and target is None:
        start_info = {"warm_start": "default", "warm_start_reason": "no target to search"}
    elif o.warm_start == "laplace":
        params, start_info = laplace_start(target, family, est, mu0, params,
                                           key=purpose_key(key, 0, "init"), ledger=ledger,
                                           log_scale0=o.log_scale0, alternatives=alternatives,
                                           fallbacks=fallbacks if o.sample == "fixed" else None,
                                           point=context.laplace_point)
    trace = Trace(compile_clock=compile_clock(est), start=clock_start)
    trace.record(0, params, ledger, delta=o.delta0)
    counts = {"accepted": 0, "rejected_lambda": 0, "rejected_change": 0, "rejected_failure": 0}
    if o.sample == "fixed":
        start_elbo = start_info.get("laplace_elbo" if start_info.get("warm_start") == "laplace"
                                    else "default_elbo")
        # the warm start's mode (its Laplace q's mean, chosen or not): a path reaching it
        # is in the basin the fit started from
        laplace = [params] if start_info.get("warm_start") == "laplace" else alternatives
        modes = [np.asarray(family.mean(p), dtype=float) for p in laplace]
        # a low-rank start gives up ELBO against the Laplace Gaussian it compresses: a climb
        # of that much is the family's, not the posterior's departure from a Gaussian
        deficit = (start_info.get("laplace_deficit")
                   if start_info.get("warm_start") == "laplace" else None)
        result = run_fixed(o, est, family, key, ledger, trace, params, alternatives, context,
                           counts, start_elbo, target, basin_centres=modes,
                           start_deficit=deficit or 0.0)
        if fallbacks and result[0] == "max_iters":
            result = run_from_fallback(result, fallbacks[0], o, est, family, key, ledger, trace,
                                       alternatives, context, counts, target, modes)
        status, message, params, info = result
        info = {**counts, **start_info, **info}
        status, message = honest_outcome(target, family, params, key, status, message, counts,
                                         info, ledger)
        return MethodResult(params=params, trace=trace, ledger=ledger, status=status,
                            message=message, info=info)
    setup = _Setup(o, est, family, key, ledger, tau1, tau2, counts)
    state = State(params, o.delta0, 1, o.n_change0, in_warmup=o.warmup)
    state, k, status, message = iterate(partial(step, setup), state, max_iters=o.max_iters,
                                        trace=trace, ledger=ledger, context=context)
    params = state.params
    info = {**counts, **start_info, "final_delta": state.delta, "final_r": state.r,
            "final_n_change": state.n_change}
    if status == "converged" and o.refine_draws:
        params, status, message = refine_after_stop(est, family, params, o, key, ledger, trace,
                                                    k, state.delta, message, info, context)
    status, message = honest_outcome(target, family, params, key, status, message, counts,
                                     info, ledger)
    return MethodResult(params=params, trace=trace, ledger=ledger, status=status, message=message,
                        info=info)
