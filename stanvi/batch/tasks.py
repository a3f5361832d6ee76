"""The tasks of a batch run and how a worker runs one (issue P2-2, "Running it").

A batch is a compile task per model and a fit task per (model, method, profile, family, seed)
that depends on it.  Each task is a plain function of plain arguments, so any executor can run
it (the Dask runner in :mod:`stanvi.batch.runner`, or a loop in tests); it

1. returns at once the record already in the store, when the task finished before (a re-run of
   the same batch skips it);
2. otherwise runs the job in its own process (:mod:`stanvi.batch.child`) with a timeout enforced
   here, in the worker: when it passes, the process group is killed and the record says
   ``timeout``; a process that dies (a crash in the model's C++, the OOM killer) gives a
   ``crashed`` record with its exit code and the end of its stderr — except that a fit which
   had finished keeps the stages of its record done before (:func:`job_result`).  The worker
   survives both;
3. writes the record to the store (:class:`~stanvi.batch.store.RunStore`, atomically) and
   returns it.

Every record carries the task's identity (``key``, ``model``, ``source``, and for fits
``method``, ``profile``, ``family``, ``seed``, ``options``), its ``status`` and ``message``, the
host and the wall time of the task.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stanvi.batch.child import PARTIAL_PREFIX, PROGRESS_PREFIX, RESULT_PREFIX, reference_file
from stanvi.batch.discover import ModelCase
from stanvi.batch.store import RunStore

__all__ = ["FitSpec", "NOT_RUN", "compile_task", "fit_task", "run_job", "job_result",
           "case_job", "write_record", "fit_identity", "compile_record_usable"]

STDERR_TAIL = 3000

#: The status of a seed that the batch's ``skip_after_timeout`` did not run
#: (docs/batch.md#skip-after-timeout).
NOT_RUN = "not_run"


@dataclass(frozen=True)
class FitSpec:
    """One fit of a batch.  ``options`` are the method's options (JSON values)."""

    model: str
    method: str
    family: str = "meanfield"
    profile: str | None = None
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)

    @property
    def key(self) -> str:
        """The task's name in the store: readable, plus a digest of everything that defines it."""
        ident = json.dumps(asdict(self), sort_keys=True)
        digest = hashlib.sha256(ident.encode()).hexdigest()[:12]
        return (f"{self.model}__{self.method}-{self.profile or 'default'}-{self.family}"
                f"-s{self.seed}__{digest}")


def case_job(case: ModelCase) -> dict[str, Any]:
    """The JSON fields of a model case that a child process needs."""
    return {"model": case.name, "stan": str(case.stan),
            "data": str(case.data) if case.data else None, "data_format": case.data_format,
            "source": case.source, "reference": str(case.reference) if case.reference else None}


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


