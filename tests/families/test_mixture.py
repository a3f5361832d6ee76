"""The Gaussian-mixture family (stanvi.families.mixture) and its Rao-Blackwellized ELBO gradient
(stanvi.estimators.mixture_rb; docs/discrete.md#mixture-estimator, docs/discrete.md#rb-checks):
exact sampling and log q, moments, the enumerated RB gradient equal to the stratified one, and a
fit of the bimodal stan_models model that finds both modes where a single Gaussian cannot."""

from __future__ import annotations

import functools
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import stanvi
from stanvi.estimators.mixture_rb import exact_log_p, mixture_calc_grad
from stanvi.estimators.mixture_surrogate import surrogate
from stanvi.discrete.rao_blackwell import columns_for, fixed_columns
from stanvi.errors import VIError
from stanvi.families import GaussianMixture, make_family

ROOT = Path(__file__).resolve().parents[2]
BIMODAL = (str(ROOT / "stan_models/bimodal/bimodal.stan"),
           str(ROOT / "stan_models/bimodal/bimodal.data.json"))
MU = np.array([2.0, 1.5])


def random_params(fam: GaussianMixture, seed: int) -> jnp.ndarray:
    rng = np.random.default_rng(seed)
    p = fam.initial_params(rng.normal(size=fam.dim))
    return jnp.asarray(p + 0.3 * rng.normal(size=p.size))


def log_density(x):
    """The bimodal model's density in JAX (normalized): ½N(μ, I) + ½N(−μ, I)."""
    a = jax.scipy.stats.norm.logpdf(x, MU, 1.0).sum()
    b = jax.scipy.stats.norm.logpdf(x, -MU, 1.0).sum()
    return jnp.logaddexp(a, b) + jnp.log(0.5)


# ----------------------------------------------------------------- the family
@pytest.mark.parametrize("cov", ["diag", "full"])
def test_log_q_is_the_mixture_density(cov):
    fam = GaussianMixture(3, n_components=3, covariance_type=cov)
    params = random_params(fam, 1)
    w, means, covs = fam._np_components(params)
    z = np.random.default_rng(2).normal(size=(50, 3)) * 2
    want = np.log(sum(w[c] * stats.multivariate_normal(means[c], covs[c]).pdf(z)
                      for c in range(3)))
    np.testing.assert_allclose(np.asarray(fam.log_q(params, jnp.asarray(z))), want, atol=1e-10)


@pytest.mark.parametrize("cov", ["diag", "full"])
def test_sample_is_exact(cov):
    """Draws from D standard normals (first coordinate reused for the component choice) follow
    the mixture: component frequencies (chi-square), per-component standardized draws N(0, I)
    (KS per coordinate), moments against mean()/covariance()."""
    fam = GaussianMixture(2, n_components=3, covariance_type=cov)
    params = random_params(fam, 3)
    eps = jax.random.normal(jax.random.PRNGKey(0), (40_000, 2))
    c, e0 = fam.choose(params, eps)
    z = np.asarray(fam.sample(params, eps))
    w, means, covs = fam._np_components(params)
    counts = np.bincount(np.asarray(c), minlength=3)
    assert stats.chisquare(counts, w * len(z)).pvalue > 1e-3
    for k in range(3):
        zk = z[np.asarray(c) == k]
        e = np.linalg.solve(np.linalg.cholesky(covs[k]), (zk - means[k]).T).T
        for j in range(2):
            assert stats.kstest(e[:, j], "norm").pvalue > 1e-3
    np.testing.assert_allclose(z.mean(0), fam.mean(params), atol=0.05)
    np.testing.assert_allclose(np.cov(z.T), fam.covariance(params), rtol=0.05, atol=0.05)


def test_family_options_and_registry():
    assert isinstance(make_family("mixture", 2, n_components=5), GaussianMixture)
    assert GaussianMixture(2, n_components=3).exact                      # auto: C ≤ 4
    assert GaussianMixture(2, n_components=10).budget == 4                # auto: M = 4
    assert GaussianMixture(2, n_components=10, component_budget=None).exact
    assert GaussianMixture(2, n_components=10, component_budget=2).budget == 2
    for bad in ({"n_components": 0}, {"covariance_type": "tied"}, {"component_budget": 0},
                {"budget_rule": "best"}, {"component_budget": 3, "budget_rule": "fixed",
                                          "rb_k": 3, "n_components": 6}):
        with pytest.raises(ValueError):
            GaussianMixture(2, **bad)
    assert not hasattr(GaussianMixture(2), "entropy")   # no closed form: log p − log q per draw


