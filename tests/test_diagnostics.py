"""Diagnostics of a fit (issue P1-3): Pareto k-hat of p/q with arviz-stats' PSIS, the
sample-size-dependent threshold, the verdict bands, importance ESS, PSIS resampling, warnings.

Synthetic cases use exact p and q (no optimizer involved), so their k-hat is known in theory;
the end-to-end cases fit a Gaussian full-rank (k-hat small) and Neal's funnel mean-field
(k-hat large), as in Yao et al. (2018).
"""

from __future__ import annotations

import math
import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from arviz_stats.base import array_stats
from scipy import stats

import stanvi
from stanvi import diagnostics as dg
from stanvi.stan.compiler import compile_model

from conftest import MODELS_DIR


# ----------------------------------------------------------------- threshold and verdict bands
def test_threshold_is_min_of_log10_rule_and_0_7():
    assert dg.khat_threshold(100) == pytest.approx(0.5)
    assert dg.khat_threshold(1000) == pytest.approx(1 - 1 / 3)
    assert dg.khat_threshold(10**4) == pytest.approx(0.7)  # 1 − 1/4 = 0.75 capped at 0.7
    assert dg.khat_threshold(10**6) == pytest.approx(0.7)


def test_verdict_bands():
    assert dg.verdict(0.3, 1000) == "good"
    assert dg.verdict(0.5, 1000) == "good"
    assert dg.verdict(0.6, 1000) == "use with care"
    assert dg.verdict(0.68, 1000) == "unreliable"      # above 2/3 for S = 1000 ...
    assert dg.verdict(0.68, 10**4) == "use with care"  # ... but not for S = 10^4
    assert dg.verdict(1.3, 10**4) == "unreliable"
    assert dg.verdict(-math.inf, 1000) == "good"
    assert dg.verdict(math.inf, 1000) == "unreliable"
    assert dg.verdict(float("nan"), 1000) == "unreliable"
    # With S = 100 the threshold is 0.5: no 'use with care' band is left.
    assert dg.verdict(0.45, 100) == "good" and dg.verdict(0.55, 100) == "unreliable"


# ----------------------------------------------------------------- PSIS
def test_psis_is_arviz_stats_psis_on_the_ratios(rng):
    r = rng.standard_normal(2000) * 0.7
    lw, k = dg.psis(r)
    ref_lw, ref_k = array_stats.psislw(-r)  # arviz-stats' LOO convention: pass −log ratio
    assert k == pytest.approx(float(ref_k))
    np.testing.assert_allclose(lw, ref_lw - np.logaddexp.reduce(ref_lw), atol=1e-12)
    assert np.exp(lw).sum() == pytest.approx(1.0)


def _gaussian_case(rng, n, q_scale):
    """log p and log q at n draws from q = N(0, q_scale²) for p = N(0, 1) in 3-D."""
    z = rng.standard_normal((n, 3)) * q_scale
    log_p = stats.norm.logpdf(z).sum(axis=1)
    log_q = stats.norm.logpdf(z, scale=q_scale).sum(axis=1)
    return log_p, log_q


def test_exact_q_gives_constant_ratios_and_full_ess(rng):
    log_p, log_q = _gaussian_case(rng, 1000, 1.0)
    d = dg.compute(log_p, log_q, status="converged")
    assert d.khat == -math.inf and d.verdict == "good"
    assert d.ess == pytest.approx(1000)
    assert d.elbo == pytest.approx(0.0, abs=1e-9)  # log Z = 0 for a normalized p
    assert not d.warnings


def test_wider_q_gives_small_khat(rng):
    # q wider than p: p/q is bounded, so k-hat is near or below 0 (theory: k < 0).
    d = dg.compute(*_gaussian_case(rng, 4000, 1.2))
    assert d.khat < 0.3 and d.verdict == "good"
    assert d.ess > 0.6 * d.n_draws


def test_narrow_q_gives_large_khat(rng):
    # q = N(0, 0.4²) for p = N(0, 1): p/q = exp(c z²) has a Pareto tail with k = 0.84.
    d = dg.compute(*_gaussian_case(rng, 4000, 0.4), status="converged")
    assert d.khat > d.threshold and d.verdict == "unreliable"
    assert d.khat == pytest.approx(0.84, abs=0.2)
    assert d.ess < 0.5 * d.n_draws


def test_failed_draws_get_zero_weight_and_a_warning(rng):
    log_p, log_q = _gaussian_case(rng, 1000, 1.1)
    log_p[[3, 17]] = -np.inf
    log_p[5] = np.nan
    d = dg.compute(log_p, log_q, status="converged")
    assert d.n_failed == 3
    assert np.all(np.exp(d.log_weights[[3, 5, 17]]) == 0.0)
    assert np.exp(d.log_weights).sum() == pytest.approx(1.0)
    assert d.elbo == -math.inf
    assert any("non-finite log density" in w for w in d.warnings)


