"""The reading of q's means apart from the verdict (stanvi.diagnostics.verdict.means_reading,
docs/diagnostics.md#means): the Newton step of the means from the diagnostic draws (Stein's
lemma), and the rule that reads it."""

import math

import numpy as np
import pytest

from stanvi.diagnostics.report import compute
from stanvi.diagnostics.verdict import (CURVATURE_REACH, DECISION_Z, NEWTON_STEP_LIMIT,
                                        curved_upper,
                                        means_reading, newton_curvature, newton_figures,
                                        newton_step)


def _gaussian_log_density(z, mean, cov):
    prec = np.linalg.inv(cov)
    d = z - mean
    return -0.5 * np.einsum("si,ij,sj->s", d, prec, d) - 0.5 * np.linalg.slogdet(cov)[1]


def test_the_newton_step_is_the_offset_of_a_gaussian_of_the_same_covariance():
    # p = N(delta, S), q = N(0, S): log p - log q = delta' S^-1 z + c, so Cov(r, z) = delta
    # exactly, and the step is |delta_i| / sd_i, correlations or not
    cov = np.array([[1.0, 0.8, 0.3], [0.8, 2.0, -0.5], [0.3, -0.5, 0.5]])
    delta = np.array([0.5, 0.0, -0.2])
    rng = np.random.default_rng(5)
    z = rng.multivariate_normal(np.zeros(3), cov, size=40000)
    r = _gaussian_log_density(z, delta, cov) - _gaussian_log_density(z, np.zeros(3), cov)
    step, se = newton_step(z, r)
    expected = np.abs(delta) / np.sqrt(np.diag(cov))
    assert np.all(np.abs(step - expected) < 4 * se + 1e-12)
    assert np.all(se < 0.05)


def test_the_newton_step_of_a_non_gaussian_target_by_steins_lemma():
    # p ∝ exp(-z^4/4), q = N(mu, s^2): Cov(r, z) = s^2 E_q[-z^3] and E_q[z^3] = mu^3 + 3 mu s^2,
    # so the step in sds of q is s |mu^3 + 3 mu s^2| (0.4824 here) — with no gradient evaluated
    mu, s = 0.3, 0.8
    rng = np.random.default_rng(9)
    z = mu + s * rng.standard_normal((200000, 1))
    r = -0.25 * z[:, 0] ** 4 + 0.5 * ((z[:, 0] - mu) / s) ** 2
    step, se = newton_step(z, r)
    assert abs(step[0] - s * abs(mu ** 3 + 3 * mu * s ** 2)) < 4 * se[0]
    assert se[0] < 0.01


def test_the_newton_step_skips_failed_draws_and_still_coordinates():
    z = np.column_stack([np.arange(6.0), np.ones(6)])
    r = np.array([0.0, 1.0, 2.0, 3.0, 4.0, -np.inf])   # the last draw failed
    step, se = newton_step(z, r)
    # over the five finite draws: Cov(r, z_0) = Var(0..4) = 2, sd(z_0) = sqrt(2)
    assert step == pytest.approx([math.sqrt(2.0), 0.0]) and se[1] == 0.0
    assert np.isnan(newton_step(z[:1], r[:1])[0]).all()


def test_the_reading_of_the_means():
    assert means_reading("good", math.nan) == "hold"
    assert means_reading("use with care", 0.9) == "hold"
    assert means_reading("unreliable", 0.05) == "plausible"
    assert means_reading("unreliable", NEWTON_STEP_LIMIT) == "plausible"
    assert means_reading("unreliable", NEWTON_STEP_LIMIT + 1e-9) == "doubtful"
    assert means_reading("unreliable", math.nan) == "doubtful"     # not computed
    assert means_reading("unreliable", 0.0, off_by_psis=True) == "doubtful"
    assert means_reading("unreliable", 0.0, fails=True) == "doubtful"
    assert means_reading("unreliable", 0.0, collapsed=True) == "doubtful"
    figures = newton_figures(np.array([0.1, 0.5, 0.3]), np.array([0.01, 0.1, 0.5]))
    assert figures["newton_step_median"] == pytest.approx(0.3)
    assert figures["newton_step_max"] == pytest.approx(0.5)
    # DECISION_Z standard errors above: 0.1 + 0.01645, 0.5 + 0.1645, 0.3 + 0.8225; median
    assert figures["newton_step_upper"] == pytest.approx(0.5 + DECISION_Z * 0.1)
    assert newton_figures(None, None) == {}


