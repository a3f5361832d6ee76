"""The process that runs one batch task (issue P2-2, "Running it"): ``python -m
stanvi.batch.child`` reads a job (JSON) on stdin and prints its result as one line
``STANVI_BATCH_RESULT <json>`` on stdout, after a ``STANVI_BATCH_PARTIAL <json>`` line for
each stage of a fit's record done (:func:`emit_partial`), and while one of stanvi's methods
fits, a ``STANVI_BATCH_PROGRESS <json>`` line when the fit starts and then at most every two
seconds with its last iteration (:class:`FitProgressReporter`).

A task runs in its own process so that the Dask worker that launched it
(:func:`stanvi.batch.tasks.run_job`) can stop it at its timeout (the process group is killed) and
survives a model that crashes the process; the worker turns a timeout, a crash or a missing
result into a record with the reason.

Jobs:

* ``compile``: read the data, compile the model (the compile cache's file lock makes concurrent
  workers safe; a cached library is found by content), load it with its data, and for a
  posterior with reference draws write them, in constrained and (where the reference has every
  parameter) unconstrained space, to ``<runs>/references/<model>.npz`` for the fit tasks.
* ``reference``: a NUTS reference for a model that has none (:mod:`stanvi.batch.nuts_reference`),
  written where the compile task writes posteriordb's.
* ``fit``: ``stanvi.fit`` of the compiled library with the job's method, profile, family, seed and
  options; the record holds the status and message, the ELBO on 10,000 draws common to every
  run of the model, with its standard error, and the paper protocol's figures (the final ELBO
  on the same draws, evaluation ELBOs along the trace), the trace (thinned to at most 400
  rows), the oracle ledger, draw-level model evaluations, run time and JAX compile time apart,
  the k-hat diagnostic, with reference draws the accuracy figures of
  :mod:`stanvi.evaluation.accuracy`, and each stage's seconds.  Stan's own algorithms
  (``stan-advi``, ``pathfinder``, ``nuts``) go to :mod:`stanvi.batch.reference_job`.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

RESULT_PREFIX = "STANVI_BATCH_RESULT "
PARTIAL_PREFIX = "STANVI_BATCH_PARTIAL "
PROGRESS_PREFIX = "STANVI_BATCH_PROGRESS "
PROGRESS_EVERY = 2.0
TRACE_ROWS = 400
TRACE_POINTS = 40


def _case(job: dict):
    from stanvi.batch.discover import ModelCase  # noqa: PLC0415

    return ModelCase(job["model"], Path(job["stan"]), Path(job["data"]) if job.get("data") else None,
                     job.get("data_format", "none"), source=job.get("source", "example-models"),
                     reference=Path(job["reference"]) if job.get("reference") else None)


def _first_lines(exc: BaseException, limit: int = 2000) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + " ..."


def reference_file(runs_dir: str | Path, model: str) -> Path:
    """Where the compile task leaves a model's reference draws."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in model)
    return Path(runs_dir) / "references" / f"{safe}.npz"


def compile_job(job: dict) -> dict[str, Any]:
    from stanvi.evaluation.accuracy import write_reference_npz  # noqa: PLC0415
    from stanvi.batch.discover import load_data  # noqa: PLC0415
    from stanvi.batch.posteriordb import read_reference_draws  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    case = _case(job)
    try:
        data = load_data(case)
    except Exception as exc:  # noqa: BLE001 — any unreadable data is the record's reason
        return {"status": "data_error", "message": _first_lines(exc)}
    t0 = time.perf_counter()
    try:
        compiled = compile_model(case.stan, progress=False)
    except Exception as exc:  # noqa: BLE001
        return {"status": "compile_failed", "message": _first_lines(exc),
                "compile_seconds": time.perf_counter() - t0}
    record: dict[str, Any] = {"library": str(compiled.library), "cached": compiled.cached,
                              "compile_seconds": time.perf_counter() - t0}
    try:
        target = StanTarget(compiled, data, progress=False)
    except Exception as exc:  # noqa: BLE001
        return {**record, "status": "load_failed", "message": _first_lines(exc)}
    record.update(status="ok", message="", dim=int(target.dim),
                  variables={v.name: list(v.shape) for v in target.variables()})
    if case.reference is not None:
        path = reference_file(job["runs_dir"], case.name)
        try:
            ref = read_reference_draws(case.reference)
            unconstrained, why = write_reference_npz(path, target, ref)
        except Exception as exc:  # noqa: BLE001
            record.update(reference="unreadable", reference_message=_first_lines(exc))
            return record
        record.update(reference=str(path), reference_draws=len(next(iter(ref.values()))),
                      reference_unconstrained=unconstrained, reference_message=why)
    return record


