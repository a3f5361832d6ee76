"""GLTR: the Lanczos trust-region method, and subspace Hessian reuse
(Gould, Lucidi, Roma & Toint 1999, SIAM J. Optim. 9(2):504–525; trlib, Lenders, Kirches &
Potschka 2016, which the TrustVI authors' code calls; Regier et al. 2017, §3.2, for the reuse;
docs/algorithms.md#gltr and #hessian-reuse).

Minimize ``q(s) = cᵀs + ½ sᵀBs`` subject to ``‖s‖ ≤ δ`` with ``B`` available only as an
operator. Lanczos from ``q₁ = c/‖c‖`` (with full reorthogonalization, since ``j`` stays small)
builds an orthonormal basis ``Q_j`` of the Krylov space and the projected matrix
``T_j = Q_jᵀBQ_j``; the reduced problem ``min ‖c‖e₁ᵀh + ½hᵀT_jh, ‖h‖ ≤ δ`` is solved densely
(Moré–Sorensen, docs/algorithms.md#dense-tr) and ``s = Q_jh``. Because
``BQ_j = Q_jT_j + β_{j+1}q_{j+1}e_jᵀ``, the full-space Lagrangian-gradient residual is
``(B + νI)s + c = β_{j+1}(e_jᵀh) q_{j+1}``, of norm ``|β_{j+1}||e_jᵀh|``, so convergence is
checked without extra operator applications, and
``q(s) = ‖c‖h₁ + ½hᵀT_jh`` is exact.

We store the full projected column ``Q_jᵀ(Bq_j)`` (the Gram–Schmidt coefficients of the
reorthogonalization) rather than only the tridiagonal entries, so ``T`` is the Rayleigh–Ritz
matrix ``QᵀBQ`` to rounding and can be extended directly for reuse
(docs/algorithms.md#hessian-reuse).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stanvi.optim.dense_tr import solve_dense_tr
from stanvi.optim.norms import norm as _norm
from stanvi.optim.trust_region import (NEWTON_RADIUS, TRResult, non_finite_result,
                                       validated_problem, zero_step_result)

__all__ = ["krylov_limit", "solve_gltr", "solve_subspace_reuse", "truncated"]

HVP = Callable[[np.ndarray], np.ndarray]

#: Lanczos breakdown: ``β_{j+1} ≤ BREAKDOWN_TOL · max(|T_j|)`` means the Krylov space is
#: (numerically) invariant under B.
BREAKDOWN_TOL = 1e-12
#: Memory for the Lanczos basis: at most ``max(MIN_KRYLOV, KRYLOV_BYTES // (8 n))`` basis
#: vectors are stored (:func:`krylov_limit`).  For n ≤ 5,792 (mean-field up to D = 2,896,
#: full rank up to D = 106) the limit is ≥ n and changes nothing; at a full-rank D = 2,000 (n = 2,003,000, 16 MB a vector) it keeps 16 vectors, where
#: an unlimited solve kept hundreds (issue 17 item 6).
KRYLOV_BYTES = 256 * 2**20
MIN_KRYLOV = 8
#: Subspace reuse skips the new direction when the new gradient's component outside span(Q)
#: is below this fraction of ``‖c‖`` (docs/algorithms.md#hessian-reuse).
REUSE_SKIP_TOL = 1e-8


def _apply(hvp: HVP, v: np.ndarray) -> np.ndarray | None:
    """One operator application; ``None`` if the result is not a finite vector like ``v``."""
    w = np.asarray(hvp(v), dtype=float)
    if w.shape != v.shape or not np.isfinite(w).all():
        return None
    return w


def _orthogonalize(basis: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Classical Gram–Schmidt against the rows of ``basis`` (j×n), applied twice
    ("twice is enough"); returns the residual and the accumulated coefficients ``basisᵀw``."""
    coef = basis @ w
    w = w - coef @ basis
    corr = basis @ w
    w = w - corr @ basis
    return w, coef + corr


