"""ELBO estimators: per-draw values and gradients, HVPs, matched pairs, redraws
(docs/algorithms.md#elbo, #meanfield, #fullrank, #failed-draws, #gaussian-closed-forms).

* Formula checks compare with the closed forms of docs/algorithms.md#meanfield and #fullrank at
  the same fixed draws (exact up to rounding).
* HVP checks compare with central finite differences of the fixed-draw gradient (the MC ELBO
  with fixed draws is a smooth deterministic function of λ, docs/algorithms.md#elbo), relative
  tolerance 1e-5 (exact nested-AD HVPs; 1e-3 for a finite-difference Stan build).
* Monte Carlo checks use 5 standard errors of the estimator they test.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fd
from stanvi.estimators import (ElboEstimator, GradientFailure, gradient_with_redraws,
                               standard_normal)
from stanvi.families import FullRank, MeanField

jax.config.update("jax_enable_x64", True)

# ------------------------------------------------------------------------------ targets

_X = np.array([[0.3, -1.2, 0.8], [1.1, 0.4, -0.5], [-0.7, 0.9, 1.3], [0.2, -0.3, -1.0],
               [1.5, 1.0, 0.1]])
_Y = np.array([1.0, -1.0, 1.0, 1.0, -1.0])


def banana_logistic(z):
    """A non-Gaussian 4-d log density: a banana in (z0, z1) plus a
    logistic-regression likelihood coupling (z1, z2, z3); all third derivatives non-zero."""
    banana = -0.5 * z[0] ** 2 - 0.5 * ((z[1] - 0.5 * z[0] ** 2) / 0.8) ** 2
    logit = jnp.sum(jax.nn.log_sigmoid(_Y * (jnp.asarray(_X) @ z[1:4])))
    return banana + logit - 0.1 * jnp.sum(z[2:] ** 2)


DIM = 4


def gaussian_target(m, S):
    """Normalized log N(z; m, S) as a JAX function, with the precision matrix."""
    Lam = np.linalg.inv(S)
    _, logdet = np.linalg.slogdet(S)
    d = len(m)
    mj, Lj = jnp.asarray(m), jnp.asarray(Lam)

    def lp(z):
        r = z - mj
        return -0.5 * r @ (Lj @ r) - 0.5 * logdet - 0.5 * d * math.log(2 * math.pi)

    return lp, Lam


M3 = np.array([0.5, -1.0, 2.0])
S3 = np.array([[1.0, 0.6, 0.2], [0.6, 2.0, -0.5], [0.2, -0.5, 0.7]])


def families(d):
    return [MeanField(d), FullRank(d, diagonal="stan"), FullRank(d, diagonal="log")]


FAM_IDS = ["meanfield", "fullrank-stan", "fullrank-log"]


def some_params(family, rng, *, mu_scale=0.5, negative_diag=True):
    d = family.dim
    mu = rng.normal(0, mu_scale, d)
    if isinstance(family, MeanField):
        return np.concatenate([mu, rng.uniform(-1.2, -0.2, d)])
    rows, cols = np.tril_indices(d)
    vech = rng.normal(0, 0.15, len(rows))
    diag = rows == cols
    if family.diagonal == "log":
        vech[diag] = rng.uniform(-1.2, -0.2, diag.sum())
    else:
        vech[diag] = np.exp(rng.uniform(-1.2, -0.2, diag.sum()))
        if negative_diag:
            vech[np.flatnonzero(diag)[0]] *= -1.0   # Stan allows a negative L_dd
    return np.concatenate([mu, vech])


def cholesky_of(family, params):
    return np.asarray(family.cholesky(params)) if isinstance(family, FullRank) \
        else np.diag(np.exp(params[family.dim:]))


def mean_gradient(est, eps):
    return lambda p: est.values_and_grads(p, eps)[1].mean(axis=0)


@pytest.fixture(scope="module")
def banana_estimators():
    return {fid: ElboEstimator(f, banana_logistic) for fid, f in zip(FAM_IDS, families(DIM))}


# ------------------------------------------------------------------------------ per-draw formulas (docs/algorithms.md#meanfield, #fullrank)

@pytest.mark.parametrize("fid", FAM_IDS)
def test_values_are_log_p_plus_closed_form_entropy(banana_estimators, fid, rng):
    est = banana_estimators[fid]
    fam = est.family
    params = some_params(fam, rng)
    eps = rng.standard_normal((9, DIM))
    z = params[:DIM] + eps @ cholesky_of(fam, params).T
    expected = np.array([float(banana_logistic(jnp.asarray(zi))) for zi in z]) \
        + float(fam.entropy(params))
    np.testing.assert_allclose(est.values(params, eps), expected, rtol=1e-12, atol=1e-12)
    v, _ = est.values_and_grads(params, eps)
    np.testing.assert_allclose(v, expected, rtol=1e-12, atol=1e-12)


def test_meanfield_per_draw_gradient_formula(banana_estimators, rng):
    """G_j = (g_j, g_j ⊙ σ ⊙ ε_j + 1) exactly (docs/algorithms.md#meanfield)."""
    est = banana_estimators["meanfield"]
    params = some_params(est.family, rng)
    mu, sigma = params[:DIM], np.exp(params[DIM:])
    eps = rng.standard_normal((11, DIM))
    g = np.asarray(jax.vmap(jax.grad(banana_logistic))(jnp.asarray(mu + sigma * eps)))
    _, G = est.values_and_grads(params, eps)
    np.testing.assert_allclose(G[:, :DIM], g, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(G[:, DIM:], g * sigma * eps + 1.0, rtol=1e-12, atol=1e-12)
    # the mean ω-gradient is mean(g ⊙ σ ⊙ ε) + 1 (Stan applies σ after averaging: same result)
    np.testing.assert_allclose(G[:, DIM:].mean(0), sigma * (g * eps).mean(0) + 1.0, rtol=1e-12)


@pytest.mark.parametrize("fid", ["fullrank-stan", "fullrank-log"])
def test_fullrank_per_draw_gradient_formula(banana_estimators, fid, rng):
    """Stan: ∂/∂L = tril(g εᵀ) + diag(1/L_dd); log diagonal: the diagonal entry is
    g_d e^{ω_d} ε_d + 1 (docs/algorithms.md#fullrank)."""
    est = banana_estimators[fid]
    fam = est.family
    params = some_params(fam, rng)
    L = cholesky_of(fam, params)
    eps = rng.standard_normal((6, DIM))
    g = np.asarray(jax.vmap(jax.grad(banana_logistic))(jnp.asarray(params[:DIM] + eps @ L.T)))
    _, G = est.values_and_grads(params, eps)
    rows, cols = np.tril_indices(DIM)
    diag = rows == cols
    np.testing.assert_allclose(G[:, :DIM], g, rtol=1e-12, atol=1e-12)
    outer = g[:, rows] * eps[:, cols]                 # tril(g εᵀ) packed row by row
    if fam.diagonal == "stan":
        expected = outer + np.where(diag, 1.0 / np.where(diag, L[rows, cols], 1.0), 0.0)
    else:
        expected = np.where(diag, outer * L[rows, cols] + 1.0, outer)
    np.testing.assert_allclose(G[:, DIM:], expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("fid", FAM_IDS)
def test_hvp_matches_per_draw_formula(banana_estimators, fid, rng):
    """The ELBO HVP equals the mean over draws of the per-draw formulas (docs/algorithms.md
    #meanfield, #fullrank), computed here from the model's own Hessian H(z_j) (exact, no finite
    differences)."""
    est = banana_estimators[fid]
    fam = est.family
    params = some_params(fam, rng)
    L = cholesky_of(fam, params)
    n = 5
    eps = rng.standard_normal((n, DIM))
    z = params[:DIM] + eps @ L.T
    g = np.asarray(jax.vmap(jax.grad(banana_logistic))(jnp.asarray(z)))
    H = np.asarray(jax.vmap(jax.hessian(banana_logistic))(jnp.asarray(z)))
    v = rng.standard_normal(fam.n_params)
    a, b = v[:DIM], v[DIM:]
    rows, cols = np.tril_indices(DIM)
    diag = rows == cols
    if isinstance(fam, MeanField):
        sigma = np.exp(params[DIM:])
        u = a + sigma * eps * b                                  # (n, D)
        Hu = np.einsum("nij,nj->ni", H, u)
        expected = np.concatenate([Hu.mean(0), (sigma * eps * Hu + g * sigma * eps * b).mean(0)])
    else:
        B = np.zeros((DIM, DIM))
        B[rows, cols] = b
        if fam.diagonal == "stan":
            u = a + eps @ B.T
            Hu = np.einsum("nij,nj->ni", H, u)
            lblock = (Hu[:, rows] * eps[:, cols]).mean(0)
            ldd = L[rows, cols]
            lblock = lblock + np.where(diag, -b / np.where(diag, ldd, 1.0) ** 2, 0.0)
        else:
            e_om = np.exp(params[DIM:][diag])                        # exp(ω)
            Bs = np.tril(B, -1)
            u = a + eps @ Bs.T + e_om * eps * np.diag(B)
            Hu = np.einsum("nij,nj->ni", H, u)
            lblock = Hu[:, rows] * eps[:, cols]
            dpart = e_om * eps * Hu + g * e_om * eps * np.diag(B)   # (n, D)
            lblock[:, diag] = dpart
            lblock = lblock.mean(0)
        expected = np.concatenate([Hu.mean(0), lblock])
    np.testing.assert_allclose(est.hvp(params, eps, v), expected, rtol=1e-11, atol=1e-12)


# ------------------------------------------------------------------------------ HVP vs finite differences

def assert_hvp_matches_fd(est, params, eps, directions, rtol):
    grad = mean_gradient(est, eps)

    def batched(points):
        return np.stack([grad(p) for p in points])

    for v in directions:
        hv = est.hvp(params, eps, v)
        fd_est, fd_tol = fd.hvp(batched, params, v)
        scale = np.linalg.norm(hv)
        assert scale > 0
        # the finite-difference estimate must itself be accurate enough to decide
        assert np.linalg.norm(fd_tol) <= 0.1 * rtol * scale, "finite differences too inexact"
        err = np.linalg.norm(hv - fd_est)
        assert err <= rtol * scale, f"relative error {err / scale:.2e} > {rtol:g}"


@pytest.mark.parametrize("fid", FAM_IDS)
def test_hvp_vs_finite_differences_jax_target(banana_estimators, fid, rng):
    est = banana_estimators[fid]
    params = some_params(est.family, rng)
    eps = rng.standard_normal((7, DIM))
    dirs = rng.standard_normal((3, est.family.n_params))
    assert_hvp_matches_fd(est, params, eps, dirs, rtol=1e-5)


@pytest.fixture(scope="module")
def eight_schools_estimators(eight_schools):
    d = eight_schools.dim
    return {fid: ElboEstimator(f, eight_schools.jax_log_density)
            for fid, f in zip(FAM_IDS, families(d))}


@pytest.mark.parametrize("fid", FAM_IDS)
def test_hvp_vs_finite_differences_stan_bridge(eight_schools, eight_schools_estimators, fid, rng):
    """Through the JAX bridge: gradients and HVPs are the Stan library's (batched C++)."""
    est = eight_schools_estimators[fid]
    d = eight_schools.dim
    params = some_params(est.family, rng, mu_scale=0.3)
    eps = rng.standard_normal((5, d))
    dirs = rng.standard_normal((2, est.family.n_params))
    rtol = 1e-5 if eight_schools.hvp_exact else 1e-3
    assert_hvp_matches_fd(est, params, eps, dirs, rtol=rtol)


# ------------------------------------------------------------------------------ symmetry

@pytest.mark.parametrize("fid", FAM_IDS)
def test_hvp_operator_is_symmetric(banana_estimators, fid, rng):
    est = banana_estimators[fid]
    params = some_params(est.family, rng)
    eps = rng.standard_normal((13, DIM))
    for _ in range(3):
        v, w = rng.standard_normal((2, est.family.n_params))
        hv, hw = est.hvp(params, eps, v), est.hvp(params, eps, w)
        scale = np.linalg.norm(hv) * np.linalg.norm(w) + np.linalg.norm(hw) * np.linalg.norm(v)
        assert abs(w @ hv - v @ hw) <= 1e-12 * scale


def test_hvp_operator_is_symmetric_stan_bridge(eight_schools_estimators, eight_schools, rng):
    est = eight_schools_estimators["meanfield"]
    params = some_params(est.family, rng, mu_scale=0.3)
    eps = rng.standard_normal((5, eight_schools.dim))
    v, w = rng.standard_normal((2, est.family.n_params))
    hv, hw = est.hvp(params, eps, v), est.hvp(params, eps, w)
    scale = np.linalg.norm(hv) * np.linalg.norm(w) + np.linalg.norm(hw) * np.linalg.norm(v)
    tol = 1e-12 if eight_schools.hvp_exact else 1e-5
    assert abs(w @ hv - v @ hw) <= tol * scale


# ------------------------------------------------------------------------------ Gaussian target closed forms (docs/algorithms.md#gaussian-closed-forms)

@pytest.fixture(scope="module")
def gaussian_mf():
    lp, Lam = gaussian_target(M3, S3)
    return ElboEstimator(MeanField(3), lp), Lam


def test_gaussian_values_closed_form_elbo(gaussian_mf, rng):
    """E ℓ = the closed-form ELBO (docs/algorithms.md#gaussian-closed-forms; MC, 5 standard
    errors)."""
    est, Lam = gaussian_mf
    params = np.array([0.0, 0.3, 1.0, -0.5, 0.2, -1.0])
    mu, sig2 = params[:3], np.exp(2 * params[3:])
    _, logdet = np.linalg.slogdet(S3)
    d = mu - M3
    elbo = (-0.5 * (d @ Lam @ d + np.sum(np.diag(Lam) * sig2)) - 0.5 * (logdet + 3 * math.log(2 * math.pi))
            + 1.5 * (1 + math.log(2 * math.pi)) + params[3:].sum())
    vals = est.values(params, standard_normal(jax.random.PRNGKey(3), 20_000, 3))
    assert abs(vals.mean() - elbo) <= 5 * vals.std(ddof=1) / math.sqrt(len(vals))


def test_gaussian_gradient_mean_is_closed_form(gaussian_mf):
    """Test 1: E[G] = (−Λ(μ−m), 1 − Λ_ii σ_i²) (MC, 5 standard errors per coordinate)."""
    est, Lam = gaussian_mf
    params = np.array([0.0, 0.3, 1.0, -0.5, 0.2, -1.0])
    mu, sig2 = params[:3], np.exp(2 * params[3:])
    n = 20_000
    _, G = est.values_and_grads(params, standard_normal(jax.random.PRNGKey(1), n, 3))
    expected = np.concatenate([-Lam @ (mu - M3), 1.0 - np.diag(Lam) * sig2])
    se = G.std(axis=0, ddof=1) / math.sqrt(n)
    assert np.all(np.abs(G.mean(0) - expected) <= 5 * se), (G.mean(0), expected, se)


def test_gaussian_expected_hvp_is_closed_form(gaussian_mf, rng):
    """Test 4: E[H v] = (−Λa, −2 diag(Λ) σ² ⊙ b) (MC over independent Hessian samples, 5 standard
    errors from the spread of the per-sample products)."""
    est, Lam = gaussian_mf
    params = np.array([0.0, 0.3, 1.0, -0.5, 0.2, -1.0])
    sig2 = np.exp(2 * params[3:])
    v = rng.standard_normal(6)
    a, b = v[:3], v[3:]
    expected = np.concatenate([-Lam @ a, -2 * np.diag(Lam) * sig2 * b])
    k, n = 400, 50
    key = jax.random.PRNGKey(2)
    prods = np.stack([est.hvp(params, standard_normal(jax.random.fold_in(key, i), n, 3), v)
                      for i in range(k)])
    se = prods.std(axis=0, ddof=1) / math.sqrt(k)
    assert np.all(np.abs(prods.mean(0) - expected) <= 5 * se + 1e-12), (prods.mean(0), expected, se)


def test_gaussian_hvp_mu_block_exact_for_mu_direction(gaussian_mf, rng):
    """For v = (a, 0), the μ-block of every Hessian sample is exactly −Λa (H(z) = −Λ)."""
    est, Lam = gaussian_mf
    params = np.array([0.0, 0.3, 1.0, -0.5, 0.2, -1.0])
    a = rng.standard_normal(3)
    hv = est.hvp(params, rng.standard_normal((4, 3)), np.concatenate([a, np.zeros(3)]))
    np.testing.assert_allclose(hv[:3], -Lam @ a, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------ matched pairs, log p and log q

@pytest.mark.parametrize("fid", FAM_IDS)
def test_pair_differences_equal_difference_of_values(banana_estimators, fid, rng):
    est = banana_estimators[fid]
    old = some_params(est.family, rng)
    new = old + 0.2 * rng.standard_normal(old.shape)
    eps = rng.standard_normal((17, DIM))
    np.testing.assert_allclose(est.pair_differences(new, old, eps),
                               est.values(new, eps) - est.values(old, eps), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("fid", FAM_IDS)
def test_log_p_and_q(banana_estimators, fid, rng):
    est = banana_estimators[fid]
    fam = est.family
    params = some_params(fam, rng)
    eps = rng.standard_normal((8, DIM))
    z, lp, lq = est.log_p_and_q(params, eps)
    np.testing.assert_allclose(z, np.asarray(fam.sample(params, eps)), rtol=1e-14)
    np.testing.assert_allclose(lp, np.asarray(jax.vmap(banana_logistic)(jnp.asarray(z))), rtol=1e-12)
    np.testing.assert_allclose(lq, np.asarray(fam.log_q(params, z)), rtol=1e-12)


# ------------------------------------------------------------------------------ gradient_with_redraws (docs/algorithms.md#failed-draws, #trustvi-gradient)

THRESHOLD = 0.5


def truncated_normal_lp(z):
    """Standard normal, with −inf (a failed evaluation) wherever z[0] > 0.5."""
    return jnp.where(z[0] > THRESHOLD, -jnp.inf, -0.5 * jnp.sum(z * z))


def nan_region_lp(z):
    """Standard normal with a NaN value where z[0] > 0.5 (a different failure)."""
    return jnp.where(z[0] > THRESHOLD, jnp.nan, -0.5 * jnp.sum(z * z))


@pytest.fixture(scope="module")
def truncated_est():
    return ElboEstimator(MeanField(2), truncated_normal_lp)


def expected_drops(key, n, dim, params):
    """Replays the documented redraw scheme (batches of n draws from fold_in(key, attempt),
    consumed in order) and counts the failed draws consumed before n valid ones."""
    have = dropped = attempt = 0
    while have < n:
        eps = standard_normal(jax.random.fold_in(key, attempt), n, dim)
        attempt += 1
        z = params[:dim] + np.exp(params[dim:]) * eps
        for ok in z[:, 0] <= THRESHOLD:
            if have == n:
                break
            if ok:
                have += 1
            else:
                dropped += 1
    return dropped


@pytest.mark.parametrize("lp", [truncated_normal_lp, nan_region_lp], ids=["minus_inf", "nan"])
def test_gradient_with_redraws_drops_failed_draws(lp):
    est = ElboEstimator(MeanField(2), lp)
    params = np.zeros(4)                       # q = N(0, I): P(z0 > 0.5) ≈ 0.31
    key = jax.random.PRNGKey(7)
    n = 64
    ge = gradient_with_redraws(est, params, key, n, max_drops=10 * n)
    assert ge.per_draw.shape == (n, 4) and ge.values.shape == (n,)
    assert np.all(np.isfinite(ge.per_draw)) and np.all(np.isfinite(ge.values))
    np.testing.assert_allclose(ge.gradient, ge.per_draw.mean(0), rtol=1e-14)
    # every kept draw is outside the failing region (μ-gradient of −½‖z‖² is −z)
    assert np.all(-ge.per_draw[:, 0] <= THRESHOLD)
    assert ge.n_dropped == expected_drops(key, n, 2, params)
    # P(no drop in 64 draws) ≈ 0.69^64 ≈ 5e-11: the redraw path is exercised
    assert ge.n_dropped > 0


def test_gradient_with_redraws_limit(truncated_est):
    """The ``max_drops``-th failed draw raises (Stan: the 10·n-th drop ends the run); one more
    allowed drop and the same draws succeed with the same count."""
    params = np.zeros(4)
    key = jax.random.PRNGKey(11)
    n = 32
    drops = gradient_with_redraws(truncated_est, params, key, n, max_drops=10 * n).n_dropped
    assert drops > 0
    with pytest.raises(GradientFailure, match=f"{drops} draws .*limit {drops}"):
        gradient_with_redraws(truncated_est, params, key, n, max_drops=drops)
    ok = gradient_with_redraws(truncated_est, params, key, n, max_drops=drops + 1)
    assert ok.n_dropped == drops


def test_gradient_with_redraws_all_fail_raises(truncated_est):
    """A region where (nearly) every draw fails: GradientFailure, a VIError, with the count."""
    params = np.array([5.0, 0.0, -3.0, -3.0])            # z0 ≈ 5 > 0.5 always
    with pytest.raises(GradientFailure, match="limit 80") as info:
        gradient_with_redraws(truncated_est, params, jax.random.PRNGKey(0), 8, max_drops=80)
    from stanvi.errors import VIError
    assert isinstance(info.value, VIError)


# ------------------------------------------------------------------ the estimator registry (P2-1b item 5)

def test_every_method_names_a_registered_estimator_and_fit_builds_it(eight_schools):
    from stanvi import methods
    from stanvi.estimators.registry import ESTIMATORS, estimator_for

    for name, module in methods.METHODS.items():
        assert module.ESTIMATOR in ESTIMATORS, name
    est = estimator_for(eight_schools, MeanField(eight_schools.dim), "reparameterization")
    assert isinstance(est, ElboEstimator)
    assert estimator_for(eight_schools, MeanField(eight_schools.dim)) is est   # built once
    with pytest.raises(ValueError, match="unknown estimator 'nope'"):
        estimator_for(eight_schools, MeanField(eight_schools.dim), "nope")


# --------------------------------------------------------------- base draws from shape buckets

@pytest.mark.parametrize("dim", [1, 3, 10, 300, 3000])
def test_standard_normal_from_a_bucket_is_the_exact_shape_draw(dim):
    """standard_normal draws a bucketed block and keeps its first n rows: bit for bit the draw of
    shape (n, dim) (partitionable threefry); breaks if the bucket changed the values."""
    from stanvi.estimators.elbo import normal_rows, standard_normal

    key = jax.random.key(11)
    for n in (1, 3, 8, 16, 17, 100, 256, 257, 1000, 4096, 5000):
        want = np.asarray(jax.random.normal(key, (n, dim), dtype=jnp.float64))
        got = standard_normal(key, n, dim)
        assert got.shape == (n, dim)
        assert np.array_equal(got, want), (n, dim)
        rows = normal_rows(n, dim)
        assert rows >= n and (rows == n or rows * dim <= 1 << 20)


def test_normal_rows_buckets():
    from stanvi.estimators.elbo import normal_rows

    assert [normal_rows(n, 10) for n in (1, 8, 16, 17, 256, 300, 1024, 4096)] == \
        [1, 16, 16, 256, 256, 1024, 1024, 4096]
    assert normal_rows(5000, 300) == 5000          # beyond 2^20 entries: the exact size
    assert normal_rows(100, 3000) == 256            # a power of 4 up to 2^20 entries
