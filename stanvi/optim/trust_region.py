"""What the operator-based trust-region solvers share (Steihaug, GLTR, subspace reuse;
docs/algorithms.md#trust-region-subproblem): the result type :class:`TRResult`, the problem's
validation, the trivial results, and the pieces a trust-region method builds on them: the dense
solve through an operator (:func:`solve_dense_operator`), a scaled (ellipsoidal) trust region
(:func:`scaled_problem`, Conn, Gould & Toint 2000, §6.7) and the Newton gain a solve's Krylov
model predicts (:func:`newton_gain`).

All solvers minimize ``q(s) = cᵀs + ½ sᵀBs`` s.t. ``‖s‖ ≤ δ``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stanvi.optim.dense_tr import solve_dense_tr, solve_eigen_tr
from stanvi.optim.norms import norm


#: The radius of a solve that wants the Newton step itself ("no trust region"): far beyond any
#: step of a posterior in q-sd or parameter units, and with δ² (1e24) far from overflow — a
#: radius of 1e300 made the dense solver's products overflow ("RuntimeWarning: overflow
#: encountered in dot" on 5 of 15 public models, issue T3-1).
NEWTON_RADIUS = 1e12


class TRResult(NamedTuple):
    """Approximate solution of ``min q(s) = cᵀs + ½ sᵀBs`` s.t. ``‖s‖ ≤ δ``
    (docs/algorithms.md#trust-region-subproblem).

    ``s``: the step; ``q_value``: ``q(s)`` (≤ 0; the TrustVI model improvement is
    ``m' = −q_value``), exact from quantities already computed (no extra HVP); ``n_hvp``: number
    of operator applications ``v ↦ Bv`` spent; ``on_boundary``: the step lies on the trust-region
    boundary; ``hard_case``: the (reduced) dense solve hit the hard case
    (docs/algorithms.md#gltr); ``Q`` (n×j) and ``T`` (j×j, ``= QᵀBQ``): the orthonormal Krylov
    basis and projected matrix, kept for subspace reuse (docs/algorithms.md#hessian-reuse),
    ``None`` for Steihaug; ``status``: ``"converged"`` (interior, residual test met),
    ``"boundary"`` (converged/terminated on the boundary), ``"max_iter"``, ``"breakdown"``
    (invariant Krylov subspace) or ``"non_finite"`` (an operator result was not finite:
    ``s = 0``, ``q_value = nan``; the caller must reject the step, docs/algorithms.md#non-finite).
    """

    s: np.ndarray
    q_value: float
    n_hvp: int
    on_boundary: bool
    hard_case: bool
    Q: np.ndarray | None
    T: np.ndarray | None
    status: str


def validated_problem(c, delta) -> tuple[np.ndarray, float, int, float]:
    """(c as float array, δ, n, ‖c‖) for an operator trust-region solve; δ must be positive."""
    c = np.asarray(c, dtype=float)
    delta = float(delta)
    if not delta > 0:
        raise ValueError(f"delta must be positive, got {delta}")
    return c, delta, c.shape[0], norm(c)


def zero_step_result(n: int, Q: np.ndarray | None = None,
                     T: np.ndarray | None = None) -> TRResult:
    """Result for ``c = 0``: ``s = 0``, ``q = 0``, no operator applications."""
    return TRResult(np.zeros(n), 0.0, 0, False, False, Q, T, "converged")


def non_finite_result(n: int, n_hvp: int) -> TRResult:
    """Result after a non-finite operator application: reject the step
    (docs/algorithms.md#non-finite)."""
    return TRResult(np.zeros(n), float("nan"), n_hvp, False, False, None, None, "non_finite")


def solve_dense_operator(hvp, c: np.ndarray, delta: float) -> TRResult:
    """Form B column by column (P operator applications) and solve exactly (docs/algorithms.md#dense-tr); for
    small problems and tests.  Returns a GLTR-like result without a reusable basis."""
    p = len(c)
    cols = [hvp(e) for e in np.eye(p)]
    B = np.column_stack(cols)
    if not np.all(np.isfinite(B)):
        return TRResult(np.zeros(p), float("nan"), p, False, False, None, None, "non_finite")
    B = 0.5 * (B + B.T)
    return _exact_result(solve_dense_tr(B, c, delta), p)


def _exact_result(r, n_hvp: int) -> TRResult:
    """A dense solver's :class:`~stanvi.optim.dense_tr.DenseTRResult` as a :class:`TRResult`
    (no reusable basis; ``"converged"`` when interior, else ``"boundary"``)."""
    return TRResult(r.h, float(r.q_value), n_hvp, not r.interior, r.hard_case, None, None,
                    "converged" if r.interior else "boundary")


class MatrixModel:
    """A trust-region model whose B is a small dense matrix: applied as an operator (a
    matrix-vector product), and solved exactly (:meth:`solve`) from one eigendecomposition that
    every solve with this B shares (docs/algorithms.md#dense-tr).  Below a few dozen
    parameters one ``eigh`` costs less than GLTR's Lanczos iterations, each of which solves a
    small dense problem of its own (docs/benchmarks.md#dense-model-solve)."""

    def __init__(self, matrix: np.ndarray):
        self.matrix = matrix
        self._eigen: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return self.matrix.dot(v)

    def solve(self, c: np.ndarray, delta: float) -> TRResult:
        """The global minimizer of ``cᵀs + ½ sᵀBs`` over ``‖s‖ ≤ δ``; no operator
        applications (``n_hvp = 0``), status ``"converged"`` (interior) or ``"boundary"``, or
        ``"non_finite"`` when B or c is not finite."""
        c, delta, n, _ = validated_problem(c, delta)
        if self._eigen is None:
            if not (np.isfinite(self.matrix).all() and np.isfinite(c).all()):
                return non_finite_result(n, 0)
            self._eigen = np.linalg.eigh(0.5 * (self.matrix + self.matrix.T))
        elif not np.isfinite(c).all():
            return non_finite_result(n, 0)
        return _exact_result(solve_eigen_tr(self._eigen, c, delta), 0)


def scaled_problem(neg_hvp, c: np.ndarray, scale: np.ndarray | None):
    """The subproblem in the variables t = scale ⊙ s, so that the Euclidean ball ‖t‖ ≤ δ is the
    ellipsoid ‖scale ⊙ s‖ ≤ δ (a scaled trust region, Conn, Gould & Toint 2000, §6.7): gradient
    c/scale, operator v ↦ B(v/scale)/scale.  The model values are the same in both variables."""
    if scale is None:
        return neg_hvp, c
    return (lambda v: neg_hvp(v / scale) / scale), c / scale


def newton_gain(sol: TRResult, c: np.ndarray, m_prime: float) -> float:
    """The gain ``½ bᵀT⁻¹b`` (``b = Qᵀc``) the quadratic model predicts for its unconstrained
    minimizer over the solver's Krylov subspace: ``m'`` itself for an interior solution, ``inf``
    when the model is not concave there or no basis is available (Steihaug, dense)."""
    if sol.status == "non_finite" or not np.isfinite(m_prime):
        return float("inf")
    if not sol.on_boundary:
        return m_prime
    if sol.Q is None or sol.T is None or sol.T.size == 0:
        return float("inf")
    b = sol.Q.T @ c
    try:
        chol = np.linalg.cholesky(0.5 * (sol.T + sol.T.T))
    except np.linalg.LinAlgError:
        return float("inf")
    y = np.linalg.solve(chol, b)
    gain = 0.5 * float(y @ y)
    return gain if np.isfinite(gain) else float("inf")
