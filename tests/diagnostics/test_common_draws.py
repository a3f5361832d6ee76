"""The verdict's draws are the same for every fit (common random numbers,
docs/diagnostics.md#common-draws): k̂ is a function of q, so two fits with the same q get the
same verdict whatever their seeds; a seed given to ``diagnostics`` draws others."""

from __future__ import annotations

import copy

import jax.numpy as jnp
import numpy as np

import stanvi
from stanvi.diagnostics.draws import DIAGNOSTIC_SEED, diagnostic_log_densities
from stanvi.diagnostics.report import diagnose


def _fit(seed: int):
    # a Student-t-like posterior (3 degrees of freedom): a Gaussian q has k̂ well above 0
    target = stanvi.JaxTarget(lambda z: -2.0 * jnp.sum(jnp.log1p(z * z / 3.0)), 3)
    return stanvi.fit(target, method="trustvi", seed=seed, progress=False)


def test_the_same_q_under_another_seed_gets_the_same_draws_and_verdict():
    fit = _fit(0)
    other = copy.copy(fit)
    other.seed, other._diagnostics = 11, None   # the same q, another seed
    a, b = fit.diagnostics(), other.diagnostics()
    assert a.khat == b.khat and a.verdict == b.verdict and a.n_draws == b.n_draws
    # before: the draws came from the fit's seed, and k̂ differed with it
    own = diagnostic_log_densities(fit, 4000, seed=fit.seed)
    other_own = diagnostic_log_densities(other, 4000, seed=other.seed)
    assert not np.array_equal(own.log_p, other_own.log_p)
    common = diagnostic_log_densities(other, 4000)
    assert np.array_equal(common.log_p, diagnostic_log_densities(fit, 4000, seed=DIAGNOSTIC_SEED)
                          .log_p)


def test_a_seed_given_to_the_diagnostics_draws_other_draws():
    fit = _fit(0)
    assert diagnose(fit, seed=5).khat != fit.diagnostics().khat
