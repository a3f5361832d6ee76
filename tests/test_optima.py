"""The stored mean-field optima of stan_models (``<stem>.optimum.json``, made by
stan_models/compute_optima.py without any stanvi method) and the property they exist for:
TrustVI's ``converged`` means converged (issue P2-1, part 1)."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

import stanvi
from stanvi.bench.methods_bench import discover_models
from stanvi.bench.stopping_bench import load_optimum
from stanvi.estimators.elbo import estimator_for, standard_normal
from stanvi.families import MeanField

from conftest import MODELS_DIR

MODELS = {stem: (stan, data) for stem, stan, data in discover_models(MODELS_DIR)}
EXACT = ("gaussian", "gaussian_diag", "gaussian_ill")


def test_every_model_has_an_optimum():
    for stem, (stan, _) in MODELS.items():
        opt = load_optimum(stan)
        assert opt is not None, f"{stem}: no {stan.with_suffix('.optimum.json').name}"
        if opt["elbo"] is None:  # only where no Gaussian q has a finite ELBO
            assert stem == "reject_region" and "-inf" in opt["reason"]
            continue
        assert math.isfinite(opt["elbo"]) and len(opt["mu"]) == len(opt["sigma"]) == opt["dim"]
        assert all(s > 0 for s in opt["sigma"])
        starts = opt.get("starts") or opt["numerical"]["starts"]
        assert len(starts) >= 2


@pytest.mark.parametrize("stem", EXACT)
def test_closed_form_optima(stem):
    """μ* = m, σ*_i = 1/√Λ_ii, ELBO* = −½(log|Σ| + Σ log Λ_ii), recomputed from the data; the
    numerical optimum (fresh-draw ELBO) is below ELBO* by no more than its noise and the
    fixed-draw optimum's own suboptimality (~P/(2N) nats)."""
    stan, data_path = MODELS[stem]
    opt = load_optimum(stan)
    data = json.loads(data_path.read_text())
    if stem == "gaussian":
        m, cov = np.array(data["m"]), np.array(data["Sigma"])
    elif stem == "gaussian_diag":
        m, cov = np.array(data["mu"]), np.diag(np.array(data["sigma"]) ** 2)
    else:
        q = np.array(data["Q"])
        m, cov = np.array(data["m"]), q @ np.diag(data["lambda"]) @ q.T
    precision = np.linalg.inv(0.5 * (cov + cov.T))
    assert opt["exact"] is True
    np.testing.assert_allclose(opt["mu"], m, rtol=0, atol=0)
    np.testing.assert_allclose(opt["sigma"], 1 / np.sqrt(np.diag(precision)), rtol=1e-9)
    elbo = -0.5 * (np.linalg.slogdet(cov)[1] + np.sum(np.log(np.diag(precision))))
    assert opt["elbo"] == pytest.approx(elbo, abs=1e-9)
    num = opt["numerical"]
    slack = 5 * num["elbo_se"] + 2 * len(m) / 4096
    assert elbo - slack <= num["elbo"] <= elbo + 5 * num["elbo_se"]


@pytest.mark.parametrize("stem", ["loglog_heights", "far_posterior"])
def test_stored_optimum_is_stationary(stem):
    """On 4,096 fresh draws the ELBO gradient at the stored optimum is zero within its Monte
    Carlo error (|mean| ≤ 6 standard errors in every coordinate)."""
    stan, data = MODELS[stem]
    opt = load_optimum(stan)
    target = stanvi.load(str(stan), data=str(data), progress=False)
    est = estimator_for(target, MeanField(target.dim))
    params = np.concatenate([opt["mu"], np.log(opt["sigma"])])
    _, grads = est.values_and_grads(params, standard_normal(jax.random.PRNGKey(11), 4096,
                                                            target.dim))
    z = grads.mean(axis=0) / (grads.std(axis=0, ddof=1) / math.sqrt(len(grads)))
    assert np.all(np.abs(z) <= 6.0), z


@pytest.mark.parametrize("stem", ["raw_regression_interaction", "loglog_heights",
                                  "far_posterior", "raw_logistic"])
def test_converged_means_converged_on_ill_conditioned_models(stem):
    """The defect: TrustVI ``default`` said ``converged`` 17 nats short on a raw-unit regression
    with an interaction, and ~100 nats short where the posterior sits near 1,500.  Now a
    converged fit's ELBO (20,000 fresh draws) is within 0.1 nat of the independent optimum
    (or above it), on two seeds."""
    stan, data = MODELS[stem]
    opt = load_optimum(stan)
    target = stanvi.load(str(stan), data=str(data), progress=False)
    for seed in range(2):
        fit = stanvi.fit(target, method="trustvi", seed=seed, progress=False, draws=10)
        assert fit.status == "converged", fit.message
        elbo, se = fit.elbo(20_000)
        assert opt["elbo"] - elbo <= 0.1 + 5 * se, (seed, elbo, opt["elbo"])
