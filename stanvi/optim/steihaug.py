"""Steihaug–Toint truncated conjugate gradients for the trust-region subproblem
(Steihaug 1983; Toint 1981; Nocedal & Wright 2006, Algorithm 7.2; docs/algorithms.md#steihaug).

Minimize ``q(s) = cᵀs + ½ sᵀBs`` subject to ``‖s‖ ≤ δ`` where ``B`` is only available as an
operator ``hvp(v) = Bv``. One operator application per CG iteration; the model value is tracked
along the way so that ``m' = −q(s)`` costs no extra application (unlike Celeste.jl's
``cg_trust_region.jl``, which spends one more HVP).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stanvi.optim.trust_region import (TRResult, non_finite_result, validated_problem,
                                       zero_step_result)

__all__ = ["boundary_tau", "solve_steihaug"]

HVP = Callable[[np.ndarray], np.ndarray]


def boundary_tau(s: np.ndarray, p: np.ndarray, delta: float) -> float:
    """The root ``τ ≥ 0`` of ``‖s + τp‖ = δ`` for ``‖s‖ ≤ δ`` (the boundary exit,
    docs/algorithms.md#steihaug).

    Uses the cancellation-free form of the positive root of
    ``pᵀp τ² + 2 sᵀp τ + (sᵀs − δ²) = 0``.
    """
    pp = float(p @ p)
    sp = float(s @ p)
    gap = max(delta * delta - float(s @ s), 0.0)
    disc = np.sqrt(sp * sp + pp * gap)
    if sp > 0:
        return gap / (sp + disc) if sp + disc > 0 else 0.0
    return (disc - sp) / pp


def solve_steihaug(hvp: HVP, c: np.ndarray, delta: float, *, tol: float = 1e-2,
                   max_iter: int | None = None) -> TRResult:
    """Steihaug–Toint CG (docs/algorithms.md#steihaug). Returns a
    :class:`~stanvi.optim.trust_region.TRResult`.

    From ``s = 0``, ``r = c``, ``p = −r``, each iteration applies the operator once
    (``κ = pᵀBp``); on negative curvature or when the CG step would leave the region it moves
    to the boundary along ``p`` and stops (status ``"boundary"``); otherwise it takes the CG
    step and stops when ``‖r‖ ≤ tol·‖c‖`` (``"converged"``). ``max_iter`` defaults to ``n``
    (``"max_iter"`` when reached).

    Model value: each interior step lowers ``q`` by ``½ α ‖r‖²``; the final boundary step adds
    ``τ pᵀr + ½ τ² κ`` with ``pᵀr`` computed explicitly. The first iteration is the Cauchy step
    and ``q`` decreases monotonically afterwards, so ``q(s) ≤ q(s_Cauchy) ≤ 0``.
    """
    c, delta, n, c_norm = validated_problem(c, delta)
    if c_norm == 0.0:
        return zero_step_result(n)
    if max_iter is None:
        max_iter = max(n, 1)

    s = np.zeros(n)
    r = c.copy()
    p = -r
    rr = c_norm * c_norm
    q = 0.0
    n_hvp = 0
    for _ in range(max_iter):
        Bp = np.asarray(hvp(p), dtype=float)
        n_hvp += 1
        if Bp.shape != p.shape or not np.all(np.isfinite(Bp)):
            return non_finite_result(n, n_hvp)
        kappa = float(p @ Bp)
        alpha = rr / kappa if kappa > 0 else np.inf
        s_next = s + alpha * p if kappa > 0 else None
        if kappa <= 0 or np.linalg.norm(s_next) >= delta:
            tau = boundary_tau(s, p, delta)
            q = q + tau * float(p @ r) + 0.5 * tau * tau * kappa
            s = s + tau * p
            norm = float(np.linalg.norm(s))
            if norm > delta:  # rounding guard
                s *= delta / norm
            return TRResult(s, float(q), n_hvp, True, False, None, None, "boundary")
        s = s_next
        q -= 0.5 * alpha * rr
        r = r + alpha * Bp
        rr_next = float(r @ r)
        if np.sqrt(rr_next) <= tol * c_norm:
            return TRResult(s, float(q), n_hvp, False, False, None, None, "converged")
        p = -r + (rr_next / rr) * p
        rr = rr_next
    return TRResult(s, float(q), n_hvp, False, False, None, None, "max_iter")
