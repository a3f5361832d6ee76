"""Small dense trust-region subproblem: Moré–Sorensen on an eigendecomposition
(Moré & Sorensen 1983; Nocedal & Wright 2006, *Numerical Optimization*, §4.3, Algorithm 4.3;
docs/algorithms.md#dense-tr).

Minimize ``q(h) = bᵀh + ½ hᵀTh`` subject to ``‖h‖ ≤ δ`` for a symmetric ``T`` (k×k, k at most
a few hundred). The global minimizer is characterized by (N&W Thm. 4.1)

    (T + νI) h = −b,   ν ≥ 0,   ν(δ − ‖h‖) = 0,   T + νI positive semidefinite.

With ``T = VΛVᵀ`` and ``b̃ = Vᵀb`` the boundary multiplier solves the secular equation
``‖h(ν)‖² = Σ b̃ᵢ²/(λᵢ+ν)² = δ²``. We solve it in the shifted variable ``t = λ₁ + ν`` (so that
``λᵢ + ν = (λᵢ − λ₁) + t`` is formed without cancellation even when ν → −λ₁, the near-hard
case), by safeguarded Newton on ``1/‖h(t)‖ − 1/δ`` (which is concave and increasing in t,
so Newton from the left converges monotonically) with a bisection fallback.

This solver is used by GLTR (``b = ‖c‖e₁``), by subspace Hessian reuse
(docs/algorithms.md#hessian-reuse) and as the reference solver in the tests.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stanvi.optim.norms import norm as _norm

__all__ = ["DenseTRResult", "solve_dense_tr", "solve_eigen_tr", "tr_model_value"]

#: Relative size (w.r.t. ``‖b‖``) below which the components of b̃ along the bottom
#: eigenspace count as zero (the "hard case", docs/algorithms.md#dense-tr).
HARD_CASE_TOL = 1e-12
#: Relative gap (w.r.t. ``max|λ|``) below which an eigenvalue counts as equal to λ₁.
EIG_CLUSTER_TOL = 1e-12
_SECULAR_RTOL = 1e-13
_MAX_SECULAR_ITER = 200


class DenseTRResult(NamedTuple):
    """Solution of the dense subproblem (docs/algorithms.md#dense-tr).

    ``h``: minimizer; ``q_value``: ``bᵀh + ½hᵀTh`` (≤ 0); ``multiplier``: the Lagrange
    multiplier ν ≥ 0 (0 for an interior solution); ``hard_case``: the bottom-eigenvector
    correction of step 4 was used; ``interior``: ``‖h‖ < δ`` with ν = 0 (Newton step).
    """

    h: np.ndarray
    q_value: float
    multiplier: float
    hard_case: bool
    interior: bool


def tr_model_value(b: np.ndarray, T: np.ndarray, h: np.ndarray) -> float:
    """``q(h) = bᵀh + ½ hᵀTh`` (for checks; the solver itself works in the eigenbasis)."""
    return float(b @ h + 0.5 * h @ (T @ h))


def _q_eig(bt: np.ndarray, lam: np.ndarray, ht: np.ndarray) -> float:
    """Model value in the eigenbasis: ``b̃ᵀh̃ + ½ Σ λᵢ h̃ᵢ²``."""
    return float(bt @ ht + 0.5 * (lam * ht * ht).sum())


def _finish(V: np.ndarray, bt: np.ndarray, lam: np.ndarray, ht: np.ndarray, delta: float,
            nu: float, hard_case: bool, interior: bool) -> DenseTRResult:
    norm = _norm(ht)
    if norm > delta:  # rounding guard: ‖h‖ ≤ δ must hold exactly
        ht = ht * (delta / norm)
    return DenseTRResult(h=V @ ht, q_value=_q_eig(bt, lam, ht), multiplier=float(max(nu, 0.0)),
                         hard_case=hard_case, interior=interior)


def _solve_secular(bt: np.ndarray, d: np.ndarray, delta: float, t_lo: float) -> float:
    """Root ``t > t_lo`` of ``‖b̃/(d + t)‖ = δ``, where ``d ≥ 0`` and ``‖b̃/(d+t_lo)‖ > δ``.

    Safeguarded Newton on ``φ(t) = 1/‖h(t)‖ − 1/δ`` with ``h(t) = −b̃/(d+t)``:
    ``φ'(t) = ‖h‖⁻³ Σ b̃ᵢ²/(dᵢ+t)³``. The bracket ``[lo, hi]`` always satisfies φ(lo) < 0 ≤ φ(hi);
    a Newton iterate outside it is replaced by a bisection point.
    """
    bnorm = _norm(bt)
    lo = t_lo
    hi = t_lo + bnorm / delta  # ‖h(t)‖ ≤ ‖b‖/t ≤ δ there since d ≥ 0
    t = hi
    for _ in range(_MAX_SECULAR_ITER):
        den = d + t
        w = bt / den
        hn = _norm(w)
        if hn == 0.0 or not np.isfinite(hn):  # t so large that h underflowed, or den = 0
            phi = np.inf if hn == 0.0 else -np.inf
        else:
            phi = 1.0 / hn - 1.0 / delta
        if np.isfinite(phi) and abs(hn - delta) <= _SECULAR_RTOL * delta:
            return t
        if phi < 0:
            lo = t
        else:
            hi = t
        if hi - lo <= 4 * np.finfo(float).eps * max(abs(hi), np.finfo(float).tiny):
            return hi
        t_new = np.nan
        if np.isfinite(phi) and hn > 0:
            dphi = float(np.sum(w * w / den)) / hn ** 3
            if dphi > 0:
                t_new = t - phi / dphi
        if not (lo < t_new < hi):
            # bisection; geometric when the bracket spans orders of magnitude above 0
            t_new = np.sqrt(lo * hi) if 0 < 4 * lo < hi else 0.5 * (lo + hi)
        t = t_new
    return hi


def solve_dense_tr(T: np.ndarray, b: np.ndarray, delta: float) -> DenseTRResult:
    """Global minimizer of ``bᵀh + ½ hᵀTh`` over ``‖h‖ ≤ δ`` (docs/algorithms.md#dense-tr).

    1. ``T = VΛVᵀ``, ``b̃ = Vᵀb``, λ₁ = smallest eigenvalue.
    2. Interior: λ₁ > 0 and ``‖Λ⁻¹b̃‖ ≤ δ`` → Newton step ``h = −VΛ⁻¹b̃``, ν = 0.
    3. Boundary: ν ≥ max(0, −λ₁) with ``Σ b̃ᵢ²/(λᵢ+ν)² = δ²`` (safeguarded Newton/bisection).
    4. Hard case: λ₁ ≤ 0, b̃ ≈ 0 on the λ₁-eigenspace and ``‖h(−λ₁)‖ < δ`` → ν = −λ₁ and
       ``h = h(−λ₁) + τ v₁`` with τ chosen to reach the boundary (sign: the one that does not
       increase q).
    """
    T = np.asarray(T, dtype=float)
    b = np.asarray(b, dtype=float)
    if T.ndim != 2 or T.shape[0] != T.shape[1] or b.shape != (T.shape[0],):
        raise ValueError(f"shape mismatch: T {T.shape}, b {b.shape}")
    if b.shape[0] == 0:
        _positive_radius(delta)
        return DenseTRResult(np.zeros(0), 0.0, 0.0, False, True)
    return solve_eigen_tr(np.linalg.eigh(0.5 * (T + T.T)), b, delta)


def _positive_radius(delta) -> float:
    delta = float(delta)
    if not delta > 0:
        raise ValueError(f"delta must be positive, got {delta}")
    return delta


def solve_eigen_tr(eigen: tuple[np.ndarray, np.ndarray], b: np.ndarray,
                   delta: float) -> DenseTRResult:
    """:func:`solve_dense_tr` from T's eigendecomposition ``(Λ, V)`` (``np.linalg.eigh``'s
    output, eigenvalues ascending), steps 2–4: several subproblems with the same T (and other
    b or δ) share one decomposition."""
    lam, V = eigen
    b = np.asarray(b, dtype=float)
    delta = _positive_radius(delta)
    k = b.shape[0]
    bt = V.T @ b
    lam1 = float(lam[0])
    bnorm = _norm(bt)

    # 2. interior (Newton) case
    if lam1 > 0:
        ht = -bt / lam
        if _norm(ht) <= delta:
            return _finish(V, bt, lam, ht, delta, 0.0, hard_case=False, interior=True)

    scale = max(abs(lam1), abs(float(lam[-1])), np.finfo(float).tiny)   # max |λ| (λ sorted)
    d = np.maximum(lam - lam1, 0.0)  # shifted eigenvalues, d[0] = 0

    # 4. hard case (only possible for λ₁ ≤ 0, where ν = −λ₁ ≥ 0)
    if lam1 <= 0:
        bottom = d <= EIG_CLUSTER_TOL * scale
        if _norm(bt[bottom]) <= HARD_CASE_TOL * bnorm or bnorm == 0.0:
            ht = np.zeros(k)
            rest = ~bottom
            ht[rest] = -bt[rest] / d[rest]
            rest_norm = _norm(ht)
            if rest_norm <= delta:
                tau = np.sqrt(max(delta * delta - rest_norm * rest_norm, 0.0))
                # put the boundary mass on the first bottom eigenvector; pick the sign so that
                # the (tiny) linear term b̃₁τ is ≤ 0
                sign = -1.0 if bt[0] > 0 else 1.0
                ht[0] = sign * tau
                return _finish(V, bt, lam, ht, delta, -lam1, hard_case=True, interior=False)

    # 3. boundary case: t = λ₁ + ν > max(λ₁, 0)
    t_lo = max(lam1, 0.0)
    t = _solve_secular(bt, d, delta, t_lo)
    ht = -bt / (d + t)
    return _finish(V, bt, lam, ht, delta, t - lam1, hard_case=False, interior=False)
