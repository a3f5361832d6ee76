"""Jackknife signal-to-noise check and replication factor (Regier, Jordan & McAuliffe 2017,
§3.2; Efron & Stein 1981; docs/algorithms.md#trustvi-gradient)."""

from __future__ import annotations

import numpy as np
import pytest

from stanvi.optim.jackknife import jackknife_snr, update_replication


def u_statistic(G):
    """``(1/(n(n−1))) Σ_{i≠j} G_iᵀG_j`` by brute force."""
    n = G.shape[0]
    gram = G @ G.T
    return (gram.sum() - np.trace(gram)) / (n * (n - 1))


def brute_force_jackknife(G):
    n = G.shape[0]
    loo = np.array([u_statistic(np.delete(G, i, axis=0)) for i in range(n)])
    v = (n - 1) / n * np.sum((loo - loo.mean()) ** 2)
    return u_statistic(G), np.sqrt(v)


@pytest.mark.parametrize("n,p,signal", [(3, 2, 1.0), (10, 5, 0.3), (40, 7, 3.0), (25, 1, 0.0)])
def test_matches_brute_force_leave_one_out(n, p, signal):
    rng = np.random.default_rng(n * 100 + p)
    mu = signal * rng.normal(size=p)
    G = mu + rng.normal(size=(n, p)) * rng.uniform(0.5, 2.0, size=p)
    res = jackknife_snr(G)
    theta, sd = brute_force_jackknife(G)
    assert res.theta_hat == pytest.approx(theta, rel=1e-10, abs=1e-13)
    assert res.sd == pytest.approx(sd, rel=1e-9, abs=1e-13)
    # the formulae with S and Q (docs/algorithms.md#trustvi-gradient), written out literally
    S, Q = G.sum(0), np.sum(G * G)
    assert res.theta_hat == pytest.approx((S @ S - Q) / (n * (n - 1)), rel=1e-10, abs=1e-13)
    # the noise part of ‖ḡ‖²: tr(Σ̂)/n with the unbiased sample covariance
    assert res.noise == pytest.approx(np.trace(np.atleast_2d(np.cov(G.T))) / n, rel=1e-10)
    assert res.noise + res.theta_hat == pytest.approx(G.mean(0) @ G.mean(0), rel=1e-10, abs=1e-13)


def test_large_offset_is_numerically_stable():
    rng = np.random.default_rng(9)
    G = 1e4 + rng.normal(size=(50, 3))
    theta, sd = brute_force_jackknife(G - 1e4)  # shift-free reference for the deviations
    res = jackknife_snr(G)
    assert res.theta_hat == pytest.approx(3e8 + 2e4 * (G - 1e4).mean(0).sum() + theta, rel=1e-12)
    assert np.isfinite(res.sd) and res.sd > 0


def test_theta_hat_unbiased_for_squared_mean_norm():
    """MC check: mean of θ̂ over replications equals ‖E G‖² within 5 standard errors, while the
    plug-in ‖Ḡ‖² is visibly biased by tr(Σ)/n (so the test can tell them apart)."""
    rng = np.random.default_rng(2024)
    n, p, reps = 12, 6, 4000
    mu = np.array([0.3, -0.2, 0.1, 0.0, 0.25, -0.15])
    scales = np.array([1.0, 2.0, 0.5, 1.5, 1.0, 0.8])
    draws = mu + rng.normal(size=(reps, n, p)) * scales
    thetas = np.array([jackknife_snr(G).theta_hat for G in draws])
    target = float(mu @ mu)
    se = thetas.std(ddof=1) / np.sqrt(reps)
    assert abs(thetas.mean() - target) <= 5 * se
    plug_in = np.sum(draws.mean(axis=1) ** 2, axis=1)
    bias = np.sum(scales**2) / n
    assert abs(plug_in.mean() - target - bias) <= 5 * plug_in.std(ddof=1) / np.sqrt(reps)
    assert bias > 20 * se


def test_sd_is_jackknife_scale():
    """The jackknife sd tracks the sampling sd of θ̂ (loose: within a factor 1.5 on average)."""
    rng = np.random.default_rng(5)
    n, p, reps = 64, 4, 800
    mu = np.array([0.5, 0.2, -0.3, 0.1])
    draws = mu + rng.normal(size=(reps, n, p))
    res = [jackknife_snr(G) for G in draws]
    spread = np.std([r.theta_hat for r in res], ddof=1)
    mean_sd = np.mean([r.sd for r in res])
    assert spread / 1.5 < mean_sd < 1.5 * spread


def test_too_few_draws():
    with pytest.raises(ValueError):
        jackknife_snr(np.ones((2, 3)))


def test_update_replication_rules():
    assert update_replication(1, theta_hat=0.1, sd=0.5) == 2      # θ̂ − sd < 0 → double
    assert update_replication(16, theta_hat=-1.0, sd=0.1) == 32
    assert update_replication(32, theta_hat=0.1, sd=0.5) == 32    # at r_max
    assert update_replication(8, theta_hat=1.0, sd=0.2) == 4      # θ̂ − 3sd > 0 → halve
    assert update_replication(1, theta_hat=1.0, sd=0.2) == 1      # at 1
    assert update_replication(8, theta_hat=1.0, sd=0.5) == 8      # in between: keep
    assert update_replication(8, theta_hat=1.0, sd=1.0) == 8      # θ̂ − sd = 0: keep
    assert update_replication(4, theta_hat=0.1, sd=0.5, r_max=4) == 4
    assert update_replication(4, theta_hat=np.nan, sd=0.5) == 4


def test_update_replication_norm_test():
    """Byrd et al.'s norm test on top of the jackknife rule: double while the MC noise exceeds
    ν²θ̂ even when the jackknife is satisfied; halve only if half the draws would still pass."""
    # jackknife alone would halve (θ̂ − 3sd > 0) ...
    assert update_replication(8, theta_hat=1.0, sd=0.2) == 4
    # ... but the noise (1.5) exceeds θ̂: double instead
    assert update_replication(8, theta_hat=1.0, sd=0.2, noise=1.5, norm_test=1.0) == 16
    assert update_replication(8, theta_hat=1.0, sd=0.2, noise=1.5, norm_test=1.3) == 8  # 1.69 ≥ 1.5
    # passes, but halving would double the noise past θ̂: keep
    assert update_replication(8, theta_hat=1.0, sd=0.2, noise=0.6, norm_test=1.0) == 8
    assert update_replication(8, theta_hat=1.0, sd=0.2, noise=0.5, norm_test=1.0) == 4
    assert update_replication(64, theta_hat=1.0, sd=0.2, noise=5.0, norm_test=1.0, r_max=64) == 64
    # without the option, or with a non-finite noise, the jackknife rule alone
    assert update_replication(8, theta_hat=1.0, sd=0.2, noise=1.5) == 4
    assert update_replication(8, theta_hat=1.0, sd=0.2, noise=np.nan, norm_test=1.0) == 4


def test_update_replication_from_data_stays_in_range():
    rng = np.random.default_rng(0)
    # low signal-to-noise data drive r up to 32 and no further
    r = 1
    for _ in range(10):
        res = jackknife_snr(rng.normal(size=(64, 5)) * 3.0 + 0.01)
        r = update_replication(r, res.theta_hat, res.sd)
        assert 1 <= r <= 32
    assert r == 32
    # high signal-to-noise data drive it down to 1 and no further
    for _ in range(10):
        res = jackknife_snr(rng.normal(size=(64, 5)) * 0.1 + 2.0)
        r = update_replication(r, res.theta_hat, res.sd)
        assert 1 <= r <= 32
    assert r == 1
