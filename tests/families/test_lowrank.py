"""The diagonal-plus-low-rank family (docs/algorithms.md#lowrank, issue T3-6): its density,
entropy and moments against the dense formulas, its host math against JAX autodiff, and its
exactness on a Gaussian target whose covariance is diagonal plus rank k."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import multivariate_normal

import stanvi
from stanvi.estimators.fixed_sample import moment_matched
from stanvi.families import LowRank, make_family
from stanvi.families.lowrank import default_rank
from stanvi.targets import JaxTarget

jax.config.update("jax_enable_x64", True)


def _params(fam: LowRank, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=fam.n_params) * 0.5


def _dense(fam: LowRank, p: np.ndarray) -> np.ndarray:
    """diag(e^{2ω}) + BBᵀ from λ by hand (B lower trapezoidal)."""
    D, k = fam.dim, fam.rank
    B = np.tril(p[2 * D:].reshape(D, k))
    return np.diag(np.exp(2 * p[D:2 * D])) + B @ B.T


def test_layout_options_and_rank_rules():
    fam = make_family("lowrank", 7, rank=3)
    assert (fam.n_params, fam.base_dim, fam.family_options()) == (35, 10, {"rank": 3})
    assert make_family("lowrank", 50).rank == default_rank(50) == 10
    assert default_rank(1) == 1 and default_rank(9) == 4
    for bad in (0, -1, 2.5, True, 8):
        with pytest.raises(ValueError, match="rank"):
            LowRank(7, bad)
    assert hash(LowRank(7, 3)) == hash(LowRank(7, 3))   # static argument of compiled functions


def test_log_q_entropy_and_moments_match_the_dense_formulas():
    fam = LowRank(7, 3)
    p = _params(fam)
    S = _dense(fam, p)
    np.testing.assert_allclose(fam.covariance(p), S, atol=1e-14)
    z = np.random.default_rng(2).normal(size=(5, 7))
    ref = multivariate_normal(p[:7], S).logpdf(z)
    np.testing.assert_allclose(np.asarray(fam.log_q(jnp.asarray(p), jnp.asarray(z))), ref,
                               atol=1e-10, rtol=0)
    np.testing.assert_allclose(fam.log_q_np(p, z), ref, atol=1e-10, rtol=0)
    h = 0.5 * np.linalg.slogdet(2 * math.pi * math.e * S)[1]
    assert abs(float(fam.entropy(jnp.asarray(p))) - h) < 1e-10
    assert abs(fam.entropy_np(p) - h) < 1e-10
    np.testing.assert_allclose(fam.marginal_sd(p), np.sqrt(np.diag(S)), rtol=1e-13)
    eps = np.random.default_rng(3).normal(size=(4, 10))
    z = fam.sample_np(p, eps)
    np.testing.assert_allclose(fam.log_q_eps_np(p, eps),
                               multivariate_normal(p[:7], S).logpdf(z), atol=1e-10, rtol=0)


def test_sampling_covariance_is_exactly_diag_plus_low_rank():
    """With base draws whose sample mean is 0 and sample covariance exactly I_{D+k}, the draws'
    sample covariance is Σ to rounding (the map ε ↦ z is affine): so the sampler's covariance is
    diag(d²) + BBᵀ, and the same through JAX and NumPy."""
    fam = LowRank(6, 2)
    p = _params(fam, 4)
    eps = moment_matched(np.random.default_rng(5).normal(size=(200, fam.base_dim)))
    for z in (fam.sample_np(p, eps), np.asarray(fam.sample(jnp.asarray(p), jnp.asarray(eps)))):
        c = z - z.mean(axis=0)
        np.testing.assert_allclose(c.T @ c / len(z), _dense(fam, p), atol=1e-12)
        np.testing.assert_allclose(z.mean(axis=0), p[:6], atol=1e-12)


def test_host_math_matches_jax_autodiff():
    """Gradient rows, their mean, the HVP pullback, the entropy's derivatives and the Stein model
    (exact for a Gaussian log p with moment-matched draws) against JAX autodiff of the ELBO."""
    fam = LowRank(7, 3)
    rng = np.random.default_rng(6)
    p = _params(fam)
    A = rng.normal(size=(7, 7))
    lam, m = A @ A.T / 7 + np.eye(7), rng.normal(size=7)

    def log_p(x):
        r = x - m
        return -0.5 * r @ (jnp.asarray(lam) @ r)

    def ell(pp, e):
        return log_p(fam.sample(pp, e[None])[0]) + fam.entropy(pp)

    v = rng.normal(size=fam.n_params)
    pj = jnp.asarray(p)
    np.testing.assert_allclose(fam.entropy_grad_np(p), np.asarray(jax.grad(fam.entropy)(pj)),
                               atol=1e-12)
    np.testing.assert_allclose(
        fam.entropy_hvp_np(p, v),
        np.asarray(jax.jvp(jax.grad(fam.entropy), (pj,), (jnp.asarray(v),))[1]), atol=1e-12)
    for eps in (rng.normal(size=(6, 10)), moment_matched(rng.normal(size=(64, 10)))):
        z = fam.sample_np(p, eps)
        g = -(z - m) @ lam
        rows = np.asarray(jax.vmap(jax.grad(ell), in_axes=(None, 0))(pj, jnp.asarray(eps)))
        np.testing.assert_allclose(fam.pullback_rows(p, eps, g), rows, atol=1e-12)
        np.testing.assert_allclose(fam.pullback_rows_at(np.tile(p, (len(eps), 1)), eps, g),
                                   rows, atol=1e-12)
        np.testing.assert_allclose(fam.pullback_mean(p, eps, g), rows.mean(axis=0), atol=1e-12)

        def mean_ell(pp, _eps=jnp.asarray(eps)):
            return jnp.mean(jax.vmap(ell, in_axes=(None, 0))(pp, _eps))

        hvp = np.asarray(jax.jvp(jax.grad(mean_ell), (pj,), (jnp.asarray(v),))[1])
        hu = -fam.tangent(p, eps, v) @ lam
        np.testing.assert_allclose(fam.hvp_pullback(p, eps, g, hu, v), hvp, atol=1e-12)
    # the last sample is moment matched: the Stein model is the fixed-sample Hessian exactly
    np.testing.assert_allclose(fam.stein_hvp_operator(p, eps, g)(v), hvp, atol=1e-11)
    # the gauge: the entries above B's diagonal have zero gradient and zero curvature
    upper = 2 * 7 + np.flatnonzero(~np.tri(7, 3, dtype=bool).ravel())
    assert upper.size == 3
    assert np.all(fam.pullback_mean(p, eps, g)[upper] == 0)
    assert np.all(fam.stein_hvp_operator(p, eps, g)(v)[upper] == 0)


def test_params_from_precision_is_diagonal_plus_low_rank_and_keeps_marginals():
    fam = LowRank(8, 2, laplace_fit="ppca")   # the PPCA start keeps H⁻¹'s marginals
    rng = np.random.default_rng(7)
    C = rng.normal(size=(8, 2))
    S = np.diag(np.exp(rng.uniform(-1, 1, 8))) + C @ C.T
    p = fam.params_from_precision(np.zeros(8), np.linalg.inv(S), -1.0)
    np.testing.assert_allclose(fam.marginal_sd(p), np.sqrt(np.diag(S)), rtol=1e-10)
    B = p[16:].reshape(8, 2)
    assert np.all(np.triu(B, 1) == 0)
    # a precision that is not positive definite: the mean-field rule
    bad = np.diag([4.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    p = fam.params_from_precision(np.zeros(8), bad, -1.0)
    assert p[8] == pytest.approx(-0.5 * math.log(4.0)) and p[9] == -1.0


def _diag_plus_low_rank_problem(dim: int, rank: int, seed: int):
    rng = np.random.default_rng(seed)
    a = np.exp(rng.uniform(-1, 1, dim))
    C = rng.normal(size=(dim, rank))
    m = rng.normal(size=dim)
    S = np.diag(a * a) + C @ C.T
    lam, mj = jnp.asarray(np.linalg.inv(S)), jnp.asarray(m)

    def log_p(z):
        r = z - mj
        return -0.5 * r @ (lam @ r)

    return JaxTarget(log_p, dim), m, S


def test_trustvi_is_exact_on_a_contained_gaussian():
    """A Gaussian whose covariance is diagonal plus rank 2 is in the family: TrustVI's default
    profile (fixed moment-matched sample, where the Stein model is the exact Hessian), asked to
    certify to 1e-13 nats with near-exact trust-region solves, recovers its mean and covariance
    to 1e-6 relative error, deterministically. (At the default tolerance, 0.1 nat, it stops
    within ~2e-4 nats: relative covariance error ~1e-3.)"""
    target, m, S = _diag_plus_low_rank_problem(8, 2, 0)
    fit = stanvi.fit(target, method="trustvi", family="lowrank", family_options={"rank": 2},
                     seed=1, progress=False, certify_gap=1e-13, fixed_krylov_tol=1e-10)
    assert fit.status == "converged", fit.message
    assert np.max(np.abs(fit.mean - m)) <= 1e-6 * np.max(np.abs(m))
    assert np.max(np.abs(fit.covariance - S)) <= 1e-6 * np.max(np.abs(S))
    assert fit.family.family_options() == {"rank": 2}


def test_trustvi_keeps_the_stein_model_on_the_low_rank_family():
    """The low-rank family's poor trust-region steps come from its parameterization, so the
    fixed-sample loop keeps the Stein model (``stein_model_gives_way = False``): on the
    contained Gaussian the only Hessian-vector products are the Laplace start's D, where the
    switch to HVPs (the mean-field and full-rank rule) made 20,392 and 5x the gradients."""
    target, _, _ = _diag_plus_low_rank_problem(8, 2, 0)
    fit = stanvi.fit(target, method="trustvi", family="lowrank", family_options={"rank": 2},
                     seed=1, progress=False)
    assert fit.status == "converged", fit.message
    assert "hessian_switch" not in fit.info
    assert fit.oracle["hvp_draws"] == 8


@pytest.mark.parametrize("method, options", [
    ("advi", {"max_iterations": 300}),
    ("mlmcvi", {"max_iters": 60}),
    ("hfsgvi", {"max_iters": 20}),
    ("trustvi", {"profile": "stochastic", "max_iters": 20}),
])
def test_methods_accept_lowrank(method, options):
    target, _, _ = _diag_plus_low_rank_problem(6, 2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # short runs need not converge
        fit = stanvi.fit(target, method=method, family="lowrank", family_options={"rank": 2},
                         seed=0, progress=False, draws=200, **options)
    assert fit.family.rank == 2
    assert fit.unconstrained_draws.shape == (200, 6)
    assert np.all(np.isfinite(fit.unconstrained_draws)) and np.all(np.isfinite(fit.log_q))
    assert not np.isnan(fit.diagnostics().khat)   # −inf: constant ratios (q = p)


def test_jointcv_accepts_lowrank():
    from jointcv_problems import linear_gaussian_problem  # noqa: PLC0415

    target, _, _, _ = linear_gaussian_problem()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(target, method="jointcv", family="lowrank", family_options={"rank": 1},
                         seed=0, progress=False, draws=100, max_iters=200)
    assert fit.unconstrained_draws.shape == (100, 3)
    assert np.all(np.isfinite(fit.unconstrained_draws))


def test_stan_fit_saves_reads_back_and_converts_to_arviz(load_target, tmp_path):
    """On a Stan model (the host path): a TrustVI lowrank fit, its ArviZ tree, and its save and
    read round trip with the family's rank."""
    target = load_target("eight_schools")
    fit = stanvi.fit(target, method="trustvi", family="lowrank", family_options={"rank": 3},
                     seed=0, progress=False, draws=300)
    assert np.all(np.isfinite(fit.unconstrained_draws))
    tree = fit.to_arviz()
    assert "posterior" in tree.children
    paths = fit.save(tmp_path / "out")
    back = stanvi.read(paths["netcdf"])
    assert back.family.name == "lowrank" and back.family.rank == 3
    np.testing.assert_allclose(back.params, fit.params)
    np.testing.assert_allclose(back.family.marginal_sd(back.params),
                               fit.family.marginal_sd(fit.params))


