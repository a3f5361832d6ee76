"""Where a fit was when its task's timeout stopped it (docs/batch.md#progress-at-stop): the child
prints the fit's latest iteration as it runs, and the worker's record of a stopped fit keeps the
last one and says it in the message."""

from __future__ import annotations

import io
import json
import time

import pytest

from stanvi.batch.child import PARTIAL_PREFIX, PROGRESS_PREFIX, FitProgressReporter
from stanvi.batch.tasks import job_result, run_job
from stanvi.progress import IterationProgress, observe_iterations

from conftest import data_file, stan_file

STOPPED = "stopped after 300 s (the task's timeout)"


def _line(prefix: str, record: dict) -> str:
    return prefix + json.dumps(record) + "\n"


def test_a_timeout_keeps_the_last_iteration_and_says_it():
    out = (_line(PROGRESS_PREFIX, {"seconds": 1.25})
           + _line(PROGRESS_PREFIX, {"method": "trustvi", "iteration": 3, "seconds": 10.0,
                                     "elbo": -50.0, "oracle": 400, "phase": "fixed"})
           + _line(PROGRESS_PREFIX, {"method": "trustvi", "iteration": 41, "seconds": 290.25,
                                     "elbo": -12.5, "oracle": 5120.0, "phase": "certify"}))
    rec = job_result("fit", out, "", -9, STOPPED)
    assert rec["status"] == "timeout"
    assert rec["progress_at_stop"]["iteration"] == 41
    assert rec["message"] == (
        "stopped after 300 s (the task's timeout); its process was killed; the last iteration "
        "of the fit to end was iteration 41, 290.2 s into the task (ELBO -12.5, 5120 scaled "
        "oracle calls), in its certify phase")


def test_a_fit_stopped_before_its_first_iteration_says_so():
    rec = job_result("fit", _line(PROGRESS_PREFIX, {"seconds": 1.25}), "", -9, STOPPED)
    assert rec["progress_at_stop"] == {"seconds": 1.25}
    assert rec["message"].endswith(
        "; the fit had started 1.2 s into the task and no iteration of it had ended")


def test_a_cut_progress_line_is_passed_over_and_a_crash_keeps_the_progress_too():
    out = (_line(PROGRESS_PREFIX, {"method": "advi", "iteration": 7, "seconds": 2.0})
           + PROGRESS_PREFIX + '{"method": "advi", "itera\n')
    rec = job_result("fit", out, "Killed\n", -9)
    assert rec["status"] == "crashed" and "killed by signal 9" in rec["message"]
    assert rec["progress_at_stop"]["iteration"] == 7
    assert "iteration 7, 2.0 s into the task" in rec["message"]


def test_a_finished_fit_or_a_partial_record_has_no_progress_at_stop():
    progress = _line(PROGRESS_PREFIX, {"method": "trustvi", "iteration": 9, "seconds": 3.0})
    partial = _line(PARTIAL_PREFIX, {"status": "converged", "evaluated": ["fit"]})
    rec = job_result("fit", progress + partial, "", -9, STOPPED)
    assert rec["status"] == "converged" and "progress_at_stop" not in rec
    rec = job_result("fit", "", "", -9, STOPPED)     # Stan's methods print no progress
    assert rec == {"status": "timeout", "message": f"{STOPPED}; its process was killed"}


def test_observers_see_every_iteration_shown_or_not_and_only_within_the_block():
    seen = []
    bar = IterationProgress("advi", enabled=False)
    with observe_iterations(lambda *args: seen.append(args)):
        bar.update(1, elbo=-3.0, oracle=10)
        bar.update(2, elbo=-2.0, oracle=20, phase="sgd")
    bar.update(3, elbo=-1.0)
    assert seen == [("advi", 1, {"elbo": -3.0, "oracle": 10}),
                    ("advi", 2, {"elbo": -2.0, "oracle": 20, "phase": "sgd"})]