# ----------------------------------------------------- the RB gradient (docs/discrete.md#rb-checks)
@functools.lru_cache(maxsize=None)
def _grad_fn(fam: GaussianMixture):
    def grad(params, cols, eps):
        lp, g = exact_log_p(fam, log_density, params, cols, eps)
        return jax.grad(surrogate)(params, fam, cols, eps, lp, g)
    return jax.jit(grad)


def test_enumerated_rb_gradient_equals_the_stratified_one():
    """With the Gaussian noise fixed per component (F̂_c deterministic), Σ_v q(v|C̄) ĝ(v) equals
    the all-components gradient to 1e-10, for every k (one remainder draw)."""
    C, S = 4, 3
    fam = GaussianMixture(2, n_components=C)
    params = random_params(fam, 7)
    noise = jax.random.normal(jax.random.PRNGKey(4), (C, S, 2))
    lw = jax.lax.stop_gradient(fam.log_weights(params))
    w = np.exp(np.asarray(lw))
    exact_cols = fixed_columns(jax.random.PRNGKey(0), lw, C)
    want = np.asarray(_grad_fn(fam)(params, exact_cols, noise[exact_cols.idx]))
    order = np.argsort(-w, kind="stable")
    for k in range(C):
        top, rest = order[:k], order[k:]
        total = 0.0
        for v in rest:
            cols = columns_for(lw, jnp.asarray(top), jnp.asarray([v]))
            total = total + w[v] / w[rest].sum() * np.asarray(
                _grad_fn(fam)(params, cols, noise[cols.idx]))
        np.testing.assert_allclose(total, want, atol=1e-10, rtol=0)
    # and the stratified gradient is the exact gradient of Σ_c w_c F̂_c (autodiff, no RB)
    def stratified(lam):
        z = fam.component_sample(lam, jnp.repeat(jnp.arange(C), S), noise.reshape(-1, 2))
        h = jax.vmap(log_density)(z) - fam.log_q(lam, z)
        return jnp.sum(jnp.exp(fam.log_weights(lam)) * h.reshape(C, S).mean(1))
    np.testing.assert_allclose(want, np.asarray(jax.grad(stratified)(params)), atol=1e-10)


def test_budget_gradient_is_unbiased_monte_carlo():
    """The compiled budget gradient (C = 6, M = 2, Prop. 2, drop-and-redraw loop) averages to the
    stratified gradient within 4 SE per coordinate."""
    fam = GaussianMixture(2, n_components=6, component_budget=2, samples_per_component=2)
    params = random_params(fam, 9)
    grad = mixture_calc_grad(fam, log_density, 2)
    exact = mixture_calc_grad(GaussianMixture(2, n_components=6, component_budget=None,
                                              samples_per_component=32), log_density, 32)
    keys = jax.random.split(jax.random.PRNGKey(5), 10_000)
    g = np.asarray(jax.jit(jax.vmap(lambda k: grad(params, k)[0]))(keys))
    ge = np.asarray(jax.jit(jax.vmap(lambda k: exact(params, k)[0]))(keys[:1000]))
    se = np.sqrt(g.var(0) / len(g) + ge.var(0) / len(ge))
    assert np.all(np.abs(g.mean(0) - ge.mean(0)) <= 4 * se + 1e-9), (g.mean(0), ge.mean(0), se)
    kind, dropped, evaluated = (np.asarray(x) for x in grad(params, keys[0])[1:])
    assert kind == 0 and dropped == 0 and evaluated == 2 * 2


def test_failed_draws_are_redrawn():
    """A model that fails on half the space: every gradient is finite; dropped draws counted."""
    fam = GaussianMixture(1, n_components=2, samples_per_component=8)

    def half(x):
        return jnp.where(x[0] > 0, -0.5 * x[0] ** 2, jnp.nan)

    g, kind, dropped, evaluated = mixture_calc_grad(fam, half, 8)(
        jnp.asarray(fam.initial_params(np.zeros(1))), jax.random.PRNGKey(0))
    assert int(kind) == 0 and int(dropped) > 0 and np.all(np.isfinite(np.asarray(g)))
    assert int(evaluated) % 16 == 0 and int(evaluated) > 16


