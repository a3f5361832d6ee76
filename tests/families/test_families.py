"""Gaussian variational families (docs/algorithms.md#meanfield and #fullrank).

Monte Carlo checks use tolerances of at least 5 standard errors of the estimator they test.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

from stanvi.families import FAMILIES, FullRank, MeanField, make_family

jax.config.update("jax_enable_x64", True)

D = 4
N_MC = 20_000


def _families():
    return [MeanField(D), FullRank(D, diagonal="stan"), FullRank(D, diagonal="log")]


def _ids(fams):
    return [f"{f.name}-{getattr(f, 'diagonal', '')}".rstrip("-") for f in fams]


FAMS = _families()
FAM_IDS = _ids(FAMS)


def random_params(family, rng, *, negative_diag: bool = False) -> np.ndarray:
    """Random variational parameters; for Stan's full-rank parameterization optionally with
    negative diagonal entries of L (allowed: only |L_dd| enters the density)."""
    mu = rng.normal(0.0, 1.5, family.dim)
    if isinstance(family, MeanField):
        return np.concatenate([mu, rng.uniform(-1.0, 0.7, family.dim)])
    rows, cols = np.tril_indices(family.dim)
    vech = rng.normal(0.0, 0.4, len(rows))
    diag = rows == cols
    if family.diagonal == "log":
        vech[diag] = rng.uniform(-1.0, 0.7, diag.sum())
    else:
        mags = np.exp(rng.uniform(-1.0, 0.7, diag.sum()))
        signs = np.where(rng.random(diag.sum()) < 0.5, -1.0, 1.0) if negative_diag else 1.0
        if negative_diag:
            signs[0] = -1.0          # at least one negative entry
        vech[diag] = signs * mags
    return np.concatenate([mu, vech])


def explicit_cholesky(family, params: np.ndarray) -> np.ndarray:
    """L built independently of the family code: λ = (μ, lower triangle row by row)."""
    d = family.dim
    if isinstance(family, MeanField):
        return np.diag(np.exp(params[d:]))
    L = np.zeros((d, d))
    k = d
    for i in range(d):
        for j in range(i + 1):
            L[i, j] = math.exp(params[k]) if (i == j and family.diagonal == "log") else params[k]
            k += 1
    return L


# ------------------------------------------------------------------------------- layout

@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
def test_parameter_count_and_packing_round_trip(family, rng):
    params = random_params(family, rng)
    assert params.shape == (family.n_params,)
    expected = 2 * D if isinstance(family, MeanField) else D + D * (D + 1) // 2
    assert family.n_params == expected
    L = np.asarray(family.cholesky(params)) if isinstance(family, FullRank) else None
    np.testing.assert_array_equal(np.asarray(family.mean(params)), params[:D])
    if isinstance(family, MeanField):
        mu, omega = family.split(params)
        np.testing.assert_array_equal(np.concatenate([mu, omega]), params)
        return
    # unpack -> pack gives the same vector back
    np.testing.assert_allclose(L, explicit_cholesky(family, params), rtol=0, atol=0)
    assert np.all(np.triu(L, 1) == 0.0)
    rows, cols = np.tril_indices(D)
    vech = L[rows, cols].copy()
    if family.diagonal == "log":
        vech[rows == cols] = np.log(vech[rows == cols])
    np.testing.assert_allclose(np.concatenate([params[:D], vech]), params, rtol=1e-15, atol=0)


@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
@pytest.mark.parametrize("log_scale0", [0.0, -1.0])
def test_initial_params(family, log_scale0):
    mu0 = np.arange(D, dtype=float) - 1.5
    params = family.initial_params(mu0, log_scale0)
    assert params.shape == (family.n_params,)
    np.testing.assert_array_equal(np.asarray(family.mean(params)), mu0)
    # Stan: ω₀ = 0 / L₀ = I; the TrustVI paper: σ₀ = e^{-1}
    np.testing.assert_allclose(np.asarray(family.covariance(params)),
                               np.exp(2 * log_scale0) * np.eye(D), rtol=1e-15, atol=0)


def test_make_family_and_bad_arguments():
    assert set(FAMILIES) == {"meanfield", "fullrank", "mixture", "lowrank"}   # mixture, lowrank: own modules
    assert make_family("meanfield", 3) == MeanField(3)
    assert make_family("fullrank", 3, diagonal="log") == FullRank(3, diagonal="log")
    with pytest.raises(ValueError, match="unknown family 'gauss'"):
        make_family("gauss", 3)
    with pytest.raises(ValueError, match="diagonal must be"):
        FullRank(3, diagonal="softplus")
    # families are hashable (static arguments of jit-compiled estimators)
    assert len({MeanField(3), MeanField(3), FullRank(3), FullRank(3, diagonal="log")}) == 3


# ------------------------------------------------------------------------------- sampling

@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
def test_sample_is_mu_plus_L_eps_and_covariance_is_LLt(family, rng):
    params = random_params(family, rng, negative_diag=True) if isinstance(family, FullRank) \
        else random_params(family, rng)
    L = explicit_cholesky(family, params)
    eps = rng.standard_normal((7, D))
    z = np.asarray(family.sample(params, eps))
    np.testing.assert_allclose(z, params[:D] + eps @ L.T, rtol=1e-13, atol=1e-13)
    C = np.asarray(family.covariance(params))
    np.testing.assert_allclose(C, L @ L.T, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(np.asarray(family.marginal_sd(params)), np.sqrt(np.diag(L @ L.T)),
                               rtol=1e-13)
    if isinstance(family, FullRank):  # the host-side factor is the compiled one
        np.testing.assert_allclose(family.lower_factor(params), np.asarray(family.cholesky(params)),
                                   rtol=1e-15, atol=0)


@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
def test_sample_moments_by_monte_carlo(family, rng):
    """Draws have mean μ and covariance L Lᵀ (5-standard-error tolerances)."""
    params = random_params(family, rng, negative_diag=isinstance(family, FullRank))
    C = np.asarray(family.covariance(params))
    z = np.asarray(family.sample(params, rng.standard_normal((N_MC, D))))
    se_mean = np.sqrt(np.diag(C) / N_MC)
    assert np.all(np.abs(z.mean(0) - params[:D]) <= 5 * se_mean)
    emp = np.cov(z, rowvar=False)
    # sd of a sample covariance entry of a Gaussian: sqrt((C_ii C_jj + C_ij²) / n)
    se_cov = np.sqrt((np.outer(np.diag(C), np.diag(C)) + C**2) / N_MC)
    assert np.all(np.abs(emp - C) <= 5 * se_cov)


# ------------------------------------------------------------------------------- densities

@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
def test_log_q_matches_scipy(family, rng):
    params = random_params(family, rng, negative_diag=isinstance(family, FullRank))
    mean = params[:D]
    cov = explicit_cholesky(family, params) @ explicit_cholesky(family, params).T
    z = mean + rng.normal(0, 2.0, (50, D))
    expected = multivariate_normal(mean, cov).logpdf(z)
    np.testing.assert_allclose(np.asarray(family.log_q(params, z)), expected, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
def test_entropy_closed_form(family, rng):
    params = random_params(family, rng, negative_diag=isinstance(family, FullRank))
    L = explicit_cholesky(family, params)
    expected = multivariate_normal(params[:D], L @ L.T).entropy()
    assert float(family.entropy(params)) == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("family", FAMS, ids=FAM_IDS)
def test_log_q_integrates_to_entropy(family, rng):
    """E_q[−log q(z)] = H(q): the sample mean of −log q at draws from ``sample`` agrees with the
    closed-form entropy within 5 standard errors (ties sample, log_q and entropy together)."""
    params = random_params(family, rng, negative_diag=isinstance(family, FullRank))
    z = family.sample(params, rng.standard_normal((N_MC, D)))
    neg_lq = -np.asarray(family.log_q(params, z))
    se = neg_lq.std(ddof=1) / math.sqrt(N_MC)      # = sqrt(D/2)/sqrt(n): −log q − H = ½(χ²_D − D)
    assert abs(neg_lq.mean() - float(family.entropy(params))) <= 5 * se
    # and the spread is that of ½χ²_D (variance D/2), a check that log q is normalised per draw
    # sd of the sample variance of Y = ½χ²_D: √((μ₄ − σ⁴)/n) with μ₄ = 3D(D+4)/4, σ² = D/2
    se_var = math.sqrt((D * D + 6 * D) / (2 * N_MC))
    assert abs(neg_lq.var(ddof=1) - D / 2) <= 5 * se_var


def test_stan_diagonal_may_be_negative(rng):
    """Stan's full-rank parameterization: the diagonal of L is unconstrained; flipping the sign
    of a column of L leaves the distribution (covariance, log q, entropy) unchanged."""
    fam = FullRank(D, diagonal="stan")
    params = random_params(fam, rng)
    rows, cols = np.tril_indices(D)
    L = explicit_cholesky(fam, params)
    flipped_L = L.copy()
    flipped_L[:, 1] *= -1.0                 # column 1: L_11 < 0 and the entries below it
    flipped = np.concatenate([params[:D], flipped_L[rows, cols]])
    assert np.asarray(fam.cholesky(flipped))[1, 1] < 0
    np.testing.assert_allclose(np.asarray(fam.covariance(flipped)), np.asarray(fam.covariance(params)),
                               rtol=1e-13, atol=1e-14)
    assert float(fam.entropy(flipped)) == pytest.approx(float(fam.entropy(params)), abs=1e-13)
    z = rng.normal(0, 1, (10, D))
    np.testing.assert_allclose(np.asarray(fam.log_q(flipped, z)), np.asarray(fam.log_q(params, z)),
                               rtol=1e-12, atol=1e-12)
    assert np.all(np.isfinite(np.asarray(fam.sample(flipped, z))))


def test_stan_diagonal_exact_zero_is_skipped_in_entropy():
    """Stan's ``normal_fullrank::entropy`` skips exact zeros on the diagonal
    (docs/algorithms.md#fullrank)."""
    fam = FullRank(2, diagonal="stan")
    params = np.array([0.0, 0.0, 2.0, 0.3, 0.0])    # L = [[2, 0], [0.3, 0]]
    expected = 0.5 * 2 * (1 + math.log(2 * math.pi)) + math.log(2.0)
    assert float(fam.entropy(params)) == pytest.approx(expected, abs=1e-14)
    assert np.isfinite(float(jax.grad(fam.entropy)(jnp.asarray(params))[2]))


# ------------------------------------------------------------------------------- entropy derivatives

def test_meanfield_entropy_gradient_is_one_and_hessian_zero(rng):
    fam = MeanField(D)
    params = jnp.asarray(random_params(fam, rng))
    grad = np.asarray(jax.grad(fam.entropy)(params))
    np.testing.assert_array_equal(grad, np.concatenate([np.zeros(D), np.ones(D)]))
    np.testing.assert_array_equal(np.asarray(jax.hessian(fam.entropy)(params)), 0.0)


def test_fullrank_log_entropy_gradient_is_one_and_hessian_zero(rng):
    fam = FullRank(D, diagonal="log")
    params = jnp.asarray(random_params(fam, rng))
    rows, cols = np.tril_indices(D)
    expected = np.concatenate([np.zeros(D), (rows == cols).astype(float)])
    np.testing.assert_array_equal(np.asarray(jax.grad(fam.entropy)(params)), expected)
    np.testing.assert_array_equal(np.asarray(jax.hessian(fam.entropy)(params)), 0.0)


def test_fullrank_stan_entropy_gradient_and_hessian(rng):
    """Stan parameterization: ∂H/∂L_dd = 1/L_dd and ∂²H/∂L_dd² = −1/L_dd², negative L_dd too."""
    fam = FullRank(D, diagonal="stan")
    params = random_params(fam, rng, negative_diag=True)
    rows, cols = np.tril_indices(D)
    diag = np.flatnonzero(rows == cols) + D
    ldd = params[diag]
    assert (ldd < 0).any()
    grad = np.asarray(jax.grad(fam.entropy)(jnp.asarray(params)))
    expected = np.zeros(fam.n_params)
    expected[diag] = 1.0 / ldd
    np.testing.assert_allclose(grad, expected, rtol=1e-14, atol=0)
    hess = np.asarray(jax.hessian(fam.entropy)(jnp.asarray(params)))
    expected_h = np.zeros((fam.n_params, fam.n_params))
    expected_h[diag, diag] = -1.0 / ldd**2
    np.testing.assert_allclose(hess, expected_h, rtol=1e-14, atol=0)


# ------------------------------------------------------------ the mean-field family inside

@pytest.mark.parametrize("diagonal", ["stan", "log"])
def test_fullrank_meanfield_member_has_the_conditional_variances(diagonal, rng):
    """The mean-field member nearest q in KL(q_mf ‖ q) keeps q's mean and takes the
    conditional variances 1/Λ_ii, Λ = (L Lᵀ)⁻¹ (Bishop 2006, §10.1.2): computed here from the
    explicit inverse; and no other diagonal Gaussian is nearer (the KL at the member is below
    that at perturbed variances)."""
    fam = FullRank(D, diagonal=diagonal)
    params = random_params(fam, rng)
    cov = explicit_cholesky(fam, params) @ explicit_cholesky(fam, params).T
    prec = np.linalg.inv(cov)
    member = fam.meanfield_member(params)
    np.testing.assert_array_equal(member[:D], params[:D])
    np.testing.assert_allclose(np.exp(-2.0 * member[D:]), np.diag(prec), rtol=1e-10)

    def kl(omega):   # KL(N(μ, diag e^{2ω}) ‖ N(μ, cov))
        var = np.exp(2.0 * omega)
        return 0.5 * (np.sum(np.diag(prec) * var) - D - np.sum(np.log(var))
                      + np.linalg.slogdet(cov)[1])
    best = kl(member[D:])
    for shift in rng.normal(0.0, 0.1, size=(20, D)):
        assert kl(member[D:] + shift) > best


@pytest.mark.parametrize("diagonal", ["stan", "log"])
def test_fullrank_from_meanfield_is_the_same_q(diagonal, rng):
    """``from_meanfield`` maps a mean-field λ to the full-rank λ of the same Gaussian: the same
    draws from the same base draws, the same log q and entropy; and ``meanfield_member`` of it
    gives the mean-field λ back (a diagonal q is its own nearest mean-field member)."""
    fam, mf = FullRank(D, diagonal=diagonal), MeanField(D)
    assert fam.inner_meanfield() == mf and mf.inner_meanfield() is None
    lam = random_params(mf, rng)
    full = fam.from_meanfield(lam)
    eps = rng.normal(size=(7, D))
    np.testing.assert_allclose(np.asarray(fam.sample(jnp.asarray(full), jnp.asarray(eps))),
                               np.asarray(mf.sample(jnp.asarray(lam), jnp.asarray(eps))),
                               rtol=1e-13)
    z = rng.normal(size=(5, D))
    np.testing.assert_allclose(np.asarray(fam.log_q(jnp.asarray(full), jnp.asarray(z))),
                               np.asarray(mf.log_q(jnp.asarray(lam), jnp.asarray(z))),
                               rtol=1e-12)
    assert float(fam.entropy(jnp.asarray(full))) == pytest.approx(
        float(mf.entropy(jnp.asarray(lam))), rel=1e-13)
    np.testing.assert_allclose(fam.meanfield_member(full), lam, rtol=1e-12, atol=1e-14)