def test_a_noisy_step_is_not_read_as_small():
    # a far-off q's log ratios vary so much that its Newton step is known only to within a
    # wide band: its means are doubtful, not plausible, even where the estimate itself is 0
    log_p, log_q, z = _mean_field_of_correlated(0.0, n=2000)
    noisy = log_p + 40.0 * np.random.default_rng(4).standard_normal(log_p.size)
    d = compute(noisy, log_q, z=z)
    figures = newton_figures(d.newton_steps, d.newton_steps_se)
    assert figures["newton_step_upper"] > NEWTON_STEP_LIMIT and d.means == "doubtful"


def _mean_field_of_correlated(offset_in_sd: float, rho: float = 0.95, n: int = 20000):
    """log p, log q and z for p = N(0, [[1, rho], [rho, 1]]) and its mean-field optimum
    q = N(mu, diag(1 - rho^2)) (sds sqrt(1 - rho^2) = 0.31 of p's), mu offset along z_0."""
    cov = np.array([[1.0, rho], [rho, 1.0]])
    sd = math.sqrt(1 - rho ** 2)
    mu = np.array([offset_in_sd * sd, 0.0])
    z = mu + sd * np.random.default_rng(2).standard_normal((n, 2))
    log_q = _gaussian_log_density(z, mu, sd ** 2 * np.eye(2))
    return _gaussian_log_density(z, np.zeros(2), cov), log_q, z


def test_a_centred_mean_field_q_of_a_correlated_posterior_has_plausible_means():
    # the case the verdict alone cannot tell from an off q: sds a third of p's, means right
    d = compute(*_mean_field_of_correlated(0.0)[:2], z=_mean_field_of_correlated(0.0)[2])
    assert d.verdict == "unreliable" and d.khat > d.threshold
    assert d.means == "plausible"
    assert newton_figures(d.newton_steps, d.newton_steps_se)["newton_step_median"] < 0.05
    assert "(means plausible)" in d.one_line()
    assert d.verdict_figures()["means"] == "plausible"


def test_the_same_q_half_an_sd_off_has_doubtful_means():
    # its Newton step: 0.5 in z_0 and 0.5 * rho in z_1 (Sigma_q P mu in sds of q), median 0.49
    log_p, log_q, z = _mean_field_of_correlated(0.5)
    d = compute(log_p, log_q, z=z)
    figures = newton_figures(d.newton_steps, d.newton_steps_se)
    assert figures["newton_step_median"] == pytest.approx(0.5 * (1 + 0.95) / 2, abs=0.03)
    assert d.verdict == "unreliable" and d.means == "doubtful"
    assert "means doubtful" in d.one_line() and "means:            doubtful" in str(d)


def test_a_q_that_is_not_one_gaussian_has_no_newton_step_to_read():
    # Stein's lemma is a Gaussian's: for a mixture q the covariance of r and z is not a step
    from stanvi.families.gaussian import FullRank, MeanField
    from stanvi.families.lowrank import LowRank
    from stanvi.families.mixture import GaussianMixture

    assert MeanField.gaussian and FullRank.gaussian and LowRank.gaussian
    assert not GaussianMixture.gaussian
    log_p, log_q, z = _mean_field_of_correlated(0.0)
    d = compute(log_p, log_q, z=z, gaussian=False)
    assert d.verdict == "unreliable" and d.newton_steps is None and d.means == "doubtful"


