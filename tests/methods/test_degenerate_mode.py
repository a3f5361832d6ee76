"""The Laplace warm start refuses a degenerate mode (stanvi.methods.warm_start, step 4;
docs/methods.md#degenerate-mode): at the neck of a centred hierarchical model, where L-BFGS on
log p ends, the Laplace Gaussian's sds are ~1e-16, and a TrustVI fit started there could not
move (its trust region collapsed, the group scale stayed at 2e-16)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import stanvi
from stanvi.methods.warm_start import DEGENERATE_SD, degenerate_coordinate

MODEL = Path(__file__).resolve().parents[1] / "models" / "centered_groups.stan"


def test_the_degenerate_coordinate_is_the_smallest_conditional_sd_against_its_size():
    z = np.array([0.0, 2.68, -38.9, 1e9])
    precision = np.diag([1.0, 1e30, 4.0, 1e-6])
    assert degenerate_coordinate(z, precision) == (1, pytest.approx(1e-15))
    # sds at or above 1e-8 of max(1, |z|) are not degenerate: a precise coordinate of a big
    # size (sd 1 at 1e9 is 1e-9 of it, degenerate; at 1e7 it is not), a small sd at |z| < 1
    assert degenerate_coordinate(np.array([1e7, 0.1]), np.diag([1.0, 1e14])) is None
    assert degenerate_coordinate(np.array([1e9, 0.0]), np.diag([1.0, 1.0]))[0] == 0
    edge = 1.0 / (0.5 * DEGENERATE_SD) ** 2
    assert degenerate_coordinate(np.zeros(1), np.diag([edge]))[0] == 0
    assert degenerate_coordinate(np.zeros(1), np.diag([edge / 16])) is None
    # a coordinate where the mode is not a maximum (Λ_ii <= 0) is not called degenerate
    assert degenerate_coordinate(np.zeros(2), np.diag([-1e40, 0.0])) is None


def _groups_data(seed: int = 20261202) -> dict:
    """40 groups of 20 draws, group means N(1.5, 0.17²), noise sd 0.75 (radon's figures)."""
    rng = np.random.default_rng(seed)
    J, n = 40, 20
    means = 1.5 + 0.17 * rng.standard_normal(J)
    group = np.repeat(np.arange(1, J + 1), n)
    y = means[group - 1] + 0.75 * rng.standard_normal(J * n)
    return {"N": J * n, "J": J, "group": group.tolist(), "y": y.tolist()}


def test_trustvi_does_not_start_at_a_funnels_neck():
    fit = stanvi.fit(str(MODEL), data=_groups_data(), method="trustvi", seed=0, progress=False)
    assert fit.info["warm_start"] == "default"
    assert "degenerate" in fit.info["warm_start_reason"]
    assert "mu_a" in fit.info["warm_start_reason"] or "a." in fit.info["warm_start_reason"]
    # from the neck the group scale stayed at 2e-16 (max_iters, ELBO -1,143.5); from the
    # default start the fit converges near the truth, 0.17 (ELBO -935.3)
    assert fit.status == "converged"
    sigma_a = fit.stan_variable("sigma_a")
    assert 0.1 < sigma_a.mean() < 0.35
    elbo, se = fit.elbo(4000)
    assert elbo > -1000.0
