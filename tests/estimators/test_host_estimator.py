"""The host path (stanvi.estimators.host, stanvi.families.host_math, stanvi.estimators.keys):
the NumPy estimator gives the JAX estimator's values to rounding on a Stan model, the Stein
Hessian model is exact on a Gaussian target with moment-matched draws, host keys are
deterministic, and a TrustVI fit on a Stan model compiles no JAX program."""

from __future__ import annotations

import numpy as np
import pytest

import stanvi
from stanvi.estimators.registry import estimator_for, host_path
from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.estimators.fixed_sample import moment_matched
from stanvi.estimators.host import HostElboEstimator
from stanvi.estimators.keys import HostKey, fold_in, make_key
from stanvi.families import FullRank, MeanField
from stanvi.families.host_math import STEIN_MATRIX_MAX_PARAMS
from stanvi.methods.base import purpose_key
from stanvi.targets import JaxTarget
from gaussian_targets import make_problem

RTOL = 1e-10


def _families(dim: int):
    return [MeanField(dim), FullRank(dim, diagonal="log"), FullRank(dim, diagonal="stan")]


def _params(family, rng) -> np.ndarray:
    p = 0.3 * rng.standard_normal(family.n_params)
    if getattr(family, "diagonal", None) == "stan":   # a positive diagonal, away from zero
        d = np.arange(family.dim)
        where = family.dim + d * (d + 3) // 2
        p[where] = 0.5 + np.abs(p[where])
    return p


def _close(a, b):
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    scale = max(1.0, float(np.max(np.abs(b))))
    assert float(np.max(np.abs(a - b))) <= RTOL * scale


@pytest.mark.parametrize("index", [0, 1, 2], ids=["meanfield", "fullrank-log", "fullrank-stan"])
def test_host_estimator_equals_the_jax_estimator(load_target, index):
    target = load_target("eight_schools")
    family = _families(target.dim)[index]
    rng = np.random.default_rng(index)
    params, other = _params(family, rng), _params(family, rng)
    eps = rng.standard_normal((9, target.dim))
    v = rng.standard_normal(family.n_params)
    jax_est = ElboEstimator(family, target.jax_log_density)
    host = HostElboEstimator(family, target)
    _close(host.values(params, eps), jax_est.values(params, eps))
    for a, b in zip(host.values_and_grads(params, eps), jax_est.values_and_grads(params, eps)):
        _close(a, b)
    for a, b in zip(host.values_and_model_grads(params, eps),
                    jax_est.values_and_model_grads(params, eps)):
        _close(a, b)
    _close(host.entropy_gradient(params), jax_est.entropy_gradient(params))
    _close(host.hvp(params, eps, v), jax_est.hvp(params, eps, v))
    _close(host.pair_differences(other, params, eps),
           jax_est.pair_differences(other, params, eps))
    for a, b in zip(host.log_p_and_q(params, eps), jax_est.log_p_and_q(params, eps)):
        _close(a, b)
    _, g = host.values_and_model_grads(params, eps)
    _close(family.pullback_mean(params, eps, g), jax_est.values_and_grads(params, eps)[1].mean(0))


