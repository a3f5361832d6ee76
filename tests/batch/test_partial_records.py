"""A fit task's record in stages (docs/batch.md#partial-records): the child process prints the
record after each stage, and the worker keeps the last one where a timeout or a crash stops the
process before its result; the record's ELBO and the protocol's final ELBO come from one
evaluation on the common draws."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from stanvi.batch.child import PARTIAL_PREFIX, RESULT_PREFIX, fit_job
from stanvi.batch.tasks import job_result
from stanvi.evaluation.protocol import final_elbos

from conftest import data_file, stan_file


def _line(prefix: str, record: dict) -> str:
    return prefix + json.dumps(record) + "\n"


FIT = {"status": "converged", "message": "", "run_time": 1.5, "evaluated": ["fit"]}
ELBO = {**FIT, "elbo": -3.0, "final_elbo": -3.0, "evaluated": ["fit", "elbo"]}


def test_a_finished_result_is_the_record():
    out = _line(PARTIAL_PREFIX, FIT) + "noise\n" + _line(RESULT_PREFIX, {"status": "converged",
                                                                         "khat": 0.3})
    assert job_result("fit", out, "", 0) == {"status": "converged", "khat": 0.3}


def test_a_timeout_after_the_fit_keeps_its_last_stage():
    out = _line(PARTIAL_PREFIX, FIT) + _line(PARTIAL_PREFIX, ELBO)
    rec = job_result("fit", out, "", -9, "stopped after 300 s (the task's timeout)")
    assert rec["status"] == "converged" and rec["final_elbo"] == -3.0
    assert rec["evaluated"] == ["fit", "elbo"]
    assert "300 s" in rec["incomplete"] and "fit, elbo" in rec["incomplete"]


def test_a_timeout_keeps_nothing_of_a_result_line_printed_as_it_was_killed():
    # a result line with a timeout: the process was stopped, the record says so
    out = _line(PARTIAL_PREFIX, FIT) + _line(RESULT_PREFIX, {"status": "converged"})
    rec = job_result("fit", out, "", -9, "stopped after 8 s (the task's timeout)")
    assert rec["evaluated"] == ["fit"] and "8 s" in rec["incomplete"]


def test_a_timeout_before_the_fit_finished_is_a_timeout():
    rec = job_result("fit", "", "", -9, "stopped after 8 s (the task's timeout)")
    assert rec == {"status": "timeout",
                   "message": "stopped after 8 s (the task's timeout); its process was killed"}


def test_a_crash_after_the_fit_keeps_its_stage_and_names_the_signal():
    rec = job_result("fit", _line(PARTIAL_PREFIX, ELBO), "Killed\n", -9)
    assert rec["status"] == "converged" and "killed by signal 9" in rec["incomplete"]
    assert "Killed" in rec["incomplete"]


def test_a_crash_before_the_fit_or_a_failing_exit_is_crashed():
    rec = job_result("fit", "", "boom in C++\n", -11)
    assert rec["status"] == "crashed" and "signal 11" in rec["message"]
    assert "boom in C++" in rec["message"]
    rec = job_result("compile", _line(RESULT_PREFIX, {"status": "ok"}), "", 3)
    assert rec["status"] == "crashed" and "exit status 3" in rec["message"]


class _Values:
    """An estimator whose per-draw ELBO terms are given: ``values(params, eps)`` returns the
    rows of ``terms`` that ``eps`` indexes (eps holds row numbers)."""

    def __init__(self, terms):
        self.terms = np.asarray(terms, dtype=float)
        self.calls = 0

    def values(self, params, eps):
        self.calls += 1
        return self.terms[np.asarray(eps, dtype=int)]


class _Fit:
    def __init__(self, terms, status="converged"):
        self._estimator = _Values(terms)
        self.params = np.zeros(1)
        self.status = status


def test_final_elbos_give_both_estimates_from_one_evaluation():
    rng = np.random.default_rng(3)
    terms = rng.normal(-2.0, 0.5, 1000)
    fit = _Fit(terms)
    plain, se, final = final_elbos(fit, np.arange(1000))
    assert plain == pytest.approx(terms.mean(), rel=1e-12) and final == plain
    assert se == pytest.approx(terms.std(ddof=1) / math.sqrt(1000), rel=1e-12)
    assert fit._estimator.calls == 2            # the screen (200 draws), then the rest
    # a failing draw: the plain mean is -inf (honestly), the protocol's drops it
    terms[17] = -np.inf
    plain, se, final = final_elbos(_Fit(terms), np.arange(1000))
    assert plain == -np.inf and math.isnan(se)
    assert final == pytest.approx(np.delete(terms, 17).mean(), rel=1e-12)
    # a failed run: its protocol ELBO is -inf whatever the draws give
    assert final_elbos(_Fit(terms, "failed"), np.arange(1000))[2] == -np.inf
    # most of the screen failing: -inf, and the rest is never evaluated
    terms[:150] = -np.inf
    fit = _Fit(terms)
    assert final_elbos(fit, np.arange(1000))[::2] == (-np.inf, -np.inf)
    assert fit._estimator.calls == 1


def _job(compiled, key: str, method: str = "trustvi") -> dict:
    return {"model": key, "stan": str(stan_file(key)), "data": str(data_file(key)),
            "data_format": "json", "source": "example-models", "kind": "fit",
            "library": str(compiled(key).library), "method": method, "family": "meanfield",
            "profile": None, "seed": 0, "options": {}, "draws": 500, "reference_npz": None,
            "trace_points": 5}


def test_a_fit_job_reports_its_stages_in_order(compiled):
    seen = []
    record = fit_job(_job(compiled, "gaussian"),
                     lambda rec, done: seen.append((json.loads(json.dumps(
                         rec, default=float)), list(done))))
    assert [done for _, done in seen] == [["fit"], ["fit", "elbo"], ["fit", "elbo", "verdict"]]
    assert "elbo" not in seen[0][0] and "khat" not in seen[1][0]
    assert "trace_points" not in seen[2][0] and "trace_points" in record
    assert seen[2][0]["khat"] == pytest.approx(record["khat"])
    # what the task's time went to, stage by stage
    assert list(record["stage_seconds"]) == ["fit", "elbo", "verdict", "trace"]
    assert all(t >= 0 for t in record["stage_seconds"].values())
    assert list(seen[1][0]["stage_seconds"]) == ["fit", "elbo"]
    # no draw fails on a Gaussian target: the record's ELBO and the protocol's are one number
    assert record["elbo"] == record["final_elbo"] and np.isfinite(record["elbo"])
    assert 0 < record["elbo_se"] < 0.1


@pytest.mark.slow
def test_the_child_process_prints_a_partial_record_per_stage(compiled):
    """The child's own output, read as the worker reads it after a timeout: the last partial
    record is the fit's, with its stages."""
    job = _job(compiled, "gaussian")
    out = subprocess.run([sys.executable, "-m", "stanvi.batch.child"], input=json.dumps(job),
                         capture_output=True, text=True, timeout=600, check=True).stdout
    kinds = [ln.split(" ", 1)[0] for ln in out.splitlines()
             if ln.startswith((PARTIAL_PREFIX, RESULT_PREFIX))]
    assert kinds == [PARTIAL_PREFIX.strip()] * 3 + [RESULT_PREFIX.strip()]
    rec = job_result("fit", out, "", -9, "stopped after 60 s (the task's timeout)")
    assert rec["status"] == "converged" and rec["evaluated"] == ["fit", "elbo", "verdict"]
    assert rec["khat"] is not None and "trace_points" not in rec
