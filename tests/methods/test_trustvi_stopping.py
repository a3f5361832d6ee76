"""TrustVI's certified stop (issue P2-1 part 1): the Fisher-metric trust region, the certified
split-sample Newton gain, the Laplace warm start and the fixed-draw refinement, on
ill-conditioned Gaussian targets whose mean-field optimum is known exactly (μ* = m,
σ*_i = 1/√Λ_ii, ELBO* = −½(log|Σ| + Σ log Λ_ii); tests/gaussian_targets.py).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from gaussian_targets import GaussianProblem, gap
from stanvi.estimators import ElboEstimator
from stanvi.families import FullRank, MeanField
from stanvi.methods.base import OracleLedger
from stanvi.methods.refine import refine
from stanvi.optim.gltr import certified_newton_gain as _certified_gain
from stanvi.methods.warm_start import laplace_start
from stanvi.targets.jax_target import JaxTarget

jax.config.update("jax_enable_x64", True)


def ill_conditioned(dim: int, condition: float, seed: int = 0, offset: float = 0.0) -> GaussianProblem:
    """N(m, Σ) with a random rotation and eigenvalues log-spaced over ``condition``, with the
    mean at ``offset`` + N(0, 1) (a posterior far from Stan's uniform(−2, 2) init for a large
    offset)."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    S = q @ np.diag(np.geomspace(1.0, condition, dim)) @ q.T
    S = 0.5 * (S + S.T)
    return GaussianProblem(offset + rng.normal(size=dim), S, f"ill{dim}-{condition:g}-{offset:g}")


ILL = ill_conditioned(50, 1e6)
FAR = ill_conditioned(3, 100.0, seed=1, offset=1500.0)


def mf_errors(problem: GaussianProblem, fit) -> tuple[float, float]:
    """The issue's accuracy measures: largest |mean error| in units of the posterior sd √Σ_ii,
    largest |sd / σ*_i − 1| against the exact mean-field optimum's sd σ*_i = 1/√Λ_ii.  (The
    mean-field sd is up to 1e3 times smaller than the posterior sd here; along the posterior's
    long axes the mean-field ELBO is nearly flat, so the mean is determined in posterior-sd
    units, not mean-field ones.)"""
    fit_sd = np.sqrt(np.diag(fit.covariance))
    return (float(np.max(np.abs(fit.mean - problem.m) / np.sqrt(np.diag(problem.S)))),
            float(np.max(np.abs(fit_sd / problem.mf_sigma - 1.0))))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_default_is_right_on_condition_number_1e6(seed):
    """D = 50, condition number 1e6: ``converged`` means within 0.05 nats (not 1), the mean within
    0.05 sd and the sd within 5% of the exact mean-field optimum (the issue's accuracy
    target); before the fix the stop fired on a one-step Krylov gain."""
    fit = stanvi.fit(ILL.log_density, dim=ILL.dim, method="trustvi", seed=seed, progress=False,
                     draws=10)
    assert fit.status == "converged", fit.message
    assert "certified on" in fit.message
    assert gap(ILL, fit.family, fit.params) < 0.05
    mean_err, sd_err = mf_errors(ILL, fit)
    assert mean_err < 0.05 and sd_err < 0.05, (mean_err, sd_err)


def test_default_finds_a_posterior_far_from_the_init():
    """Mean near 1,500 (Stan's init is uniform(−2, 2)): the Laplace start puts q there."""
    for seed in range(2):
        fit = stanvi.fit(FAR.log_density, dim=FAR.dim, method="trustvi", seed=seed,
                         progress=False, draws=10)
        assert fit.status == "converged", fit.message
        assert fit.info["warm_start"] == "laplace"
        assert gap(FAR, fit.family, fit.params) < 0.05
        mean_err, sd_err = mf_errors(FAR, fit)
        assert mean_err < 0.05 and sd_err < 0.05


def test_laplace_start_is_the_meanfield_optimum_of_a_gaussian():
    """For a Gaussian p, the Laplace start N(mode, diag(1/Λ_ii)) is the mean-field optimum."""
    target = JaxTarget(FAR.log_density, FAR.dim)
    family = MeanField(FAR.dim)
    est = ElboEstimator(family, FAR.log_density)
    default = family.initial_params(np.zeros(FAR.dim), -1.0)
    ledger = OracleLedger()
    params, info = laplace_start(target, family, est, np.zeros(FAR.dim), default,
                                 key=jax.random.PRNGKey(0), ledger=ledger, log_scale0=-1.0)
    assert info["warm_start"] == "laplace"
    np.testing.assert_allclose(params[:FAR.dim], FAR.m, rtol=0, atol=1e-4)
    np.testing.assert_allclose(np.exp(params[FAR.dim:]), FAR.mf_sigma, rtol=1e-6)
    assert ledger.gradient_draws == info["laplace_iterations"] or ledger.gradient_draws > 0
    assert ledger.hvp_draws == FAR.dim  # one batched Hessian: D products at the mode


def test_laplace_start_falls_back_when_its_elbo_is_lower():
    """A density whose mode is a spike (a narrow bump on a broad Gaussian): the Laplace q sits
    on the spike, its ELBO on common draws is lower, and the default start is kept."""
    def spiky(z):
        broad = -0.5 * jnp.sum((z / 3.0) ** 2)
        spike = jnp.log1p(20.0 * jnp.exp(-0.5 * jnp.sum(((z - 0.3) / 1e-3) ** 2)))
        return broad + spike

    target = JaxTarget(spiky, 2)
    family = MeanField(2)
    est = ElboEstimator(family, spiky)
    default = family.initial_params(np.zeros(2), 1.0)
    start = np.array([0.3, 0.3])  # L-BFGS climbs onto the spike from here
    params, info = laplace_start(target, family, est, start, default,
                                 key=jax.random.PRNGKey(1), ledger=OracleLedger(), log_scale0=1.0)
    assert info["warm_start"] == "default", info
    assert info["laplace_elbo"] < info["default_elbo"]
    np.testing.assert_array_equal(params, default)


