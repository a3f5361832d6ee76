"""Final refinement of a variational fit on a fixed sample: a deterministic trust-region Newton
method on the sample-average ELBO (stanvi's addition to TrustVI, docs/methods.md, "Why
`default` changed").

Why.  A stochastic method stops on noisy evidence: its last iterate carries the Monte Carlo noise
of its last small batches (on ``a ~ normal(5, 1)`` the mean ended up to 0.26 sd off and the sd up
to 34% off while the ELBO was within 0.1 nat), and a stopping test on a noisy quadratic model can
fire early.  With a *fixed* set of N base draws ε₁..ε_N, the sample-average ELBO

    L̂_N(λ) = (1/N) Σ_j [log p(g(λ, ε_j))] + H(q_λ)

is a deterministic smooth function (the sample-average approximation, Shapiro, Dentcheva &
Ruszczyński 2009, ch. 5; Kim, Pasupathy & Henderson 2015), whose maximizer is within
O_p(N^{-1/2}) of the ELBO's: for a Gaussian target, the mean of the mean-field SAA optimum is
off by σ·N(0, 1/N) per coordinate (0.016 sd at N = 4,096) and its sd by about (2N)^{-1/2}
(1.1%).  A trust-region Newton method (Nocedal & Wright 2006, Algorithm 4.1, with the subproblem
solved by GLTR, Gould, Lucidi, Roma & Toint 1999) converges on L̂_N with exact function values
and gradients, so its stopping test — the Newton decrement ½ gᵀB⁻¹g of L̂_N below ``tol`` — is
a certificate, not a guess: ``converged`` then means converged to the optimum of a known
N-draw objective.

Hessian-vector products use the first ``n_hess`` of the N draws (an inexact Newton method with
an exact gradient still converges to the SAA optimum, Byrd, Chin, Neveitt & Nocedal 2011,
"subsampled Hessian Newton"), and all N after two rejected steps in a row (for the full-rank
family at least 2(D + 1) of them, :func:`hessian_draws`); the trust region is measured in q's Fisher metric (see
:meth:`stanvi.families.gaussian.MeanField.metric_scale`).

The fixed draws are moment-matched (mean 0, covariance I exactly; :func:`_moment_matched`).
Draws where the model fails at the starting point are replaced before the loop (Stan's
drop-and-redraw rule, at most ``max_drops`` of them); a step at which any of the N draws fails is
rejected and the radius shrinks, so every accepted iterate has a finite L̂_N.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stanvi.estimators.elbo import GradientFailure, per_draw_gradients, valid_draws
from stanvi.lazy_jax import jax
from stanvi.methods.base import OracleLedger, purpose_key
from stanvi.optim.gltr import solve_gltr, truncated
from stanvi.optim.trust_region import NEWTON_RADIUS


class RefineResult(NamedTuple):
    params: np.ndarray
    converged: bool
    over_budget: bool
    iterations: int
    decrement: float        # the last Newton decrement ½gᵀB⁻¹g of L̂_N (nats), inf if unknown
    gain: float             # L̂_N(final) − L̂_N(start) (nats)
    message: str


def _moment_matched(est, params: np.ndarray, eps: np.ndarray, ledger: OracleLedger) -> np.ndarray:
    """The draws shifted and whitened to sample mean exactly 0 and sample covariance exactly I
    (moment matching, Boyle, Broadie & Glasserman 1997, §4.2): the ELBO of a Gaussian log p
    depends on ε only through these two moments, so its fixed-draw objective is then exact, and
    for a near-Gaussian posterior most of the fixed-draw error goes (without it, the sd of a
    D = 50, condition-number-1e6 Gaussian came out 6.5% off at N = 4,096).  Kept only if the
    model is finite at every moved draw (else the screened draws are used as they are); needs
    N > D + 1."""
    n, dim = eps.shape
    if n <= dim + 1:
        return eps
    centred = eps - eps.mean(axis=0)
    try:
        chol = np.linalg.cholesky(centred.T @ centred / n)
    except np.linalg.LinAlgError:
        return eps
    matched = np.linalg.solve(chol, centred.T).T
    values = est.values(params, matched)
    ledger.screening(n)
    return matched if np.all(np.isfinite(values)) else eps


def hessian_draws(family, n_hess: int) -> int:
    """The draws the refinement's Hessian-vector products use: ``n_hess``, and for the full-rank
    family at least 2(D + 1).  With m draws the sampled Hessian of a row of L is
    (1/m) Σ ε_[:a] ε_[:a]ᵀ-weighted, of rank ≤ m, so for m ≤ D it is singular: the Newton solve
    can never converge, and each refinement iteration spent a Krylov memory's worth of products
    before falling back to all N draws (full rank, D = 500: 266 products, 70 s an iteration;
    issue 17 item 6).  Mean-field (one curvature per coordinate from every draw) keeps
    ``n_hess``."""
    return max(int(n_hess), getattr(family, "min_curvature_draws", 1))


def refine(est, family, params: np.ndarray, *, key: jax.Array, ledger: OracleLedger,
           n_draws: int = 4096, n_hess: int = 256, tol: float = 1e-3, max_iters: int = 30,
           delta0: float = 1.0, max_drops: int | None = None, metric: str = "fisher",
           on_iteration=None, over_budget=None) -> RefineResult:
    """Maximize the fixed-draw ELBO L̂_N from ``params`` by trust-region Newton-GLTR (module
    docstring).  Returns the final parameters and whether the Newton decrement fell below
    ``tol`` within ``max_iters`` iterations.

    Trust-region constants are the textbook ones (Nocedal & Wright 2006, Algorithm 4.1): accept
    when ρ = ΔL̂/m' > 0.1; shrink δ by 4 when ρ < 1/4; double it when ρ > 3/4 and the step is on
    the boundary.  The GLTR solve uses relative residual 1e-4 (at most 2P Lanczos steps), so
    the decrement is that of the model, not of a truncated Krylov step.

    ``over_budget()`` (optional) is asked after every iteration; when it says yes the
    refinement ends with ``over_budget`` set.
    """
    max_drops = 10 * n_draws if max_drops is None else max_drops
    try:
        eps, screened = valid_draws(est, params, key, n_draws, max_drops)
    except GradientFailure as exc:
        ledger.screening(exc.evaluated)
        return RefineResult(params, False, False, 0, float("inf"), 0.0,
                            f"the refinement sample could not be drawn: {exc}")
    ledger.screening(screened)
    eps = _moment_matched(est, params, eps, ledger)
    eps_h = eps[: min(hessian_draws(family, n_hess), n_draws)]
    delta = float(delta0)
    rejections = 0
    gain = 0.0
    decrement = float("inf")
    for it in range(1, max_iters + 1):
        # the mean gradient only; full rank: from (∇log p, ε) per draw, never (N, P) (issue 17)
        values, grads = per_draw_gradients(est, params, eps)
        ledger.gradient(n_draws)
        g = grads.mean(axis=0)
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(g))):
            return RefineResult(params, False, False, it, float("inf"), gain,
                                "the model failed at a refinement draw at an accepted iterate")
        scale = family.metric_scale(params) if metric == "fisher" else np.ones_like(params)

        def op(v, _p=params, _scale=scale):
            return -est.hvp(_p, eps_h, v / _scale) / _scale

        c = -g / scale
        newton = solve_gltr(op, c, NEWTON_RADIUS, tol_interior=1e-4, tol_boundary=1e-4,
                            max_krylov=2 * len(c))
        ledger.hvp(len(eps_h), newton.n_hvp)
        if newton.status == "non_finite":
            return RefineResult(params, False, False, it, float("inf"), gain,
                                "a Hessian-vector product of the refinement was not finite")
        # a solve cut short by the Krylov memory bound (large full-rank P) certifies nothing
        decrement = (float("inf") if newton.on_boundary or truncated(newton, len(c))
                     else -float(newton.q_value))
        if on_iteration is not None:
            on_iteration(it, params, float(values.mean()), decrement, delta)
        if decrement < tol:
            return RefineResult(params, True, False, it, decrement, gain,
                                f"Newton decrement {decrement:.2g} < {tol:g} nats on "
                                f"{n_draws} fixed draws")
        # the trust-region step (the Newton step itself when it fits)
        if np.isfinite(decrement) and np.linalg.norm(newton.s) <= delta:
            t, m_prime, boundary = newton.s, decrement, False
        else:
            sol = solve_gltr(op, c, delta, tol_interior=1e-4, tol_boundary=1e-2,
                             max_krylov=2 * len(c))
            ledger.hvp(len(eps_h), sol.n_hvp)
            t, m_prime, boundary = sol.s, -float(sol.q_value), sol.on_boundary
        step = np.asarray(t, dtype=float) / scale
        change = est.pair_differences(params + step, params, eps)
        ledger.elbo_change(n_draws)
        if not np.all(np.isfinite(change)) or not m_prime > 0:
            delta /= 4.0
            rejections += 1
        else:
            dl = float(change.mean())
            rho = dl / m_prime
            if rho > 0.1:
                params = params + step
                gain += dl
                rejections = 0
            else:
                rejections += 1
            if rho < 0.25:
                delta = float(np.linalg.norm(t)) / 4.0
            elif rho > 0.75 and boundary:
                delta = 2.0 * delta
        if rejections >= 2 and len(eps_h) < len(eps):
            # the subsampled Hessian misjudges the fixed-draw objective here (on a redundantly
            # parameterized hierarchical model the radius collapsed): use all N draws from now on
            eps_h = eps
        if over_budget is not None and over_budget():
            return RefineResult(params, False, True, it, decrement, gain,
                                "the oracle budget was spent during the refinement")
        if delta < 1e-10:
            return RefineResult(params, False, False, it, decrement, gain,
                                "the refinement's trust region collapsed (no step improves the "
                                "fixed-draw ELBO)")
    return RefineResult(params, False, False, max_iters, decrement, gain,
                        f"the refinement did not reach a Newton decrement below {tol:g} nats "
                        f"in {max_iters} iterations (last {decrement:.3g})")


def refine_after_stop(est, family, params, o, key, ledger, trace, k: int, delta: float,
                      message: str, info: dict, context) -> tuple[np.ndarray, str, str]:
    """Certify a stochastic method's stop (TrustVI's options ``o``: ``refine_draws``,
    ``refine_hess``, ``refine_tol``, ``refine_max_iters``, ``refine_delta0``, ``metric``,
    ``max_gradient_drops_factor``) by refining on ``refine_draws`` fixed draws (:func:`refine`);
    the refinement's iterations continue the trace (``phase="refine"``) and the fit's progress
    display (``phase=refine``).  Returns (params, status, message): ``converged`` only when the
    fixed-draw Newton decrement fell below ``refine_tol``; otherwise ``max_iters`` with the
    reason, and the refined iterate (never worse on the fixed draws than the stopping point)."""
    def record(it, p, elbo, decrement, radius):
        trace.record(k + it, p, ledger, phase="refine", elbo=elbo, newton_gain=decrement,
                     delta=radius)
        # the fit's progress display goes on through the refinement (issue 13 item 2)
        context.progress.update(k + it, elbo=elbo, oracle=ledger.scaled, phase="refine")

    # retrospective approximation (Pasupathy 2010): a cheap stage on fewer draws solved to its
    # own statistical accuracy (~P/(2N) nats), then the certifying stage warm-started from it
    # full rank: a stage needs more draws than dimensions (2(D + 1), refine.hessian_draws):
    # on N ≤ D fixed draws the sample-average ELBO is unbounded (L grows orthogonally to every
    # draw, the entropy with it) and its Hessian singular (D = 1,000: a 512-draw first stage
    # ran Krylov-limited solves for minutes; issue 17 item 6)
    least = max(256, hessian_draws(family, 0))
    stages = ([n for n in (o.refine_draws // 8,) if n >= least]
              + [max(o.refine_draws, hessian_draws(family, 0))])
    gain = 0.0
    iterations = 0
    radius = max(delta, o.refine_delta0)
    for i, n in enumerate(stages):
        final = i == len(stages) - 1
        tol = o.refine_tol if final else max(o.refine_tol, 0.5 * len(params) / n)
        res = refine(est, family, params, key=purpose_key(key, i, "refine"), ledger=ledger,
                     n_draws=n, n_hess=min(o.refine_hess, n), tol=tol,
                     max_iters=o.refine_max_iters, delta0=radius,
                     max_drops=o.max_gradient_drops_factor * n, metric=o.metric,
                     on_iteration=lambda it, *a, _done=iterations: record(_done + it, *a),
                     over_budget=lambda: context.over_budget(ledger.scaled))
        params, gain, iterations = res.params, gain + res.gain, iterations + res.iterations
        if not res.converged:
            break
    info.update(refine_iterations=iterations, refine_gain=gain, refine_decrement=res.decrement)
    if res.converged:
        return res.params, "converged", f"{message}; refined: {res.message}"
    if res.over_budget:
        return res.params, "budget", (f"oracle budget {context.max_oracle_calls} spent in the "
                                      f"refinement after TrustVI's stop ({message})")
    return res.params, "max_iters", (f"TrustVI's stopping rule fired ({message}) but the "
                                     f"refinement could not certify convergence: {res.message}")