def run_job(job: dict[str, Any], timeout: float | None) -> dict[str, Any]:
    """Run ``job`` in a child process (:mod:`stanvi.batch.child`) and return its result, or a
    ``timeout`` / ``crashed`` record with the reason (:func:`job_result`)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "stanvi.batch.child"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    timed_out = False
    try:
        out, err = proc.communicate(json.dumps(job), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()   # what the child printed before: none of it is lost
        timed_out = True
    finally:
        if proc.poll() is None:  # an exception here (KeyboardInterrupt, a cancelled task)
            _kill_group(proc)
    result = job_result(job["kind"], out, err, proc.returncode,
                        f"stopped after {timeout:g} s (the task's timeout)" if timed_out else None)
    if timed_out or "task_seconds" not in result:
        result["task_seconds"] = time.perf_counter() - start
    return result


def _last_line(out: str, prefix: str, skip_malformed: bool = False) -> dict[str, Any] | None:
    """The JSON of the last line of ``out`` that starts with ``prefix``; with
    ``skip_malformed``, the last well-formed one (a progress line that another writer to the
    process's stdout cut into is passed over)."""
    lines = [ln[len(prefix):] for ln in (out or "").splitlines() if ln.startswith(prefix)]
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            if not skip_malformed:
                raise
    return None


def progress_text(progress: dict[str, Any]) -> str:
    """Where a stopped fit was, for its message: ``"; the last iteration of the fit to end was
    iteration 41, 290.3 s into the task (ELBO -1234.5, 5120 scaled oracle calls), in its refine
    phase"``, ``"; the fit had started 1.2 s into the task and no iteration of it had
    ended"``, or where the fit had ended, ``"; its fit had ended 12.0 s into the task, after
    iteration 41, and the accuracy figures after it had not"`` (docs/batch.md#progress-at-stop)."""
    if progress.get("fit_ended"):
        after = (f", after iteration {progress['iteration']}" if "iteration" in progress
                 else "")
        return (f"; its fit had ended {progress['seconds']:.1f} s into the task{after}, and the "
                "accuracy figures after it had not")
    if "iteration" not in progress:
        return (f"; the fit had started {progress['seconds']:.1f} s into the task and no "
                "iteration of it had ended")
    figures = []
    if isinstance(progress.get("elbo"), (int, float)):
        figures.append(f"ELBO {progress['elbo']:.6g}")
    if isinstance(progress.get("oracle"), (int, float)):
        figures.append(f"{progress['oracle']:.0f} scaled oracle calls")
    text = (f"; the last iteration of the fit to end was iteration {progress['iteration']}, "
            f"{progress['seconds']:.1f} s into the task")
    if figures:
        text += f" ({', '.join(figures)})"
    if progress.get("phase"):
        text += f", in its {progress['phase']} phase"
    return text


def job_result(kind: str, out: str, err: str, returncode: int,
               stopped: str | None = None) -> dict[str, Any]:
    """The record of a child process's output: its ``STANVI_BATCH_RESULT`` line; where the
    process was stopped (``stopped``: why, e.g. its timeout) or ended without one, a
    ``timeout`` / ``crashed`` record with the reason — unless it had finished its fit and
    printed a ``STANVI_BATCH_PARTIAL`` record (:func:`stanvi.batch.child.emit_partial`): then
    that record, the fit's own status kept, with ``incomplete`` saying what stopped the
    evaluation after which of its stages (docs/batch.md#partial-records).  A fit stopped before
    it ended keeps in ``progress_at_stop`` the last ``STANVI_BATCH_PROGRESS`` line of the child
    (:class:`stanvi.batch.child.FitProgressReporter`), and its message says where the fit was
    (:func:`progress_text`, docs/batch.md#progress-at-stop)."""
    result = None if stopped else _last_line(out, RESULT_PREFIX)
    if result is not None and returncode == 0:
        return result
    if stopped:
        status, why = "timeout", f"{stopped}; its process was killed"
    else:
        code = (f"killed by signal {-returncode}" if returncode < 0
                else f"exit status {returncode}")
        status, why = "crashed", (f"the {kind} process ended without a result ({code}): "
                                  f"{(err or '')[-STDERR_TAIL:].strip() or 'no output'}")
    partial = _last_line(out, PARTIAL_PREFIX)
    if partial is None:
        progress = _last_line(out, PROGRESS_PREFIX, skip_malformed=True)
        if progress is None:
            return {"status": status, "message": why}
        return {"status": status, "message": why + progress_text(progress),
                "progress_at_stop": progress}
    done = partial.get("evaluated") or []
    partial["incomplete"] = (f"{why} after the stage(s) {', '.join(done)} of its record; the "
                             f"figures of the later ones are missing")
    return partial


def write_record(store: RunStore, kind: str, key: str, identity: dict, result: dict) -> dict:
    """Store and return the record of a finished task: its identity, its result, and where and
    when it finished."""
    record = {**identity, **result, "key": key, "kind": kind, "host": socket.gethostname(),
              "finished": time.time()}
    store.put(kind, key, record)
    return record


def fit_identity(spec: FitSpec, case: ModelCase) -> dict[str, Any]:
    """The fields that name a fit in its record."""
    return {**asdict(spec), "source": case.source}


def compile_record_usable(record: dict[str, Any] | None, runs_dir: str | os.PathLike) -> bool:
    """Whether a stored compile record can serve this machine's fit tasks as it is.

    An ``ok`` record names files outside the record: the model library (in the compile cache of
    the machine that compiled it) and, for a posterior with reference draws, the draws it wrote
    to ``<runs>/references/``.  A runs directory carried to another machine (a fresh clone of a
    committed store, another cache directory, a moved runs directory) finds them missing; its
    models are then compiled again (a cache hit where the library is there under another path)
    and the record replaced, while its fit records stay and are not run again.  Any other
    status (a compile that failed, data Stan refused) is the model's outcome and is kept."""
    if record is None:
        return False
    if record.get("status") != "ok":
        return True
    if not Path(record.get("library") or "").is_file():
        return False
    if record.get("reference") in (None, "unreadable"):
        return True
    return reference_file(runs_dir, record["model"]).is_file()


def reference_record_usable(record: dict[str, Any] | None, runs_dir: str | os.PathLike) -> bool:
    """Whether a stored NUTS reference record serves this machine's fits as it is: any
    outcome but ``ok`` is the model's outcome and is kept; an ``ok`` one needs its draws in
    ``<runs>/references/`` (a runs directory carried to another machine has none: the
    reference is computed again, docs/batch.md#nuts-references)."""
    return record is not None and (record.get("status") != "ok"
                                   or reference_file(runs_dir, record["model"]).is_file())


def compile_task(case: ModelCase, runs_dir: str, timeout: float | None = 1800.0) -> dict[str, Any]:
    """Compile (or find compiled) one model and load it with its data; the record has
    ``status`` 'ok' (with ``library``, ``dim``, ``reference``), 'skipped' (the case's reason),
    'data_error', 'compile_failed', 'load_failed', 'timeout' or 'crashed'.  A stored record is
    returned as it is unless its files are missing here (:func:`compile_record_usable`)."""
    store = RunStore(runs_dir)
    found = store.get("compile", case.name)
    if compile_record_usable(found, runs_dir):
        return found
    identity = {"model": case.name, "source": case.source, "stan": str(case.stan),
                "data": str(case.data) if case.data else None}
    if case.skip is not None:
        return write_record(store, "compile", case.name, identity,
                       {"status": "skipped", "message": case.skip})
    job = {**case_job(case), "kind": "compile", "runs_dir": str(runs_dir)}
    return write_record(store, "compile", case.name, identity, run_job(job, timeout))


def reference_task(case: ModelCase, compiled: dict[str, Any], runs_dir: str,
                   timeout: float | None = 3600.0) -> dict[str, Any]:
    """The model's NUTS reference (:mod:`stanvi.batch.nuts_reference`), its draws in
    ``<runs>/references/``; a stored record is returned as it is unless its draws are missing
    here (a runs directory carried to another machine: the reference is computed again)."""
    store = RunStore(runs_dir)
    path = reference_file(runs_dir, case.name)
    found = store.get("reference", case.name)
    if reference_record_usable(found, runs_dir):
        return found
    identity = {"model": case.name, "source": case.source, "method": "nuts"}
    if compiled.get("status") != "ok":
        return write_record(store, "reference", case.name, identity, {
            "status": "not_compiled",
            "message": f"{compiled.get('status')}: {compiled.get('message', '')}"})
    job = {**case_job(case), "kind": "reference", "reference_path": str(path),
           # a stored reference whose draws are missing here: regenerate the run it kept
           "stored_attempts": (found or {}).get("attempts")}
    return write_record(store, "reference", case.name, identity, run_job(job, timeout))


def fit_task(spec: FitSpec, case: ModelCase, compiled: dict[str, Any], runs_dir: str,
             timeout: float | None = 600.0, draws: int = 2000,
             reference: dict[str, Any] | None = None) -> dict[str, Any]:
    """Fit one (model, method, profile, family, seed); ``compiled`` is the model's compile
    record, ``reference`` its NUTS reference record where the batch computes one.  A model
    that did not compile gives a ``not_compiled`` record with the compile record's status and
    message (so that every planned fit has a record)."""
    store = RunStore(runs_dir)
    found = store.get("fit", spec.key)
    if found is not None and found.get("status") != NOT_RUN:   # a seed skipped after a
        return found                                            # timeout runs when asked
    identity = fit_identity(spec, case)
    if compiled.get("status") != "ok":
        return write_record(store, "fit", spec.key, identity, {
            "status": "not_compiled",
            "message": f"{compiled.get('status')}: {compiled.get('message', '')}"})
    has_reference = compiled.get("reference") or (reference or {}).get("status") == "ok"
    ref = reference_file(runs_dir, case.name) if has_reference else None
    job = {**case_job(case), "kind": "fit", "library": compiled["library"], "method": spec.method,
           "family": spec.family, "profile": spec.profile, "seed": spec.seed,
           "options": spec.options, "draws": draws,
           "reference_npz": str(ref) if ref is not None and Path(ref).is_file() else None}
    return write_record(store, "fit", spec.key, identity, run_job(job, timeout))
