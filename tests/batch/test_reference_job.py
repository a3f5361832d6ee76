"""Batch fits by Stan's own algorithms (stanvi.batch.reference_job): Stan's full-rank ADVI past
D = 44 is asked for enough output draws to recover its Gaussian, so that its ELBO and verdict
are computed as for stanvi's fits (docs/diagnostics.md#stan), while its costs and accuracy stay
those of Stan's default run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stanvi.batch.reference_job import reference_fit_job
from stanvi.reference import stan_advi
from stanvi.reference.advi import output_samples_to_recover
from stanvi.stan.compiler import compile_model

pytestmark = pytest.mark.slow

MODEL = Path(__file__).resolve().parents[2] / "stan_models" / "gaussian_diag" / "gaussian_diag.stan"


def test_output_draws_to_recover_stan_s_gaussian():
    assert output_samples_to_recover(44, "fullrank") == 1000      # 990 unknowns: the default
    assert output_samples_to_recover(45, "fullrank") == 1552      # 1,035 unknowns
    assert output_samples_to_recover(1000, "meanfield") == 1000
    assert output_samples_to_recover(1001, "meanfield") == 1501


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