@pytest.mark.parametrize("index", [0, 1, 2], ids=["meanfield", "fullrank-log", "fullrank-stan"])
def test_per_row_pullbacks_equal_autodiff(index):
    """The family's per-draw ELBO gradients with a λ per row (``pullback_rows_at``: what the
    joint control variate's table needs) and its z − μ (``noise_np``) equal JAX's
    vector-Jacobian products through ``family.sample`` plus ∇H, row by row."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    rng = np.random.default_rng(7 + index)
    family = _families(4)[index]
    rows = np.array([_params(family, rng) for _ in range(6)])
    eps, g = rng.standard_normal((6, 4)), rng.standard_normal((6, 4))

    def one(p, e, gi):
        _, vjp = jax.vjp(lambda pp: family.sample(pp, e[None, :])[0], p)
        return vjp(gi)[0] + jax.grad(family.entropy)(p)
    expected = jax.vmap(one)(jnp.asarray(rows), jnp.asarray(eps), jnp.asarray(g))
    _close(family.pullback_rows_at(rows, eps, g), expected)
    _close(family.pullback_rows_at(np.broadcast_to(rows[0], rows.shape), eps, g),
           family.pullback_rows(rows[0], eps, g))
    _close(family.noise_np(rows[0], eps),
           np.asarray(family.sample(jnp.asarray(rows[0]), jnp.asarray(eps))) - rows[0][:4])


@pytest.mark.parametrize("index", [0, 1, 2], ids=["meanfield", "fullrank-log", "fullrank-stan"])
def test_stein_model_is_the_exact_hessian_on_a_gaussian(index):
    """With moment-matched draws, E[g εᵀ] A⁻¹ is the Gaussian's Hessian exactly (Stein's
    lemma), so the Stein model's product equals the fixed-sample ELBO's HVP to rounding; on a
    non-Gaussian target it would not (the test would fail if the pullback were wrong)."""
    problem = make_problem(5, correlated=True)
    target = JaxTarget(problem.log_density, problem.dim)
    family = _families(problem.dim)[index]
    rng = np.random.default_rng(7 + index)
    params = _params(family, rng)
    eps = moment_matched(rng.standard_normal((40, problem.dim)))
    est = HostElboEstimator(family, target)
    _, g = est.values_and_model_grads(params, eps)
    model = family.stein_hvp_operator(params, eps, g)
    for _ in range(3):
        v = rng.standard_normal(family.n_params)
        _close(model(v), est.hvp(params, eps, v))


@pytest.mark.parametrize("index", [0, 1, 2], ids=["meanfield", "fullrank-log", "fullrank-stan"])
def test_stein_model_matrix_is_the_operator_as_a_matrix(index):
    """The Stein model formed as a matrix (used for small P) has the operator's columns and is
    symmetric; a mistaken block or index would show in one of the (P, P) entries."""
    rng = np.random.default_rng(11 + index)
    for dim in (1, 4, 7):
        family = _families(dim)[index]
        params = _params(family, rng)
        eps = moment_matched(rng.standard_normal((30, dim)))
        g = rng.standard_normal((30, dim))
        matrix = family.stein_model_matrix(params, eps, g)
        operator = family.stein_hvp_operator(params, eps, g)
        columns = np.stack([operator(e) for e in np.eye(family.n_params)], axis=1)
        _close(matrix, columns)
        _close(matrix, matrix.T)


def test_stein_model_matrix_is_not_formed_for_many_parameters():
    dim = 30   # full rank: P = 495 > STEIN_MATRIX_MAX_PARAMS
    family = FullRank(dim)
    assert family.n_params > STEIN_MATRIX_MAX_PARAMS
    eps, g = np.ones((4, dim)), np.ones((4, dim))
    assert family.stein_model_matrix(family.diagonal_params(np.zeros(dim), np.zeros(dim)),
                                     eps, g) is None


def test_moment_matching_gives_exact_moments():
    rng = np.random.default_rng(0)
    eps = moment_matched(rng.standard_normal((50, 6)))
    assert np.allclose(eps.mean(axis=0), 0.0, atol=1e-14)
    assert np.allclose(eps.T @ eps / 50, np.eye(6), atol=1e-12)
    few = moment_matched(rng.standard_normal((4, 6)))   # n ≤ D + 1: per-coordinate only
    assert np.allclose(few.mean(axis=0), 0.0, atol=1e-14)
    assert np.allclose((few * few).mean(axis=0), 1.0, atol=1e-12)


def test_host_keys_are_deterministic_and_independent():
    key = make_key(3, host=True)
    assert isinstance(key, HostKey)
    a = standard_normal(purpose_key(key, 1, "gradient"), 5, 4)
    assert np.array_equal(a, standard_normal(purpose_key(make_key(3, host=True), 1, "gradient"),
                                             5, 4))
    # the first rows of a larger draw are the smaller draw (bucketed batch sizes stay exact)
    assert np.array_equal(a, standard_normal(purpose_key(key, 1, "gradient"), 9, 4)[:5])
    for other in (purpose_key(key, 2, "gradient"), purpose_key(key, 1, "hessian"),
                  fold_in(key, 1), purpose_key(make_key(4, host=True), 1, "gradient")):
        assert not np.allclose(a, standard_normal(other, 5, 4))


def test_estimator_choice(load_target):
    target = load_target("eight_schools")
    fam = MeanField(target.dim)
    assert host_path(target, fam)
    assert isinstance(estimator_for(target, fam, host=True), HostElboEstimator)
    assert isinstance(estimator_for(target, fam), ElboEstimator)   # ADVI's compiled loop
    problem = make_problem(3, correlated=False)
    jax_target = JaxTarget(problem.log_density, 3)
    assert not host_path(jax_target, MeanField(3))   # a JAX-native target keeps JAX (GPU)


def test_stanvi_host_path_0_selects_the_jax_estimator(load_target, monkeypatch):
    target = load_target("eight_schools")
    monkeypatch.setenv("STANVI_HOST_PATH", "0")
    assert not host_path(target, MeanField(target.dim))


def test_a_trustvi_fit_on_a_stan_model_compiles_nothing(load_target):
    fit = stanvi.fit(load_target("eight_schools"), method="trustvi", seed=1, progress=False)
    assert fit.converged
    assert fit.compile_time == 0.0
    assert isinstance(fit._estimator, HostElboEstimator)
