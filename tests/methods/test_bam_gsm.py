"""Methods bam and gsm (issue T3-7; stanvi/methods/bam.py, gsm.py, score_vi.py;
docs/methods.md#bam, #gsm): exactness on Gaussian targets, the updates' defining properties
(BaM: the root of Σ U Σ + Σ = V, the brief's closed form; GSM: the score matched at the draw),
the target as a fixed point, affine invariance, oracle accounting against the target's counter,
failed draws, the family check, and the end-to-end runs on a Stan model (API and CLI)."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.linalg

import stanvi
from stanvi.errors import NotConvergedWarning
from stanvi.methods.bam import bam_update
from stanvi.methods.gsm import gsm_update
from stanvi.methods.score_vi import gaussian_kl

from conftest import data_file, stan_file
from gaussian_targets import make_problem

jax.config.update("jax_enable_x64", True)


def moments(fit) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(fit.family.mean(fit.params)), np.asarray(fit.family.covariance(fit.params))


def relative_errors(fit, problem) -> tuple[float, float]:
    mu, cov = moments(fit)
    return (float(np.linalg.norm(mu - problem.m) / np.linalg.norm(problem.m)),
            float(np.linalg.norm(cov - problem.S) / np.linalg.norm(problem.S)))


def quiet_fit(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NotConvergedWarning)
        return stanvi.fit(*args, **kwargs)


# ---- exactness on Gaussian targets -----------------------------------------------------------

@pytest.mark.parametrize("dim, iters", [(10, 60), (100, 40)])
def test_bam_recovers_a_correlated_gaussian(dim, iters):
    """B = D draws, λ_t = BD/(t+1): the mean and covariance to 1e-6 relative error (AR(1)
    ρ = 0.9, condition numbers in the hundreds), from μ₀ = 0, Σ₀ = I."""
    problem = make_problem(dim, correlated=True)
    fit = quiet_fit(problem.log_density, dim=dim, method="bam", family="fullrank", seed=1,
                    progress=False, draws=10, batch_size=dim, tol_kl=None, max_iters=iters)
    assert fit.status == "max_iters" and fit.info["rejected_updates"] == 0
    err_mu, err_cov = relative_errors(fit, problem)
    assert err_mu <= 1e-6 and err_cov <= 1e-6, (err_mu, err_cov)


def test_gsm_recovers_a_correlated_gaussian():
    problem = make_problem(10, correlated=True)
    fit = quiet_fit(problem.log_density, dim=10, method="gsm", family="fullrank", seed=1,
                    progress=False, draws=10, batch_size=10, tol_kl=None, max_iters=300)
    err_mu, err_cov = relative_errors(fit, problem)
    assert err_mu <= 1e-6 and err_cov <= 1e-6, (err_mu, err_cov)


def test_the_stopping_rule_fires_on_a_gaussian():
    """Default options (B = 8 < D = 10) but Σ₀ = I: the run converges by its rule, near p."""
    problem = make_problem(10, correlated=True)
    for method in ("bam", "gsm"):
        fit = stanvi.fit(problem.log_density, dim=10, method=method, family="fullrank", seed=2,
                         progress=False, draws=10)
        assert fit.status == "converged", (method, fit.message)
        assert "KL(q_t+1" in fit.message and "ELBO gained" in fit.message
        assert problem.kl(*moments(fit)) < 1e-3, method


# ---- the updates ---------------------------------------------------------------------------

def random_state(dim: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(dim, dim))
    cov = A @ A.T / dim + 0.5 * np.eye(dim)
    mu = rng.normal(size=dim)
    z = mu + rng.normal(size=(batch, dim)) @ np.linalg.cholesky(cov).T
    g = -np.tanh(z) - 0.3 * z ** 3       # the score of a non-Gaussian density
    return mu, cov, z, g


def test_bam_update_is_the_root_of_the_quadratic_matrix_equation():
    """Σ_{t+1} = 2V(I + (I + 4UV)^{1/2})⁻¹ (the brief's form, with SciPy's sqrtm) is the
    positive-definite solution of Σ U Σ + Σ = V; μ_{t+1} as the formula says."""
    dim, lam = 6, 3.7
    mu, cov, z, g = random_state(dim, 4)
    mu_new, cov_new = bam_update(mu, cov, z, g, lam)
    zbar, gbar = z.mean(0), g.mean(0)
    C = (z - zbar).T @ (z - zbar) / len(z)
    G = (g - gbar).T @ (g - gbar) / len(z)
    U = lam * G + lam / (1 + lam) * np.outer(gbar, gbar)
    V = cov + lam * C + lam / (1 + lam) * np.outer(mu - zbar, mu - zbar)
    reference = 2 * V @ np.linalg.inv(np.eye(dim) + scipy.linalg.sqrtm(np.eye(dim) + 4 * U @ V).real)
    np.testing.assert_allclose(cov_new, reference, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(cov_new @ U @ cov_new + cov_new, V, rtol=1e-9, atol=1e-12)
    assert np.all(np.linalg.eigvalsh(cov_new) > 0)
    np.testing.assert_allclose(mu_new, (mu + lam * (cov_new @ gbar + zbar)) / (1 + lam),
                               rtol=1e-12)


def test_gsm_update_matches_the_score_at_the_draw():
    """One draw: the new q's score at z equals ∇log p(z), −Σ'⁻¹(z − μ') = g."""
    mu, cov, z, g = random_state(5, 1, seed=3)
    mu_new, cov_new = gsm_update(mu, cov, z, g)
    np.testing.assert_allclose(-np.linalg.solve(cov_new, z[0] - mu_new), g[0], rtol=1e-9,
                               atol=1e-10)


@pytest.mark.parametrize("update", ["bam", "gsm"])
def test_a_gaussian_target_is_a_fixed_point(update):
    """q = p = N(m, S): any batch (here B = 3 < D) leaves q where it is."""
    rng = np.random.default_rng(7)
    dim = 8
    A = rng.normal(size=(dim, dim))
    S = A @ A.T / dim + 0.2 * np.eye(dim)
    m = rng.normal(size=dim)
    z = m + rng.normal(size=(3, dim)) @ np.linalg.cholesky(S).T
    g = -np.linalg.solve(S, (z - m).T).T
    mu_new, cov_new = (bam_update(m, S, z, g, 50.0) if update == "bam"
                       else gsm_update(m, S, z, g))
    np.testing.assert_allclose(mu_new, m, atol=1e-10)
    np.testing.assert_allclose(cov_new, S, atol=1e-10)


@pytest.mark.parametrize("update", ["bam", "gsm"])
def test_affine_invariance(update):
    """Fitting the image of p under y = A z + b (A lower triangular, so chol(AΣAᵀ) = A chol(Σ)
    and common base draws give y_b = A z_b + b) gives the image of the iterates: μ ↦ Aμ + b,
    Σ ↦ AΣAᵀ (BaM and GSM are affine invariant), here over 15 iterations on a non-Gaussian p."""
    dim = 4
    rng = np.random.default_rng(11)
    A = np.tril(rng.normal(size=(dim, dim)), -1) + np.diag(rng.uniform(0.5, 2.0, dim))
    b = rng.normal(size=dim)

    def score_z(z):
        return -np.tanh(z) - 0.3 * z ** 3

    def score_y(y):                       # ∇_y log p(A⁻¹(y − b)) = A⁻ᵀ ∇_z log p
        z = np.linalg.solve(A, (y - b).T).T
        return np.linalg.solve(A.T, score_z(z).T).T

    def step(mu, cov, eps, score, t):
        x = mu + eps @ np.linalg.cholesky(cov).T
        if update == "bam":
            return bam_update(mu, cov, x, score(x), 8.0 * dim / (t + 1))
        return gsm_update(mu, cov, x, score(x))

    mu, cov = np.zeros(dim), np.eye(dim)
    mu_y, cov_y = A @ mu + b, A @ cov @ A.T
    for t in range(15):
        eps = rng.normal(size=(8, dim))
        mu, cov = step(mu, cov, eps, score_z, t)
        mu_y, cov_y = step(mu_y, cov_y, eps, score_y, t)
    np.testing.assert_allclose(mu_y, A @ mu + b, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(cov_y, A @ cov @ A.T, rtol=1e-7, atol=1e-9)


# ---- robustness, options, family -----------------------------------------------------------

def test_meanfield_family_is_refused():
    problem = make_problem(3, correlated=False)
    for method in ("bam", "gsm"):
        with pytest.raises(ValueError, match="family='fullrank'"):
            stanvi.fit(problem.log_density, dim=3, method=method, family="meanfield",
                       progress=False)


def test_failed_draws_are_redrawn_and_a_model_that_always_fails_stops_clearly():
    problem = make_problem(4, correlated=True)
    base = problem.log_density

    def half(z):                            # −∞ (the model throws) on part of q's mass
        return jnp.where(z[0] > problem.m[0] + 1.0, -jnp.inf, base(z))

    fit = quiet_fit(half, dim=4, method="bam", family="fullrank", seed=0, progress=False,
                    draws=10, max_iters=50)
    assert fit.oracle["redrawn_draws"] > 0 and np.all(np.isfinite(fit.params))

    def never(z):
        return -jnp.inf * jnp.sum(z * 0.0 + 1.0)

    fit = quiet_fit(never, dim=4, method="gsm", family="fullrank", seed=0, progress=False,
                    draws=10)
    assert fit.status == "failed" and "failed at too many draws" in fit.message
    assert np.all(np.isfinite(fit.params))


def test_bad_options_are_refused():
    problem = make_problem(3, correlated=False)
    with pytest.raises(ValueError, match="schedule"):
        stanvi.fit(problem.log_density, dim=3, method="bam", family="fullrank",
                   schedule="cosine", progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        stanvi.fit(problem.log_density, dim=3, method="gsm", family="fullrank", batch_size=0,
                   progress=False)


# ---- accounting and Stan models ------------------------------------------------------------

@pytest.mark.parametrize("method", ["bam", "gsm"])
def test_gradient_evaluations_are_iterations_times_batch(load_target, method):
    """The paper profile (no warm start, no stopping rule): gradient evaluations = iterations × B,
    in the ledger and in the target's own counter (``fit.info['model_evaluations']``)."""
    fit = quiet_fit(load_target("eight_schools"), method=method, family="fullrank",
                    profile="paper", max_iters=40, seed=3, progress=False, draws=10)
    assert fit.status == "max_iters"
    assert fit.oracle["gradient_draws"] == 40 * 2
    assert fit.oracle["oracle_scaled"] == pytest.approx(40 * 2 / 256)
    assert fit.info["model_evaluations"] == {"log_density": 0, "gradient": 80, "hvp": 0}


@pytest.mark.parametrize("model", ["eight_schools", "reject_region"])
@pytest.mark.parametrize("method", ["bam", "gsm"])
def test_ledger_equals_the_target_counter(load_target, method, model):
    """Default profile (Laplace warm start: L-BFGS gradients, D HVPs, ELBO draws; then the
    batches, and redraws where reject_region throws): every evaluation charged."""
    fit = quiet_fit(load_target(model), method=method, family="fullrank", seed=3,
                    progress=False, draws=10, max_iters=300)
    o = fit.oracle
    ledger = {"log_density": o["log_density_draws"] + o["screening_draws"],
              "gradient": o["gradient_draws"] + o["redrawn_draws"], "hvp": o["hvp_draws"]}
    assert ledger == fit.info["model_evaluations"], fit.status
    assert np.all(np.isfinite(fit.unconstrained_draws))


@pytest.mark.parametrize("method", ["bam", "gsm"])
def test_eight_schools_end_to_end(load_target, method):
    fit = stanvi.fit(load_target("eight_schools"), method=method, family="fullrank", seed=1,
                     progress=False, draws=200)
    assert fit.status == "converged", fit.message
    assert np.all(np.isfinite(fit.unconstrained_draws))
    summary = fit.summary()
    assert "tau" in summary.index and np.isfinite(summary.loc["mu", "mean"])
    # near TrustVI's full-rank fit of the same posterior (a different divergence, so not equal)
    reference = stanvi.fit(load_target("eight_schools"), method="trustvi", family="fullrank",
                           seed=1, progress=False, draws=10)
    assert gaussian_kl(*moments(fit), *moments(reference)) < 0.5


def test_cli_fit_method_bam(compiled, tmp_path):
    compiled("eight_schools")       # the subprocess finds it in the compile cache
    stanvi_cmd = Path(sys.executable).parent / "stanvi"
    proc = subprocess.run([str(stanvi_cmd), "fit", str(stan_file("eight_schools")), "--data",
                           str(data_file("eight_schools")), "--method", "bam", "--family",
                           "fullrank", "--seed", "2", "--draws", "100", "--output",
                           str(tmp_path), "--quiet"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "bam" in proc.stdout and "tau" in proc.stdout
    assert list(tmp_path.glob("*-bam-fullrank-seed2.csv"))


def test_batch_plans_bam_and_gsm_on_the_fullrank_family_only():
    """``stanvi batch --methods bam`` with only mean-field refuses before any work; with both
    families, bam and gsm get full-rank tasks only and the other methods both."""
    from types import SimpleNamespace  # noqa: PLC0415

    from stanvi.batch.runner import BatchConfig, check_config, plan  # noqa: PLC0415

    with pytest.raises(ValueError, match="'bam' fits the fullrank or lowrank family only"):
        check_config(BatchConfig(methods=(("bam", None),), families=("meanfield",)))
    config = BatchConfig(methods=(("bam", None), ("gsm", "paper"), ("advi", None)),
                         families=("meanfield", "fullrank"), seeds=1)
    check_config(config)
    tasks = [(spec.method, spec.family) for _, spec in plan([SimpleNamespace(name="m")], config)]
    assert tasks == [("bam", "fullrank"), ("gsm", "fullrank"), ("advi", "meanfield"),
                     ("advi", "fullrank")]
