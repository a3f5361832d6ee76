"""Batch runs end to end (issue P2-2): fake example-models and posteriordb trees, compiled and
fitted on real Dask clusters (a LocalCluster; a scheduler and two workers started as separate
``dask scheduler`` / ``dask worker`` processes on 127.0.0.1), a failing compile, unreadable data,
a fit stopped at its timeout, resuming after ``kill -9`` of the running batch, and ``kill -9`` of
a worker in the middle of a task.

Every model file is called ``normal.stan`` with the same program, so all of them share one
compiled library (the compile cache is keyed on the code and the name)."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from stanvi.batch.discover import discover_example_models
from stanvi.batch.posteriordb import discover_posteriordb
from stanvi.batch.runner import BatchConfig, plan, run_batch
from stanvi.batch.store import RunStore
from stanvi.batch.tasks import FitSpec, compile_task, fit_task

pytestmark = pytest.mark.slow

NORMAL = "data { int N; vector[N] y; } parameters { real mu; } model { y ~ normal(mu, 1); }"
Y = [0.3, 1.9, 1.1, 0.4, 1.6, 0.9, 1.3, 0.7]
# exact posterior of mu (flat prior, unit noise): N(mean(y), 1/N)
POST_MEAN, POST_SD = float(np.mean(Y)), 1.0 / np.sqrt(len(Y))
DASK = Path(sys.executable).with_name("dask")


def put(root: Path, rel: str, text: str) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def zipped_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("x.json", json.dumps(obj))
    path.write_bytes(buf.getvalue())


@pytest.fixture
def example_tree(tmp_path):
    root = tmp_path / "example-models"
    data = json.dumps({"N": len(Y), "y": Y})
    for d in ("a", "b", "c"):
        put(root, f"{d}/normal.stan", NORMAL)
        put(root, f"{d}/normal.data.json", data)
    put(root, "rdump/normal.stan", NORMAL)
    put(root, "rdump/normal.data.R", f"N <- {len(Y)}\ny <- c({', '.join(map(str, Y))})\n")
    put(root, "broken/normal.stan", "parameters { real mu } model { mu ~ normal(0, 1); }")
    put(root, "na/normal.stan", NORMAL)
    put(root, "na/normal.data.R", "N <- 2\ny <- c(1, NA)\n")
    put(root, "nodata/normal.stan", NORMAL)
    return root


@pytest.fixture
def pdb_tree(tmp_path):
    db = tmp_path / "posteriordb" / "posterior_database"
    put(db, "models/stan/normal.stan", NORMAL)
    zipped_json(db / "data" / "data" / "eight.json.zip", {"N": len(Y), "y": Y})
    put(db, "posteriors/eight-normal.json", json.dumps(
        {"name": "eight-normal", "model_name": "normal", "data_name": "eight",
         "reference_posterior_name": "eight-normal"}))
    draws = np.random.default_rng(1).normal(POST_MEAN, POST_SD, (4, 2500))
    zipped_json(db / "reference_posteriors" / "draws" / "draws" / "eight-normal.json.zip",
                [{"mu": chain.tolist()} for chain in draws])
    return db.parent


def fit_files(runs: Path) -> dict[str, float]:
    return {p.name: p.stat().st_mtime_ns for p in (runs / "records" / "fit").glob("*.json")}


def test_posteriordb_batch_on_a_local_cluster_with_accuracy_and_resume(pdb_tree, tmp_path):
    runs = tmp_path / "runs"
    cases = discover_posteriordb(pdb_tree)
    config = BatchConfig(methods=(("trustvi", None), ("advi", None)), seeds=2)
    counts = run_batch(cases, runs, config, workers=2, progress=False)
    assert counts == {"converged": 4}
    store = RunStore(runs)
    comp = store.get("compile", "eight-normal")
    assert comp["status"] == "ok" and comp["dim"] == 1 and comp["reference_unconstrained"]
    for rec in store.query("fit"):
        assert rec["model"] == "eight-normal" and rec["source"] == "posteriordb"
        assert rec["elbo_se"] > 0 and rec["draw_evaluations"] > 0 and rec["trace"]
        # (TrustVI's q is this posterior exactly: constant ratios, k̂ = −inf, stored as null)
        assert rec["verdict"] is not None and rec["run_time"] >= 0
        assert rec["khat"] is not None or (rec["method"] == "trustvi" and rec["verdict"] == "good")
        for space in ("constrained", "unconstrained"):
            acc = rec["accuracy"][space]["marginals"]["mu"]
            # mean-field is exact here: errors are Monte Carlo / optimisation noise
            assert acc["mean_error_sd"] < 0.25 and abs(acc["sd_ratio"] - 1) < 0.25, rec["method"]
    before = fit_files(runs)
    assert len(before) == 4
    # the same batch again: nothing is run again, nothing rewritten
    assert run_batch(cases, runs, config, workers=1, progress=False) == {"converged": 4}
    assert fit_files(runs) == before


def test_a_lowrank_batch_fit_gets_its_protocol_figures(pdb_tree, tmp_path):
    # the protocol's common draws are base draws of the family's width (D + k for lowrank):
    # with D's width every lowrank fit of the batch was an error (LinAlgError)
    config = BatchConfig(methods=(("trustvi", None),), families=("lowrank",), seeds=1)
    counts = run_batch(discover_posteriordb(pdb_tree), tmp_path / "runs", config, workers=1,
                       progress=False)
    assert counts == {"converged": 1}
    (rec,) = RunStore(tmp_path / "runs").query("fit")
    assert rec["family"] == "lowrank" and np.isfinite(rec["final_elbo"])
    assert rec["accuracy"]["constrained"]["marginals"]["mu"]["mean_error_sd"] < 0.25


def test_a_runs_directory_carried_to_another_machine_recompiles_and_keeps_its_fits(pdb_tree,
                                                                                  tmp_path):
    """A committed runs directory in a fresh clone: the compile records name a library in
    another machine's cache and reference draws that were not committed.  The models compile
    again (the fits would otherwise fail to load the library, or lose their accuracy figures);
    the finished fits are neither run again nor rewritten."""
    first, runs = tmp_path / "first", tmp_path / "clone" / "runs"
    cases = discover_posteriordb(pdb_tree)
    run_batch(cases, first, BatchConfig(methods=(("advi", None),), seeds=1), workers=1,
              progress=False)
    shutil.copytree(first / "records", runs / "records")   # no references/, no index
    stale = RunStore(runs).get("compile", "eight-normal")
    RunStore(runs).put("compile", "eight-normal",
                       {**stale, "library": str(tmp_path / "other-machine" / "normal.so")})
    before = fit_files(runs)
    counts = run_batch(cases, runs, BatchConfig(methods=(("advi", None),), seeds=2), workers=1,
                       progress=False)
    assert counts == {"converged": 2}
    after = fit_files(runs)
    assert {k: after[k] for k in before} == before          # the carried fit is kept as it was
    comp = RunStore(runs).get("compile", "eight-normal")
    assert comp["status"] == "ok" and Path(comp["library"]).is_file()
    new = [r for r in RunStore(runs).records("fit") if r["seed"] == 1]
    assert len(new) == 1 and new[0]["status"] == "converged"
    assert new[0]["accuracy"]["constrained"]["marginals"]["mu"]["mean_error_sd"] < 0.25


def test_failures_are_records_with_reasons(example_tree, tmp_path):
    runs = str(tmp_path / "runs")
    cases = {c.name: c for c in discover_example_models(example_tree)}
    assert "no data file" in cases["nodata/normal"].skip
    records = {name: compile_task(case, runs) for name, case in cases.items()}
    assert records["a/normal"]["status"] == "ok" and records["rdump/normal"]["status"] == "ok"
    assert records["broken/normal"]["status"] == "compile_failed"
    assert "line 1" in records["broken/normal"]["message"] or "Syntax" in \
        records["broken/normal"]["message"]
    assert records["na/normal"]["status"] == "data_error"
    assert "NA" in records["na/normal"]["message"]
    assert records["nodata/normal"]["status"] == "skipped"
    # a fit of a model that did not compile is a record too
    rec = fit_task(FitSpec("broken/normal", "advi"), cases["broken/normal"],
                   records["broken/normal"], runs)
    assert rec["status"] == "not_compiled" and "compile_failed" in rec["message"]
    # a runaway fit is stopped at its timeout, in the worker, and recorded
    start = time.perf_counter()
    rec = fit_task(FitSpec("a/normal", "advi", options={"max_iterations": 10**9,
                                                          "tol_rel_obj": 1e-300}),
                   cases["a/normal"], records["a/normal"], runs, timeout=8.0)
    assert rec["status"] == "timeout" and "8 s" in rec["message"]
    assert time.perf_counter() - start < 30
    # bad options are the fit's error, named
    rec = fit_task(FitSpec("a/normal", "advi", options={"no_such_option": 1}),
                   cases["a/normal"], records["a/normal"], runs)
    assert rec["status"] == "error" and "no_such_option" in rec["message"]
    # steps that overflow leave no q to draw from: a failed fit with the reason, not an error
    rec = fit_task(FitSpec("a/normal", "advi", options={"eta": 1e308, "adapt_engaged": False}),
                   cases["a/normal"], records["a/normal"], runs)
    assert rec["status"] == "failed" and "DivergedError" in rec["message"]
    assert "steps diverged" in rec["message"]


_BATCH_SCRIPT = """
import sys
from stanvi.batch.discover import discover_example_models
from stanvi.batch.runner import BatchConfig, run_batch
cases = [c for c in discover_example_models(sys.argv[1]) if c.name in ("a/normal", "b/normal", "c/normal")]
config = BatchConfig(methods=(("trustvi", None), ("advi", None)), seeds=int(sys.argv[3]))
print(run_batch(cases, sys.argv[2], config, workers=2, progress=False, scheduler=(sys.argv[4] if len(sys.argv) > 4 else None)))
"""


def test_resume_after_kill_9_of_the_running_batch(example_tree, tmp_path):
    runs = tmp_path / "runs"
    args = [sys.executable, "-c", _BATCH_SCRIPT, str(example_tree), str(runs), "2"]
    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while len(fit_files(runs) if (runs / "records" / "fit").is_dir() else {}) < 3:
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)       # the client, its cluster and the running fits
    proc.wait()
    survived = {p.name: p.read_text() for p in (runs / "records" / "fit").glob("*.json")}
    assert 3 <= len(survived) < 12
    for text in survived.values():
        assert json.loads(text)["status"] in ("converged", "max_iters")
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    files = {p.name: p.read_text() for p in (runs / "records" / "fit").glob("*.json")}
    planned = {spec.key for _, spec in plan(
        [c for c in discover_example_models(example_tree)
         if c.name in ("a/normal", "b/normal", "c/normal")],
        BatchConfig(methods=(("trustvi", None), ("advi", None)), seeds=2))}
    assert {json.loads(t)["key"] for t in files.values()} == planned and len(files) == 12
    for name, text in survived.items():      # finished records were kept, not redone
        assert files[name] == text


def _children(pid: int, needle: str) -> list[int]:
    """Processes whose parent is ``pid`` and whose command line contains ``needle``."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and int(parts[1]) == pid and needle in parts[2]:
            found.append(int(parts[0]))
    return found


