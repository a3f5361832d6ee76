"""ELBO-change sample sizes (Regier, Jordan & McAuliffe 2017, §3.3.1: Inequalities 11 and 13,
Eq. 12; docs/algorithms.md#sample-size and #trustvi-constants)."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest

from stanvi.optim.sample_size import (N_INFINITE, ineq11_sup, ineq11_sup_closed_form, n_ineq11,
                                      n_ineq11_closed_form, n_ineq13, reference_code_update,
                                      retrospective_update,
                                      tau_constants)

TAU1, TAU2 = tau_constants()
ETA = 0.25


def brute_force_sup(sigma2, m_prime, delta, *, tau1=TAU1, tau2=TAU2, eta=ETA, factor=2.0):
    """``max R`` on a fine log-spaced grid of offsets ``y − y_lo`` (independent of ψ)."""
    A, B, C = eta * m_prime, tau2 * delta**2, tau1 * delta**2
    y_lo = max(-A / 2, -B)
    scale = A + B + C
    off = np.logspace(-13, 5, 400_001) * scale
    y = y_lo + off
    R = factor * sigma2 * np.log((B + y) / C) / (A + y) ** 2
    return float(np.max(R))


def test_tau_constants_defaults():
    tau1, tau2 = tau_constants()
    assert tau1 == pytest.approx(3.749, abs=1e-12)
    assert tau2 == pytest.approx(18.75, abs=1e-12)
    assert tau_constants(alpha=5, gamma=2, lam=2) == pytest.approx((1.75, 18.75))
    with pytest.raises(ValueError):
        tau_constants(alpha=1e-3, gamma=2, lam=1e-3)  # α below λ/(1 − γ⁻²)


# (sigma2, m_prime, delta, expected branch)
BRANCH_CASES = [
    (1.0, 10.0, 0.1, "root"),       # B ≤ A/2: y_lo = −B, ψ(−B⁺) = A − B > 0
    (3.0, 120.0, 1.0, "root"),      # y_lo = −A/2 with ψ(y_lo) > 0
    (0.5, 0.04, 1.0, "boundary"),   # A ≪ B: ψ(y_lo) ≈ −2B log(τ2/τ1) < 0
    (2.0, 1e-3, 0.05, "boundary"),
    (7.0, 1e3, 3.0, "root"),
]


@pytest.mark.parametrize("sigma2,m_prime,delta,branch", BRANCH_CASES)
def test_ineq11_matches_brute_force_and_closed_form(sigma2, m_prime, delta, branch):
    res = ineq11_sup(sigma2, m_prime, delta, tau1=TAU1, tau2=TAU2)
    assert res.branch == branch
    brute = brute_force_sup(sigma2, m_prime, delta)
    assert res.value == pytest.approx(brute, rel=1e-6)
    assert res.value >= brute * (1 - 1e-12)  # the grid cannot beat the supremum
    closed = ineq11_sup_closed_form(sigma2, m_prime, delta, tau1=TAU1, tau2=TAU2)
    assert closed.branch == branch
    assert res.value == pytest.approx(closed.value, rel=1e-10)
    assert res.y_star == pytest.approx(closed.y_star, rel=1e-8, abs=1e-10 * delta**2)
    assert n_ineq11(sigma2, m_prime, delta, tau1=TAU1, tau2=TAU2) == \
        n_ineq11_closed_form(sigma2, m_prime, delta, tau1=TAU1, tau2=TAU2) == \
        math.ceil(max(0.0, res.value))


def test_ineq11_random_problems_exercise_both_branches():
    rng = np.random.default_rng(1)
    branches = set()
    for _ in range(40):
        sigma2 = float(np.exp(rng.uniform(-4, 4)))
        m_prime = float(np.exp(rng.uniform(-8, 8)))
        delta = float(np.exp(rng.uniform(-4, 2)))
        tau1, tau2 = tau_constants(alpha=float(np.exp(rng.uniform(-1, 3))), lam=1e-3)
        res = ineq11_sup(sigma2, m_prime, delta, tau1=tau1, tau2=tau2)
        branches.add(res.branch)
        closed = ineq11_sup_closed_form(sigma2, m_prime, delta, tau1=tau1, tau2=tau2)
        assert res.branch == closed.branch
        assert res.value == pytest.approx(closed.value, rel=1e-9)
        brute = brute_force_sup(sigma2, m_prime, delta, tau1=tau1, tau2=tau2)
        assert res.value == pytest.approx(brute, rel=1e-6)
    assert branches == {"root", "boundary"}


def test_ineq11_factor_two_profile():
    full = ineq11_sup(2.0, 3.0, 0.5, tau1=TAU1, tau2=TAU2)
    half = ineq11_sup(2.0, 3.0, 0.5, tau1=TAU1, tau2=TAU2, factor_two=False)
    assert half.value == pytest.approx(full.value / 2, rel=1e-12)
    assert half.y_star == pytest.approx(full.y_star, rel=1e-9)


def test_ineq11_monotone_in_sigma2_and_m_prime():
    for delta in (0.01, 0.3, 2.0):
        for m_prime in (1e-4, 0.1, 5.0, 1e3):
            values = [ineq11_sup(s2, m_prime, delta, tau1=TAU1, tau2=TAU2).value
                      for s2 in np.logspace(-3, 3, 25)]
            assert np.all(np.diff(values) >= 0)
            ns = [n_ineq11(s2, m_prime, delta, tau1=TAU1, tau2=TAU2)
                  for s2 in np.logspace(-3, 3, 25)]
            assert np.all(np.diff(ns) >= 0)
        m_grid = np.logspace(-5, 4, 60)
        values = [ineq11_sup(1.5, m, delta, tau1=TAU1, tau2=TAU2).value for m in m_grid]
        assert np.all(np.diff(values) <= 1e-12 * np.abs(values[:-1]))
        ns = [n_ineq11(1.5, m, delta, tau1=TAU1, tau2=TAU2) for m in m_grid]
        assert np.all(np.diff(ns) <= 0)


def test_ineq11_finite_whenever_A_positive_and_degenerate_inputs():
    for m_prime in (1e-12, 1e-3, 1.0, 1e12):
        for delta in (1e-4, 1.0, 1e4):
            res = ineq11_sup(1.0, m_prime, delta, tau1=TAU1, tau2=TAU2)
            assert np.isfinite(res.value)
            n = n_ineq11(1.0, m_prime, delta, tau1=TAU1, tau2=TAU2)
            assert isinstance(n, int) and 0 <= n <= sys.maxsize
    assert n_ineq11(0.0, 1.0, 1.0, tau1=TAU1, tau2=TAU2) == 0
    assert n_ineq11(1.0, 0.0, 1.0, tau1=TAU1, tau2=TAU2) == N_INFINITE
    assert n_ineq11(1.0, -1.0, 1.0, tau1=TAU1, tau2=TAU2) == N_INFINITE
    assert n_ineq11(np.nan, 1.0, 1.0, tau1=TAU1, tau2=TAU2) == N_INFINITE
    with pytest.raises(ValueError):
        ineq11_sup(1.0, 0.0, 1.0, tau1=TAU1, tau2=TAU2)


def test_ineq11_typical_value():
    # σ² = 1, m' = 1, δ = 0.1: A = 0.25, B = 0.1875, C = 0.03749 → y_lo = −0.125 (boundary?
    # ψ(y_lo) = 0.125 − 2·0.0625·log(1.667) > 0 → root branch)
    res = ineq11_sup(1.0, 1.0, 0.1, tau1=TAU1, tau2=TAU2)
    assert res.branch == "root"
    A, B, C = 0.25, 0.1875, 0.03749
    y = res.y_star
    assert (A + y) - 2 * (B + y) * math.log((B + y) / C) == pytest.approx(0.0, abs=1e-9)
    assert res.value == pytest.approx(2 * math.log((B + y) / C) / (A + y) ** 2, rel=1e-12)


def test_ineq13_closed_form():
    # −2·2·log(0.3) / (0.25·3·0.01) = 642.119 → 643
    assert n_ineq13(2.0, 3.0, 0.1) == 643
    rng = np.random.default_rng(0)
    for _ in range(20):
        s2, g2, d = np.exp(rng.uniform(-3, 3, 3))
        z1, nu1 = rng.uniform(0.55, 0.95), rng.uniform(0.1, 0.7)
        expected = math.ceil(-2 * s2 * math.log(1 - z1) / (nu1**2 * g2 * d**2))
        assert n_ineq13(s2, g2, d, zeta1=z1, nu1=nu1) == expected
    assert n_ineq13(1.0, 0.0, 1.0) == sys.maxsize
    assert n_ineq13(1.0, -0.5, 1.0) == sys.maxsize
    assert n_ineq13(0.0, 1.0, 1.0) == 0
    # monotone: more variance or a smaller gradient/radius needs more samples
    assert n_ineq13(2.0, 1.0, 0.1) >= n_ineq13(1.0, 1.0, 0.1) >= n_ineq13(1.0, 2.0, 0.1)
    assert n_ineq13(1.0, 1.0, 0.05) >= n_ineq13(1.0, 1.0, 0.1)


@pytest.mark.parametrize("N_k,N_star,n_g,N_max,expected", [
    (128, 200, 256, 4096, 256),     # N* > N_k → double
    (2048, 3000, 256, 4096, 4096),  # double, reaching N_max
    (4096, 10**6, 256, 4096, 4096),  # capped at N_max
    (3000, 3001, 256, 4096, 4096),  # min(2N_k, N_max)
    (512, 100, 256, 4096, 256),     # N_k > n_g and N_k > 2N* → halve
    (512, 256, 256, 4096, 512),     # N_k = 2N*: keep
    (512, 300, 256, 4096, 512),     # N_k < 2N*: keep
    (256, 10, 256, 4096, 256),      # N_k = n_g: keep (not > n_g)
    (256, 10, 512, 4096, 256),      # N_k < n_g: keep
    (128, 128, 256, 4096, 128),     # N* = N_k: keep
    (0, 1000, 256, 4096, 0),        # λ-test rejection (no assessment draws): unchanged
    (512, None, 256, 4096, 512),    # aborted assessment: unchanged
])
def test_retrospective_update(N_k, N_star, n_g, N_max, expected):
    assert retrospective_update(N_k, N_star, n_g, N_max) == expected


@pytest.mark.parametrize("N_k, N_star, N_min, N_max, expected", [
    (128, 200, 128, 4096, 256),     # N* > N_k → double
    (4096, 10**6, 128, 4096, 4096),  # capped at N_max
    (512, 255, 128, 4096, 256),     # N* < N_k/2 → halve (no condition on the gradient batch)
    (512, 256, 128, 4096, 512),     # N* = N_k/2: keep
    (256, 10, 128, 4096, 128),      # halve
    (128, 10, 128, 4096, 128),      # floor N_min
    (0, 1000, 128, 4096, 0),        # nothing assessed: unchanged
    (512, None, 128, 4096, 512),    # aborted assessment: unchanged
])
def test_reference_code_update(N_k, N_star, N_min, N_max, expected):
    """[R]'s rule (docs/algorithms.md#sample-size, the "reference" policy): halves whenever
    N* < N_k/2 down to 128, doubles to N_max."""
    assert reference_code_update(N_k, N_star, N_min, N_max) == expected


def test_retrospective_update_stays_within_bounds():
    rng = np.random.default_rng(3)
    N = 128
    for _ in range(200):
        N_star = int(np.exp(rng.uniform(0, 10)))
        N = retrospective_update(N, N_star, 256, 4096)
        assert 1 <= N <= 4096