def test_the_newton_step_in_units_of_the_weighted_sd():
    figures = newton_figures(np.array([0.4, 0.6, 0.2]), np.zeros(3), np.array([2.0, 1.0, 4.0]))
    # with no noise: 0.4, 0.6, 0.2; over the weighted sds' ratios 2, 1, 4: 0.2, 0.6, 0.05
    assert figures["newton_step_upper"] == pytest.approx(0.4)
    assert figures["newton_step_upper_in_weighted_sd"] == pytest.approx(0.2)


def test_the_curvature_along_the_step_of_a_full_rank_q_a_scaled_posterior():
    # p = N(mu, S), q = N(m, c S) with L = chol(c S): the ELBO's Hessian in whitened means is
    # L' (-S^-1) L = -c I, so kappa = c along any direction, the step Newton's method with q's
    # covariance takes (Sigma_q grad = c (mu - m)) is c times the offset, and step / kappa is
    # the offset itself in sds of q
    cov = np.array([[1.0, 0.8, 0.3], [0.8, 2.0, -0.5], [0.3, -0.5, 0.5]])
    mu, m, c = np.array([0.4, -0.3, 0.1]), np.zeros(3), 0.36
    chol = np.linalg.cholesky(c * cov)
    eps = np.random.default_rng(11).standard_normal((200000, 3))
    z = m + eps @ chol.T
    r = _gaussian_log_density(z, mu, cov) - _gaussian_log_density(z, m, c * cov)
    kappa, se = newton_curvature(eps, r)
    assert abs(kappa - c) < 4 * se and se < 0.03
    step, step_se = newton_step(z, r)
    offset = np.abs(mu - m) / np.sqrt(np.diag(c * cov))
    # the quotient's error, to first order, from the step's and kappa's
    tolerance = 4 * (step_se + offset * se) / kappa
    assert np.all(np.abs(step / kappa - offset) < tolerance) and np.all(tolerance < 0.25)


def test_the_curvature_of_a_mean_field_q_too_wide_in_a_stiff_direction():
    # p = N(0, diag(1, 0.01)), q = N(m, diag(0.5², 0.5²)): whitened curvatures 0.25 and 25; the
    # step is almost all along the stiff coordinate, whose curvature kappa then reads (about 25),
    # and divides the overstated step (0.5² · 0.05 / 0.01 / 0.5 = 2.5 sds of q) down to the
    # offset itself (0.05 / 0.5 = 0.1)
    sd_p, sd_q, m = np.array([1.0, 0.1]), np.array([0.5, 0.5]), np.array([0.0, 0.05])
    eps = np.random.default_rng(3).standard_normal((40000, 2))
    z = m + sd_q * eps
    r = (-0.5 * np.sum((z / sd_p) ** 2, axis=1)) - (-0.5 * np.sum(eps ** 2, axis=1))
    kappa, se = newton_curvature(eps, r)
    assert abs(kappa - 25.0) < 4 * se + 0.5
    step, step_se = newton_step(z, r)
    assert step[1] == pytest.approx(2.5, rel=0.1)
    assert step[1] / kappa == pytest.approx(0.1, rel=0.15)


def test_the_curved_upper_bound():
    # a resolved step (median 0.2 against a bound of 0.3) within q's sd: divided by kappa's
    # lower bound
    assert curved_upper(0.3, 3.0, 0.0, 0.2) == pytest.approx(0.1)
    assert curved_upper(0.3, 3.0, 1.0, 0.2) == pytest.approx(0.3 / (3.0 - DECISION_Z))
    assert curved_upper(0.3, 0.5, 0.0, 0.2) == pytest.approx(0.6)   # flatter than q: longer
    assert curved_upper(0.3, 0.1, 0.2, 0.2) == math.inf          # may not curve down: no bound
    assert curved_upper(0.3, math.nan, math.nan, 0.2) == 0.3     # not computed: the plain bound
    # a step within its noise (median 0.1, error margin 0.2): no direction, the plain bound
    assert curved_upper(0.3, 3.0, 0.0, 0.1) == 0.3
    # a step beyond q's own sd (CURVATURE_REACH): no extrapolation, the plain bound
    assert CURVATURE_REACH == 1.0
    assert curved_upper(16979.0, 227265.0, 24362.0, 8538.0) == 16979.0
    figures = newton_figures(np.array([0.4, 0.6, 0.2]), np.zeros(3), curvature=(2.0, 0.0))
    assert figures["newton_step_upper_curved"] == pytest.approx(0.2)
    assert figures["newton_curvature"] == 2.0 and figures["newton_curvature_se"] == 0.0
    assert "newton_curvature" not in newton_figures(np.array([0.4]), np.zeros(1))