# ----------------------------------------------------------------- stanvi.fit
def test_other_methods_refuse_the_mixture_with_the_reason():
    for method, why in (("trustvi", "Hessian-vector"), ("hfsgvi", "Hessian-vector"),
                        ("jointcv", "Taylor expansion")):
        with pytest.raises(VIError, match=why):
            stanvi.fit(log_density, dim=2, method=method, family="mixture", progress=False)
    # mlmcvi takes the mixture, but not its options defined for one Gaussian's coordinates
    for bad in ({"scale_param": "direct"}, {"truncate": 5.0}, {"snr_every": 10}):
        with pytest.raises(VIError, match="mixture"):
            stanvi.fit(log_density, dim=2, method="mlmcvi", family="mixture", progress=False,
                       max_iters=2, **bad)


def test_mixture_mlmc_levels_are_the_rb_gradient_and_coupled():
    """MLMCVI's per-slot rows for the mixture (stanvi.estimators.mixture_mlmc): their mean over n
    slots is minus the RB gradient with n draws per component (same columns, same draws), and a
    level difference at θ_t = θ_{t−1} is exactly zero (coupling: the same ξ in both terms)."""
    from stanvi.estimators.mixture_surrogate import columns  # noqa: PLC0415
    from stanvi.estimators.mixture_mlmc import free_energy_rows  # noqa: PLC0415

    fam = GaussianMixture(2, n_components=6, component_budget=3)
    params = random_params(fam, 3)
    key = jax.random.PRNGKey(2)
    eps = jax.random.normal(jax.random.PRNGKey(8), (5, 3, 2))          # n = 5 slots, M = 3
    rows, ok = free_energy_rows(fam, log_density)(params, key, eps)
    cols = columns(fam, key, jax.lax.stop_gradient(fam.log_weights(params)))
    e = jnp.swapaxes(eps, 0, 1)
    want = -np.asarray(_grad_fn(fam)(params, cols, e))
    assert np.all(np.asarray(ok))
    np.testing.assert_allclose(np.asarray(rows).mean(0), want, atol=1e-12)
    from stanvi.estimators.mixture_mlmc import MixtureMultilevel  # noqa: PLC0415
    from stanvi.targets.jax_target import JaxTarget  # noqa: PLC0415

    levels = MixtureMultilevel(JaxTarget(log_density, 2), fam, seed=0)
    rng = np.random.default_rng(0)
    theta = np.asarray(params)
    diff = levels.difference(theta, theta, lambda k: rng.standard_normal((k, 2)), 4)
    assert np.all(diff.mean == 0.0) and diff.evaluated == 2 * 3 * 4


