"""Progress and logging everywhere (issue 13 item 2): compiles, fits (TrustVI's refinement
included) and batches show progress when stderr is not a terminal (notebooks, CI, pipes);
messages go through the ``stanvi`` logger hierarchy, so ``setLevel(logging.WARNING)`` silences
them and ``progress=False`` turns the displays off; a CLI fit that did not converge says so once.

Only models the other tests compile are used (bernoulli), and a program stanc rejects (which
costs a stanc run, no C++ build)."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import stanvi
from conftest import data_file, stan_file
from gaussian_targets import GaussianProblem
from stanvi.errors import StanCompileError
from stanvi.stan.compiler import compile_model

BAD_PROGRAM = "parameters { real mu } model { mu ~ normal(0, 1); }"   # a ';' is missing


@pytest.fixture
def quiet_stanvi():
    """``logging.getLogger("stanvi").setLevel(logging.WARNING)`` for one test."""
    logger = logging.getLogger("stanvi")
    level = logger.level
    logger.setLevel(logging.WARNING)
    yield
    logger.setLevel(level)


def messages(caplog, name: str, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name and r.levelno == level]


# ------------------------------------------------------------------------------------ compiles

def test_a_cached_compile_is_logged_at_debug_only(stanvi_log, capfd):
    """Every fit of a .stan file goes through the compile cache: a hit is a DEBUG message on
    ``stanvi.stan`` (a user's INFO output stays the verdict alone), and draws nothing."""
    compile_model(stan_file("bernoulli"), progress=False)       # compiled, or by other tests
    capfd.readouterr()
    stanvi_log.clear()
    found = compile_model(stan_file("bernoulli"), progress=True)
    assert found.cached
    assert messages(stanvi_log, "stanvi.stan", logging.DEBUG) == [
        f"bernoulli.stan: using the cached library {found.library}"]
    assert not [r for r in stanvi_log.records if r.levelno >= logging.INFO]
    assert capfd.readouterr().err == f"stanvi: {stanvi_log.records[0].getMessage()}\n"  # no bar
    logging.getLogger("stanvi").setLevel(logging.INFO)          # the default level: silent
    assert compile_model(stan_file("bernoulli"), progress=True).cached
    assert capfd.readouterr().err == ""


def test_compile_progress_and_messages_when_stderr_is_not_a_terminal(tmp_path, capfd):
    """Off a terminal, a compile shows its stages as plain lines (no carriage returns) and
    announces and times itself on the ``stanvi.stan`` logger (``stanvi: ...``)."""
    bad = tmp_path / "broken_model.stan"
    bad.write_text(BAD_PROGRAM)
    with pytest.raises(StanCompileError):
        compile_model(bad)
    out, err = capfd.readouterr()
    assert out == "" and "\r" not in err
    lines = err.splitlines()
    assert lines[0] == ("stanvi: compiling broken_model.stan (10-60 s; later runs use the cached "
                        "library)")
    assert lines[1].startswith("compiling broken_model.stan: stanc [00:0")
    assert lines[-1].startswith("stanvi: compiling broken_model.stan: failed after ")


def test_the_logger_silences_compile_messages_and_progress_false_the_display(tmp_path, capfd,
                                                                             quiet_stanvi):
    bad = tmp_path / "broken_model.stan"
    bad.write_text(BAD_PROGRAM)
    with pytest.raises(StanCompileError):
        compile_model(bad)
    err = capfd.readouterr().err
    assert "stanvi:" not in err                                  # messages silenced ...
    assert err.startswith("compiling broken_model.stan: stanc")  # ... the display stays
    with pytest.raises(StanCompileError):
        compile_model(bad, progress=False)
    assert capfd.readouterr().err == ""


# ---------------------------------------------------------------------------------------- fits

@pytest.mark.parametrize("profile, phase", [("stochastic", "refine"), ("default", "certify")])
def test_trustvi_progress_display_follows_every_phase(capfd, profile, phase):
    """The stochastic profile's certifying refinement runs after its stop, the default profile
    ends with the fresh-sample certification; the progress display follows either
    (``phase=refine``, ``phase=certify``) up to the fit's last iteration."""
    lp = GaussianProblem(np.array([1.0, -1.0]), np.diag([1.0, 4.0]), "2d").log_density
    fit = stanvi.fit(lp, dim=2, progress=True, draws=5, seed=0, profile=profile,
                     second_start_iters=0)
    phases = [row.get("phase") for row in fit.trace.rows]
    assert phase in phases and phases[-1] == phase
    err = capfd.readouterr().err
    bar = [line for line in err.splitlines() if line.startswith("trustvi: ")]
    last_iteration = fit.trace.rows[-1]["iteration"]
    assert bar[-1].startswith(f"trustvi: {last_iteration} it [") and f"phase={phase}" in bar[-1]
    assert "oracle=" in bar[-1] and "elbo=" in bar[-1]


def test_a_fit_shows_its_diagnostic_draws_when_they_last(capfd, monkeypatch):
    """``stanvi.fit`` computes the verdict after the fit; draws that last longer than
    ``PROGRESS_DELAY`` show what is drawn (here the delay is 0: every fit shows it); with
    ``progress=False`` nothing is drawn, and the quick default draws nothing either."""
    from stanvi.diagnostics import report

    lp = GaussianProblem(np.array([1.0, -1.0]), np.diag([1.0, 4.0]), "2d").log_density
    monkeypatch.setattr(report, "PROGRESS_DELAY", 0.0)
    stanvi.fit(lp, dim=2, progress=True, draws=5, seed=0, second_start_iters=0)
    err = capfd.readouterr().err
    assert "diagnostics of the trustvi fit: k-hat on 32,000 draws from q [00:00]" in err, err
    assert "diagnostics of the trustvi fit: done in" not in err     # the verdict line says it
    stanvi.fit(lp, dim=2, progress=False, draws=5, seed=0, second_start_iters=0).diagnostics()
    assert "diagnostics of" not in capfd.readouterr().err
    monkeypatch.setattr(report, "PROGRESS_DELAY", 2.0)
    stanvi.fit(lp, dim=2, progress=True, draws=5, seed=0, second_start_iters=0)
    assert "diagnostics of" not in capfd.readouterr().err


# ------------------------------------------------------------------------------------- batches

@pytest.mark.slow
def test_batch_progress_is_visible_when_stderr_is_not_a_terminal(tmp_path, capfd):
    """A batch piped to a log shows its tqdm status (done/total, failed, running) as plain lines,
    at the start and at the end (and every 30 s between), on a bernoulli fit."""
    from distributed import Client  # noqa: PLC0415

    from stanvi.batch.discover import ModelCase  # noqa: PLC0415
    from stanvi.batch.runner import BatchConfig, run_batch  # noqa: PLC0415

    compile_model(stan_file("bernoulli"), progress=False)
    case = ModelCase("bernoulli", stan_file("bernoulli"), data_file("bernoulli"), "json")
    config = BatchConfig(methods=(("advi", None),), seeds=1, draws=100)
    with Client(processes=False, n_workers=1, threads_per_worker=1,
                dashboard_address=":0") as client:
        counts = run_batch([case], tmp_path / "runs", config, client=client, progress=True)
    assert sum(counts.values()) == 1
    failed = sum(v for k, v in counts.items() if k not in ("converged", "max_iters", "budget"))
    err = capfd.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("batch: ")]
    assert lines[0].startswith("batch:   0%|          | 0/1 [00:00<?")
    assert lines[-1].startswith("batch: 100%|##########| 1/1 [")
    assert lines[-1].endswith(f"failed={failed}, running=0]")