def _start(args, log):
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def test_scheduler_and_worker_processes_and_a_worker_killed_mid_task(example_tree, tmp_path):
    if not DASK.exists():
        pytest.skip(f"no dask command next to {sys.executable}")
    sched_file = tmp_path / "scheduler.json"
    log = open(tmp_path / "dask.log", "w")
    procs = [_start([str(DASK), "scheduler", "--host", "127.0.0.1", "--port", "0",
                     "--no-dashboard", "--scheduler-file", str(sched_file)], log)]
    try:
        deadline = time.time() + 60
        while not sched_file.exists() or not sched_file.read_text().strip():
            assert time.time() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(2):
            procs.append(_start([str(DASK), "worker", address, "--nthreads", "1", "--no-nanny",
                                 "--host", "127.0.0.1", "--no-dashboard"], log))
        runs = tmp_path / "runs"
        args = [sys.executable, "-c", _BATCH_SCRIPT, str(example_tree), str(runs), "1", address]
        batch = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        # once a fit has finished and worker 1 is running a fit, kill -9 that worker and its
        # fit process: the machine is gone in the middle of a task
        deadline = time.time() + 300
        victim = procs[1].pid
        while True:
            assert batch.poll() is None, batch.communicate()
            assert time.time() < deadline, "worker 1 never ran a fit"
            running = _children(victim, "stanvi.batch.child")
            if running and (runs / "records" / "fit").is_dir() and fit_files(runs):
                break
            time.sleep(0.1)
        for pid in [victim, *running]:
            os.kill(pid, signal.SIGKILL)
        out, err = batch.communicate(timeout=600)
        assert batch.returncode == 0, err[-3000:]
        files = [json.loads(p.read_text()) for p in (runs / "records" / "fit").glob("*.json")]
        assert len(files) == 6 and len({r["key"] for r in files}) == 6
        # the task killed with its worker was run again on the surviving one: nothing lost
        assert {r["status"] for r in files} <= {"converged", "max_iters"}, \
            [(r["key"], r["status"], r["message"]) for r in files]
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def test_stans_own_algorithms_as_batch_methods(pdb_tree, tmp_path):
    """stan-advi, pathfinder (single path) and NUTS in a batch: records in stanvi's units, with
    accuracy against the reference; Stan ADVI's ELBO from its recovered Gaussian."""
    runs = tmp_path / "runs"
    cases = discover_posteriordb(pdb_tree)
    config = BatchConfig(methods=(("stan-advi", None), ("pathfinder", "single"), ("nuts", None),
                                  ("trustvi", None)),
                         seeds=1, options={"nuts": {"chains": 2, "num_samples": 500}})
    counts = run_batch(cases, runs, config, workers=1, progress=False)
    records = {r["method"]: r for r in RunStore(runs).query("fit")}
    assert set(records) == {"stan-advi", "pathfinder", "nuts", "trustvi"}, counts
    # the report puts them beside stanvi's; the paper protocol pairs only traced methods
    from stanvi.batch.report import write_report
    write_report(runs, tmp_path / "report")
    models_csv = (tmp_path / "report" / "models.csv").read_text()
    assert "stan-advi" in models_csv and "nuts" in models_csv
    assert "stan-advi" not in (tmp_path / "report" / "protocol.csv").read_text()
    del records["trustvi"]
    nuts_rec = records["nuts"]
    assert nuts_rec["status"] == "sampled" and nuts_rec["family"] == "none"
    assert nuts_rec["info"]["max_r_hat"] < 1.05 and nuts_rec["draw_evaluations"] > 0
    for rec in records.values():
        acc = rec["accuracy"]["constrained"]["marginals"]["mu"]
        assert acc["mean_error_sd"] < 0.3 and abs(acc["sd_ratio"] - 1) < 0.3, rec["method"]
        assert rec["oracle"]["gradient"] > 0 and rec["run_time"] > 0
    advi = records["stan-advi"]
    assert advi["status"] in ("converged", "max_iters") and advi["trace"]
    # exact posterior N(mean y, 1/N) with a flat prior: the best Gaussian's ELBO is log Z
    log_z = (-0.5 * len(Y) * np.log(2 * np.pi) - 0.5 * np.sum((np.array(Y) - POST_MEAN) ** 2)
             + 0.5 * np.log(2 * np.pi * POST_SD**2))
    assert log_z - 0.2 < advi["final_elbo"] <= log_z + 4 * advi["elbo_se"] + 1e-9
    # one evaluation on the batch's common draws gives both (docs/batch.md#the-results-store)
    assert advi["elbo"] == advi["final_elbo"]
    # Pathfinder's Gaussian is the exact posterior here: its ELBO (mean log p - log q over its
    # draws) is log Z up to Monte Carlo error
    path = records["pathfinder"]
    assert abs(path["elbo"] - log_z) < 4 * path["elbo_se"] + 0.02


