"""The verdict's decision rule (stanvi.diagnostics.verdict): k-hat's band decided by adding
draws, the PSIS mean shift, and Stan's approximations judged on the same rule."""

import math

import numpy as np
import pytest

from stanvi.diagnostics.draws import (DiagnosticSample, diagnostic_draw_cap, gaussian_draws,
                                     merge_blocks)
from stanvi.diagnostics.report import (MAX_FAILED_FRACTION, compute, decided_diagnostics,
                                       khat_standard_error, khat_threshold)
from stanvi.diagnostics.verdict import (DECISION_Z, MEAN_SHIFT_LIMIT, mean_shift,
                                        open_boundaries, sample_until_decided)
from stanvi.reference.diagnostics import quadratic_gaussian


def test_open_boundaries_are_those_within_z_standard_errors():
    assert open_boundaries(0.45, 0.05, 0.7) == [0.5]          # 0.05 < 1.645 * 0.05
    assert open_boundaries(0.40, 0.05, 0.7) == []             # 0.10 > 0.082
    assert open_boundaries(0.62, 0.06, 0.7) == [0.7]
    assert open_boundaries(0.60, 0.10, 0.7) == [0.5, 0.7]
    assert open_boundaries(math.nan, 0.1, 0.7) == [] and open_boundaries(0.5, math.nan, 0.7) == []
    b = 0.5 - DECISION_Z * 0.05
    assert open_boundaries(b + 1e-9, 0.05, 0.7) == [0.5] and open_boundaries(b - 1e-9, 0.05, 0.7) == []


def _pareto_draw(k, calls):
    """Draws whose importance ratios have a generalized Pareto tail of shape k."""
    def draw(n, batch):
        calls.append((n, batch))
        rng = np.random.default_rng([batch, 11])
        u = rng.uniform(size=n)
        log_r = np.log((u ** (-k) - 1.0) / k + 1e-12)
        return DiagnosticSample(log_r, np.zeros(n), {}, rng.standard_normal((n, 2)))
    return draw


def _run(k, first=4000, cap=32000):
    calls = []
    sample, decided = sample_until_decided(_pareto_draw(k, calls), first, cap, khat_threshold,
                                           khat_standard_error, MAX_FAILED_FRACTION)
    return sample, decided, calls


def test_a_clear_band_is_decided_on_the_first_draws():
    sample, decided, calls = _run(0.1)
    assert decided and calls == [(4000, 0)] and len(sample.log_p) == 4000


def test_a_band_at_a_boundary_doubles_the_draws_up_to_the_cap():
    sample, decided, calls = _run(0.5)          # true k on the good / use-with-care boundary
    assert calls == [(4000, 0), (4000, 1), (8000, 2), (16000, 3)]
    assert not decided and len(sample.log_p) == 32000 and sample.z.shape == (32000, 2)
    d = compute(sample.log_p, sample.log_q, z=sample.z, decided=decided)
    assert d.borderline and d.n_draws == 32000 and "(borderline)" in d.one_line()
    assert abs(d.khat - 0.5) < 2 * d.khat_se   # the larger sample pins k-hat down


def test_each_addition_is_announced_with_the_figures_that_asked_for_it():
    """``on_more`` hears of every addition before it is drawn: the draws so far, k̂ and its
    standard error on them (the figures the band is decided from), the open boundary and the
    number of draws added; a band decided at once announces nothing."""
    heard = []
    sample_until_decided(_pareto_draw(0.5, []), 4000, 32000, khat_threshold,
                         khat_standard_error, MAX_FAILED_FRACTION,
                         on_more=lambda *a: heard.append(a))
    assert [(n, more) for n, _, _, _, more in heard] == [(4000, 4000), (8000, 8000),
                                                          (16000, 16000)]
    first = merge_blocks([_pareto_draw(0.5, [])(4000, 0)])
    k = compute(first.log_p, first.log_q).khat
    _, k_heard, se, undecided, _ = heard[0]
    assert k_heard == pytest.approx(k) and se == pytest.approx(khat_standard_error(k, 4000))
    assert undecided == open_boundaries(k, se, khat_threshold(4000)) and 0.5 in undecided
    quiet = []
    sample_until_decided(_pareto_draw(0.1, []), 4000, 32000, khat_threshold,
                         khat_standard_error, MAX_FAILED_FRACTION, on_more=quiet.append)
    assert quiet == []


def test_good_needs_a_decided_band():
    # k-hat 0.41 +/- 0.06 at the cap: below 0.5, but not with 90 % confidence -> 'use with care'
    sample, decided, _ = _run(0.47)
    d = compute(sample.log_p, sample.log_q, z=sample.z, decided=decided)
    assert not decided and d.borderline and d.khat < 0.5 and d.verdict == "use with care"
    clear, decided, _ = _run(0.44)
    d = compute(clear.log_p, clear.log_q, z=clear.z, decided=decided)
    assert decided and not d.borderline and d.khat < 0.5 and d.verdict == "good"


