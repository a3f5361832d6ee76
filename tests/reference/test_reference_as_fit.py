"""Stan's own algorithms through stanvi.fit and `stanvi fit --method` (issue T3-5 item 2;
docs/stan_reference.md#through-fit): the same runs as stanvi.reference's functions, saved like
stanvi's fits, and stanvi-only arguments refused with the Stan setting to use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import stanvi
from stanvi.reference import ReferenceFit, nuts, pathfinder, stan_advi
from stanvi.stan.compiler import compile_model

pytestmark = pytest.mark.slow

MODELS = Path(__file__).resolve().parents[2] / "stan_models"
DIAG = {"D": 4, "mu": [1.0, -2.0, 0.5, 3.0], "sigma": [0.5, 2.0, 1.0, 0.1]}


@pytest.fixture(scope="module")
def diag_model():
    return compile_model(MODELS / "gaussian_diag" / "gaussian_diag.stan", progress=False)


def test_fit_runs_the_same_stan_algorithms(diag_model):
    """Same seed and settings: the draws are those of stanvi.reference's own functions."""
    cases = [("nuts", {"num_samples": 200, "num_warmup": 200, "chains": 2}, nuts, {}),
             ("pathfinder", {"num_paths": 1}, pathfinder, {}),
             ("stan-advi", {}, stan_advi, {"algorithm": "fullrank"})]
    for method, settings, function, extra in cases:
        family = extra.get("algorithm", "meanfield")
        ours = stanvi.fit(diag_model, DIAG, method=method, family=family, seed=3,
                          progress=False, **settings)
        theirs = function(diag_model, DIAG, seed=3, **extra, **settings)
        assert isinstance(ours, ReferenceFit)
        np.testing.assert_array_equal(ours.draws["z"], theirs.draws["z"])
    loaded = stanvi.load_model(diag_model, DIAG, progress=False)   # its own data
    again = stanvi.fit(loaded, method="pathfinder", seed=3, num_paths=1, progress=False)
    np.testing.assert_array_equal(again.draws["z"],
                                  pathfinder(diag_model, DIAG, seed=3, num_paths=1).draws["z"])


def test_the_outcome_reads_as_on_stanvi_s_fits(diag_model):
    """``method``, ``status``, ``converged``, ``message``, ``seed`` and ``run_time`` as on a
    ``Fit``: a loop over stanvi's and Stan's methods reads each fit's outcome the same way
    (before, ``fit.status`` on Stan's Pathfinder raised AttributeError)."""
    runs = {method: stanvi.fit(diag_model, DIAG, method=method, seed=5, progress=False,
                               **settings)
            for method, settings in (("pathfinder", {}), ("stan-advi", {}),
                                     ("nuts", {"num_samples": 100, "num_warmup": 100,
                                               "chains": 1}))}
    runs["trustvi"] = stanvi.fit(diag_model, DIAG, method="trustvi", seed=5, progress=False)
    for method, fit in runs.items():
        assert fit.method == method and fit.seed == 5 and fit.run_time > 0
        assert fit.status in ("converged", "max_iters", "sampled") and isinstance(fit.message, str)
        assert fit.converged == (fit.status == "converged")
    assert runs["pathfinder"].status == "converged" and runs["nuts"].status == "sampled"
    advi = runs["stan-advi"]   # Stan says which way its ADVI ended; the status follows it
    assert advi.status == ("converged" if "CONVERGED" in advi.messages[0] else "max_iters")
    assert advi.message and advi.message in advi.messages[0]
    stopped = stan_advi(diag_model, DIAG, seed=5, iter=3, progress=False)
    assert stopped.status == "max_iters" and "maximum number" in stopped.message
    assert "status='max_iters'" in repr(stopped)


