"""``stanvi batch --skip-after-timeout`` (docs/batch.md#skip-after-timeout): seeds run
seed-major, a seed whose configuration timed out on a lower seed gets a ``not_run`` record
instead of running, and without the option those seeds run again."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from stanvi.batch import runner, tasks
from stanvi.batch.discover import ModelCase
from stanvi.batch.plan_status import plan_status
from stanvi.batch.runner import (NOT_RUN, BatchConfig, earlier_seed_keys, fit_or_skip, plan,
                                 seed_major, task_done)
from stanvi.batch.store import RunStore
from stanvi.batch.summary import group_runs, model_rows
from stanvi.batch.tasks import FitSpec, fit_identity, write_record

CASE = ModelCase("a/one", Path("a/one.stan"), Path("a/one.json"), "json")
COMPILED = {"status": "ok", "dim": 3, "library": "unused.so"}
SKIP = BatchConfig(methods=(("trustvi", "default"),), seeds=3, skip_after_timeout=True)


@pytest.fixture
def ran(monkeypatch):
    """The seeds whose fit really ran (fit_task's child process replaced by a record)."""
    calls: list[int] = []

    def fake_run_job(job, timeout):
        calls.append(job["seed"])
        return {"status": "converged", "final_elbo": -1.0}

    monkeypatch.setattr(tasks, "run_job", fake_run_job)
    return calls


def spec(seed: int, **kw) -> FitSpec:
    return FitSpec("a/one", "trustvi", "meanfield", "default", seed, kw)


def test_seed_major_order_is_stable_within_a_seed():
    models = [CASE, ModelCase("b/two", Path("b/two.stan"), None, "none")]
    work = plan(models, BatchConfig(methods=(("trustvi", "default"), ("advi", "paper")),
                                    seeds=3))
    ordered = seed_major(work)
    assert [s.seed for _, s in ordered] == [0] * 4 + [1] * 4 + [2] * 4
    assert [(c.name, s.method) for c, s in ordered[:4]] == [
        ("a/one", "trustvi"), ("a/one", "advi"), ("b/two", "trustvi"), ("b/two", "advi")]


def test_earlier_seed_keys_name_the_same_configuration():
    keys = earlier_seed_keys(spec(2, eta=0.1))
    assert keys == (spec(0, eta=0.1).key, spec(1, eta=0.1).key)
    assert spec(0, eta=0.2).key not in keys and earlier_seed_keys(spec(0)) == ()


def test_a_seed_after_a_timeout_is_not_run(tmp_path, ran):
    store = RunStore(tmp_path)
    write_record(store, "fit", spec(0).key, fit_identity(spec(0), CASE),
                 {"status": "timeout", "message": "ran past 300 s"})
    record = fit_or_skip(spec(1), CASE, COMPILED, str(tmp_path), 300.0, 100, None,
                         skip_after_timeout=True)
    assert ran == []
    assert record["status"] == NOT_RUN and record["after_timeout_of_seed"] == 0
    assert "seed 0" in record["message"] and "300 s" in record["message"]
    assert store.get("fit", spec(1).key)["status"] == NOT_RUN
    # a timeout of another configuration (other options) does not stop it
    fit_or_skip(spec(1, eta=0.1), CASE, COMPILED, str(tmp_path), 300.0, 100, None,
                skip_after_timeout=True)
    assert ran == [1]


@pytest.mark.parametrize("earlier", ["converged", "failed", None])
def test_a_seed_runs_when_no_lower_seed_timed_out(tmp_path, ran, earlier):
    store = RunStore(tmp_path)
    if earlier is not None:
        write_record(store, "fit", spec(0).key, fit_identity(spec(0), CASE), {"status": earlier})
    record = fit_or_skip(spec(1), CASE, COMPILED, str(tmp_path), 300.0, 100, None,
                         skip_after_timeout=True)
    assert ran == [1] and record["status"] == "converged"


def test_without_the_option_the_seed_runs_and_replaces_the_not_run_record(tmp_path, ran):
    store = RunStore(tmp_path)
    write_record(store, "fit", spec(0).key, fit_identity(spec(0), CASE), {"status": "timeout"})
    fit_or_skip(spec(1), CASE, COMPILED, str(tmp_path), 300.0, 100, None,
                skip_after_timeout=True)
    assert task_done(store, spec(1).key, SKIP)
    assert not task_done(store, spec(1).key, replace(SKIP, skip_after_timeout=False))
    record = fit_or_skip(spec(1), CASE, COMPILED, str(tmp_path), 300.0, 100, None)
    assert ran == [1] and record["status"] == "converged"
    assert store.get("fit", spec(1).key)["status"] == "converged"


def test_plan_counts_not_run_records_as_done_only_with_the_option(tmp_path, ran):
    store = RunStore(tmp_path)
    write_record(store, "fit", spec(0).key, fit_identity(spec(0), CASE), {"status": "timeout"})
    for seed in (1, 2):
        fit_or_skip(spec(seed), CASE, COMPILED, str(tmp_path), 300.0, 100, None,
                    skip_after_timeout=True)
    assert plan_status([CASE], tmp_path, SKIP)["done"] == 3
    assert plan_status([CASE], tmp_path, replace(SKIP, skip_after_timeout=False))["done"] == 1


def test_not_run_seeds_count_as_runs_without_a_normal_outcome(tmp_path, ran):
    store = RunStore(tmp_path)
    write_record(store, "fit", spec(0).key, fit_identity(spec(0), CASE),
                 {"status": "timeout", "message": "ran past 300 s"})
    for seed in (1, 2):
        fit_or_skip(spec(seed), CASE, COMPILED, str(tmp_path), 300.0, 100, None,
                    skip_after_timeout=True)
    (row,) = model_rows(group_runs(store.records("fit")), {"a/one": 3})
    assert row["runs"] == 3 and row["ok"] == 0
    assert "not_run: seed 0 of this configuration ran past the batch's 300 s limit" in \
        row["failures"]


def test_the_option_reaches_the_tasks_and_orders_them(monkeypatch, tmp_path):
    """run_batch submits seed-major and passes the option to every fit task."""
    submitted = []

    class Future:
        def __init__(self, value):
            self.value = value

        def result(self):
            return self.value

    class Client:
        def submit(self, fn, *args, **kw):
            if fn is runner.fit_or_skip:
                submitted.append((args[0].seed, args[0].model, args[8]))
                return Future({"status": "converged"})
            return Future({"status": "ok", "dim": 3, "library": "x.so"})

        def processing(self):
            return {}

        def nthreads(self):
            return {"w": 1}

    monkeypatch.setattr(runner, "require_dask", lambda: None)
    import distributed   # noqa: PLC0415

    class Completed:   # distributed.as_completed: the futures given and added, in turn
        def __init__(self, futures):
            self.futures = list(futures)

        def add(self, future):
            self.futures.append(future)

        def __iter__(self):
            while self.futures:
                yield self.futures.pop(0)

    monkeypatch.setattr(distributed, "as_completed", Completed)
    models = [CASE, ModelCase("b/two", Path("b/two.stan"), Path("b/two.json"), "json")]
    runner.run_batch(models, tmp_path, SKIP, client=Client(), progress=False)
    assert submitted == [(0, "a/one", True), (0, "b/two", True), (1, "a/one", True),
                         (1, "b/two", True), (2, "a/one", True), (2, "b/two", True)]


def _run_on_dask(tmp_path, monkeypatch, stored: int, compiled_here: int) -> list[tuple[str, int]]:
    """Run a 3-seed batch on a real in-process Dask cluster (one thread): ``stored`` models
    with their compile and NUTS reference in the store, ``compiled_here`` with only the
    reference (their compile is a task, 0.2 s); the (model, seed) of each fit, in the order
    the fits ran."""
    import time   # noqa: PLC0415

    from distributed import Client, LocalCluster   # noqa: PLC0415

    from stanvi.batch.child import reference_file   # noqa: PLC0415

    order: list[tuple[str, int]] = []

    def fake_run_job(job, timeout):
        order.append((job["model"], job["seed"]))
        return {"status": "converged", "final_elbo": -1.0}

    store = RunStore(tmp_path)
    library = tmp_path / "model.so"
    library.write_bytes(b"")

    def fake_compile(case, runs_dir, timeout):
        time.sleep(0.2)
        return {"status": "ok", "dim": 3, "library": str(library)}

    monkeypatch.setattr(tasks, "run_job", fake_run_job)
    monkeypatch.setattr(runner, "compile_task", fake_compile)
    cases = [ModelCase(f"m/{i}", Path(f"m/{i}.stan"), Path(f"m/{i}.json"), "json")
             for i in range(stored + compiled_here)]
    for i, case in enumerate(cases):
        identity = {"model": case.name, "source": case.source}
        if i < stored:
            write_record(store, "compile", case.name, identity,
                         {"status": "ok", "dim": 3, "library": str(library)})
        write_record(store, "reference", case.name, {**identity, "method": "nuts"},
                     {"status": "ok"})
        reference_file(tmp_path, case.name).parent.mkdir(exist_ok=True)
        reference_file(tmp_path, case.name).write_bytes(b"")
    config = replace(SKIP, reference="nuts")
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:
        runner.run_batch(cases, tmp_path, config, client=client, progress=False)
    assert len(order) == 3 * len(cases)
    return order


def test_fits_run_seed_major_on_dask_when_the_references_are_stored(tmp_path, monkeypatch):
    """On a real (in-process) Dask cluster, with every model's NUTS reference already in the
    store, every seed 0 runs before any seed 1: a stored reference is not a task the fits wait
    on (a waiting fit would let another model's seeds 1-2 go first and so defeat the skip)."""
    order = _run_on_dask(tmp_path, monkeypatch, stored=8, compiled_here=0)
    assert [seed for _, seed in order] == sorted(seed for _, seed in order)


def test_each_model_runs_its_seeds_in_order_when_some_models_compile(tmp_path, monkeypatch):
    """With some compiles run as tasks, Dask's scheduler-side queue held back the seed-0 fits
    it had counted as root-ish while later-submitted seeds ran (T3-4, 2026-12-07: seed 1 of
    34 models before their seed 0). The batch now hands Dask two fits per thread in its own
    order: every model's seeds run 0, 1, 2, and the stored models' seeds 0 all come first."""
    order = _run_on_dask(tmp_path, monkeypatch, stored=8, compiled_here=6)
    for model in {name for name, _ in order}:
        assert [seed for name, seed in order if name == model] == [0, 1, 2], order
    assert {seed for _, seed in order[:8]} == {0}, order