def _thin_trace(rows: list[dict]) -> tuple[list[dict], bool]:
    """At most TRACE_ROWS rows: the first, the last and evenly spaced ones between, every row
    with an ELBO estimate kept first."""
    if len(rows) <= TRACE_ROWS:
        return rows, False
    keep = {0, len(rows) - 1}
    with_elbo = [i for i, r in enumerate(rows) if r.get("elbo") is not None]
    step = max(1, math.ceil(len(with_elbo) / (TRACE_ROWS // 2)))
    keep.update(with_elbo[::step])
    spaced = np.linspace(0, len(rows) - 1, TRACE_ROWS - len(keep)).round().astype(int)
    keep.update(int(i) for i in spaced)
    return [rows[i] for i in sorted(keep)][:TRACE_ROWS], True


def _protocol_trace(result, job: dict, common, final: float) -> dict[str, Any]:
    """The paper protocol's trace figures (docs/algorithms.md#benchmark-protocol), as ``stanvi
    bench methods`` computes them (:func:`stanvi.evaluation.protocol.summarize_run`): the
    evaluation ELBO on the first 2,000 of the ``common`` draws at up to ``trace_points``
    log-spaced trace rows, with each row's iteration, oracle calls, draw-level evaluations and
    run time (``final``: the final ELBO on all of them, already computed)."""
    from stanvi.batch.fit_figures import EVAL_DRAWS  # noqa: PLC0415
    from stanvi.evaluation.protocol import summarize_run  # noqa: PLC0415

    run = summarize_run(result, "", common, common[:EVAL_DRAWS],
                        int(job.get("trace_points", TRACE_POINTS)), final=final)
    return {"trace_points": {
        "iteration": run.trace_iter, "oracle": run.trace_oracle, "draws": run.trace_draws,
        "run_time": run.trace_wall, "elbo": run.trace_elbo}}


def emit_partial(record: dict[str, Any], evaluated: list[str]) -> None:
    """Print the record so far, ``STANVI_BATCH_PARTIAL <json>``, naming the stages done: the
    worker keeps the last one where the task's timeout or a crash stops the process before
    its result (:func:`stanvi.batch.tasks.run_job`), so a fit that finished is not lost to a
    slow evaluation after it (docs/batch.md#partial-records)."""
    from stanvi.batch.store import record_json  # noqa: PLC0415

    sys.stdout.write(PARTIAL_PREFIX + record_json({**record, "evaluated": list(evaluated)})
                     + "\n")
    sys.stdout.flush()


class FitProgressReporter:
    """Prints how far a fit has got, ``STANVI_BATCH_PROGRESS <json>``: once when the fit starts
    (``{"seconds": …}``, the seconds since the task's start: reading the data before it), then,
    as an observer of :func:`stanvi.progress.observe_iterations`, the fit's latest iteration
    (``iteration``, ``seconds`` and the method's fields: ``elbo``, ``oracle``, ``phase`` …) at
    most every ``every`` seconds, from a thread, so that the last iteration before a stall is
    printed too.  The worker keeps the last line where the task's timeout or a crash stops the
    process before the fit ends (:func:`stanvi.batch.tasks.job_result`), so the record says
    where the fit was (docs/batch.md#progress-at-stop).  Use it as a context manager: when the
    block ends without an exception it prints the last iteration with ``fit_ended`` true (a
    timeout after it stopped the accuracy figures, the first stage of the record, not the
    fit)."""

    def __init__(self, start: float, every: float = PROGRESS_EVERY, stream=None) -> None:
        self.start, self.every = start, float(every)
        self.stream = stream if stream is not None else sys.stdout
        self._lock = threading.Lock()
        # (method, iteration, fields, seconds) of the latest iteration: the line is built when
        # printed, not on every iteration of the fit
        self._pending: tuple | None = None
        self._latest: tuple | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _write(self, fields: dict[str, Any]) -> None:
        from stanvi.batch.store import record_json  # noqa: PLC0415

        self.stream.write(PROGRESS_PREFIX + record_json(fields) + "\n")
        self.stream.flush()

    @staticmethod
    def _line(latest: tuple | None) -> dict[str, Any]:
        if latest is None:
            return {}
        method, iteration, fields, seconds = latest
        shown = {k: v for k, v in fields.items() if isinstance(v, (int, float, str))}
        return {**shown, "method": method, "iteration": int(iteration), "seconds": seconds}

    def __enter__(self) -> FitProgressReporter:
        self._write({"seconds": time.perf_counter() - self.start})
        self._thread.start()
        return self

    def __call__(self, method: str, iteration: int, fields: dict) -> None:
        latest = (method, iteration, fields, time.perf_counter() - self.start)
        with self._lock:
            self._pending = self._latest = latest

    def flush(self) -> None:
        """Print the latest iteration if it has not been printed."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is not None:
                self._write(self._line(pending))

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            self.flush()

    def __exit__(self, exc_type, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None:
            with self._lock:
                self._pending = None
                self._write({**self._line(self._latest), "fit_ended": True,
                             "seconds": time.perf_counter() - self.start})
        else:
            self.flush()


def fit_job(job: dict, partial=None) -> dict[str, Any]:
    """A fit task's record, built in stages, cheapest first, each reported through ``partial``
    (:func:`emit_partial`) once done: the fit with its accuracy against the reference draws
    (``fit``), the ELBO on the common draws (``elbo``: one evaluation gives the record's
    ``elbo``, ``elbo_se`` and ``final_elbo``, :func:`stanvi.evaluation.protocol.final_elbos`),
    the k̂ verdict (``verdict``), then the protocol's trace (``trace``), each one's seconds in
    ``stage_seconds`` (:class:`~stanvi.batch.fit_figures.RecordStages`; the ``fit`` stage from
    the job's start: reading the data, the fit and its accuracy)."""
    from stanvi.evaluation.accuracy import labelled_draws  # noqa: PLC0415
    from stanvi.evaluation.protocol import final_elbos  # noqa: PLC0415
    from stanvi.batch.discover import load_data  # noqa: PLC0415
    from stanvi.batch.fit_figures import (ELBO_DRAWS, RecordStages,  # noqa: PLC0415
                                          common_draws, fit_accuracy)
    from stanvi.batch.reference_job import REFERENCE_METHODS, reference_fit_job  # noqa: PLC0415
    from stanvi.errors import DivergedError  # noqa: PLC0415
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.progress import observe_iterations  # noqa: PLC0415

    start = time.perf_counter()
    data = load_data(_case(job))
    options = dict(job.get("options") or {})
    if job["method"] in REFERENCE_METHODS:
        try:
            return reference_fit_job(job, data, partial, start)
        except Exception as exc:  # noqa: BLE001 — Stan's own message names what is wrong
            return {"status": "error", "message": _first_lines(exc)}
    try:
        with FitProgressReporter(start) as reporter, observe_iterations(reporter):
            result = fit(job["library"], data=data, method=job["method"], family=job["family"],
                         seed=int(job["seed"]), profile=job.get("profile"), progress=False,
                         draws=int(job.get("draws", 2000)), **options)
    except DivergedError as exc:  # the method's steps diverged: a failed fit, not a broken call
        return {"status": "failed", "message": _first_lines(exc)}
    except Exception as exc:  # noqa: BLE001 — stanvi's own errors name what is wrong
        return {"status": "error", "message": _first_lines(exc)}
    trace, thinned = _thin_trace([dict(r) for r in result.trace.rows])
    evaluations = result.info.get("model_evaluations") or {}
    record: dict[str, Any] = {
        "status": result.status, "message": result.message, "dim": int(result.family.dim),
        "iterations": len(result.trace) - 1,
        "trace": trace, "trace_thinned": thinned, "oracle": result.oracle,
        "draw_evaluations": int(sum(evaluations.values())), "model_evaluations": evaluations,
        "wall_time": result.wall_time, "compile_time": result.compile_time,
        "run_time": result.run_time, "setup_time": result.setup_time,
        "info": {k: v for k, v in result.info.items()
                 if isinstance(v, (int, float, str, bool)) or v is None}}
    if job.get("reference_npz"):
        names = list(result.target.unconstrained_names)
        z = np.asarray(result.unconstrained_draws)
        accuracy = fit_accuracy(job, labelled_draws(result.stan_variables()),
                                {name: z[:, j] for j, name in enumerate(names)})
        if accuracy is not None:
            record["accuracy"] = accuracy
    stages = RecordStages(record, partial, start)
    stages.done("fit")
    common = common_draws(ELBO_DRAWS, result.family.base_dim)   # D + k for lowrank
    elbo, elbo_se, final = final_elbos(result, common)
    record.update(elbo=elbo, elbo_se=elbo_se, final_elbo=final)
    stages.done("elbo")
    diag = result.diagnostics()
    record.update(khat=diag.khat, khat_se=diag.khat_se, verdict=diag.verdict, ess=diag.ess,
                  verdict_figures=diag.verdict_figures())
    stages.done("verdict")
    record.update(_protocol_trace(result, job, common, final))
    stages.done("trace", report=False)
    return record


def reference_job(job: dict) -> dict[str, Any]:
    """A NUTS reference for a model without one (:mod:`stanvi.batch.nuts_reference`), written
    to ``job['reference_path']``."""
    from stanvi.batch.discover import load_data  # noqa: PLC0415
    from stanvi.batch.nuts_reference import nuts_reference  # noqa: PLC0415

    case = _case(job)
    try:
        data = load_data(case)
    except Exception as exc:  # noqa: BLE001
        return {"status": "data_error", "message": _first_lines(exc)}
    try:
        return nuts_reference(case, data, Path(job["reference_path"]),
                              job.get("stored_attempts"))
    except Exception as exc:  # noqa: BLE001 — Stan's message names what is wrong
        return {"status": "error", "message": _first_lines(exc)}


JOBS = {"compile": compile_job, "fit": fit_job, "reference": reference_job}


def main() -> int:
    job = json.loads(sys.stdin.read())
    t0 = time.perf_counter()
    try:
        run = JOBS[job["kind"]]
        record = run(job, emit_partial) if job["kind"] == "fit" else run(job)
    except Exception as exc:  # noqa: BLE001 — reported, not a crash of the batch
        record = {"status": "error", "message": _first_lines(exc),
                  "traceback": traceback.format_exc(limit=8)}
    record["task_seconds"] = time.perf_counter() - t0
    from stanvi.batch.store import record_json  # noqa: PLC0415

    sys.stdout.write(RESULT_PREFIX + record_json(record) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
