"""The simulated problems of ``stanvi bench mlmcvi`` (docs/mlmcvi.md#bench-problems): dimensions,
and the JAX log densities against scipy at random points (priors, likelihood and
log-Jacobians)."""

from __future__ import annotations

import numpy as np
from scipy import stats

from stanvi.bench import mlmcvi_bench


def test_hlr_density():
    t = mlmcvi_bench.hlr_target(seed=0, I=7, K=3)
    assert t.dim == 7 * 3 + 3 + 2
    z = np.random.default_rng(5).standard_normal(t.dim) * 0.5
    m, lsb, lsy, B = z[:3], z[3], z[4], z[5:].reshape(7, 3)
    sb, sy = np.exp(lsb), np.exp(lsy)
    lp = float(t.log_density(z).log_density[0])
    prior = (stats.norm(0, 10).logpdf(m).sum() + stats.lognorm(0.5).logpdf(sb) + lsb
             + stats.lognorm(0.5).logpdf(sy) + lsy + stats.norm(m, sb).logpdf(B).sum())
    like = lp - prior
    # the rest must equal Σ log N(y_i | x_i·b_i, σ_y) for the data simulated as the generator does
    rng2 = np.random.default_rng(0)
    X = rng2.standard_normal((7, 3))
    mu = rng2.normal(0, 1.0, 3)
    sb0, sy0 = np.exp(rng2.normal(0, 0.5)), np.exp(rng2.normal(0, 0.5))
    B0 = mu + sb0 * rng2.standard_normal((7, 3))
    y = np.sum(X * B0, axis=1) + sy0 * rng2.standard_normal(7)
    want = stats.norm(np.sum(X * B, axis=1), sy).logpdf(y).sum()
    np.testing.assert_allclose(like, want, rtol=1e-10)
    assert mlmcvi_bench.hlr_target().dim == 1012


def test_blr_density():
    t = mlmcvi_bench.blr_target(seed=0)
    assert t.dim == 11
    rng = np.random.default_rng(0)
    X = rng.standard_normal((286, 9))
    X = (X - X.mean(0)) / X.std(0)
    zt = rng.standard_normal(9)
    y = (rng.random(286) < 1 / (1 + np.exp(-X @ zt))).astype(float)
    z = np.random.default_rng(1).standard_normal(11) * 0.3
    ltau, mu, w = z[0], z[1], z[2:]
    tau = np.exp(ltau)
    want = (stats.gamma(0.5, scale=1 / 0.5).logpdf(tau) + ltau + stats.norm(0, 1).logpdf(mu)
            + stats.norm(mu, 1 / np.sqrt(tau)).logpdf(w).sum()
            + stats.bernoulli(1 / (1 + np.exp(-X @ w))).logpmf(y).sum())
    np.testing.assert_allclose(float(t.log_density(z).log_density[0]), want, rtol=1e-10)