def test_log_q_at_draws_stays_accurate_when_a_diagonal_scale_collapses():
    """log q at the output and diagnostic draws is computed from ε (the quadratic form is
    ‖ε‖² minus a projection, so 0 ≤ it ≤ ‖ε‖²): with d_0 = e^{−40} and B_0 of order 1, the
    Woodbury form from z cancels catastrophically (errors of order (B/d)² · 1e-16)."""
    fam = LowRank(5, 2)
    p = _params(fam, 8)
    p[5] = -40.0
    eps = np.random.default_rng(9).normal(size=(50, 7))
    lq = fam.log_q_eps_np(p, eps)
    _, d, B = fam.parts_np(p)
    W = B / d[:, None]
    const = (np.sum(p[5:10]) + 0.5 * np.linalg.slogdet(np.eye(2) + W.T @ W)[1]
             + 2.5 * math.log(2 * math.pi))
    quad = -2.0 * (lq + const)
    assert np.all(quad >= -1e-6) and np.all(quad <= np.sum(eps * eps, axis=1) + 1e-6)


def test_stein_model_on_few_draws_applies_the_stein_hessian_to_each_tangent():
    """With few unmatched draws the Stein model is the mean of J_jᵀ Ĥ J_j plus the curvature and
    entropy terms, Ĥ = sym(M Σ⁻¹), M = (1/n) Σ g_j (z_j − μ)ᵀ (checked against Ĥ formed densely)."""
    fam = LowRank(7, 3)
    rng = np.random.default_rng(10)
    p = _params(fam)
    eps = rng.normal(size=(8, 10))
    g = rng.normal(size=(8, 7))
    v = rng.normal(size=fam.n_params)
    y = fam.noise_np(p, eps)
    h = (g.T @ y / 8) @ np.linalg.inv(fam.covariance(p))
    h = 0.5 * (h + h.T)
    expected = fam.hvp_pullback(p, eps, g, fam.tangent(p, eps, v) @ h, v)
    np.testing.assert_allclose(fam.stein_hvp_operator(p, eps, g)(v), expected, atol=1e-11)