def test_mlmcvi_with_the_mixture_finds_both_modes():
    """mlmcvi (MLRG of the RB gradient) on stan_models/bimodal: both modes, ELBO near 0 (the
    level-0 error of MLMC, docs/mlmcvi.md#persisting-error, leaves it a few hundredths below:
    n0 = 64)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(*BIMODAL, method="mlmcvi", family="mixture", seed=1, progress=False,
                         profile="paper",
                         family_options={"n_components": 2}, n0=64, lr0=0.3, drop_every=300,
                         max_iters=400, elbo_every=400, elbo_draws=500)
    side = np.mean(fit.stan_variable("theta") @ MU > 0)
    assert 0.4 < side < 0.6 and fit.elbo()[0] > -0.1
    assert sorted(np.sign(c["mean"] @ MU) for c in fit.family.components(fit.params)) == [-1, 1]
    assert fit.info["model_evaluations"]["gradient"] >= fit.oracle["gradient_draws"] > 0


def _fit(family, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return stanvi.fit(*BIMODAL, method="advi", family=family, seed=1, progress=False,
                          grad_samples=8, max_iterations=1000, **kwargs)


def test_mixture_finds_both_modes_of_the_bimodal_stan_model(tmp_path):
    """stan_models/bimodal (½N(μ, I) + ½N(−μ, I), normalized): a single mean-field Gaussian sits
    on one mode (ELBO ≈ log ½, k̂ > 0.7: unreliable); a two-component mixture covers both (half
    of its draws in each, ELBO ≈ 0, k̂ < 0.5), and the draws flow through Fit (by Stan name,
    log q = the mixture's, summary, draws_pd, ArviZ)."""
    single = _fit("meanfield")
    mix = _fit("mixture", family_options={"n_components": 2})
    th_single, th_mix = single.stan_variable("theta"), mix.stan_variable("theta")
    side = lambda th: np.mean(th @ MU > 0)  # noqa: E731
    assert min(side(th_single), 1 - side(th_single)) < 0.02
    assert 0.4 < side(th_mix) < 0.6
    assert single.diagnostics().khat > 0.7 and mix.diagnostics().khat < 0.5
    e_single, e_mix = single.elbo()[0], mix.elbo()[0]
    assert abs(e_single - np.log(0.5)) < 0.1 and e_mix > -0.05
    comps = mix.family.components(mix.params)
    assert sorted(np.sign(c["mean"] @ MU) for c in comps) == [-1, 1]
    assert all(abs(c["weight"] - 0.5) < 0.1 for c in comps)
    # Fit plumbing: log q is the mixture's, output columns, summary, ArviZ
    z = mix.unconstrained_draws
    np.testing.assert_allclose(mix.log_q, np.asarray(mix.family.log_q(jnp.asarray(mix.params),
                                                                       jnp.asarray(z))), atol=1e-12)
    assert th_mix.shape == (1000, 2) and list(mix.draws_pd().columns)[:3] == [
        "lp__", "log_p__", "log_g__"]
    assert mix.summary().shape[0] == 2
    assert "posterior" in mix.to_arviz().children
    mix.save(tmp_path)
    back = stanvi.read(tmp_path)
    assert back.family == mix.family
    np.testing.assert_allclose(back.covariance, mix.covariance, rtol=1e-12)
    # cost: one gradient = 2 components × 8 draws; the ledger equals the target's counter
    assert mix.oracle["gradient_draws"] == 16 * (len(mix.trace) - 1)
    assert mix.info["model_evaluations"]["gradient"] == (mix.oracle["gradient_draws"]
                                                          + mix.oracle["redrawn_draws"])


def test_a_mixture_too_large_for_memory_is_refused_up_front(monkeypatch):
    """Issue T3-2 item 12: n_components=100000 ran 85–141 s, then failed with a 14-deep
    JaxRuntimeError (51 GB).  The estimate is checked before any work, with the figures."""
    import time  # noqa: PLC0415

    import psutil  # noqa: PLC0415

    from conftest import MODELS_DIR  # noqa: PLC0415

    fam = GaussianMixture(dim=2, n_components=100_000)
    assert fam.peak_bytes(1000) == 8 * (3 * 1000 * 100_000 * 2 + 2 * 100_000 * 2)
    start = time.perf_counter()
    with pytest.raises(stanvi.VIError, match=r"needs about .* GB .* are available"):
        stanvi.fit(MODELS_DIR / "bernoulli" / "bernoulli.stan",
                   data=MODELS_DIR / "bernoulli" / "bernoulli.data.json", method="mlmcvi",
                   family="mixture", family_options={"n_components": 100_000}, progress=False)
    assert time.perf_counter() - start < 30
    # the same fit is not refused where the memory is there
    class Plenty:
        available = 10 ** 15
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Plenty)
    from stanvi.fit_inputs import check_memory  # noqa: PLC0415

    check_memory(fam, 1000)


@pytest.mark.parametrize("method", ["mlmcvi", "advi"])
def test_a_one_component_mixture_is_fitted_as_the_gaussian(logistic_regression, method):
    """Issue T3-2 item 4: MLMCVI with family='mixture', n_components=1 collapsed q to a point
    (sd 0 on logistic_regression's betas, means off) where its mean-field fit is right.  A
    one-component mixture is that Gaussian: the fit is the mean-field fit, draw for draw, and
    says so in ``fit.info['family_note']``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gaussian = stanvi.fit(logistic_regression, method=method, seed=3, progress=False,
                              draws=200)
        mixture = stanvi.fit(logistic_regression, method=method, family="mixture", seed=3,
                             family_options={"n_components": 1}, progress=False, draws=200)
    assert mixture.family.name == "meanfield" and mixture.status == gaussian.status
    np.testing.assert_array_equal(mixture.params, gaussian.params)
    np.testing.assert_array_equal(mixture.draws["beta"], gaussian.draws["beta"])
    assert np.all(mixture.draws["beta"].std(axis=0) > 0.05)
    assert "n_components=1 is a single Gaussian" in mixture.info["family_note"]
    full = stanvi.fit(logistic_regression, method="trustvi", family="mixture", seed=3,
                      family_options={"n_components": 1, "covariance_type": "full"},
                      progress=False, draws=10)
    assert full.family.name == "fullrank"