def test_too_few_or_no_usable_draws(rng):
    d = dg.compute(*_gaussian_case(rng, 20, 0.8), status="converged")
    assert math.isnan(d.khat) and d.verdict == "unreliable"
    assert any("could not be estimated" in w for w in d.warnings)
    d = dg.compute(np.full(50, -np.inf), np.zeros(50), status="converged")
    assert d.verdict == "unreliable" and d.ess == 0.0 and d.n_failed == 50


@pytest.mark.parametrize("status, words", [("budget", "budget"), ("max_iters", "iteration limit"),
                                           ("failed", "failed")])
def test_warning_when_not_converged(rng, status, words):
    d = dg.compute(*_gaussian_case(rng, 500, 1.1), status=status, message="boom")
    assert any(words in w for w in d.warnings)
    assert "not converged" in d.one_line() or status == "failed"
    assert "warning: " in str(d)


def test_importance_ess():
    assert dg.importance_ess(np.zeros(50)) == pytest.approx(50)
    lw = np.log([0.5, 0.5, 1e-300, 1e-300])
    assert dg.importance_ess(lw) == pytest.approx(2.0)


def test_stratified_resampling_follows_the_weights(rng):
    w = np.array([0.5, 0.25, 0.125, 0.125])
    idx = dg.resample_indices(np.log(w), n=800, seed=3)
    counts = np.bincount(idx, minlength=4)
    np.testing.assert_array_equal(counts, 800 * w)  # stratified: exact for these weights
    idx = dg.resample_indices(np.log([1e-300, 1.0, 1e-300]), n=10, seed=0)
    assert set(idx.tolist()) == {1}


def test_str_is_readable(rng):
    d = dg.compute(*_gaussian_case(rng, 1000, 0.5), status="converged", method="trustvi")
    text = str(d)
    for word in ("Pareto k-hat", "threshold 0.67", "verdict", "importance ESS", "ELBO"):
        assert word in text
    assert d.one_line().startswith("trustvi converged: Pareto k-hat")


# ----------------------------------------------------------------- end to end on fits
A = np.array([[1.0, 0.8, 0.3], [0.8, 2.0, 0.5], [0.3, 0.5, 1.5]])
M = np.array([1.0, -1.0, 2.0])


@pytest.fixture(scope="module")
def gaussian_fullrank_fit():
    prec, m = jnp.asarray(np.linalg.inv(A)), jnp.asarray(M)
    target = stanvi.JaxTarget(lambda z: -0.5 * (z - m) @ prec @ (z - m), 3, name="gaussian3")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return stanvi.fit(target, method="advi", family="fullrank", seed=3, draws=2000,
                          progress=False, max_iterations=3000)


def test_khat_small_for_gaussian_fitted_fullrank(gaussian_fullrank_fit):
    d = gaussian_fullrank_fit.diagnostics()
    assert d.khat < 0.5, str(d)
    assert d.verdict == "good"
    assert d.ess > 0.5 * d.n_draws


@pytest.mark.slow
def test_khat_large_for_funnel_fitted_meanfield():
    compiled = compile_model(MODELS_DIR / "funnel" / "funnel.stan", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(compiled, method="advi", family="meanfield", seed=1, draws=2000,
                         progress=False, max_iterations=2000)
    d = fit.diagnostics()
    assert d.khat > d.threshold, str(d)
    assert d.verdict == "unreliable"
    assert fit.to_arviz().attrs["verdict"] == "unreliable"


def test_fit_stores_diagnostics_and_resamples(gaussian_fullrank_fit):
    fit = gaussian_fullrank_fit
    assert fit.diagnostics() is fit.diagnostics()  # computed once by stanvi.fit, stored
    d = fit.diagnostics(resample=True)
    assert d.resampled is not None and d.resampled_indices.shape == (2000,)
    assert set(d.resampled) == set(fit.draws)  # a JAX target's draws: z.1, z.2, z.3
    np.testing.assert_array_equal(d.resampled["z.2"], fit.draws["z.2"][d.resampled_indices])
    # The PSIS-reweighted mean of a good fit is close to the exact mean.
    z = fit.unconstrained_draws
    np.testing.assert_allclose(d.weighted_mean(z), M, atol=0.15)


def test_fit_prints_one_line_verdict(capsys):
    target = stanvi.JaxTarget(lambda z: -0.5 * jnp.sum(z**2), 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stanvi.fit(target, method="advi", seed=0, progress=True, max_iterations=300)
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Pareto k-hat" in err[-1] and "->" in err[-1]
