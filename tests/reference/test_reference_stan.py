"""Stan's dense NUTS, C++ ADVI and Pathfinder run in-process (stanvi.reference).

Targets with known answers: stan_models/gaussian (exactly N(m, Sigma)) and stan_models/
gaussian_diag with D = 4 (exactly N(mu, diag(sigma^2)), which the mean-field family contains).
Evaluation counts are checked against what each algorithm must do for given settings.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stanvi.errors import StanDataError
from stanvi.reference import ReferenceRunError, nuts, pathfinder, stan_advi
from stanvi.stan.compiler import compile_model

pytestmark = pytest.mark.slow

MODELS = Path(__file__).resolve().parents[2] / "stan_models"
DIAG = {"D": 4, "mu": [1.0, -2.0, 0.5, 3.0], "sigma": [0.5, 2.0, 1.0, 0.1]}
# every point is rejected (shared with test_reference_nuts: one compile)
REJECT = MODELS.parent / "tests" / "models" / "always_rejects.stan"


@pytest.fixture(scope="module")
def diag_model():
    return compile_model(MODELS / "gaussian_diag" / "gaussian_diag.stan", progress=False)


@pytest.fixture(scope="module")
def gaussian():
    return compile_model(MODELS / "gaussian" / "gaussian.stan", progress=False)


def test_dense_nuts_recovers_exact_mean_and_covariance(gaussian):
    data_path = MODELS / "gaussian" / "gaussian.data.json"
    data = json.loads(data_path.read_text())
    m, sigma = np.array(data["m"]), np.array(data["Sigma"])
    fit = nuts(gaussian, data_path, chains=4, seed=5, metric="dense_e")
    z = fit.stan_variable("z")
    n_eff = z.shape[0] / 10   # as in test_reference_nuts: ESS well above a tenth of the draws
    np.testing.assert_array_less(np.abs(z.mean(0) - m), 5 * np.sqrt(np.diag(sigma) / n_eff))
    cov_se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / n_eff)
    np.testing.assert_array_less(np.abs(np.cov(z, rowvar=False) - sigma), 5 * cov_se)
    assert fit.algorithm == "nuts-dense" and fit.settings["metric"] == "dense_e"
    table = fit.summary()
    assert list(table.index[:2]) == ["z[1]", "z[2]"]
    assert (table["r_hat"] < 1.05).all() and (table["ess_bulk"] > 100).all()
    tree = fit.to_arviz()
    assert tree.posterior["z"].shape == (4, 1000, 10)
    assert list(tree.posterior["z"].coords["z_dim_0"].values) == list(range(1, 11))
    assert int(tree.sample_stats["diverging"].sum()) == sum(fit.sampler_diagnostics["divergences"])


def test_stan_advi_meanfield_finds_the_exact_diagonal_gaussian(diag_model):
    fit = stan_advi(diag_model, DIAG, seed=3)
    z = fit.stan_variable("z")
    assert z.shape == (1000, 4) and set(fit.stan_columns) == {"lp__", "log_p__", "log_g__"}
    mu, sd = np.array(DIAG["mu"]), np.array(DIAG["sigma"])
    # The optimum is q = p exactly; Stan's SGD stops with its iterate wandering about it by a
    # fraction of each sd (measured up to 0.26 sd; elements are 1 to 5 sd apart).
    np.testing.assert_array_less(np.abs(fit.mean["z"] - mu), 0.5 * sd)
    np.testing.assert_allclose(z.std(0), sd, rtol=0.5)
    # log_g__ is -|eta|^2 / 2 of the standard-normal draw behind each output draw
    eta = (z - fit.mean["z"]) / z.std(0)
    assert np.corrcoef(fit.log_q, -0.5 * (eta**2).sum(1))[0, 1] > 0.95
    assert fit.elbo_trace.shape[1] == 3 and fit.elbo_trace[-1, 0] >= 100
    assert fit.diagnostics().khat < 0.7


def test_stan_advi_counts_every_gradient_and_density(diag_model):
    """Without eta adaptation and with a tolerance it cannot meet, Stan's ADVI takes exactly
    `iter` steps of `grad_samples` gradients, evaluates the ELBO (`elbo_samples` densities)
    every `eval_elbo` steps, and evaluates log p once per output draw; initialization adds one
    gradient and one density (no ELBO before the first step without adaptation)."""
    it, gs, es, ev, out = 200, 3, 50, 40, 100
    fit = stan_advi(diag_model, DIAG, seed=1, iter=it, grad_samples=gs, elbo_samples=es,
                    eval_elbo=ev, adapt_engaged=False, tol_rel_obj=1e-12, output_samples=out)
    assert fit.gradient_evaluations == it * gs + 1
    assert fit.density_evaluations == (it // ev) * es + out + 1
    assert len(fit.elbo_trace) == it // ev


def test_stan_advi_fullrank_runs_and_names_agree(gaussian):
    fit = stan_advi(gaussian, MODELS / "gaussian" / "gaussian.data.json", algorithm="fullrank",
                    seed=2, output_samples=200)
    assert fit.stan_variable("z").shape == (200, 10) and fit.settings["algorithm"] == "fullrank"


def test_pathfinder_single_and_multi_path(diag_model):
    single = pathfinder(diag_model, DIAG, num_paths=1, seed=4)
    mu, sd = np.array(DIAG["mu"]), np.array(DIAG["sigma"])
    z = single.stan_variable("z")
    assert single.algorithm == "pathfinder" and z.shape == (1000, 4)
    np.testing.assert_array_less(np.abs(z.mean(0) - mu), 5 * sd / np.sqrt(1000) + 0.05 * sd)
    assert single.diagnostics().khat < 0.7
    assert single.gradient_evaluations > 0
    multi = pathfinder(diag_model, DIAG, seed=4, num_paths=3, num_psis_draws=500)
    assert multi.algorithm == "pathfinder-multi" and multi.num_draws == 500
    assert set(np.unique(multi.stan_columns["path__"])) <= {1.0, 2.0, 3.0}
    # three paths cost about three times one (each path's L-BFGS and ELBO draws)
    assert 2 * single.gradient_evaluations <= multi.gradient_evaluations
    with pytest.raises(ValueError, match="no single proposal density"):
        multi.diagnostics()
    everything = pathfinder(diag_model, DIAG, seed=4, num_paths=3, psis_resample=False)
    assert everything.num_draws == 3 * 1000 and not everything.has_proposal_density


def test_failures_carry_stans_message(diag_model):
    with pytest.raises(ReferenceRunError, match="(?s)always rejects"):
        stan_advi(REJECT, iter=10)
    with pytest.raises(ReferenceRunError, match="(?s)always rejects"):
        pathfinder(REJECT, num_paths=1)
    with pytest.raises(StanDataError, match="sigma"):
        stan_advi(diag_model, {"D": 4, "mu": DIAG["mu"]})
    with pytest.raises(TypeError, match="adapt_delta"):
        pathfinder(diag_model, DIAG, adapt_delta=0.9)


@pytest.mark.parametrize("algorithm", ["meanfield", "fullrank"])
def test_stan_advi_gaussian_is_recovered_exactly(diag_model, algorithm):
    """The Gaussian behind Stan's ADVI output reproduces every draw's log_g__ = -|eta|^2/2."""
    from stanvi.reference.advi import stan_advi_gaussian
    from stanvi.targets.stan_target import StanTarget

    fit = stan_advi(diag_model, DIAG, algorithm=algorithm, seed=7, output_samples=300)
    target = StanTarget(diag_model, DIAG, progress=False)
    zeta = np.array([target.unconstrain({"z": row}) for row in fit.stan_variable("z")])
    mu = target.unconstrain(fit.mean)
    chol = stan_advi_gaussian(fit, zeta, mu)
    eta = np.linalg.solve(chol, (zeta - mu).T).T
    np.testing.assert_allclose(-0.5 * (eta**2).sum(1), fit.log_q, rtol=1e-8, atol=1e-8)
    if algorithm == "meanfield":
        assert np.count_nonzero(chol - np.diag(np.diag(chol))) == 0


ADVI_AGREEMENT_MODELS = [("bernoulli", "bernoulli", "bernoulli"),
                         ("eight_schools", "eight_schools_noncentered", "eight_schools"),
                         ("poisson_glm", "poisson_glm", "poisson_glm")]


@pytest.mark.parametrize("folder,stem,data", ADVI_AGREEMENT_MODELS, ids=lambda x: str(x))
def test_stan_advi_and_stanvi_advi_agree_in_distribution(folder, stem, data):
    """Stan's C++ ADVI and stanvi's ``advi`` (profile ``stan``) are the same algorithm: over 20
    seeds each, their final ELBOs (the last ``calc_ELBO`` of each run, 100 draws, as Stan
    reports it) come from one distribution.  Two-sample Kolmogorov-Smirnov test, rejected at
    p < 0.001 (a false alarm once in 1,000 runs per model).  Measured on this set:
    p = 0.83 (bernoulli), 0.34 (eight schools), 0.98 (poisson_glm)."""
    from scipy.stats import ks_2samp

    import stanvi
    from stanvi.reference.advi import advi_final_elbo

    stan_file = MODELS / folder / f"{stem}.stan"
    data_file = MODELS / folder / f"{data}.data.json"
    compiled = compile_model(stan_file, progress=False)
    stan_elbos = [advi_final_elbo(stan_advi(compiled, data_file, seed=s)) for s in range(20)]
    # one target for the 20 fits (a fit of (model, data) would load a new target each time, and
    # each new target's JAX programs are compiled anew: ~1 s a fit); the same draws either way
    target = stanvi.load(compiled, data_file, progress=False)
    ours = []
    for s in range(20):
        fit = stanvi.fit(target, method="advi", profile="stan", seed=s, progress=False)
        elbo = fit.trace.column("elbo")
        ours.append(float(elbo[np.isfinite(elbo)][-1]))
    assert np.all(np.isfinite(stan_elbos)) and np.all(np.isfinite(ours))
    assert ks_2samp(stan_elbos, ours).pvalue > 1e-3, (np.median(stan_elbos), np.median(ours))
