"""method='jointcv' on JAX per-datum targets (stanvi/methods/jointcv.py; docs/jointcv.md#table,
docs/jointcv.md#defaults)."""

from __future__ import annotations

import numpy as np
import pytest

import stanvi
from jointcv_problems import exact_neg_elbo, simulate_logistic
from stanvi.errors import VIError
from stanvi.methods import jointcv
from stanvi.targets.subsampled import logistic_regression_target


@pytest.fixture(scope="module")
def australian_like():
    X, y = simulate_logistic(690, 14, seed=0)
    return logistic_regression_target(X, y), X, y


def _fit(target, **kw):
    kw.setdefault("progress", False)
    return stanvi.fit(target, method="jointcv", **kw)


def test_defaults_and_option_checks():
    o = jointcv.Options()
    assert (o.estimator, o.variant, o.optimizer, o.step_size, o.warmup_epochs, o.momentum) == \
        ("joint", "saga", "sgd", 5e-4, 1, 0.0)
    assert jointcv.Options(optimizer="adam").step_size == 1e-2
    with pytest.raises(ValueError, match="estimator"):
        jointcv.Options(estimator="saga")
    with pytest.raises(ValueError, match="batch_size"):
        jointcv.Options(batch_size=0)


def test_plain_log_density_is_refused():
    with pytest.raises(VIError, match="needs data to subsample"):
        stanvi.fit(lambda z: -0.5 * (z @ z), dim=2, method="jointcv", progress=False)


def test_joint_beats_naive_and_counts(australian_like):
    """Synthetic Australian size (docs/jointcv.md#simulated-data), SGD, b = 5, lr 1e-3: joint
    ends at a higher exact ELBO than naive and cv; the warm-up is one epoch (138 iterations) and
    the term counts follow docs/jointcv.md#cost; the same seed gives the same iterate."""
    target, X, y = australian_like
    from stanvi.families.gaussian import MeanField

    f_exact = exact_neg_elbo(MeanField(14), X, y)[0]
    final = {}
    for est in ("naive", "cv", "joint"):
        fit = _fit(target, estimator=est, learning_rate=1e-3, max_iters=2000, elbo_every=500,
                   elbo_draws=200, seed=0)
        assert fit.status == "max_iters"
        final[est] = -float(f_exact(fit.params))
        if est == "joint":
            assert fit.info["warmup_iterations"] == 138
            assert fit.oracle["term_gradients"] == 2 * 690 + 2 * 5 * (2000 - 138)
            assert fit.oracle["term_hvps"] == 5 * (2000 - 138)
            again = _fit(target, estimator=est, learning_rate=1e-3, max_iters=2000,
                         elbo_every=500, elbo_draws=200, seed=0)
            np.testing.assert_array_equal(fit.params, again.params)
    assert final["joint"] > final["naive"] + 1.0, final
    assert final["joint"] > final["cv"], final


@pytest.mark.parametrize("kw", [dict(estimator="joint", variant="svrg"),
                                dict(estimator="inc", max_iters=300),
                                dict(estimator="joint", family="fullrank", optimizer="adam",
                                     learning_rate=1e-2),
                                dict(estimator="joint", per_datum_eps=True, hvp_scale="current",
                                     warmup_epochs=0, optimizer="adam")])
def test_variants_run_and_improve(australian_like, kw):
    target, _, _ = australian_like
    kw = {"max_iters": 600, "learning_rate": 1e-3, "elbo_every": 300, "elbo_draws": 200, **kw}
    fit = _fit(target, seed=2, **kw)
    elbo = fit.trace.column("elbo")
    assert fit.status == "max_iters", fit.message
    assert elbo[-1] > elbo[0] + 50, elbo[~np.isnan(elbo)]


def test_runaway_is_reported_as_failed(australian_like):
    target, _, _ = australian_like
    fit = _fit(target, estimator="naive", learning_rate=5.0, max_iters=200, seed=0)
    assert fit.status == "failed"
    assert "step size" in fit.message
