"""Honest outcomes when the model misbehaves (issue P2-1c): TrustVI never calls a run
``converged`` when q ran away or when the model fails on much of q's mass."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from stanvi.families import FullRank, MeanField
from stanvi.methods.checks import divergence

REJECT_HALF = """
parameters { vector[2] x; }
model { if (x[1] > 0) reject("x[1] must be <= 0"); x ~ std_normal(); }
"""


def flat(z):
    """parameters { real x; } model { }: ∫p = ∞, the ELBO grows without bound with q's sd."""
    return 0.0 * jnp.sum(z)


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_improper_posterior_fails_with_the_reason(family):
    fit = stanvi.fit(flat, dim=1, method="trustvi", family=family, seed=0, progress=False,
                     draws=10)
    assert fit.status == "failed"
    assert "improper" in fit.message and "grew without bound" in fit.message


@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_model_failing_on_half_of_q_fails_with_the_stan_message(tmp_path, family):
    """Before: status 'converged' with no accepted step and 53% of q's draws rejected."""
    path = tmp_path / "reject_half.stan"
    path.write_text(REJECT_HALF)
    fit = stanvi.fit(str(path), method="trustvi", family=family, seed=0, progress=False,
                     draws=10)
    assert fit.status == "failed", fit.message
    assert "x[1] must be <= 0" in fit.message
    assert "fails at" in fit.message and "% of q's draws" in fit.message
    assert 0.2 < fit.info["failing_fraction"] < 0.8


def test_divergence_thresholds():
    mf = MeanField(2)
    assert divergence(mf, np.array([0.0, 0.0, 1.0, 2.0])) is None
    assert "grew without bound" in divergence(mf, np.array([0.0, 0.0, 1.0, 24.0]))
    assert "non-finite" in divergence(mf, np.array([np.nan, 0.0, 1.0, 2.0]))
    assert "mean ran away" in divergence(mf, np.array([2e15, 0.0, 1.0, 2.0]))
    fr = FullRank(2, diagonal="log")
    assert divergence(fr, np.array([0.0, 0.0, 0.0, 0.5, 0.0])) is None
    assert "grew without bound" in divergence(fr, np.array([0.0, 0.0, 0.0, 1e11, 0.0]))