def test_certified_split_gain_is_the_cross_term():
    """½ c_bᵀB⁻¹c_a exactly (dense check), and the plug-in gain ½cᵀB⁻¹c."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(6, 6))
    B = a @ a.T + 0.1 * np.eye(6)
    ca, cb = rng.normal(size=6), rng.normal(size=6)
    gain, n = _certified_gain(lambda v: B @ v, ca, 1e-12, cb)
    assert gain == pytest.approx(0.5 * cb @ np.linalg.solve(B, ca), rel=1e-8)
    assert 1 <= n <= 6
    plug, _ = _certified_gain(lambda v: B @ v, ca, 1e-12)
    assert plug == pytest.approx(0.5 * ca @ np.linalg.solve(B, ca), rel=1e-8)
    # an indefinite model has no Newton gain: inf (never a stop)
    indefinite, _ = _certified_gain(lambda v: -B @ v, ca, 1e-12, cb)
    assert indefinite == math.inf


def test_metric_scale_values():
    mf = MeanField(2)
    np.testing.assert_allclose(mf.metric_scale(np.array([5.0, -1.0, math.log(2.0), -1.0])),
                               [0.5, math.e, math.sqrt(2), math.sqrt(2)])
    fr = FullRank(2, diagonal="log")
    # L = [[2, 0], [1, 3]] (log diagonal): row sds 2 and √10
    p = np.array([0.0, 0.0, math.log(2.0), 1.0, math.log(3.0)])
    sd = np.array([2.0, math.sqrt(10.0)])
    np.testing.assert_allclose(fr.metric_scale(p),
                               [1 / sd[0], 1 / sd[1], math.sqrt(2), 1 / sd[1], math.sqrt(2)])


def test_refine_reaches_the_fixed_draw_optimum_and_certifies_it():
    """From a perturbed start the refinement converges (Newton decrement below tol) to the
    optimum of the N-draw objective, whose exact ELBO gap is within the statistical error of an
    N-draw optimum (about P/(2N) nats, P = 20; 5× that as the bound)."""
    problem = ill_conditioned(10, 1e4, seed=4)
    family = MeanField(10)
    est = ElboEstimator(family, problem.log_density)
    start = np.concatenate([problem.m + 3 * problem.mf_sigma, np.log(problem.mf_sigma) + 1.0])
    ledger = OracleLedger()
    res = refine(est, family, start, key=jax.random.PRNGKey(7), ledger=ledger, n_draws=4096,
                 tol=1e-6, max_iters=50)
    assert res.converged, res.message
    assert res.decrement < 1e-6 and res.gain > 0
    assert gap(problem, family, res.params) < 5 * 20 / (2 * 4096)
    assert ledger.gradient_draws == 4096 * res.iterations


def test_refine_never_accepts_a_step_into_failing_draws():
    """A wall at z₀ = 1 (−inf beyond) next to the optimum: steps that put any fixed draw past
    the wall are rejected, so the fixed-draw ELBO is finite at every accepted iterate."""
    def wall(z):
        return jnp.where(z[0] > 1.0, -jnp.inf, -0.5 * jnp.sum((z - 0.8) ** 2))

    family = MeanField(2)
    est = ElboEstimator(family, wall)
    start = np.array([-2.0, 0.0, math.log(0.2), 0.0])
    elbos = []
    res = refine(est, family, start, key=jax.random.PRNGKey(2), ledger=OracleLedger(),
                 n_draws=512, tol=1e-4, max_iters=30,
                 on_iteration=lambda it, p, elbo, *rest: elbos.append(elbo))
    assert "failed" not in res.message
    assert len(elbos) >= 2 and np.all(np.isfinite(elbos))
    assert res.params[0] > start[0] + 0.5  # it moved towards the wall ...
    # ... but every Gaussian q puts mass past the wall (the true ELBO is −inf), the unconstrained
    # Newton step always crosses it, and no certificate is given
    assert not res.converged and "did not reach" in res.message


def test_budget_spent_in_the_refinement_is_reported_as_budget():
    """The oracle budget binds in the refinement too: status 'budget' with the reason, never a
    'converged' that the refinement did not certify.  (A hand-over after 3 iterations from the
    default start leaves the refinement several iterations of work.)"""
    opts = dict(warm_start="none", tol_model=1e9, method="trustvi", seed=0, progress=False,
                draws=10, profile="stochastic")
    free = stanvi.fit(ILL.log_density, dim=ILL.dim, **opts)
    assert free.status == "converged"
    busy = [r for r in free.trace.rows if r.get("phase") == "refine" and r["newton_gain"] > 0.2]
    assert busy, "the refinement converged at once: the test would not exercise the budget"
    budget = busy[0]["oracle_scaled"] + 1e-9  # spent within that refinement iteration
    fit = stanvi.fit(ILL.log_density, dim=ILL.dim, max_oracle_calls=budget, **opts)
    assert fit.status == "budget", fit.message
    assert "refinement" in fit.message
    assert fit.oracle["oracle_scaled"] >= budget
