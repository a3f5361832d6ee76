"""The ``stanvi`` command (issue P1-3): ``stanvi fit`` end to end in a subprocess, ``stanvi info``,
help text for every option, and each bad-input case giving a non-zero exit status and one
readable error line (plus stanc's own message for a compile error)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import stanio

from stanvi.output.arviz_io import load_datatree
from stanvi.cli import build_parser

from conftest import data_dict, data_file, stan_file

pytestmark = pytest.mark.usefixtures("compile_in_background")

STANVI = Path(sys.executable).parent / "stanvi"


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("STANVI_DEBUG", None)
    return subprocess.run([str(STANVI), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, f"no error message; stdout: {proc.stdout}"
    return lines[0]


@pytest.fixture(scope="module")
def bernoulli_compiled(compiled):
    return compiled("bernoulli")  # the subprocess then finds it in the compile cache


def test_entry_point_installed():
    assert STANVI.exists(), "the stanvi console script is not installed in the venv"


def test_fit_end_to_end(bernoulli_compiled, tmp_path):
    proc = run_cli("fit", stan_file("bernoulli"), "--data", data_file("bernoulli"),
                   "--method", "advi", "--seed", "3", "--draws", "500", "--output", tmp_path,
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "theta" in out and "mean" in out  # the summary table
    assert "Pareto k-hat" in out and "verdict" in out  # the diagnostics
    csv = tmp_path / "bernoulli-advi-meanfield-seed3.csv"
    nc = tmp_path / "bernoulli-advi-meanfield-seed3.nc"
    assert csv.exists() and nc.exists()
    header, data = stanio.read_csv(str(csv))
    assert header.split(",") == ["lp__", "log_p__", "log_g__", "theta"]
    assert data.shape == (1, 501, 4)
    theta = data[0, 1:, 3]
    assert np.all((theta > 0) & (theta < 1))
    tree = load_datatree(nc)
    assert tree.attrs["method"] == "advi" and tree.attrs["seed"] == 3
    np.testing.assert_array_equal(tree["posterior"]["theta"].values[0], theta)
    y = np.asarray(data_dict("bernoulli")["y"])
    np.testing.assert_array_equal(tree["observed_data"]["y"].values, y)
    # the posterior is Beta(1 + Σy, 1 + N − Σy): the VI mean is close to it
    exact = (1 + y.sum()) / (2 + y.size)
    assert abs(theta.mean() - exact) < 0.05


def test_info_prints_parameters_and_dims(compiled):
    compiled("eight_schools")
    proc = run_cli("info", stan_file("eight_schools"), "--data", data_file("eight_schools"),
                   "--quiet")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines() if line.strip()}
    assert "unconstrained dimension: 10" in proc.stdout
    assert "parameter" in rows["theta_tilde"] and "(8,)" in rows["theta_tilde"]
    assert "(J)" in rows["theta_tilde"]
    assert "transformed_parameter" in rows["theta"]


def test_every_option_has_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"compile", "info", "fit", "bench"} <= set(sub.choices)
    for name, p in sub.choices.items():
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"stanvi {name}: {action.dest} has no help text"


# ------------------------------------------------------------------ bad input
def test_syntax_error(tmp_path):
    bad = tmp_path / "bad.stan"
    bad.write_text("parameters { real x }\nmodel { x ~ normal(0, 1); }\n")
    proc = run_cli("fit", bad, "--quiet")
    assert proc.returncode != 0
    first = error_line(proc)
    assert first.startswith("stanvi: error: StanCompileError") and "bad.stan" in first
    assert "line 1" in first
    assert "Expected \";\"" in proc.stderr  # stanc's own message follows
    assert "Traceback" not in proc.stderr


def test_missing_data_file(bernoulli_compiled, tmp_path):
    proc = run_cli("fit", stan_file("bernoulli"), "--data", tmp_path / "nope.json", "--quiet")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0  # exactly one line
    assert "data file not found" in error_line(proc) and "nope.json" in error_line(proc)


def test_missing_data_variable(bernoulli_compiled, tmp_path):
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"N": 3}))
    proc = run_cli("fit", stan_file("bernoulli"), "--data", partial, "--quiet")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    first = error_line(proc)
    assert first.startswith("stanvi: error: StanDataError") and "'y'" in first


def test_unknown_method(bernoulli_compiled):
    proc = run_cli("fit", stan_file("bernoulli"), "--data", data_file("bernoulli"),
                   "--method", "bfgs", "--quiet")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    first = error_line(proc)
    assert "--method" in first and "'bfgs'" in first and "trustvi" in first and "nuts" in first


def test_missing_model_file(tmp_path):
    proc = run_cli("fit", tmp_path / "nope.stan", "--quiet")
    assert proc.returncode != 0
    assert proc.stderr.strip().count("\n") == 0
    assert "not found" in error_line(proc)


def test_bad_options_messages(bernoulli_compiled, capsys):
    from stanvi.cli import main  # noqa: PLC0415

    base = ["fit", str(stan_file("bernoulli")), "--data", str(data_file("bernoulli")), "--quiet"]
    rc = main([*base, "--profile", "nope"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0 and "unknown profile 'nope'" in err
    rc = main([*base, "--option", "bogus=1"])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0 and "unknown option(s) ['bogus']" in err
    with pytest.raises(SystemExit) as exc:
        main(["fit", str(stan_file("bernoulli")), "--draws", "0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--draws" in err and "at least 1" in err


# ------------------------------------------------------------------ issue 13 item 9
def test_fit_prints_the_verdict_once_and_refuses_to_overwrite_before_fitting(
        bernoulli_compiled, tmp_path):
    args = ("fit", stan_file("bernoulli"), "--data", data_file("bernoulli"), "--seed", "1",
            "--output", tmp_path)
    proc = run_cli(*args)                       # not --quiet: progress and messages allowed
    assert proc.returncode == 0, proc.stderr
    both = proc.stdout + proc.stderr
    assert both.count("Pareto k-hat") == 1 and both.count("verdict:") == 1
    assert (tmp_path / "bernoulli-trustvi-meanfield-seed1.nc").exists()
    again = run_cli(*args, "--quiet")
    assert again.returncode == 1 and again.stdout == ""      # refused before any fit output
    assert "bernoulli-trustvi-meanfield-seed1.csv exists" in error_line(again)
    assert "--overwrite" in error_line(again)
    assert run_cli(*args, "--quiet", "--overwrite").returncode == 0


def test_init_from_a_json_file(bernoulli_compiled, tmp_path, capsys):
    """--init FILE.json takes constrained values by name, as CmdStan's init file does."""
    from stanvi.cli import main  # noqa: PLC0415

    init = tmp_path / "init.json"
    init.write_text(json.dumps({"theta": 0.9}))
    base = ["fit", str(stan_file("bernoulli")), "--data", str(data_file("bernoulli")), "--quiet",
            "--method", "advi", "--option", "max_iterations=200", "--output", str(tmp_path)]
    assert main([*base, "--init", str(init)]) == 0
    tree = load_datatree(tmp_path / "bernoulli-advi-meanfield-seed0.nc")
    import stanvi  # noqa: PLC0415

    fit = stanvi.fit(str(stan_file("bernoulli")), str(data_file("bernoulli")), method="advi",
                     init={"theta": 0.9}, progress=False, max_iterations=200)
    np.testing.assert_allclose(fit.trace.params_at(0)[0], np.log(0.9 / 0.1), rtol=1e-12)
    np.testing.assert_array_equal(tree["posterior"]["theta"].values[0], fit.draws["theta"])
    capsys.readouterr()
    missing = tmp_path / "nope.json"
    assert main([*base, "--init", str(missing), "--name", "x"]) == 1
    assert "--init" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main([*base, "--init", str(bad), "--name", "y"]) == 1
    assert "JSON object" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 15: --family mixture
