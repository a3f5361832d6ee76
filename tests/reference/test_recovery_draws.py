"""Stan's output draws raised where its default 1,000 cannot identify q, and the default run
given back (stanvi.reference.diagnostics.recovery_options, default_run; docs/diagnostics.md#stan)."""

from __future__ import annotations

import numpy as np

from stanvi.reference.diagnostics import default_run, recovery_options
from stanvi.reference.result import ReferenceFit


def test_recovery_options_raise_the_output_draws_only_where_needed_and_not_set():
    assert recovery_options("fullrank", 44, {"eta": 0.1}) == ({"eta": 0.1, "output_samples": 1000}, 0)
    assert recovery_options("fullrank", 45, {}) == ({"output_samples": 1552}, 552)
    assert recovery_options("quadratic", 44, {}) == ({"num_draws": 1554}, 554)
    # the caller's own setting stands, and there is nothing to take off
    assert recovery_options("fullrank", 45, {"output_samples": 300}) == ({"output_samples": 300}, 0)
    assert recovery_options(None, 500, {"num_paths": 4}) == ({"num_paths": 4}, 0)


def _fit(algorithm, settings, n=12):
    rng = np.random.default_rng(0)
    cols = {"lp__": rng.normal(size=n), "lp_approx__": rng.normal(size=n)}
    return ReferenceFit(algorithm=algorithm, model_name="m", draws={"theta": rng.normal(size=(n, 2))},
                        stan_columns=cols, chains=1, gradient_evaluations=40,
                        density_evaluations=100, wall_time=1.0, settings=settings,
                        log_p=cols["lp__"].copy(), log_q=cols["lp_approx__"].copy())


def test_default_run_takes_the_last_draws_and_their_densities_off():
    fit = _fit("pathfinder", {"num_draws": 12, "num_paths": 1})
    shown = default_run(fit, 5)
    assert shown.num_draws == 7 and shown.draws["theta"].shape == (7, 2)
    np.testing.assert_array_equal(shown.draws["theta"], fit.draws["theta"][:7])
    np.testing.assert_array_equal(shown.log_p, fit.log_p[:7])
    np.testing.assert_array_equal(shown.stan_columns["lp_approx__"], fit.log_q[:7])
    assert shown.density_evaluations == 95 and shown.gradient_evaluations == 40
    assert shown.settings["num_draws"] == 7 and fit.settings["num_draws"] == 12
    advi = default_run(_fit("stan-advi", {"algorithm": "fullrank", "output_samples": 12}), 2)
    assert advi.settings["output_samples"] == 10 and advi.num_draws == 10
    assert default_run(fit, 0) is fit


def test_too_few_draws_for_a_large_quadratic_fail_before_its_design_matrix():
    """D = 2,000 with 10 draws: the design would be 10 × 2,003,001 numbers; the count is
    checked first."""
    import pytest

    from stanvi.reference.diagnostics import quadratic_gaussian

    with pytest.raises(ValueError, match="10 draws cannot identify a 2000-dimensional"):
        quadratic_gaussian(np.zeros((10, 2000)), np.zeros(10))
    assert recovery_options("quadratic", 175, {}) == ({"num_draws": 1000}, 0)
