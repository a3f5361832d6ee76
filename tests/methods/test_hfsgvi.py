"""HFSGVI, the TrustVI paper's Hessian-free Newton comparator (Fan et al. 2015; Regier, Jordan &
McAuliffe 2017, §5.2; docs/algorithms.md#hfsgvi).

Tolerances: on a Gaussian target every HFSGVI iterate is a full Newton step computed from a
gradient of n_g draws, so near the optimum its ELBO loss is the weighted χ² of
:func:`gaussian_targets.noise_gap_bound` (mean tr(M)/(2n), 5σ bound), inflated by the error of
the n_h-draw Hessian that scales the step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from gaussian_targets import GaussianProblem, gap, make_problem, noise_gap_bound
from stanvi.estimators import ElboEstimator, standard_normal
from stanvi.families import MeanField
from stanvi.methods import hfsgvi, make_options
from stanvi.methods.base import RunContext, purpose_key
from stanvi.progress import IterationProgress

jax.config.update("jax_enable_x64", True)

CORRELATED = make_problem(3, True)


def well_conditioned(dim=5, seed=0) -> GaussianProblem:
    rng = np.random.default_rng(seed)
    sd = np.exp(rng.uniform(math.log(0.7), math.log(1.5), dim))
    return GaussianProblem(rng.normal(0.0, 1.0, dim), np.diag(sd**2), f"well-conditioned D={dim}")


WELL = well_conditioned()


def run_direct(est, options, *, seed=0, init_mu=None):
    fam = est.family
    ctx = RunContext(init_mu=np.zeros(fam.dim) if init_mu is None else init_mu,
                     random_init_mu=np.zeros(fam.dim), max_oracle_calls=None, estimator=est,
                     progress=IterationProgress("hfsgvi", enabled=False))
    return hfsgvi.run(None, fam, key=jax.random.PRNGKey(seed), options=options, context=ctx)


# ------------------------------------------------------------------------------ Newton property (docs/algorithms.md#hfsgvi)

def mu_newton_step(est, params, grad_mu, eps_h):
    """One Newton step in μ alone (ω fixed), by HFSGVI's truncated CG on the μ-block of the
    Monte Carlo Hessian."""
    d = est.family.dim

    def neg_hvp_mu(a):
        return -est.hvp(params, eps_h, np.concatenate([a, np.zeros(d)]))[:d]

    p, n_hvp, status = hfsgvi.truncated_cg(neg_hvp_mu, grad_mu, tol=1e-14, maxiter=d)
    assert status in ("converged", "max_iter") and n_hvp <= d
    return params[:d] + p


def test_newton_step_with_exact_gradient_lands_on_mean():
    problem = CORRELATED
    d = problem.dim
    est = ElboEstimator(MeanField(d), problem.log_density)
    params = np.concatenate([np.array([3.0, -2.0, 0.5]), np.array([-0.3, 0.4, -1.0])])
    # the exact gradient in μ: docs/algorithms.md#gaussian-closed-forms
    exact_grad_mu = -problem.precision @ (params[:d] - problem.m)
    eps_h = standard_normal(jax.random.PRNGKey(0), 85, d)
    mu_new = mu_newton_step(est, params, exact_grad_mu, eps_h)
    np.testing.assert_allclose(mu_new, problem.m, rtol=0, atol=1e-10)


def test_newton_step_with_mc_gradient_error_is_mean_sigma_eps():
    """With a Monte Carlo gradient from draws ε_grad the μ-Newton step lands on
    m − mean(σ ⊙ ε_grad) exactly."""
    problem = CORRELATED
    d = problem.dim
    est = ElboEstimator(MeanField(d), problem.log_density)
    params = np.concatenate([np.array([3.0, -2.0, 0.5]), np.array([-0.3, 0.4, -1.0])])
    sigma = np.exp(params[d:])
    eps_g = standard_normal(jax.random.PRNGKey(1), 256, d)
    _, G = est.values_and_grads(params, eps_g)
    eps_h = standard_normal(jax.random.PRNGKey(2), 85, d)
    mu_new = mu_newton_step(est, params, G[:, :d].mean(0), eps_h)
    np.testing.assert_allclose(mu_new - problem.m, -(sigma * eps_g).mean(0), rtol=0, atol=1e-10)


class RecordingEstimator:
    def __init__(self, est):
        self._est = est
        self.family = est.family
        self.grad_calls = []
        self.hess_eps = None

    def values_and_grads(self, params, eps):
        out = self._est.values_and_grads(params, eps)
        self.grad_calls.append(out[1])
        return out

    def hvp(self, params, eps, v):
        self.hess_eps = eps
        return self._est.hvp(params, eps, v)


def test_iteration_takes_the_full_newton_step():
    """One HFSGVI iteration: the step p solves (−H_t) p = g_t to the CG tolerance (relative
    residual ≤ cg_tol) for the iteration's own gradient and Hessian sample, and is taken in full
    (no step size, line search or trust region)."""
    problem = WELL
    d = problem.dim
    est = RecordingEstimator(ElboEstimator(MeanField(d), problem.log_density))
    o = make_options(hfsgvi, "paper", {"max_iters": 1})
    res = run_direct(est, o, seed=4)
    assert res.status == "max_iters" and len(res.trace) == 2
    assert len(est.grad_calls) == 1 and est.grad_calls[0].shape == (o.n_grad, 2 * d)
    g = est.grad_calls[0].mean(0)
    p = res.params - res.trace.params_at(0)
    assert res.trace.rows[1]["cg_status"] == "converged"
    assert est.hess_eps.shape == (o.n_hess, d)
    # the Hessian sample came from the iteration's own key, independent of the gradient's
    np.testing.assert_array_equal(est.hess_eps,
                                  standard_normal(purpose_key(jax.random.PRNGKey(4), 1, "hessian"),
                                                  o.n_hess, d))
    residual = -est._est.hvp(res.trace.params_at(0), est.hess_eps, p) - g
    assert np.linalg.norm(residual) <= o.cg_tol * np.linalg.norm(g)
    assert res.trace.rows[1]["step_norm"] == pytest.approx(np.linalg.norm(p), rel=1e-12)
    # oracle prices: 1 per 256-draw gradient, 2 per 85-draw HVP
    row = res.trace.rows[1]
    assert row["oracle_scaled"] == pytest.approx(1 + 2 * row["n_hvp"], rel=1e-14)


def test_truncated_cg_negative_curvature_rules():
    """Nocedal & Wright Alg. 7.1: non-positive curvature at the first iteration returns the
    gradient itself; later, the current iterate."""
    c = np.array([1.0, 2.0])
    p, n, status = hfsgvi.truncated_cg(lambda v: -v, c, tol=1e-10, maxiter=2)
    assert status == "negative_curvature" and n == 1
    np.testing.assert_array_equal(p, c)
    B = np.array([[1.0, 0.0], [0.0, -1.0]])
    p, n, status = hfsgvi.truncated_cg(lambda v: B @ v, np.array([1.0, 1e-3]), tol=1e-12, maxiter=5)
    assert status == "negative_curvature" and n == 2 and np.all(np.isfinite(p))
    p, n, status = hfsgvi.truncated_cg(lambda v: np.full(2, np.nan), c, tol=1e-10, maxiter=2)
    assert status == "non_finite"
    p, n, status = hfsgvi.truncated_cg(lambda v: v, np.zeros(2), tol=1e-10, maxiter=2)
    assert status == "converged" and n == 0 and not p.any()


# ------------------------------------------------------------------------------ convergence (docs/algorithms.md#gaussian-closed-forms)

def test_converges_on_well_conditioned_gaussian_large_batches():
    """With 4096-draw gradients and Hessians the final iterate's ELBO loss is below
    2 × the 5σ noise bound: the Hessian's relative error is ≤ 5·√(2/4096) ≈ 0.11 (5σ), which
    inflates the loss by ≤ 1/(1−0.11)² ≈ 1.26 and leaves a contraction factor ≤ 0.11 per
    Newton step; 2 covers both."""
    problem = WELL
    fit = stanvi.fit(problem.log_density, dim=problem.dim, method="hfsgvi", seed=0, progress=False,
                     draws=10, n_grad=4096, n_hess=4096, max_iters=30, profile="paper")
    assert fit.status == "max_iters"
    est = ElboEstimator(fit.family, problem.log_density)
    problem.assert_mf_optimum(fit.family, fit.params,
                              2 * noise_gap_bound(problem, fit.family, est, 4096))


def test_paper_profile_hovers_at_the_noise_floor():
    """The paper profile (256/85 draws, 500 iterations, no convergence test): the last 100
    iterates are each a Newton step from 256 draws, so their mean ELBO loss is about
    tr(M)/(2n) (the Hessian's noise averages out over iterates); we allow twice that."""
    problem = WELL
    fit = stanvi.fit(problem.log_density, dim=problem.dim, method="hfsgvi", seed=1,
                     progress=False, draws=10, profile="paper")
    assert fit.status == "max_iters" and len(fit.trace) == 501
    rows_ = fit.trace.kept_rows()[-100:]
    gaps = np.array([gap(problem, fit.family, fit.trace.params_at(i)) for i in rows_])
    mean_loss = 2 * problem.dim / (2 * 256)          # tr M = 2D for a diagonal target
    assert np.all(np.isfinite(gaps))
    assert gaps.mean() <= 2 * mean_loss, (gaps.mean(), mean_loss)


# ------------------------------------------------------------------------------ overflow is a failed run, never a crash

def flat(z):
    """An almost flat log density: the ω-Newton step is ≈ 1/(2·1e-10·σ²) ≈ 4e10, so σ = e^ω
    overflows at the first iteration."""
    return -0.5e-10 * jnp.sum(z * z)


def cauchy(z):
    """Heavy tails: the log density has positive curvature for |z| > 1."""
    return -jnp.sum(jnp.log1p(z * z))


@pytest.mark.parametrize("profile", ["paper", "default"])
def test_overflow_is_reported_as_failed(profile):
    """An almost flat target: the paper profile's first step from q₀ overflows (the last finite
    iterate, the initial one, is kept)."""
    fit = stanvi.fit(flat, dim=2, method="hfsgvi", profile=profile, progress=False, draws=10)
    if profile == "default":
        # the Laplace start sees what this target is, a proper Gaussian with sd 1e5, and the
        # capped Newton steps end at its mean-field optimum
        assert fit.status == "converged", fit.message
        np.testing.assert_allclose(np.exp(fit.params[2:]), 1e5, rtol=0.05)
        return
    assert fit.status == "failed"
    assert fit.message.startswith("overflow"), fit.message
    np.testing.assert_array_equal(fit.params, fit.trace.params_at(0))
    assert np.all(np.isfinite(fit.params)) and np.all(np.isfinite(fit.draws["z.1"]))


def test_paper_profile_recovers_from_its_first_overshoot():
    """Issue T3-2 item 2: on a 6-D correlated Gaussian the paper profile's first undamped step
    overshoots ω by tens (sd ~1e22) and the following steps bring it back; from commit 6fdf738
    the run was 'failed' at iteration 1.  It now ends at max_iters near the optimum (ELBO loss
    below 10× the noise floor of its 256-draw gradients)."""
    rng = np.random.default_rng(0)        # the kind of model: Σ = AAᵀ + D·I, D = 6
    A = rng.normal(size=(6, 6))
    problem = GaussianProblem(rng.normal(size=6), A @ A.T + 6 * np.eye(6), "issue T3-2 item 2")
    fit = stanvi.fit(problem.log_density, dim=problem.dim, method="hfsgvi", profile="paper",
                     seed=0, progress=False, draws=10)
    assert fit.status == "max_iters", fit.message
    sds = [float(np.max(np.exp(fit.trace.params_at(i)[problem.dim:])))
           for i in fit.trace.kept_rows()]
    assert max(sds) > 1e10           # the overshoot happened ...
    mean_loss = 2 * problem.dim / (2 * 256)
    assert gap(problem, fit.family, fit.params) < 10 * mean_loss   # ... and was recovered


@pytest.mark.parametrize("dim, correlated", [(6, True), (20, True), (100, False)])
def test_default_profile_converges_where_newton_should(dim, correlated):
    """The default profile (Laplace start, 2-q-sd step cap, noise-level stop, mean of the last
    3 iterates) ends converged within a small multiple of the noise floor."""
    problem = make_problem(dim, correlated)
    fit = stanvi.fit(problem.log_density, dim=problem.dim, method="hfsgvi", seed=2,
                     progress=False, draws=10)
    assert fit.status == "converged", fit.message
    assert gap(problem, fit.family, fit.params) < 5 * 2 * problem.dim / (2 * 256)


def test_nonfinite_cg_is_overflow():
    class NaNHessian:
        family = MeanField(2)

        def values_and_grads(self, params, eps):
            return np.zeros(len(eps)), np.tile([1.0, 0.0, 0.5, 0.0], (len(eps), 1))

        def hvp(self, params, eps, v):
            return np.full_like(v, np.nan)

    res = run_direct(NaNHessian(), make_options(hfsgvi, "paper", {}))
    assert res.status == "failed" and res.message.startswith("overflow")
    assert "conjugate-gradient" in res.message


def test_gradient_failure_is_overflow():
    def dead(z):
        return jnp.where(z[0] > -1e300, -jnp.inf, 0.0)

    fit = stanvi.fit(dead, dim=2, method="hfsgvi", progress=False, draws=5)
    assert fit.status == "failed" and fit.message.startswith("overflow: the gradient failed")


def test_overflow_never_raises_even_with_warnings_as_errors():
    """The overflow on the way to a failure (‖r‖² overflowing inside CG, here on the 100
    independent normals of stan_models/gaussian_diag with the default profile's 32-draw
    Hessians under the paper profile, whose ω-block is indefinite far from the optimum) is
    reported as status
    'failed', also when floating-point warnings are errors (``-W error``)."""
    import json
    import warnings

    from conftest import data_file

    data = json.loads(data_file("gaussian_diag").read_text())
    problem = GaussianProblem(np.asarray(data["mu"]), np.diag(np.asarray(data["sigma"]) ** 2),
                              "gaussian_diag")
    est = ElboEstimator(MeanField(problem.dim), problem.log_density)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = run_direct(est, make_options(hfsgvi, "paper", {"max_iters": 10, "n_grad": 64,
                                                             "n_hess": 32}), seed=0)
    assert res.status == "failed" and res.message.startswith("overflow"), res.message
    assert np.all(np.isfinite(res.params))


def test_heavy_tails_never_raise():
    """Whatever happens on a target with positive-curvature regions, fit() returns: failures are
    statuses with 'overflow' messages; iterates stay finite."""
    statuses = set()
    for seed in range(4):
        for profile in ("paper", "default"):
            fit = stanvi.fit(cauchy, dim=2, method="hfsgvi", profile=profile, seed=seed,
                             progress=False, draws=5)
            statuses.add(fit.status)
            assert fit.status in ("converged", "max_iters", "budget", "failed")
            if fit.status == "failed":
                assert fit.message.startswith("overflow"), fit.message
            assert np.all(np.isfinite(fit.params))
    assert "failed" in statuses     # the overflow path was exercised


def test_same_seed_same_result():
    a = stanvi.fit(WELL.log_density, dim=WELL.dim, method="hfsgvi", seed=3, max_iters=20,
                   progress=False, draws=10)
    b = stanvi.fit(WELL.log_density, dim=WELL.dim, method="hfsgvi", seed=3, max_iters=20,
                   progress=False, draws=10)
    c = stanvi.fit(WELL.log_density, dim=WELL.dim, method="hfsgvi", seed=4, max_iters=20,
                   progress=False, draws=10)
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.trace.column("elbo"), b.trace.column("elbo"))
    np.testing.assert_array_equal(a.draws["z.1"], b.draws["z.1"])
    assert not np.array_equal(a.params, c.params)


@pytest.mark.parametrize("name, value", [("init", "zeros"), ("fullrank_diagonal", "exp")])
def test_misspelt_option_values_are_clear_errors(name, value):
    with pytest.raises(ValueError, match=rf"{name}='{value}' is not one of"):
        make_options(hfsgvi, None, {name: value})