def test_fit_with_the_mixture_family_and_its_options(tmp_path, capsys):
    """--family mixture with --family-options (JSON): the saved fit has the options and reads
    back with its family; bad JSON, a non-object and unknown settings are one-line errors."""
    import stanvi  # noqa: PLC0415
    from stanvi.cli import main  # noqa: PLC0415

    model = Path(__file__).resolve().parents[1] / "stan_models" / "bimodal"
    base = ["fit", str(model / "bimodal.stan"), "--data", str(model / "bimodal.data.json"),
            "--quiet", "--method", "advi", "--family", "mixture", "--option",
            "max_iterations=100", "--option", "grad_samples=2", "--output", str(tmp_path)]
    assert main([*base, "--family-options", '{"n_components": 3, "init_spread": 1.5}']) == 0
    out = capsys.readouterr().out
    assert "advi (mixture, profile stan)" in out
    back = stanvi.read(tmp_path / "bimodal-advi-mixture-seed0.nc")
    assert back.family.n_components == 3 and back.family.init_spread == 1.5
    for bad, why in (('{"n_components": 3', "not valid JSON"),
                     ("[3]", "must be a JSON object"),
                     ('{"components": 3}', "unknown setting(s) ['components']"),
                     ('{"n_components": 0}', "n_components must be a positive integer")):
        assert main([*base, "--family-options", bad, "--name", "bad"]) == 1
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and why in err, err
    assert main(["fit", str(model / "bimodal.stan"), "--data", str(model / "bimodal.data.json"),
                 "--quiet", "--family-options", '{"n_components": 3}', "--name", "mf",
                 "--output", str(tmp_path)]) == 1
    assert "it takes none" in capsys.readouterr().err