# ----------------------------------------------------------------------------------------- CLI

def test_a_cli_fit_that_did_not_converge_warns_once(tmp_path, capsys):
    """The diagnostics block says a fit stopped at its iteration limit; the NotConvergedWarning
    saying it again is not printed a second time (MLMCVI at T = 5)."""
    from stanvi.cli import main  # noqa: PLC0415

    compile_model(stan_file("bernoulli"), progress=False)
    rc = main(["fit", str(stan_file("bernoulli")), "--data", str(data_file("bernoulli")),
               "--method", "mlmcvi", "--option", "max_iters=5",
               "--draws", "200", "--quiet", "--output", str(tmp_path)])
    assert rc == 0
    out = capsys.readouterr().out
    stopped = [line for line in out.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and stopped[0].split()[1].startswith("max_iters")
    said = [line for line in out.splitlines()
            if "not because it converged" in line or "before converging" in line]
    assert said == ["warning: the method stopped at its iteration limit, not because it "
                    "converged: the approximation may be far from the optimum"]


def test_waiting_for_another_compile_of_the_same_model_is_said(tmp_path, stanvi_log):
    """A compile that finds another process building the same model waits on its lock; the
    wait is announced (INFO), not silent."""
    import threading  # noqa: PLC0415

    from stanvi.stan import compiler  # noqa: PLC0415

    held = threading.Event()

    def hold():                                         # another holder of the entry's lock
        with compiler.lock_for(tmp_path, "m-key"):
            held.set()
            time.sleep(0.5)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    with compiler._locked(tmp_path, "m-key", "m.stan", progress=True):
        pass
    holder.join()
    assert messages(stanvi_log, "stanvi.stan", logging.INFO) == [
        "m.stan: waiting for another process that is compiling it"]
    stanvi_log.clear()
    with compiler._locked(tmp_path, "m-key", "m.stan", progress=True):   # free: nothing said
        pass
    assert stanvi_log.records == []