def test_cli_fits_lowrank_with_its_rank_and_reads_it_back(tmp_path, capsys):
    """``stanvi fit --family lowrank --family-options '{"rank": 2}'``: the saved fit reads back
    with its rank; an unknown setting is refused with the known ones."""
    from pathlib import Path  # noqa: PLC0415

    from stanvi.cli import main  # noqa: PLC0415

    model = Path(__file__).resolve().parents[2] / "stan_models" / "eight_schools"
    base = ["fit", str(model / "eight_schools_noncentered.stan"), "--data",
            str(model / "eight_schools.data.json"), "--quiet", "--method", "advi", "--family",
            "lowrank", "--option", "max_iterations=200", "--output", str(tmp_path)]
    assert main([*base, "--family-options", '{"rank": 2}']) == 0
    back = stanvi.read(tmp_path / "eight_schools_noncentered-advi-lowrank-seed0.nc")
    assert back.family.name == "lowrank" and back.family.rank == 2
    assert main([*base, "--family-options", '{"k": 2}', "--name", "bad"]) == 1
    assert "['laplace_fit', 'rank']" in capsys.readouterr().err


def test_jointcv_on_a_stan_model_through_the_host_pullbacks():
    """jointcv on a Stan model (the block target; the family's NumPy noise and pullbacks): the
    full-data ELBO improves and the draws are finite."""
    from conftest import MODELS_DIR  # noqa: PLC0415
    from jointcv_problems import simulate_logistic  # noqa: PLC0415

    X, y = simulate_logistic(40, 3, seed=0)
    data = {"N": 40, "K": 3, "X": X, "y": y.astype(int)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(str(MODELS_DIR / "jointcv_logistic" / "jointcv_logistic.stan"), data,
                         method="jointcv", family="lowrank", family_options={"rank": 1},
                         n_blocks=10, batch_size=2, max_iters=60, learning_rate=2e-3,
                         elbo_every=20, progress=False, seed=1)
    elbo = fit.trace.column("elbo")
    assert np.isfinite(elbo[-1]) and elbo[-1] > elbo[0]
    assert np.all(np.isfinite(fit.unconstrained_draws))


def test_a_trial_point_that_overflows_gives_nan_not_an_exception():
    # TrustVI's trial steps can drive d = exp(omega) to 0 or B to inf; on posteriordb's
    # hmm_drive_0 that raised LinAlgError out of the fit (every seed); now the entropy is NaN
    # and the step is rejected like any other non-finite trial point
    from stanvi.families import make_family

    fam = make_family("lowrank", 4, rank=2)
    params = np.asarray(fam.initial_params(np.zeros(4), 0.0), dtype=float)
    params[4:8] = -800.0                 # d = exp(-800) = 0
    params[8:] = 1.0
    assert np.isnan(fam.entropy_np(params))


def test_entropy_and_log_q_stay_exact_when_diagonal_scales_collapse_at_different_scales():
    """Two collapsed d_i at different scales (8e-18 and 2.2e-8, rank 2): C = I + WᵀW formed
    explicitly loses the smaller row's part below its rounding (a Cholesky failure here, a
    finite log det off by 8 nats on posteriordb's kidscore_interaction), so the factor comes
    from the QR factorization of [I; W]; entropy (host and JAX) and log q against the dense
    formulas."""
    fam = LowRank(5, 2)
    rng = np.random.default_rng(0)
    d = np.array([0.86, 8e-18, 2.2e-8, 0.0093, 0.034])
    B = rng.normal(size=(5, 2)) * np.array([[1.0], [3.0], [0.5], [2.0], [1.0]])
    B[0, 1] = 0.0
    p = fam.pack(np.zeros(5), np.log(d), B)
    S = np.diag(d ** 2) + B @ B.T
    dense = 0.5 * (5 * (1.0 + math.log(2.0 * math.pi)) + np.linalg.slogdet(S)[1])
    assert fam.entropy_np(p) == pytest.approx(dense, abs=1e-8)
    assert float(fam.entropy(jnp.asarray(p))) == pytest.approx(dense, abs=1e-8)   # JAX's too
    assert np.all(np.isfinite(np.asarray(jax.grad(fam.entropy)(jnp.asarray(p)))))
    eps = rng.normal(size=(50, 7))
    z = fam.sample_np(p, eps)
    np.testing.assert_allclose(fam.log_q_eps_np(p, eps),
                               multivariate_normal(np.zeros(5), S).logpdf(z), atol=1e-5)