def krylov_limit(n: int) -> int:
    """The most Lanczos vectors :func:`solve_gltr` stores for a problem of size ``n``
    (``KRYLOV_BYTES`` of float64, at least ``MIN_KRYLOV``)."""
    return max(MIN_KRYLOV, KRYLOV_BYTES // (8 * max(int(n), 1)))


def truncated(result: TRResult, n: int) -> bool:
    """True when a :func:`solve_gltr` result stopped at its iteration limit before spanning the
    whole space (status ``"max_iter"`` with fewer than ``n`` operator applications): its step is
    a valid trust-region step, but its model value is not the minimum over the space."""
    return result.status == "max_iter" and result.n_hvp < n


def solve_gltr(hvp: HVP, c: np.ndarray, delta: float, *, tol_interior: float = 1e-2,
               tol_boundary: float = 1e-1, max_krylov: int | None = None,
               max_lanczos_after_boundary: int = 100) -> TRResult:
    """GLTR (Gould et al. 1999; docs/algorithms.md#gltr). Returns a
    :class:`~stanvi.optim.trust_region.TRResult` with ``Q``, ``T``.

    Iteration ``j`` spends one operator application ``B q_j``, extends ``T_j``, solves the reduced
    problem with :func:`~stanvi.optim.dense_tr.solve_dense_tr` and stops when

    * ``|β_{j+1}·e_jᵀh| ≤ tol·‖c‖``, with ``tol = tol_interior`` for an interior reduced solution
      and ``tol_boundary`` on the boundary (status ``"converged"`` / ``"boundary"``);
    * the Lanczos process breaks down, ``β_{j+1} ≈ 0`` (``"breakdown"``): the Krylov space is
      invariant and the reduced solution is the exact minimizer over it. In the hard case
      (``c`` orthogonal to the bottom eigenspace of B) this is the reduced-space global
      minimizer, as in trlib without ``ctl_invariant``;
    * ``j = max_krylov`` (default ``n``; never more than :func:`krylov_limit` (n), a memory
      bound that only large problems reach, see :func:`truncated`), or ``max_lanczos_after_boundary`` iterations after
      the reduced solution first reached the boundary (``"max_iter"``).

    The first iterate is the Cauchy point and the Krylov spaces are nested, so
    ``q(s) ≤ q(s_Cauchy) ≤ 0``. While ``T_j`` is positive definite and the solution interior the
    iterates coincide with CG (hence with Steihaug's), and GLTR keeps improving after reaching
    the boundary, so its ``q`` is never worse than Steihaug's with the same interior tolerance.
    """
    c, delta, n, c_norm = validated_problem(c, delta)
    if c_norm == 0.0:
        return zero_step_result(n)
    if max_krylov is None:
        max_krylov = n
    max_krylov = max(1, min(int(max_krylov), n, krylov_limit(n)))

    cap = min(max_krylov, 16)
    rows = np.empty((cap, n))  # basis vectors as rows (contiguous prefix slices)
    T = np.zeros((cap, cap))
    rows[0] = c / c_norm
    n_hvp = 0
    j = 0  # current dimension of the Krylov space
    first_boundary_j: int | None = None
    status = "max_iter"
    while True:
        w = _apply(hvp, rows[j])
        n_hvp += 1
        if w is None:
            return non_finite_result(n, n_hvp)
        j += 1
        w, coef = _orthogonalize(rows[:j], w)
        T[:j, j - 1] = coef
        T[j - 1, :j] = coef
        beta = _norm(w)

        b = np.zeros(j)
        b[0] = c_norm
        red = solve_dense_tr(T[:j, :j], b, delta)
        if not red.interior and first_boundary_j is None:
            first_boundary_j = j
        tol = tol_interior if red.interior else tol_boundary
        if beta * abs(red.h[-1]) <= tol * c_norm:
            status = "converged" if red.interior else "boundary"
            break
        if beta == 0.0 or beta <= BREAKDOWN_TOL * float(np.abs(T[:j, :j]).max()):
            status = "breakdown"
            break
        if j >= max_krylov or (first_boundary_j is not None
                               and j - first_boundary_j >= max_lanczos_after_boundary):
            status = "max_iter"
            break
        if j == cap:  # grow storage geometrically
            cap = min(2 * cap, max_krylov)
            rows = np.concatenate([rows, np.empty((cap - j, n))])
            T_new = np.zeros((cap, cap))
            T_new[:j, :j] = T[:j, :j]
            T = T_new
        rows[j] = w / beta

    Q = np.ascontiguousarray(rows[:j].T)
    T_j = T[:j, :j].copy()
    s = Q @ red.h
    norm = _norm(s)
    if norm > delta:  # rounding guard (Q orthonormal to machine precision)
        s *= delta / norm
    return TRResult(s, red.q_value, n_hvp, not red.interior, red.hard_case, Q, T_j, status)


def solve_subspace_reuse(hvp: HVP, c_new: np.ndarray, delta: float, Q: np.ndarray | None,
                         T: np.ndarray | None) -> TRResult:
    """Subspace Hessian reuse (docs/algorithms.md#hessian-reuse, mode ``"subspace"``): one
    operator application at most.

    Given the basis ``Q`` (n×j, orthonormal) and ``T = QᵀBQ`` of a previous solve with the same
    operator, orthogonalize ``c_new`` against ``Q`` (twice), normalize the remainder to ``q⁺``
    and apply the operator once; extend ``T`` by the column ``Qᵀ(Bq⁺)`` and the scalar
    ``q⁺ᵀBq⁺``, and solve the dense problem ``min (Q⁺ᵀc)ᵀh + ½hᵀT⁺h, ‖h‖ ≤ δ`` in
    ``span(Q, q⁺)``; ``s = Q⁺h``. If the remainder's norm is below ``1e-8·‖c_new‖`` no vector is
    added and no operator application is spent. ``Q = None`` (or no columns) starts a fresh
    one-dimensional subspace ``span(c_new)``.

    ``c_new`` lies in the subspace, so the Cauchy step for ``c_new`` is feasible for the reduced
    problem and ``q(s) ≤ q(s_Cauchy)``. The result carries the extended ``Q⁺``, ``T⁺``; its
    status is ``"converged"`` (interior) or ``"boundary"``.
    """
    c = np.asarray(c_new, dtype=float)
    delta = float(delta)
    n = c.shape[0]
    if not delta > 0:
        raise ValueError(f"delta must be positive, got {delta}")
    if Q is None or T is None or np.asarray(Q).size == 0:
        rows = np.zeros((0, n))
        T0 = np.zeros((0, 0))
    else:
        Q = np.asarray(Q, dtype=float)
        T0 = np.asarray(T, dtype=float)
        if Q.ndim != 2 or Q.shape[0] != n or T0.shape != (Q.shape[1], Q.shape[1]):
            raise ValueError(f"shape mismatch: c {c.shape}, Q {Q.shape}, T {T0.shape}")
        rows = np.ascontiguousarray(Q.T)
    c_norm = float(np.linalg.norm(c))
    if c_norm == 0.0:
        return zero_step_result(n, None if rows.shape[0] == 0 else rows.T.copy(),
                                 None if rows.shape[0] == 0 else T0.copy())

    j = rows.shape[0]
    w, _ = _orthogonalize(rows, c)
    w_norm = float(np.linalg.norm(w))
    n_hvp = 0
    if w_norm >= REUSE_SKIP_TOL * c_norm:
        q_plus = w / w_norm
        Bq = _apply(hvp, q_plus)
        n_hvp = 1
        if Bq is None:
            return non_finite_result(n, n_hvp)
        T_ext = np.empty((j + 1, j + 1))
        T_ext[:j, :j] = T0
        col = rows @ Bq
        T_ext[:j, j] = col
        T_ext[j, :j] = col
        T_ext[j, j] = float(q_plus @ Bq)
        rows = np.concatenate([rows, q_plus[None, :]])
    else:
        T_ext = T0.copy()

    b = rows @ c
    red = solve_dense_tr(T_ext, b, delta)
    s = red.h @ rows
    # exact model value with the true c (b is only its projection when q⁺ was skipped)
    q_value = float(c @ s) + 0.5 * float(red.h @ (T_ext @ red.h))
    norm = float(np.linalg.norm(s))
    if norm > delta:
        s *= delta / norm
    status = "converged" if red.interior else "boundary"
    return TRResult(s, q_value, n_hvp, not red.interior, red.hard_case,
                    np.ascontiguousarray(rows.T), T_ext, status)


def certified_newton_gain(hvp, c: np.ndarray, tol: float,
                    c_other: np.ndarray | None = None) -> tuple[float, int]:
    """The Newton gain ½cᵀB⁻¹c of the current model, solved to relative residual ``tol`` over
    the whole space (at most ``len(c)`` Lanczos steps), and the operator applications spent;
    ``inf`` when the model is not concave.  A truncated solve can underestimate the gain by
    orders of magnitude on an ill-conditioned model (the residual is small while the step along
    low-curvature directions is not), which is how a stop on the model's prediction used to fire
    tens of nats short of the optimum.

    With ``c_other`` (the gradient of an independent half of the draws, ``c`` that of the other
    half), the cross term ½c_otherᵀB⁻¹c instead: E[½ḡᵀB⁻¹ḡ] = ½∇ᵀB⁻¹∇ + tr(B⁻¹Σ)/(2n) carries
    the noise of the gradient, which near the optimum of an ill-conditioned model stays near a
    nat however long the run, while the cross term of two independent halves is unbiased for
    ½∇ᵀB⁻¹∇ (it can be negative; it then counts as small)."""
    sol = solve_gltr(hvp, c, NEWTON_RADIUS, tol_interior=tol, tol_boundary=tol,
                     max_krylov=len(c))
    if (sol.status == "non_finite" or sol.on_boundary or not np.isfinite(sol.q_value)
            or truncated(sol, len(c))):  # a solve cut short by the Krylov memory bound
        return float("inf"), sol.n_hvp
    if c_other is None:
        return -float(sol.q_value), sol.n_hvp
    # sol.s = −B⁻¹c, so ½ c_otherᵀB⁻¹c = −½ c_otherᵀ s
    return -0.5 * float(c_other @ sol.s), sol.n_hvp