def test_nuts_references_for_example_models(example_tree, tmp_path):
    """``reference='nuts'`` gives each runnable model a NUTS reference (4 chains), judged
    trustworthy here (the posterior is N(mean y, 1/N)), and scores the fits against it; a batch
    of references only (no methods) and a second run reuse the stored references."""
    runs = tmp_path / "runs"
    cases = [c for c in discover_example_models(example_tree) if c.name.startswith("a/")]
    config = BatchConfig(methods=(("trustvi", None),), seeds=1, reference="nuts")
    counts = run_batch(cases, runs, config, workers=1, progress=False)
    assert counts == {"converged": 1}
    store = RunStore(runs)
    ref = store.get("reference", "a/normal")
    assert ref["status"] == "ok" and ref["trustworthy"] is True and ref["message"] == ""
    assert len(ref["attempts"]) == 1 and ref["attempts"][0]["max_r_hat"] < 1.01
    assert ref["reference_draws"] == 4000 and ref["reference_unconstrained"]
    with np.load(runs / "references" / "a_normal.npz") as z:
        mu = z["c:mu"]
    assert abs(mu.mean() - POST_MEAN) < 4 * POST_SD / np.sqrt(400)   # ESS >= 400
    assert abs(mu.std() / POST_SD - 1) < 0.1
    (fit,) = store.query("fit")
    acc = fit["accuracy"]["constrained"]["marginals"]["mu"]
    assert acc["mean_error_sd"] < 0.2 and abs(acc["sd_ratio"] - 1) < 0.2
    files = sorted((runs / "records" / "reference").glob("*.json"))
    mtimes = [p.stat().st_mtime_ns for p in files]
    more = [c for c in discover_example_models(example_tree) if c.name.startswith(("a/", "b/"))]
    run_batch(more, runs, BatchConfig(methods=(), reference="nuts"), workers=1, progress=False)
    assert store.get("reference", "b/normal")["trustworthy"] is True
    assert [p.stat().st_mtime_ns for p in files] == mtimes   # a/normal's record kept
    # A stored record whose draws are not on this machine is regenerated by the run it kept:
    # here a record whose first run (marked) failed its checks, so only the 4x-warmup run is
    # repeated and the first attempt's figures stay as recorded.
    record_file = next((runs / "records" / "reference").glob("b_normal*.json"))
    stored = json.loads(record_file.read_text())
    failed_first = {**stored["attempts"][0], "reasons": ["largest R-hat 1.5 > 1.01"],
                    "wall_time": 123.0}
    longer = {**stored["attempts"][0], "num_warmup": 4000}
    record_file.write_text(json.dumps({**stored, "attempts": [failed_first, longer]}))
    (runs / "references" / "b_normal.npz").unlink()
    run_batch(more, runs, BatchConfig(methods=(), reference="nuts"), workers=1, progress=False)
    regenerated = RunStore(runs).get("reference", "b/normal")
    assert (runs / "references" / "b_normal.npz").is_file()
    assert [a["num_warmup"] for a in regenerated["attempts"]] == [1000, 4000]
    assert regenerated["attempts"][0] == failed_first
    assert regenerated["attempts"][1]["wall_time"] != longer["wall_time"]   # run again
    assert regenerated["trustworthy"] is True


def test_trust_reasons_name_each_failed_check():
    from stanvi.batch.nuts_reference import trust_reasons

    good = {"max_r_hat": 1.003, "min_ess_bulk": 900.0, "min_ess_tail": 700.0, "divergences": 0}
    assert trust_reasons(good) == []
    bad = {"max_r_hat": 1.08, "min_ess_bulk": 120.0, "min_ess_tail": 410.0, "divergences": 3}
    reasons = trust_reasons(bad)
    assert reasons == ["largest R-hat 1.08 > 1.01", "smallest bulk ESS 120 < 400",
                       "3 divergent transition(s) after warmup"]
    assert "R-hat could not be computed" in trust_reasons({**good, "max_r_hat": float("nan")})
    assert "tail ESS could not be computed" in " ".join(trust_reasons(
        {k: v for k, v in good.items() if k != "min_ess_tail"}))