def test_stanvi_only_arguments_are_refused_with_the_stan_setting(diag_model):
    with pytest.raises(ValueError, match=r"draws=50 .*nuts does not take it.*num_samples"):
        stanvi.fit(diag_model, DIAG, method="nuts", draws=50, progress=False)
    with pytest.raises(ValueError, match=r"profile='paper'"):
        stanvi.fit(diag_model, DIAG, method="pathfinder", profile="paper", progress=False)
    with pytest.raises(ValueError, match="family='fullrank' has no meaning for Stan's nuts"):
        stanvi.fit(diag_model, DIAG, method="nuts", family="fullrank", progress=False)
    with pytest.raises(ValueError, match="'meanfield' and 'fullrank', not 'mixture'"):
        stanvi.fit(diag_model, DIAG, method="stan-advi", family="mixture", progress=False)


def test_save_writes_csv_netcdf_summary_and_diagnostics(diag_model, tmp_path):
    ref = stanvi.fit(diag_model, DIAG, method="nuts", seed=1, chains=2, num_warmup=150,
                     num_samples=100, progress=False)
    paths = ref.save(tmp_path)
    assert paths["csv"].name == "gaussian_diag-nuts-seed1.csv"
    import pandas as pd  # noqa: PLC0415

    table = pd.read_csv(paths["csv"], comment="#")
    assert list(table["chain__"].unique()) == [1, 2] and len(table) == 200
    np.testing.assert_array_equal(table["z.3"].to_numpy(), ref.draws["z"][:, 2])
    np.testing.assert_array_equal(table["lp__"].to_numpy(), ref.stan_columns["lp__"])
    tree = xr.open_datatree(paths["netcdf"])
    assert tree["posterior"]["z"].shape == (2, 100, 4)
    summary = pd.read_csv(paths["summary"], index_col=0)
    assert "r_hat" in summary.columns and "z[4]" in summary.index
    assert "max_r_hat" in paths["diagnostics"].read_text()
    with pytest.raises(FileExistsError):
        ref.save(tmp_path)
    assert ref.summary(var_names="z").shape[0] == 4


@pytest.mark.parametrize("method, settings", [
    ("nuts", {"chains": 2, "num_warmup": 150, "num_samples": 100}),
    ("stan-advi", {}), ("pathfinder", {"num_paths": 1})])
def test_read_gives_back_a_saved_stan_run(diag_model, tmp_path, method, settings):
    ref = stanvi.fit(diag_model, DIAG, method=method, seed=2, progress=False, **settings)
    ref.save(tmp_path)
    back = stanvi.read(tmp_path)
    assert isinstance(back, ReferenceFit) and back.algorithm == ref.algorithm
    assert back.chains == ref.chains and back.settings == ref.settings
    assert back.gradient_evaluations == ref.gradient_evaluations
    np.testing.assert_array_equal(back.draws["z"], ref.draws["z"])
    for name, column in ref.stan_columns.items():
        np.testing.assert_array_equal(back.stan_columns[name], column)
    assert back.summary().equals(ref.summary())
    if method == "nuts":
        assert back.sampler_diagnostics["divergences"] == list(ref.sampler_diagnostics["divergences"])
    else:   # the importance ratios, so the same k-hat
        assert back.diagnostics().khat == ref.diagnostics().khat
    if method == "stan-advi":
        np.testing.assert_array_equal(back.mean["z"], ref.mean["z"])
        np.testing.assert_array_equal(back.elbo_trace, ref.elbo_trace)


def test_cli_fit_with_stans_pathfinder(diag_model, tmp_path):
    import json  # noqa: PLC0415

    from stanvi.cli import main  # noqa: PLC0415

    data = tmp_path / "d.json"
    data.write_text(json.dumps(DIAG))
    stan = MODELS / "gaussian_diag" / "gaussian_diag.stan"
    args = ["fit", str(stan), "--data", str(data), "--method", "pathfinder", "--quiet",
            "--option", "num_paths=1", "--output", str(tmp_path / "out")]
    assert main(args) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["gaussian_diag-pathfinder-seed0.csv", "gaussian_diag-pathfinder-seed0.nc",
                       "gaussian_diag-pathfinder-seed0_diagnostics.txt",
                       "gaussian_diag-pathfinder-seed0_summary.csv"]
    assert main([*args, "--name", "z", "--profile", "paper"]) == 1
    assert main([*args, "--name", "z", "--zarr"]) == 1
    assert not (tmp_path / "out" / "z.csv").exists()