def test_cmdstan_compatible_csv_is_read_by_cmdstanpy(bernoulli_compiled, tmp_path):
    """A TrustVI fit's CSV states only true settings; --cmdstan-compatible adds the ones
    cmdstanpy.from_csv requires, and cmdstanpy then reads the draws."""
    import cmdstanpy  # noqa: PLC0415
    from stanvi.cli import main  # noqa: PLC0415

    base = ["fit", str(stan_file("bernoulli")), "--data", str(data_file("bernoulli")), "--quiet",
            "--output", str(tmp_path), "--draws", "50"]
    assert main([*base, "--name", "plain"]) == 0
    assert main([*base, "--name", "compat", "--cmdstan-compatible"]) == 0
    assert "grad_samples" not in (tmp_path / "plain.csv").read_text()
    vb = cmdstanpy.from_csv(str(tmp_path / "compat.csv"))
    assert vb.stan_variable("theta", mean=False).shape == (50,)


def test_no_data_at_all_says_data_are_missing(bernoulli_compiled):
    proc = run_cli("fit", stan_file("bernoulli"), "--quiet")
    assert proc.returncode != 0 and proc.stderr.strip().count("\n") == 0
    first = error_line(proc)
    assert "needs data" in first and "none were given" in first and "--data" in first
    assert "rejected" not in first


def test_var_names_restricts_the_printed_summary(compiled, tmp_path, capsys):
    from stanvi.cli import main  # noqa: PLC0415

    compiled("eight_schools")
    base = ["fit", str(stan_file("eight_schools")), "--data", str(data_file("eight_schools")),
            "--quiet", "--output", str(tmp_path)]
    assert main([*base, "--var-names", "tau,mu"]) == 0
    out = capsys.readouterr().out
    rows = [line.split()[0] for line in out.splitlines()[2:4]]
    assert rows == ["tau", "mu"] and "theta[1]" not in out
    assert main([*base, "--name", "all"]) == 0
    assert "theta[1]" in capsys.readouterr().out
