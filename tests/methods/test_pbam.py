"""BaM on the low-rank family: batch, match and patch (issue T3-7; stanvi/methods/bam_lowrank.py,
docs/methods.md#pbam): the low-rank match equals the dense BaM update, the patch's EM never
raises the KL and keeps a covariance that is already in the family, the O(Dk²) KL equals the
dense one, exactness on a Gaussian target in the family, and the accounting."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from stanvi.errors import NotConvergedWarning
from stanvi.methods.bam import bam_update
from stanvi.methods.bam_lowrank import LowRankCov, Matched, lowrank_kl, match, patch
from stanvi.methods.score_vi import gaussian_kl

jax.config.update("jax_enable_x64", True)

RNG = np.random.default_rng(0)


def random_lowrank(D: int, k: int, rng) -> LowRankCov:
    return LowRankCov(rng.uniform(0.5, 2.0, D), rng.normal(size=(D, k)))


def dense(c: LowRankCov) -> np.ndarray:
    return np.diag(c.psi) + c.lam @ c.lam.T


def test_low_rank_match_is_the_dense_bam_update():
    """Σ' = V − VQ M⁻²(VQ)ᵀ with M = ½I + (¼I + QᵀVQ)^{1/2} is BaM's 2V(I + (I + 4UV)^{1/2})⁻¹,
    and μ' the same, to rounding (D = 9, k = 2, B = 5, λ = 3)."""
    rng = np.random.default_rng(1)
    cov = random_lowrank(9, 2, rng)
    mu, z, g = rng.normal(size=9), rng.normal(size=(5, 9)), rng.normal(size=(5, 9))
    mu_dense, cov_dense = bam_update(mu, dense(cov), z, g, 3.0)
    mu_low, matched = match(mu, cov, z, g, 3.0)
    np.testing.assert_allclose(matched.dense(), cov_dense, atol=1e-12)
    np.testing.assert_allclose(mu_low, mu_dense, atol=1e-12)


def test_patch_keeps_a_family_member_and_never_raises_the_kl():
    """EM for factor analysis: started at Σ' = Ψ* + Λ*Λ*ᵀ it stays there; from elsewhere each
    iteration lowers KL(N(0, Σ') ‖ N(0, Ψ + ΛΛᵀ)) (or keeps it), and many reach Σ'."""
    rng = np.random.default_rng(2)
    target = random_lowrank(8, 2, rng)
    S = Matched(target.psi, target.lam, np.zeros((8, 1)))
    kept = patch(S, target)
    np.testing.assert_allclose(dense(kept), dense(target), atol=1e-12)
    # a matrix outside the family (full rank): KL non-increasing along single EM steps
    A = rng.normal(size=(8, 8))
    S = Matched(np.full(8, 0.3), A, np.zeros((8, 1)))
    cov, kls = random_lowrank(8, 2, rng), []
    for _ in range(30):
        kls.append(gaussian_kl(np.zeros(8), S.dense(), np.zeros(8), dense(cov)))
        cov = patch(S, cov, steps=1)
    assert all(b <= a + 1e-10 for a, b in zip(kls, kls[1:])), kls
    assert kls[-1] < 0.5 * kls[0]
    far = patch(Matched(target.psi, target.lam, np.zeros((8, 1))), random_lowrank(8, 2, rng),
                steps=3000)
    np.testing.assert_allclose(dense(far), dense(target), atol=1e-8)


def test_lowrank_kl_is_the_dense_kl():
    rng = np.random.default_rng(3)
    c1, c0 = random_lowrank(12, 3, rng), random_lowrank(12, 3, rng)
    m1, m0 = rng.normal(size=12), rng.normal(size=12)
    assert lowrank_kl(m1, c1, m0, c0) == pytest.approx(
        gaussian_kl(m1, dense(c1), m0, dense(c0)), rel=1e-12)
    assert lowrank_kl(m1, c1, m1, c1) == pytest.approx(0.0, abs=1e-12)


def test_pbam_recovers_a_gaussian_of_the_family_and_counts_its_gradients():
    """p = N(m, Ψ + ΛΛᵀ), D = 20, k = 3: the paper's protocol (μ₀ = 0, Σ₀ = I + B₀B₀ᵀ, B = 2,
    λ_t = BD/(t+1), 600 iterations) reaches m and Σ to 1e-6 relative error (measured 5e-10;
    3e-6 after 300);
    every iteration charges its B gradients and nothing else."""
    D, k = 20, 3
    rng = np.random.default_rng(1)
    cov = LowRankCov(rng.uniform(0.2, 1.0, D), rng.normal(size=(D, k)))
    m = rng.normal(size=D)
    S = dense(cov)
    P, mj = jnp.asarray(np.linalg.inv(S)), jnp.asarray(m)

    def log_density(x):
        d = x - mj
        return -0.5 * d @ P @ d

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotConvergedWarning)
        fit = stanvi.fit(log_density, dim=D, method="bam", family="lowrank",
                         family_options={"rank": k}, profile="paper", max_iters=600, seed=0,
                         progress=False, draws=10)
    assert fit.status == "max_iters" and fit.info["rejected_updates"] == 0
    mu_fit, cov_fit = fit.family.mean(fit.params), fit.family.covariance(fit.params)
    assert np.linalg.norm(mu_fit - m) / np.linalg.norm(m) < 1e-6
    assert np.linalg.norm(cov_fit - S) / np.linalg.norm(S) < 1e-6
    assert fit.oracle["gradient_draws"] == 2 * 600
    assert fit.oracle["log_density_draws"] == fit.oracle["hvp_draws"] == 0


def test_gsm_refuses_the_lowrank_family_and_names_bam():
    with pytest.raises(ValueError, match="family='fullrank'"):
        stanvi.fit(lambda x: -0.5 * x @ x, dim=3, method="gsm", family="lowrank",
                   progress=False)
