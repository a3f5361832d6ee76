"""The reference runs through cmdstanpy and CmdStan (``backend="cmdstan"``).

CmdStan cannot be installed from the package registries these tests run with, so every test
here skips with the reason unless the machine has cmdstanpy and a CmdStan it finds.  The
checks: names and shapes agree with the in-process backend's, and NUTS recovers the exact
Gaussian's mean.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stanvi.reference import nuts, pathfinder, stan_advi
from stanvi.reference.cmdstan_backend import unavailable_reason

REASON = unavailable_reason()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=str(REASON))]

MODELS = Path(__file__).resolve().parents[2] / "stan_models"
STAN = str(MODELS / "gaussian_diag" / "gaussian_diag.stan")
DIAG = {"D": 4, "mu": [1.0, -2.0, 0.5, 3.0], "sigma": [0.5, 2.0, 1.0, 0.1]}


def test_nuts_through_cmdstan_matches_in_process_shapes_and_mean():
    via_cmdstan = nuts(STAN, DIAG, chains=2, seed=1, backend="cmdstan")
    in_process = nuts(STAN, DIAG, chains=2, seed=1)
    assert via_cmdstan.stan_variable("z").shape == in_process.stan_variable("z").shape
    assert set(via_cmdstan.stan_columns) == set(in_process.stan_columns)
    sd = np.array(DIAG["sigma"])
    np.testing.assert_array_less(np.abs(via_cmdstan.stan_variable("z").mean(0) - DIAG["mu"]),
                                 5 * sd / np.sqrt(2000 / 10))


def test_advi_and_pathfinder_through_cmdstan():
    advi = stan_advi(STAN, DIAG, seed=1, backend="cmdstan")
    assert advi.stan_variable("z").shape == (1000, 4) and advi.mean["z"].shape == (4,)
    assert advi.gradient_evaluations is None
    path = pathfinder(STAN, DIAG, seed=1, backend="cmdstan")
    assert path.stan_variable("z").shape == (1000, 4)
    assert path.log_p is not None and len(path.log_p) == 1000