def test_a_q_stopped_short_in_a_stiff_direction_has_plausible_means():
    # mean-field q = N(m, 0.5² I) of p = N(0, diag(0.25², 0.25², 0.25², 3²)), 0.05 off in the
    # three stiff coordinates (0.1 of q's sd, 0.2 of p's) and narrow in the fourth (k-hat ≈ 0.77:
    # unreliable): the plain step (0.5² · 0.05 / 0.25² / 0.5 = 0.4 of q's sd) overstates the
    # distance by the curvature along it, (0.5 / 0.25)² = 4
    sd_p, sd_q = np.array([0.25, 0.25, 0.25, 3.0]), np.full(4, 0.5)
    m = np.array([0.05, 0.05, 0.05, 0.0])
    eps = np.random.default_rng(4).standard_normal((16000, 4))
    z = m + sd_q * eps
    log_p = -0.5 * np.sum((z / sd_p) ** 2, axis=1)
    log_q = -0.5 * np.sum(eps ** 2, axis=1) - np.sum(np.log(sd_q))
    d = compute(log_p, log_q, z=z, eps=eps)
    figures = d.verdict_figures()
    assert abs(figures["newton_curvature"] - 4.0) < 4 * figures["newton_curvature_se"]
    assert NEWTON_STEP_LIMIT < figures["newton_step_upper"] <= CURVATURE_REACH
    assert figures["means_bound"] == figures["newton_step_upper_curved"] < NEWTON_STEP_LIMIT
    assert d.verdict == "unreliable" and d.means == "plausible"
    assert "along it the ELBO's curvature is" in str(d)
    # without the draws' ε (a low-rank q): the plain bound decides, and it is too long
    assert compute(log_p, log_q, z=z).means == "doubtful"


def test_the_curvature_needs_draws_and_a_direction():
    assert math.isnan(newton_curvature(np.zeros((3, 2)), np.zeros(3))[0])
    # constant ratios (q is p): no gradient to follow
    assert math.isnan(newton_curvature(np.ones((10, 2)), np.zeros(10))[0])


def test_gaussian_diagnostic_draws_keep_eps_and_the_record_keeps_the_curvature():
    # Stan's ADVI and Pathfinder are diagnosed from draws z = m + L ε (gaussian_draws): the
    # verdict figures of such a fit carry kappa, here of q = N(0.2, 0.5²) against N(0, 1)
    from stanvi.diagnostics.draws import gaussian_draws
    from stanvi.diagnostics.report import decided_diagnostics

    class Target:
        def log_density(self, z):
            from stanvi.targets.base import BatchResult
            return BatchResult(log_density=-0.5 * np.sum(z * z, axis=1))

    draw = gaussian_draws(Target(), np.array([0.2, 0.2]), 0.5 * np.eye(2), seed=1)
    sample = draw(8000, 0)
    assert sample.eps.shape == (8000, 2)
    np.testing.assert_allclose(sample.z, 0.2 + 0.5 * sample.eps)
    figures = decided_diagnostics(draw, 8000, 8000).verdict_figures()
    kappa, se = figures["newton_curvature"], figures["newton_curvature_se"]
    assert abs(kappa - 0.25) < 4 * se
