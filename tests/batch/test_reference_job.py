"""Batch fits by Stan's own algorithms (stanvi.batch.reference_job): Stan's full-rank ADVI past
D = 44 is asked for enough output draws to recover its Gaussian, so that its ELBO and verdict
are computed as for stanvi's fits (docs/diagnostics.md#stan), while its costs and accuracy stay
those of Stan's default run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stanvi.batch.reference_job import reference_fit_job
from stanvi.reference import pathfinder, stan_advi
from stanvi.reference.diagnostics import draws_to_recover
from stanvi.stan.compiler import compile_model

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parents[2] / "stan_models" / "gaussian_diag" / "gaussian_diag.stan"


def test_output_draws_to_recover_stan_s_gaussian():
    assert draws_to_recover(44, "fullrank") == 1000      # 990 unknowns: Stan's default
    assert draws_to_recover(45, "fullrank") == 1552      # 1,035 unknowns
    assert draws_to_recover(1000, "meanfield") == 1000
    assert draws_to_recover(1001, "meanfield") == 1501
    assert draws_to_recover(43, "quadratic") == 1000     # 991 coefficients
    assert draws_to_recover(44, "quadratic") == 1554     # 1,036
    # up to 5,152 unknowns (Pathfinder at D = 100); beyond, the least squares costs minutes and
    # gigabytes: Stan's default draws, and the verdict on them
    assert draws_to_recover(100, "quadratic") == 7728 and draws_to_recover(101, "quadratic") == 1000
    assert draws_to_recover(101, "fullrank") == 7726 and draws_to_recover(102, "fullrank") == 1000


def test_full_rank_stan_advi_at_d_50_gets_its_elbo_and_the_same_costs():
    d = 50
    rng = np.random.default_rng(0)
    data = {"D": d, "mu": rng.normal(size=d).tolist(), "sigma": rng.uniform(0.5, 2, d).tolist()}
    job = {"method": "stan-advi", "profile": None, "family": "fullrank", "seed": 2,
           "options": {}, "stan": str(MODEL)}
    record = reference_fit_job(job, data)
    assert record["info"]["recovery_draws"] == 1912 - 1000      # 1,275 unknowns × 1.5
    # before: "ELBO not computed: 1000 draws cannot identify a 50-dimensional full-rank
    # Gaussian (need 1275)", and k-hat on Stan's own 1,000 draws
    assert np.isfinite(record["elbo"]) and not record["message"]
    figures = record["verdict_figures"]   # the rule of stanvi's fits, on fresh draws of q
    assert figures["n_draws"] != 1000 and figures["means"] in ("hold", "plausible", "doubtful")
    default = stan_advi(compile_model(MODEL, progress=False), data, algorithm="fullrank",
                        seed=2, progress=False)
    assert record["model_evaluations"] == {"gradient": default.gradient_evaluations,
                                           "log_density": default.density_evaluations}
    assert record["run_time"] > 0 and record["status"] == default.status


def test_single_path_pathfinder_at_d_50_is_judged_on_fresh_draws_at_the_same_costs():
    d = 50
    rng = np.random.default_rng(1)
    data = {"D": d, "mu": rng.normal(size=d).tolist(), "sigma": rng.uniform(0.5, 2, d).tolist()}
    job = {"method": "pathfinder", "profile": "single", "family": "none", "seed": 4,
           "options": {}, "stan": str(MODEL)}
    record = reference_fit_job(job, data)
    assert record["info"]["recovery_draws"] == 1990 - 1000      # (51·52/2 + 1) × 1.5
    figures = record["verdict_figures"]   # before: k-hat on Stan's own 1,000 draws
    assert figures["n_draws"] != 1000 and figures["means"] in ("hold", "plausible", "doubtful")
    default = pathfinder(compile_model(MODEL, progress=False), data, num_paths=1, seed=4,
                         progress=False)
    assert record["model_evaluations"] == {"gradient": default.gradient_evaluations,
                                           "log_density": default.density_evaluations}
    ratio = default.log_p - default.log_q   # the ELBO of the default run's 1,000 draws
    assert record["elbo"] == pytest.approx(float(np.mean(ratio[np.isfinite(ratio)])), rel=1e-12)

