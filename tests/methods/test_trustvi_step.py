"""One iteration of TrustVI's Algorithm 1 (:func:`stanvi.methods.trustvi.step`, the
``stochastic`` and ``paper`` profiles; docs/algorithms.md#trustvi), driven on its own from a
chosen state on an exact Gaussian target: what it charges, when it accepts, how the radius and
the Hessian sample move (issue T3-3: no test drove a single step)."""

from __future__ import annotations

import numpy as np
import pytest

from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.keys import make_key
from stanvi.families import MeanField
from stanvi.methods import make_options, trustvi
from stanvi.methods.base import OracleLedger
from stanvi.optim import tau_constants
from stanvi.targets import JaxTarget

from gaussian_targets import closed_form_elbo, make_problem


def _setup(**overrides):
    problem = make_problem(4, correlated=False, seed=3)
    family = MeanField(problem.dim)
    target = JaxTarget(problem.log_density, problem.dim)
    est = ElboEstimator(family, target.jax_log_density)
    o = make_options(trustvi, "stochastic", {"warm_start": "none", **overrides})
    tau1, tau2 = tau_constants(alpha=o.alpha, gamma=o.gamma, lam=o.lam)
    counts = {"accepted": 0, "rejected_lambda": 0, "rejected_change": 0, "rejected_failure": 0}
    setup = trustvi._Setup(o, est, family, make_key(0, host=False), OracleLedger(), tau1, tau2,
                           counts)
    state = trustvi.State(family.initial_params(np.zeros(problem.dim), 0.0), o.delta0, 1,
                          o.n_change0)
    return problem, family, setup, state


def _elbo(problem, family, params) -> float:
    return float(closed_form_elbo(problem, family, params))


def test_an_accepted_step_raises_the_elbo_and_charges_its_draws():
    """From q = N(0, I) with a radius of 1, the step is accepted: λ moves by the step, whose
    length in q's Fisher metric is at most δ, the exact ELBO rises, the radius grows by γ, and
    the ledger is charged n_grad·r gradients, the HVPs of the solve and the n_change pairs."""
    problem, family, setup, state = _setup()
    o = setup.o
    out = trustvi.step(setup, state, 1)
    row = out.row
    assert out.stop is None and row["accepted"] and setup.counts["accepted"] == 1
    assert _elbo(problem, family, out.state.params) > _elbo(problem, family, state.params) + 0.1
    s = out.state.params - state.params
    metric = family.metric_scale(state.params)
    assert np.linalg.norm(metric * s) <= state.delta * (1 + 1e-9)
    assert row["step_norm"] == pytest.approx(np.linalg.norm(metric * s))
    assert out.state.delta == pytest.approx(min(o.gamma * state.delta, o.delta_max))
    assert row["m_prime"] > 0 and row["change"] >= o.eta * row["m_prime"]
    ledger = setup.ledger
    assert ledger.gradient_draws == o.n_grad * state.r
    assert ledger.log_density_draws == 2 * o.n_change0          # the pairs, at λ and λ + s
    assert ledger.hvp_draws == o.n_hess * state.r * (row["n_hvp"] + row["n_hvp_certify"])


def test_a_rejected_step_keeps_lambda_shrinks_delta_and_reuses_the_hessian():
    """With η so close to 1 that the ELBO change cannot reach η·m', the step is rejected: λ
    stays, δ shrinks by γ, and the next iteration reuses the Hessian draws (no fresh sample),
    solving the same problem in a smaller region."""
    problem, family, setup, state = _setup(eta=0.999999)
    out = trustvi.step(setup, state, 1)
    assert not out.row["accepted"] and setup.counts["rejected_change"] == 1
    np.testing.assert_array_equal(out.state.params, state.params)
    assert out.state.delta == pytest.approx(state.delta / setup.o.gamma)
    assert out.state.reuse_next and out.state.hess_eps is not None
    again = trustvi.step(setup, out.state, 2)
    assert again.row["hessian_fresh"] is False
    assert again.row["delta"] == pytest.approx(out.state.delta)
    assert again.row["step_norm"] <= out.state.delta * (1 + 1e-9)


def test_the_paper_acceptance_rejects_a_step_whose_model_gain_is_below_lambda_delta_squared():
    """The paper's λ-test (Eq. 10 with ηm' ≥ λδ²): in a region so large that the step is the
    Newton step, its predicted gain is far below λδ²/η, and the step is rejected before any
    ELBO-change draw is spent."""
    problem, family, setup, state = _setup(acceptance="paper", delta0=1e4)
    o = setup.o
    out = trustvi.step(setup, state, 1)
    assert o.eta * out.row["m_prime"] < o.lam * 1e4 ** 2
    assert not out.row["accepted"] and setup.counts["rejected_lambda"] == 1
    assert out.row["n_change"] == 0 and setup.ledger.log_density_draws == 0
    np.testing.assert_array_equal(out.state.params, state.params)


def test_steps_from_the_same_state_and_key_are_identical():
    """A step is a function of (state, iteration, key): the same inputs give the same output
    bit for bit (the random draws come from the key, one per purpose and iteration), and
    another iteration number draws other numbers."""
    _, _, setup_a, state = _setup()
    _, _, setup_b, _ = _setup()
    a = trustvi.step(setup_a, state, 5)
    b = trustvi.step(setup_b, state, 5)
    c = trustvi.step(setup_b, state, 6)
    np.testing.assert_array_equal(a.state.params, b.state.params)
    assert a.row.keys() == b.row.keys()
    for key, value in a.row.items():
        other = b.row[key]
        assert value == other or (isinstance(value, float) and np.isnan(value)
                                  and np.isnan(other)), key
    assert c.row["grad_norm"] != a.row["grad_norm"]
