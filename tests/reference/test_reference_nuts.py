"""Stan's own NUTS, run in-process on a stanvi-compiled model (stanvi.reference.nuts).

The target is stan_models/gaussian: the posterior is exactly N(m, Sigma) with m and Sigma the data,
so the draws' mean and covariance have known values.  Tolerances use an ESS-free bound: NUTS on
this target has an effective sample size well above a tenth of the draws, so every estimate is
compared with 5 standard errors computed as if only n / 10 draws were independent.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stanvi.errors import StanDataError, StanviError
from stanvi.reference import SAMPLER_COLUMNS, nuts
from stanvi.stan.compiler import compile_model
from stanvi.stan.services_build import services_library

pytestmark = pytest.mark.slow

MODELS = Path(__file__).resolve().parents[2] / "stan_models"
STAN = MODELS / "gaussian" / "gaussian.stan"
DATA = MODELS / "gaussian" / "gaussian.data.json"


@pytest.fixture(scope="module")
def gaussian():
    return compile_model(STAN, progress=False)


@pytest.fixture(scope="module")
def fit(gaussian):
    return nuts(gaussian, DATA, chains=4, seed=11)


def test_nuts_recovers_exact_mean_and_covariance(fit):
    data = json.loads(DATA.read_text())
    m, sigma = np.array(data["m"]), np.array(data["Sigma"])
    z = fit.stan_variable("z")
    n = z.shape[0]
    assert z.shape == (4 * 1000, data["D"])
    n_eff = n / 10
    sd = np.sqrt(np.diag(sigma))
    np.testing.assert_array_less(np.abs(z.mean(0) - m), 5 * sd / np.sqrt(n_eff))
    # sd of the sample covariance of a Gaussian: sqrt((S_ii S_jj + S_ij^2) / n)
    cov = np.cov(z, rowvar=False)
    cov_se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / n_eff)
    np.testing.assert_array_less(np.abs(cov - sigma), 5 * cov_se)


def test_nuts_sampler_diagnostics(fit):
    diag = fit.sampler_diagnostics
    assert diag["divergences"] == [0, 0, 0, 0]
    assert all(k > 0 for k in diag["n_leapfrog"])
    assert diag["total_n_leapfrog"] == int(fit.stan_columns["n_leapfrog__"].sum()) > 0
    assert list(fit.stan_columns) == list(SAMPLER_COLUMNS)
    assert list(fit.draws) == ["z"]
    # the counting wrapper sees every gradient: sampling's leapfrog steps plus warmup's
    assert fit.gradient_evaluations > diag["total_n_leapfrog"]
    assert 0.6 < np.mean(diag["mean_accept_stat"]) < 1.0  # delta = 0.8 is the adaptation target
    assert fit.wall_time > 0
    assert any("Adaptation terminated" in msg for msg in fit.messages)


def test_chains_are_reproducible_and_independent_of_threading(gaussian):
    threaded = nuts(gaussian, DATA, chains=2, seed=3, num_warmup=200, num_samples=100)
    serial = nuts(gaussian, DATA, chains=2, seed=3, num_warmup=200, num_samples=100,
                  parallel=False)
    np.testing.assert_array_equal(threaded.stan_variable("z"), serial.stan_variable("z"))
    z = threaded.stan_variable("z")
    assert not np.array_equal(z[:100], z[100:])  # chains use different streams


def test_services_library_is_separate_and_cached(gaussian):
    path = services_library(gaussian, progress=False)
    assert path != gaussian.library and path.parent == gaussian.library.parent
    assert services_library(gaussian, progress=False) == path


def test_bad_data_raises_a_clear_error(gaussian):
    data = json.loads(DATA.read_text())
    del data["Sigma"]
    with pytest.raises(StanDataError, match="Sigma"):
        nuts(gaussian, data, chains=1, num_warmup=10, num_samples=10)
    data = json.loads(DATA.read_text())
    data["Sigma"][0][1] = 5.0  # not symmetric
    with pytest.raises(StanDataError, match="Sigma"):
        nuts(gaussian, data, chains=1, num_warmup=10, num_samples=10)


def test_unknown_setting_is_rejected(gaussian):
    with pytest.raises(TypeError, match="adapt_delta"):
        nuts(gaussian, DATA, adapt_delta=0.9)


def test_failed_initialization_raises_stans_message():
    rejects = MODELS.parent / "tests" / "models" / "always_rejects.stan"  # every point
    with pytest.raises(StanviError, match="(?s)always rejects.*Initialization failed"):
        nuts(rejects, chains=1, num_warmup=10, num_samples=10)