def _lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(ln[len(PROGRESS_PREFIX):]) for ln in stream.getvalue().splitlines()]


def test_the_reporter_prints_the_start_then_the_latest_iteration_throttled():
    stream = io.StringIO()
    start = time.perf_counter()
    with FitProgressReporter(start, every=3600.0, stream=stream) as reporter:
        for k in range(1, 50):
            reporter("trustvi", k, {"elbo": -1.0 / k, "oracle": 10 * k, "hessian": object()})
        assert len(_lines(stream)) == 1              # the start; the thread has not woken
    lines = _lines(stream)
    assert [ln.get("iteration") for ln in lines] == [None, 49]   # the last one, on exit
    assert lines[0]["seconds"] >= 0 and "hessian" not in lines[1]
    assert lines[1]["oracle"] == 490 and lines[1]["method"] == "trustvi"
    assert lines[1]["fit_ended"] is True                 # the block ended: so did the fit


def test_a_fit_that_raised_is_not_marked_ended():
    stream = io.StringIO()
    with pytest.raises(RuntimeError):
        with FitProgressReporter(time.perf_counter(), every=3600.0, stream=stream) as reporter:
            reporter("advi", 3, {"elbo": -1.0})
            raise RuntimeError("the model threw")
    lines = _lines(stream)
    assert lines[-1]["iteration"] == 3 and "fit_ended" not in lines[-1]


def test_a_timeout_after_the_fit_ended_says_the_fit_had_ended():
    out = (_line(PROGRESS_PREFIX, {"seconds": 0.5})
           + _line(PROGRESS_PREFIX, {"method": "trustvi", "iteration": 12, "seconds": 3.0,
                                     "fit_ended": True}))
    rec = job_result("fit", out, "", -9, STOPPED)
    assert rec["status"] == "timeout" and rec["progress_at_stop"]["fit_ended"] is True
    assert rec["message"].endswith("; its fit had ended 3.0 s into the task, after iteration "
                                   "12, and the accuracy figures after it had not")


def test_the_reporters_thread_prints_the_iteration_before_a_stall():
    stream = io.StringIO()
    with FitProgressReporter(time.perf_counter(), every=0.05, stream=stream) as reporter:
        reporter("advi", 1, {"elbo": -2.0})
        reporter("advi", 2, {"elbo": -1.5})
        deadline = time.perf_counter() + 10.0
        while len(_lines(stream)) < 2 and time.perf_counter() < deadline:
            time.sleep(0.01)
        printed = _lines(stream)                     # before the block ends: the thread's
    assert [ln.get("iteration") for ln in printed] == [None, 2]
    assert "fit_ended" not in printed[1]
    assert _lines(stream)[2] == {**printed[1], "fit_ended": True,
                                 "seconds": _lines(stream)[2]["seconds"]}   # on exit


@pytest.mark.slow
def test_a_real_fit_stopped_by_its_timeout_says_how_far_it_got(compiled):
    """ADVI asked for a million iterations with no stopping rule, on the Gaussian model, in a
    child process stopped after 25 s: the record is a timeout with the fit's last iteration."""
    job = {"model": "gaussian", "stan": str(stan_file("gaussian")),
           "data": str(data_file("gaussian")), "data_format": "json",
           "source": "example-models", "kind": "fit",
           "library": str(compiled("gaussian").library), "method": "advi",
           "family": "meanfield", "profile": None, "seed": 0,
           "options": {"max_iterations": 1_000_000, "tol_rel_obj": 1e-12}, "draws": 100,
           "reference_npz": None}
    rec = run_job(job, timeout=25.0)
    assert rec["status"] == "timeout", rec
    progress = rec["progress_at_stop"]
    assert progress["method"] == "advi" and progress["iteration"] > 10
    assert 0 < progress["seconds"] <= 25.0
    assert f"iteration {progress['iteration']}," in rec["message"]