def test_build_services_ahead(diag_model, capsys):
    """`stanvi build-services` builds (or finds) the services object reference runs link and
    prints its path; a second build finds it built."""
    from stanvi.cli import main  # noqa: PLC0415
    from stanvi.stan.services_build import build_services_ahead  # noqa: PLC0415

    assert main(["build-services", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Stan's services" in out and ".o" in out
    path, built = build_services_ahead(progress=False)
    assert path.is_file() and not built and str(path) in out


def test_stans_variational_fits_are_judged_by_the_rule_of_stanvis_fits(diag_model):
    """issue T3-5 item 1: printed side by side, Stan's ADVI and Pathfinder and a stanvi fit are
    on one scale. Before, ``fit.diagnostics()`` of ``stanvi.fit(..., method="stan-advi")`` was
    k-hat on Stan's own 1,000 draws against the threshold for 1,000 (0.67); now it is the
    verdict on fresh draws of the recovered Gaussian, the draws common to every fit, as in
    stanvi.compare and the batch (docs/diagnostics.md#stan)."""
    from stanvi.diagnostics.draws import DIAG_MIN_DRAWS
    from stanvi.reference.diagnostics import stan_diagnostics
    from stanvi.targets.labelled import labelled_draws, reference_unconstrained

    target = stanvi.load_model(diag_model, DIAG, progress=False)
    for method, settings in (("stan-advi", {"family": "fullrank"}),
                             ("pathfinder", {"num_paths": 1})):
        fit = stanvi.fit(diag_model, DIAG, method=method, seed=4, progress=False, **settings)
        d = fit.diagnostics()
        assert d.n_draws >= DIAG_MIN_DRAWS and d.threshold == pytest.approx(0.7)
        assert not any("Stan's own" in w for w in d.warnings)
        unconstrained, _ = reference_unconstrained(target, labelled_draws(fit.draws))
        same = stan_diagnostics(fit, target, unconstrained)   # the batch's call
        assert d.khat == same.khat and d.verdict == same.verdict
        again = fit.diagnostics(seed=9)                        # another sample: another k-hat
        assert again.khat != d.khat and fit.diagnostics() is d     # the first one is kept


def test_past_what_1000_draws_identify_stan_is_asked_for_more_and_the_default_run_shown(diag_model):
    d = 50
    rng = np.random.default_rng(0)
    data = {"D": d, "mu": rng.normal(size=d).tolist(), "sigma": rng.uniform(0.5, 2, d).tolist()}
    fit = stanvi.fit(diag_model, data, method="stan-advi", family="fullrank", seed=1,
                     progress=False)
    default = stan_advi(diag_model, data, algorithm="fullrank", seed=1)
    np.testing.assert_array_equal(fit.draws["z"], default.draws["z"])
    assert fit.num_draws == 1000 and fit.settings["output_samples"] == 1000
    assert fit.density_evaluations == default.density_evaluations
    assert fit.recovery_run.num_draws == 1912                 # 1,275 unknowns x 1.5
    verdict = fit.diagnostics()                               # q recovered: fresh draws
    assert not any("could not be recovered" in w for w in verdict.warnings)
    assert verdict.n_draws >= 4000
    # a setting the user gave stands (and the verdict says it fell back to Stan's draws)
    given = stanvi.fit(diag_model, data, method="stan-advi", family="fullrank", seed=1,
                       output_samples=300, progress=False)
    assert given.num_draws == 300 and given.recovery_run is None
    assert any("could not be recovered" in w for w in given.diagnostics().warnings)
