"""MLMCVI's sample-size schedule and costs (stanvi/estimators/mlmc_schedule.py;
docs/mlmcvi.md#sample-size, docs/mlmcvi.md#schedulers, docs/mlmcvi.md#cost), and the oracle
accounting of a whole run (docs/mlmcvi.md#trace-and-accounting)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import stanvi
from mlmc_gaussian import D, GaussianTarget
from stanvi.estimators.mlmc_schedule import (Scheduler, cost_ratio, equal_cost_draws,
                                             low_cost_ok, mc_cost, mlmc_cost, sample_size,
                                             sample_sizes)


def test_step_decay_blocks():
    """N_0 = 100, β = 0.5, r = 100: 100@t0–100, 50@101–200, 25, 13, 7, 4, 2, then 1 from
    t = 701 (docs/mlmcvi.md#algorithm)."""
    sizes = sample_sizes(Scheduler("step", 0.5, 100), 100, 1000)
    assert sizes[0] == 100 and np.all(sizes[1:101] == 100)
    expected = [50, 25, 13, 7, 4, 2]
    for block, n in enumerate(expected, start=1):
        assert np.all(sizes[100 * block + 1:100 * (block + 1) + 1] == n), block
    assert np.all(sizes[701:] == 1)
    assert mlmc_cost(Scheduler("step", 0.5, 100), 100, 1000) == 40_900


def test_other_schedulers_and_the_ceiling_tolerance():
    """Time-based β = 0.01 gives 100, 91, 50, 10 and exponential β = 0.005 gives 100, 61, 9, 1
    at t = 1, 11/101, 101/501, 1001; 0.1²·100 = 1.0000000000000002 gives N = 1
    (docs/mlmcvi.md#sample-size)."""
    time_based = Scheduler("time", 0.01)
    assert [sample_size(time_based, t, 100) for t in (1, 11, 101, 1001)] == [100, 91, 50, 10]
    exp = Scheduler("exp", 0.005)
    assert [sample_size(exp, t, 100) for t in (1, 101, 501, 1001)] == [100, 61, 9, 1]
    step = Scheduler("step", 0.1, 1)
    assert 0.1 ** 2 * 100 > 1.0            # the float product that must not round up
    assert sample_size(step, 3, 100) == 1
    assert [Scheduler("constant").eta(t) for t in (0, 5, 500)] == [1.0, 1.0, 1.0]
    assert Scheduler("step", 0.5, 100).eta(-1) == 1.0
    with pytest.raises(ValueError):
        Scheduler("cosine")
    with pytest.raises(ValueError):
        Scheduler("step", 1.5)


def test_costs_and_lemma2():
    """The costs of docs/mlmcvi.md#cost: 40,900 vs 100,100 (0.41); HLR 157,626 (1.57); BLR
    113,776 (1.14); BNN 76,796 vs 50,050 (1.53); Lemma 2's condition holds for the Fashion-MNIST
    setting (η_500 = 0.03125) and fails for a constant η; the equal-cost MC size is 41."""
    fm = Scheduler("step", 0.5, 100)
    assert mc_cost(100, 1000) == 100_100
    assert round(cost_ratio(fm, 100, 1000), 2) == 0.41
    assert fm.eta(500) == 0.03125
    assert mlmc_cost(Scheduler("step", 0.862527, 221), 100, 1000) == 157_626
    assert mlmc_cost(Scheduler("step", 0.226316, 458), 100, 1000) == 113_776
    assert mlmc_cost(Scheduler("step", 0.819243, 253), 50, 1000) == 76_796
    assert round(cost_ratio(Scheduler("step", 0.862527, 221), 100, 1000), 2) == 1.57
    assert round(cost_ratio(Scheduler("step", 0.226316, 458), 100, 1000), 2) == 1.14
    # T = 5000: 0.63, 0.25 and 0.57 for the tuned settings.  The default schedule costs
    # 40,900 + 2·4,000 = 48,900 (N_t = 1 for t > 1000), i.e. 0.098 (not 46,300/500,100 = 0.093)
    assert mlmc_cost(fm, 100, 5000) == 48_900
    assert [round(cost_ratio(s, n0, 5000), 2) for s, n0 in (
        (Scheduler("step", 0.862527, 221), 100), (Scheduler("step", 0.226316, 458), 100),
        (Scheduler("step", 0.819243, 253), 50))] == [0.63, 0.25, 0.57]
    assert low_cost_ok(fm, 100, 1000)
    assert not low_cost_ok(Scheduler("constant"), 100, 1000)
    assert equal_cost_draws(fm, 100, 1000) == 41


def test_a_run_costs_what_the_schedule_says():
    """Through stanvi.fit: a call-counting target records N_0 + 2ΣN_t = 40,900 gradient draws
    for T = 1000, the ledger agrees (gradient_draws, one literal call per level), and the trace
    logs N_t, η_t and α_t per iteration; the equal-cost MC baseline makes 41,041."""
    target = GaussianTarget()
    before = target.counter.gradient
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = stanvi.fit(target, method="mlmcvi", profile="paper", scale_param="direct", lr0=0.05, seed=0,
                         progress=False, elbo_every=10_000, draws=10)
    assert target.counter.gradient - before == 40_900
    assert fit.oracle["gradient_draws"] == 40_900 and fit.oracle["oracle_literal"] == 1001
    t = fit.trace
    n = t.column("N")[1:]
    assert np.array_equal(n, sample_sizes(Scheduler("step", 0.5, 100), 100, 1000))
    np.testing.assert_allclose(t.column("alpha")[1:], 0.05 * t.column("eta")[1:])
    assert t.column("eta")[-1] == 0.5 ** 10
    assert fit.info["planned_cost"] == 40_900 and fit.info["low_cost_ok"]
    # the draws accumulate level by level: N_0, then 2 N_t per level
    np.testing.assert_array_equal(np.diff(t.column("gradient_draws")),
                                  np.r_[100, 2 * n[1:]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mc = stanvi.fit(target, method="mlmcvi", profile="paper", estimator="mc", scale_param="direct",
                        lr0=0.05, seed=0, progress=False, elbo_every=10_000, draws=10)
    assert mc.info["baseline_draws"] == 41 and mc.oracle["gradient_draws"] == 41_041
    assert D == 10
