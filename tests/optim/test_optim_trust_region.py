"""Trust-region subproblem solvers (docs/algorithms.md#trust-region-subproblem, #steihaug, #gltr,
#dense-tr and #hessian-reuse; Regier, Jordan & McAuliffe 2017, §3.2).

Problems are ``min q(s) = cᵀs + ½ sᵀBs, ‖s‖ ≤ δ`` with small dense B, given to the operator
solvers only through a counting HVP wrapper. The dense Moré–Sorensen solver is itself checked
against the global-optimality (KKT) conditions of the trust-region subproblem and against an
exhaustive search in 2-d, and then serves as the reference.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from stanvi.optim import (MatrixModel, solve_dense_tr, solve_gltr, solve_steihaug,
                          solve_subspace_reuse, tr_model_value)

BOUND = 1 + 1e-10
TIGHT = dict(tol_interior=1e-12, tol_boundary=1e-12)


class CountingOperator:
    """``v ↦ Bv`` that counts its applications (optionally poisoned from a given call on)."""

    def __init__(self, B: np.ndarray, nan_from_call: int | None = None, bad_value=np.nan):
        self.B = B
        self.calls = 0
        self.nan_from_call = nan_from_call
        self.bad_value = bad_value

    def __call__(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        out = self.B @ v
        if self.nan_from_call is not None and self.calls >= self.nan_from_call:
            out = out.copy()
            out[0] = self.bad_value
        return out


def seed_of(*key) -> int:
    """Deterministic seed (``hash`` of strings is randomized per process)."""
    return zlib.crc32(repr(key).encode())


def q_of(B, c, s):
    return float(c @ s + 0.5 * s @ B @ s)


def cauchy_value(B, c, delta):
    """``min q(−t c)`` over ``0 ≤ t ≤ δ/‖c‖`` (the Cauchy point's model value)."""
    cn = np.linalg.norm(c)
    if cn == 0:
        return 0.0
    kappa = c @ B @ c
    t_max = delta / cn
    t = t_max if kappa <= 0 else min(cn * cn / kappa, t_max)
    return q_of(B, c, -t * c)


def random_problem(rng, n, kind):
    """``(B, c)``: kind in {"pd", "indefinite", "negdef", "hard", "nearhard", "illcond"}."""
    V, _ = np.linalg.qr(rng.normal(size=(n, n)))
    if kind == "pd":
        lam = rng.uniform(0.1, 5.0, n)
    elif kind == "illcond":
        lam = np.logspace(-3, 2, n)
    elif kind == "indefinite":
        lam = rng.uniform(-3.0, 3.0, n)
        lam[0] = -abs(lam[0]) - 0.5
    elif kind == "negdef":
        lam = -rng.uniform(0.1, 5.0, n)
    elif kind in ("hard", "nearhard"):
        lam = np.sort(rng.uniform(0.5, 4.0, n))
        lam[0] = -1.0
    else:
        raise ValueError(kind)
    lam = np.sort(lam)
    B = (V * lam) @ V.T
    B = 0.5 * (B + B.T)
    ct = rng.normal(size=n)
    if kind == "hard":
        ct[0] = 0.0
    elif kind == "nearhard":
        ct[0] = 1e-3
    return B, V @ ct, lam, V


def check_kkt(T, b, delta, res, tol=1e-8):
    """Global optimality of the trust-region subproblem (Nocedal & Wright Thm. 4.1)."""
    h, nu = res.h, res.multiplier
    scale = max(np.linalg.norm(T, 2), np.linalg.norm(b) / delta, 1e-300)
    assert nu >= 0
    assert np.linalg.norm(h) <= delta * BOUND
    resid = (T + nu * np.eye(len(b))) @ h + b
    assert np.linalg.norm(resid) <= tol * (scale * delta + np.linalg.norm(b))
    assert nu * (delta - np.linalg.norm(h)) <= tol * scale * delta
    assert np.linalg.eigvalsh(T)[0] + nu >= -tol * scale
    assert res.q_value == pytest.approx(tr_model_value(b, T, h), rel=1e-10, abs=1e-14)


# --------------------------------------------------------------------------------------------
# dense reference solver (Moré & Sorensen 1983; docs/algorithms.md#dense-tr)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pd", "illcond", "indefinite", "negdef", "hard", "nearhard"])
@pytest.mark.parametrize("delta", [1e-6, 0.3, 2.0, 1e6])
def test_dense_solver_satisfies_global_optimality_conditions(kind, delta):
    rng = np.random.default_rng(seed_of(kind, delta))
    for n in (1, 4, 9):
        B, c, _, _ = random_problem(rng, n, kind)
        res = solve_dense_tr(B, c, delta)
        check_kkt(B, c, delta, res)
        assert res.q_value <= cauchy_value(B, c, delta) + 1e-12 * abs(cauchy_value(B, c, delta))
        if kind == "pd" and delta == 1e6:
            assert res.interior and res.multiplier == 0.0
            np.testing.assert_allclose(res.h, -np.linalg.solve(B, c), rtol=1e-10, atol=1e-12)
        if kind == "negdef":
            assert not res.interior


def test_dense_solver_matches_exhaustive_search_in_2d():
    rng = np.random.default_rng(7)
    theta = np.linspace(0.0, 2 * np.pi, 200_001)
    circle = np.stack([np.cos(theta), np.sin(theta)], axis=1)
    for _ in range(20):
        A = rng.normal(size=(2, 2))
        T = A + A.T
        b = rng.normal(size=2)
        delta = float(np.exp(rng.uniform(-2, 2)))
        res = solve_dense_tr(T, b, delta)
        pts = delta * circle
        q_circle = pts @ b + 0.5 * np.einsum("ij,jk,ik->i", pts, T, pts)
        best = q_circle.min()
        if np.all(np.linalg.eigvalsh(T) > 0):
            newton = -np.linalg.solve(T, b)
            if np.linalg.norm(newton) <= delta:
                best = min(best, tr_model_value(b, T, newton))
        assert res.q_value <= best + 1e-12 * abs(best)
        assert res.q_value >= best - 1e-6 * abs(best)  # grid resolution


def test_dense_hard_case_is_flagged_and_reaches_the_boundary():
    lam = np.array([-2.0, -2.0, 1.0, 3.0])  # double bottom eigenvalue, b ⊥ its eigenspace
    T = np.diag(lam)
    b = np.array([0.0, 0.0, 1.0, 3.0])
    delta = 5.0  # ‖h(−λ₁)‖ = ‖(1/3, 3/5)‖ < δ
    res = solve_dense_tr(T, b, delta)
    assert res.hard_case and not res.interior
    assert res.multiplier == pytest.approx(2.0)
    assert np.linalg.norm(res.h) == pytest.approx(delta, rel=1e-12)
    np.testing.assert_allclose(res.h[2:], [-1 / 3, -3 / 5], rtol=1e-12)
    check_kkt(T, b, delta, res)
    # small radius: not the hard case any more (‖h(−λ₁)‖ > δ)
    res_small = solve_dense_tr(T, b, 0.1)
    assert not res_small.hard_case
    check_kkt(T, b, 0.1, res_small)


def test_dense_zero_gradient():
    assert solve_dense_tr(np.eye(3), np.zeros(3), 1.0).q_value == 0.0
    res = solve_dense_tr(-np.eye(3), np.zeros(3), 2.0)  # pure negative curvature
    assert res.q_value == pytest.approx(-2.0) and np.linalg.norm(res.h) == pytest.approx(2.0)


# --------------------------------------------------------------------------------------------
# Steihaug (Nocedal & Wright 2006, Alg. 7.2) and GLTR (Gould et al. 1999) vs the dense reference
# --------------------------------------------------------------------------------------------

CASES = [(kind, delta) for kind in ("pd", "illcond", "indefinite", "negdef", "nearhard")
         for delta in (1e-5, 0.1, 1.0, 10.0, 1e5)]


@pytest.mark.parametrize("kind,delta", CASES)
def test_operator_solvers_constraint_decrease_and_optimality(kind, delta):
    rng = np.random.default_rng(seed_of(kind, delta, "ops"))
    for n in (3, 10, 25):
        B, c, _, _ = random_problem(rng, n, kind)
        ref = solve_dense_tr(B, c, delta)
        q_cauchy = cauchy_value(B, c, delta)
        eps = 1e-12 * max(abs(ref.q_value), 1e-300)
        assert q_cauchy <= 0

        results = {}
        for name, solver, kwargs in [("steihaug", solve_steihaug, {}),
                                     ("gltr", solve_gltr, {}),
                                     ("gltr_tight", solve_gltr, TIGHT)]:
            op = CountingOperator(B)
            res = solver(op, c, delta, **kwargs)
            results[name] = res
            assert res.status != "non_finite"
            assert res.n_hvp == op.calls  # honest operator count
            assert np.linalg.norm(res.s) <= delta * BOUND
            assert res.q_value <= q_cauchy + eps  # Cauchy decrease
            assert res.q_value >= ref.q_value - eps - 1e-10 * abs(ref.q_value)  # ≥ global min
            # m' = −q is exactly the directly recomputed model value (test-only extra HVP)
            assert res.q_value == pytest.approx(q_of(B, c, res.s), rel=1e-9, abs=1e-13)

        # GLTR with tight tolerances reaches the global optimum (nearhard: c has a small
        # component along the bottom eigenvector, so the Krylov space finds it)
        assert results["gltr_tight"].q_value == pytest.approx(ref.q_value, rel=1e-8)
        # GLTR (same interior tolerance) is never worse than Steihaug (up to the rounding of the
        # tracked model values, ~ eps·cond(B)·|q|)
        assert results["steihaug"].q_value >= results["gltr"].q_value - 1e-10 * abs(ref.q_value)
        assert results["gltr"].Q.shape == (n, results["gltr"].n_hvp)


@pytest.mark.parametrize("kind", ["pd", "illcond", "indefinite", "negdef", "hard", "nearhard"])
def test_matrix_model_solves_exactly_from_one_shared_eigendecomposition(kind, monkeypatch):
    """Every solve with one MatrixModel equals the dense solver's on the same (B, c, δ), costs
    no operator application, and the eigendecomposition is computed once for all of them."""
    rng = np.random.default_rng(seed_of(kind, "matrix-model"))
    B, c, _, _ = random_problem(rng, 12, kind)
    calls = []
    eigh = np.linalg.eigh
    monkeypatch.setattr(np.linalg, "eigh", lambda a: calls.append(1) or eigh(a))
    model = MatrixModel(B)
    np.testing.assert_allclose(model(c), B @ c)
    for rhs, delta in ((c, 0.3), (c, 1e6), (-2.0 * c, 2.0), (rng.normal(size=12), 1.0)):
        res = model.solve(rhs, delta)
        with monkeypatch.context() as m:
            m.setattr(np.linalg, "eigh", eigh)
            ref = solve_dense_tr(B, rhs, delta)
        np.testing.assert_allclose(res.s, ref.h, rtol=1e-12, atol=1e-14)
        assert res.q_value == pytest.approx(ref.q_value, rel=1e-12)
        assert res.on_boundary == (not ref.interior) and res.hard_case == ref.hard_case
        assert res.status == ("boundary" if res.on_boundary else "converged")
        assert res.n_hvp == 0
    assert len(calls) == 1


def test_matrix_model_with_non_finite_entries_is_a_non_finite_result():
    B = np.eye(3)
    B[1, 2] = B[2, 1] = np.inf
    res = MatrixModel(B).solve(np.ones(3), 1.0)
    assert res.status == "non_finite" and not np.isfinite(res.q_value)
    assert np.array_equal(res.s, np.zeros(3))
    res = MatrixModel(np.eye(3)).solve(np.array([1.0, np.nan, 0.0]), 1.0)
    assert res.status == "non_finite"


@pytest.mark.parametrize("n", [5, 30])
def test_pd_large_radius_gives_newton_step_to_residual_tolerance(n):
    rng = np.random.default_rng(n)
    B, c, _, _ = random_problem(rng, n, "pd")
    newton = -np.linalg.solve(B, c)
    for solver, tol in [(solve_gltr, 1e-2), (solve_steihaug, 1e-2)]:
        res = solver(CountingOperator(B), c, 1e8)
        assert not res.on_boundary and res.status == "converged"
        assert np.linalg.norm(B @ res.s + c) <= tol * np.linalg.norm(c)
    res = solve_gltr(CountingOperator(B), c, 1e8, tol_interior=1e-10)
    assert np.linalg.norm(B @ res.s + c) <= 1e-10 * np.linalg.norm(c)
    np.testing.assert_allclose(res.s, newton, rtol=1e-8)
    res = solve_steihaug(CountingOperator(B), c, 1e8, tol=1e-10, max_iter=10 * n)
    np.testing.assert_allclose(res.s, newton, rtol=1e-8)


def test_gltr_agrees_with_cg_while_interior_and_beats_steihaug_on_boundary():
    rng = np.random.default_rng(11)
    B, c, _, _ = random_problem(rng, 20, "indefinite")
    st = solve_steihaug(CountingOperator(B), c, 3.0)
    gl = solve_gltr(CountingOperator(B), c, 3.0)
    assert st.on_boundary and gl.on_boundary
    assert gl.q_value < st.q_value - 1e-6  # uses negative curvature properly


def test_gltr_hard_case_returns_reduced_space_minimizer():
    # c ⊥ bottom eigenvector: the Krylov space never sees it (exact hard case). GLTR returns the
    # minimizer over the invariant Krylov space, here the complement of the bottom eigenvector.
    rng = np.random.default_rng(3)
    n = 8
    B, c, lam, V = random_problem(rng, n, "hard")
    delta = 50.0
    res = solve_gltr(CountingOperator(B), c, delta, **TIGHT)
    W = V[:, 1:]
    restricted = solve_dense_tr(W.T @ B @ W, W.T @ c, delta)
    assert res.q_value == pytest.approx(restricted.q_value, rel=1e-8)
    assert res.n_hvp <= n - 1
    assert res.q_value <= cauchy_value(B, c, delta)
    st = solve_steihaug(CountingOperator(B), c, delta)
    assert st.q_value >= res.q_value - 1e-12 * abs(res.q_value)
    # the dense solver on the full problem does find the global (hard-case) solution
    full = solve_dense_tr(B, c, delta)
    assert full.hard_case and full.q_value < res.q_value


def test_max_krylov_and_statuses():
    rng = np.random.default_rng(5)
    B, c, _, _ = random_problem(rng, 30, "illcond")
    op = CountingOperator(B)
    res = solve_gltr(op, c, 1e6, tol_interior=1e-14, max_krylov=4)
    assert res.status == "max_iter" and res.n_hvp == op.calls == 4
    assert res.Q.shape == (30, 4) and res.T.shape == (4, 4)
    np.testing.assert_allclose(res.Q.T @ res.Q, np.eye(4), atol=1e-12)
    np.testing.assert_allclose(res.T, res.Q.T @ B @ res.Q, atol=1e-10)
    op = CountingOperator(B)
    res = solve_steihaug(op, c, 1e6, tol=1e-14, max_iter=3)
    assert res.status == "max_iter" and res.n_hvp == op.calls == 3
    # after the boundary is reached GLTR stops within max_lanczos_after_boundary iterations
    B2, c2, _, _ = random_problem(rng, 30, "indefinite")
    op = CountingOperator(B2)
    res = solve_gltr(op, c2, 0.5, tol_boundary=1e-14, max_lanczos_after_boundary=2)
    assert res.on_boundary and res.status == "max_iter" and res.n_hvp <= 3


def test_breakdown_on_invariant_krylov_space():
    B = np.diag([1.0, 2.0, 3.0, 4.0])
    c = np.array([1.0, 1.0, 0.0, 0.0])  # Krylov space = span(e1, e2)
    op = CountingOperator(B)
    res = solve_gltr(op, c, 100.0, tol_interior=0.0)
    assert res.status == "breakdown" and res.n_hvp == op.calls == 2
    np.testing.assert_allclose(res.s, [-1.0, -0.5, 0.0, 0.0], atol=1e-12)


def test_zero_gradient_costs_nothing():
    for solver in (solve_steihaug, solve_gltr):
        op = CountingOperator(np.eye(4))
        res = solver(op, np.zeros(4), 1.0)
        assert op.calls == 0 and res.n_hvp == 0 and res.q_value == 0.0
        assert not np.any(res.s)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("at_call", [1, 3])
def test_non_finite_operator_result_stops_at_once(bad, at_call):
    rng = np.random.default_rng(0)
    B, c, _, _ = random_problem(rng, 10, "illcond")
    for solver in (solve_steihaug, solve_gltr):
        op = CountingOperator(B, nan_from_call=at_call, bad_value=bad)
        res = solver(op, c, 1e3, **({"tol": 1e-12} if solver is solve_steihaug else TIGHT))
        assert res.status == "non_finite"
        assert np.isnan(res.q_value) and not np.any(res.s)
        assert res.n_hvp == op.calls == at_call
    gl = solve_gltr(CountingOperator(B), c, 1e3, max_krylov=3)
    op = CountingOperator(B, nan_from_call=1, bad_value=bad)
    res = solve_subspace_reuse(op, rng.normal(size=10), 1e3, gl.Q, gl.T)
    assert res.status == "non_finite" and np.isnan(res.q_value) and res.n_hvp == op.calls == 1


# --------------------------------------------------------------------------------------------
# subspace Hessian reuse spends exactly 1 HVP (docs/algorithms.md#hessian-reuse)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["pd", "indefinite", "negdef"])
@pytest.mark.parametrize("delta", [1e-3, 0.5, 1e3])
def test_subspace_reuse_one_hvp_cauchy_decrease(kind, delta):
    rng = np.random.default_rng(seed_of(kind, delta, "reuse"))
    n = 15
    B, c1, _, _ = random_problem(rng, n, kind)
    first = solve_gltr(CountingOperator(B), c1, delta)
    Q, T = first.Q, first.T
    for _ in range(2):  # two consecutive reuses
        c2 = rng.normal(size=n)
        op = CountingOperator(B)
        res = solve_subspace_reuse(op, c2, delta, Q, T)
        assert res.n_hvp == op.calls == 1
        assert res.Q.shape == (n, Q.shape[1] + 1) and res.T.shape == (Q.shape[1] + 1,) * 2
        np.testing.assert_allclose(res.Q.T @ res.Q, np.eye(res.Q.shape[1]), atol=1e-12)
        np.testing.assert_allclose(res.T, res.Q.T @ B @ res.Q, atol=1e-10)
        assert np.linalg.norm(res.s) <= delta * BOUND
        qc = cauchy_value(B, c2, delta)
        assert res.q_value <= qc + 1e-12 * abs(qc)
        assert res.q_value == pytest.approx(q_of(B, c2, res.s), rel=1e-9, abs=1e-14)
        # it is the exact minimizer over span(Q⁺)
        sub = solve_dense_tr(res.Q.T @ B @ res.Q, res.Q.T @ c2, delta)
        assert res.q_value == pytest.approx(sub.q_value, rel=1e-8, abs=1e-14)
        Q, T = res.Q, res.T


def test_subspace_reuse_skips_direction_already_in_span():
    rng = np.random.default_rng(2)
    B, c1, _, _ = random_problem(rng, 12, "indefinite")
    first = solve_gltr(CountingOperator(B), c1, 1.0, **TIGHT, max_krylov=5)
    assert first.Q.shape == (12, 5)
    c2 = first.Q @ rng.normal(size=5)  # lies in span(Q)
    op = CountingOperator(B)
    res = solve_subspace_reuse(op, c2, 1.0, first.Q, first.T)
    assert res.n_hvp == op.calls == 0
    assert res.Q.shape == first.Q.shape
    assert res.q_value <= cauchy_value(B, c2, 1.0) + 1e-12
    assert res.q_value == pytest.approx(q_of(B, c2, res.s), rel=1e-9)


def test_subspace_reuse_without_basis_is_the_cauchy_step():
    rng = np.random.default_rng(4)
    B, c, _, _ = random_problem(rng, 6, "indefinite")
    op = CountingOperator(B)
    res = solve_subspace_reuse(op, c, 0.7, None, None)
    assert res.n_hvp == op.calls == 1
    assert res.q_value == pytest.approx(cauchy_value(B, c, 0.7), rel=1e-12)


def test_newton_radius_solves_an_indefinite_model_without_overflow():
    """The 'no trust region' radius of the Newton solves (refinement, certification) used to be
    1e300: on a model that is not concave the boundary step then overflowed
    (``RuntimeWarning: overflow encountered in dot``, seen on 5 of 15 public posteriors; issue
    T3-1).  NEWTON_RADIUS gives a finite boundary solution, and no warning."""
    import warnings

    from stanvi.optim.gltr import solve_gltr
    from stanvi.optim.trust_region import NEWTON_RADIUS

    rng = np.random.default_rng(0)
    n = 10
    Q, _ = np.linalg.qr(rng.normal(size=(n, n)))
    B = Q @ np.diag(np.linspace(-1.0, 5.0, n)) @ Q.T
    c = rng.normal(size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sol = solve_gltr(lambda v: B @ v, c, NEWTON_RADIUS, tol_interior=1e-4, tol_boundary=1e-4,
                         max_krylov=2 * n)
    assert sol.on_boundary and np.isfinite(sol.q_value)
    assert np.linalg.norm(sol.s) == pytest.approx(NEWTON_RADIUS)