def test_failed_draws_decide_at_once():
    calls = []

    def draw(n, batch):
        calls.append(n)
        log_p = np.where(np.arange(n) % 10 == 0, -np.inf, 0.0)   # 10 % fail
        return DiagnosticSample(log_p, np.zeros(n), {0: "boom"}, np.zeros((n, 1)))
    sample, decided = sample_until_decided(draw, 4000, 32000, khat_threshold,
                                           khat_standard_error, MAX_FAILED_FRACTION)
    assert decided and calls == [4000]


def test_merge_renumbers_the_failed_rows_messages():
    a = DiagnosticSample(np.zeros(3), np.zeros(3), {1: "a"}, np.zeros((3, 1)))
    b = DiagnosticSample(np.zeros(2), np.zeros(2), {0: "b"}, np.ones((2, 1)))
    m = merge_blocks([a, b])
    assert m.messages == {1: "a", 3: "b"} and m.z[:, 0].tolist() == [0, 0, 0, 1, 1]


def test_draw_cap_rule():
    assert diagnostic_draw_cap(1, 32000) == 256000
    assert diagnostic_draw_cap(16, 4000) == 32000
    assert diagnostic_draw_cap(100, 4000) == 20480
    assert diagnostic_draw_cap(1000, 4000) == 4000


def test_mean_shift_exact_value():
    z = np.array([[0.0], [1.0]] * 50)
    lw = np.log(np.array([1.0, 3.0] * 50))
    # weighted mean 0.75, plain mean 0.5, sd 0.5
    shift, sd_ratio = mean_shift(z, lw)
    # weighted sd sqrt(0.75 * 0.25), plain sd 0.5
    assert shift == pytest.approx([0.5]) and sd_ratio == pytest.approx([math.sqrt(0.1875) / 0.5])
    assert mean_shift(z, np.zeros(100))[0] == pytest.approx([0.0])


def test_a_shifted_wide_q_that_khat_passes_is_unreliable_by_its_mean_shift():
    # p = N(0, 1), q = N(0.5, 1.5^2): q covers p, so the ratios are bounded and k-hat is low,
    # but q's mean is half a posterior sd off (the under-dispersion k-hat cannot see is the
    # mirror case); the PSIS-weighted mean moves back to 0: a shift of 0.5 / 1.5 of q's sd.
    rng = np.random.default_rng(3)
    z = 0.5 + 1.5 * rng.standard_normal((20000, 1))
    log_p = -0.5 * z[:, 0] ** 2
    log_q = -0.5 * ((z[:, 0] - 0.5) / 1.5) ** 2 - math.log(1.5)
    plain = compute(log_p, log_q)
    d = compute(log_p, log_q, z=z)
    assert plain.khat < 0.5 and plain.verdict == "good"
    assert d.mean_shift == pytest.approx(1 / 3, abs=0.03) and d.mean_shift > MEAN_SHIFT_LIMIT
    assert d.verdict == "unreliable" and "q's means are off" in d.warnings[0]
    assert d.verdict_figures()["mean_shift"] == d.mean_shift


def test_quadratic_gaussian_recovers_mean_and_factor():
    rng = np.random.default_rng(0)
    d = 4
    a = rng.standard_normal((d, d))
    cov = a @ a.T + d * np.eye(d)
    chol = np.linalg.cholesky(cov)
    m = rng.standard_normal(d)
    z = m + rng.standard_normal((200, d)) @ chol.T
    e = np.linalg.solve(chol, (z - m).T).T
    log_q = -0.5 * np.sum(e * e, axis=1) + 12.3        # any constant
    m2, chol2 = quadratic_gaussian(z, log_q)
    assert np.allclose(m2, m, rtol=1e-8, atol=1e-8) and np.allclose(chol2, chol, rtol=1e-8)
    with pytest.raises(ValueError, match="cannot identify"):
        quadratic_gaussian(z[:10], log_q[:10])


class _Normal:
    """A standard normal target in D dimensions (log density with its ok flags)."""

    def __init__(self, dim):
        self.dim = dim

    def log_density(self, z):
        from types import SimpleNamespace
        z = np.asarray(z)
        return SimpleNamespace(log_density=-0.5 * np.sum(z * z, axis=1), ok=None, messages={})


def test_a_gaussian_known_by_mean_and_factor_is_judged_on_the_same_draws():
    target = _Normal(3)
    exact = decided_diagnostics(gaussian_draws(target, np.zeros(3), np.eye(3), 0), 4000, 32000,
                                method="x")
    assert exact.khat == -math.inf and exact.verdict == "good" and exact.n_draws == 4000
    assert exact.mean_shift == pytest.approx(0.0, abs=1e-12)
    off = decided_diagnostics(gaussian_draws(target, np.full(3, 0.7), 0.6 * np.eye(3), 0),
                              4000, 32000, method="x")
    assert off.verdict == "unreliable" and off.n_draws >= 4000
