"""Running a batch on Dask (issue P2-2, "Running it").

:func:`run_batch` plans a compile task per model and a fit task per (model, method, profile,
family, seed) (:mod:`stanvi.batch.tasks`), and runs them on a Dask distributed cluster:

* by default a :class:`distributed.LocalCluster` of ``workers`` processes (default: the number of
  CPUs) with one thread each, so that each worker runs one task (one fit process) at a time;
* with ``scheduler="tcp://host:port"`` an existing cluster, started with ``dask scheduler`` and
  ``dask worker tcp://host:port --nthreads 1`` on each machine.  The workers must see the runs
  directory and the model files at the same paths, and should share stanvi's cache directory
  (``$STANVI_CACHE_DIR``) so that a model compiles once per cluster; docs/batch.md.

A model's fits are submitted once its compile (and NUTS reference) is done, two per worker
thread at a time, in the batch's order (:mod:`stanvi.batch.feeder`); they run on any worker
(workers load the library by path).  Tasks whose record is in the store
already are not submitted (a re-run resumes).  When a worker dies while running a task (``kill
-9``, the OOM killer), the scheduler runs the task again on another worker; a task that has
killed ``distributed.scheduler.allowed-failures`` + 1 workers (Dask's default: 4) is recorded
here as ``lost`` with Dask's reason, and the batch goes on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stanvi.batch.discover import ModelCase
from stanvi.batch.feeder import FitFeeder, fit_slots
from stanvi.batch.store import RunStore
from stanvi.batch.tasks import (NOT_RUN, FitSpec, compile_record_usable, compile_task,
                                fit_identity, fit_task, reference_record_usable, reference_task,
                                write_record)
from stanvi.errors import require_extra
from stanvi.progress import TaskProgress

__all__ = ["BatchConfig", "check_config", "plan", "run_batch", "task_done", "OK_STATUSES",
           "NOT_RUN"]

# Fit statuses that are a method's normal outcome; every other status counts as failed.
OK_STATUSES = ("converged", "max_iters", "budget", "sampled")


@dataclass(frozen=True)
class BatchConfig:
    """What to run on every model: ``methods`` as (method, profile or None) pairs."""

    methods: tuple[tuple[str, str | None], ...] = (("trustvi", None), ("advi", None))
    families: tuple[str, ...] = ("meanfield",)
    seeds: int = 5
    options: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)
    max_dim: int | None = None
    fullrank_max_dim: int | None = 100
    timeout: float | None = 600.0
    compile_timeout: float | None = 1800.0
    draws: int = 2000
    #: 'nuts': a NUTS reference for every model the collection gives none
    #: (:mod:`stanvi.batch.nuts_reference`), the fits' accuracy computed against it
    reference: str | None = None
    reference_timeout: float | None = 3600.0
    #: run the seeds seed-major (every configuration's seed 0 first), and give a seed whose
    #: configuration timed out on a lower seed a ``not_run`` record instead of running it
    #: (docs/batch.md#skip-after-timeout)
    skip_after_timeout: bool = False


def check_config(config: BatchConfig) -> None:
    """Raise ValueError/TypeError naming a method, profile, option or family the batch cannot
    run, before any task starts."""
    from stanvi.batch.reference_job import (REFERENCE_METHODS,  # noqa: PLC0415
                                            check_reference_method)
    from stanvi.methods import get_method, make_options  # noqa: PLC0415

    for method, profile in config.methods:
        options = dict(config.options.get(method, {}))
        if method in REFERENCE_METHODS:
            check_reference_method(method, profile, options)
        else:
            make_options(get_method(method), profile, options)
            if not _families_for(method, config.families):
                only = get_method(method).FAMILIES_SUPPORTED
                raise ValueError(f"method {method!r} fits the {' or '.join(only)} family only: "
                                 f"add it to --family (e.g. --family meanfield,{only[0]})")
    bad = [f for f in config.families if f not in ("meanfield", "fullrank", "lowrank")]
    if bad:
        raise ValueError(f"unknown family {bad[0]!r}; choose meanfield, fullrank or lowrank "
                         f"(its default rank)")
    if config.reference not in (None, "nuts"):
        raise ValueError(f"unknown reference {config.reference!r}; the batch computes 'nuts'")
    if config.seeds < 1:
        raise ValueError(f"seeds must be at least 1, got {config.seeds}")


def plan(cases: Iterable[ModelCase], config: BatchConfig) -> list[tuple[ModelCase, FitSpec]]:
    """Every (case, fit) of the batch, model by model; ``options`` by method name."""
    from stanvi.batch.reference_job import NO_FAMILY  # noqa: PLC0415

    out = []
    for case in cases:
        for method, profile in config.methods:
            # Stan's Pathfinder and NUTS have no family choice: one task per seed.
            families = ((NO_FAMILY,) if method in ("pathfinder", "nuts")
                        else _families_for(method, config.families))
            for family in families:
                for seed in range(config.seeds):
                    out.append((case, FitSpec(case.name, method, family, profile, seed,
                                              dict(config.options.get(method, {})))))
    return out


def task_done(store: RunStore, key: str, config: BatchConfig) -> bool:
    """Whether the fit task ``key`` has its record: any record, except that a ``not_run`` one
    (left by ``skip_after_timeout``) counts only while the batch skips after timeouts; without
    it the seed runs, and its record replaces the ``not_run`` one."""
    found = store.get("fit", key)
    return found is not None and (found.get("status") != NOT_RUN or config.skip_after_timeout)


def seed_major(todo: list[tuple[ModelCase, FitSpec]]) -> list[tuple[ModelCase, FitSpec]]:
    """``todo`` with every seed 0 first, then every seed 1, ...; in plan order within a seed
    (Dask starts the tasks it can run in the order they were submitted)."""
    return sorted(todo, key=lambda item: item[1].seed)   # sorted() is stable


def earlier_seed_keys(spec: FitSpec) -> tuple[str, ...]:
    """The task keys of ``spec``'s configuration on its lower seeds."""
    from dataclasses import replace  # noqa: PLC0415

    return tuple(replace(spec, seed=s).key for s in range(spec.seed))


def _families_for(method: str, families: tuple[str, ...]) -> tuple[str, ...]:
    """The batch's families that ``method`` fits: all of them, or for a method that names the
    families it supports (``FAMILIES_SUPPORTED``: gsm fits the full-rank family only, bam also
    the low-rank one)
    those among them."""
    from stanvi.methods import METHODS  # noqa: PLC0415

    only = getattr(METHODS.get(method), "FAMILIES_SUPPORTED", None)
    return tuple(f for f in families if only is None or f in only)


def _dim_limit(config: BatchConfig, family: str) -> int | None:
    limits = [x for x in (config.max_dim, config.fullrank_max_dim if family == "fullrank"
                          else None) if x is not None]
    return min(limits) if limits else None


def fit_or_skip(spec: FitSpec, case: ModelCase, compiled: dict, runs_dir: str,
                timeout: float | None, draws: int, max_dim: int | None,
                reference: dict | None = None, skip_after_timeout: bool = False) -> dict:
    """:func:`~stanvi.batch.tasks.fit_task`, or a ``skipped`` record when the compiled model's
    dimension is over ``max_dim`` (known only once it is compiled), or with
    ``skip_after_timeout`` a ``not_run`` record when a lower seed of the configuration has a
    ``timeout`` record (looked up when the task starts: docs/batch.md#skip-after-timeout)."""
    dim = compiled.get("dim")
    if max_dim is not None and dim is not None and dim > max_dim:
        store = RunStore(runs_dir)
        found = store.get("fit", spec.key)
        return found if found is not None else write_record(
            store, "fit", spec.key, fit_identity(spec, case),
            {"status": "skipped", "message": f"dimension {dim} is over the batch's limit {max_dim}"})
    if skip_after_timeout and compiled.get("status") == "ok":
        store = RunStore(runs_dir)
        for key in earlier_seed_keys(spec):
            earlier = store.get("fit", key)
            if earlier is not None and earlier.get("status") == "timeout":
                limit = f" {timeout:g} s" if timeout is not None else ""
                return write_record(store, "fit", spec.key, fit_identity(spec, case), {
                    "status": NOT_RUN, "after_timeout_of_seed": earlier.get("seed"),
                    "message": f"seed {earlier.get('seed')} of this configuration ran past "
                               f"the batch's{limit} limit, so this seed was not run "
                               f"(--skip-after-timeout)"})
    return fit_task(spec, case, compiled, runs_dir, timeout, draws, reference)


def reference_or_skip(case: ModelCase, compiled: dict, runs_dir: str, timeout: float | None,
                      max_dim: int | None) -> dict:
    """:func:`~stanvi.batch.tasks.reference_task`, or a ``skipped`` record over ``max_dim``."""
    dim = compiled.get("dim")
    if max_dim is not None and dim is not None and dim > max_dim:
        return {"status": "skipped", "message": f"dimension {dim} is over the limit {max_dim}"}
    return reference_task(case, compiled, runs_dir, timeout)


def _cases_to_prepare(cases: Sequence[ModelCase], todo: list, config: BatchConfig,
                      store: RunStore, runs_dir: str) -> list[ModelCase]:
    """The models that need a compile record or a NUTS reference here: those with fits to run,
    and with ``reference='nuts'`` every runnable model without a usable reference record."""
    out = {case.name: case for case, _ in todo}
    if config.reference == "nuts":
        for case in cases:
            if case.skip is not None or case.reference is not None or case.name in out:
                continue
            if not reference_record_usable(store.get("reference", case.name), runs_dir):
                out[case.name] = case
    return list(out.values())


def _client(scheduler: str | None, workers: int | None):
    from distributed import Client, LocalCluster  # noqa: PLC0415

    if scheduler:
        try:
            return Client(scheduler, timeout=SCHEDULER_TIMEOUT), None
        except OSError as exc:   # one line, not Dask's traceback (issue T3-2 item 7)
            raise ConnectionError(f"cannot reach the Dask scheduler at {scheduler} within "
                                  f"{SCHEDULER_TIMEOUT:g} s ({exc}); is it running, and is the "
                                  f"address right?") from None
    cluster = LocalCluster(n_workers=workers or os.cpu_count() or 1, threads_per_worker=1,
                           processes=True, dashboard_address=":0", silence_logs=40)
    return Client(cluster), cluster


def require_dask() -> None:
    """Raise :class:`~stanvi.errors.MissingExtraError` naming the ``batch`` extra when Dask's
    ``distributed`` is not installed (a single fit does not need it)."""
    require_extra("distributed", "batch", "stanvi batch runs its tasks on Dask")


#: Seconds to wait for a Dask scheduler given by address.
SCHEDULER_TIMEOUT = 10.0


def run_batch(cases: Sequence[ModelCase], runs_dir: str | Path, config: BatchConfig = BatchConfig(),
              *, scheduler: str | None = None, workers: int | None = None,
              progress: bool = True, client=None) -> dict[str, int]:
    """Run the batch; returns counts of fit records by status (this run's and earlier ones').
    Every finished task's record is in ``runs_dir`` (:class:`~stanvi.batch.store.RunStore`)."""
    require_dask()
    from distributed import as_completed  # noqa: PLC0415

    check_config(config)
    runs_dir = str(Path(runs_dir).expanduser().resolve())
    store = RunStore(runs_dir)
    work = plan(cases, config)
    todo = [(case, spec) for case, spec in work if not task_done(store, spec.key, config)]
    if config.skip_after_timeout:
        todo = seed_major(todo)
    own_client = client is None
    cluster = None
    if own_client:
        client, cluster = _client(scheduler, workers)
    bar = None
    try:
        compiles: dict[str, Any] = {}
        futures: dict[Any, tuple[ModelCase, FitSpec | None]] = {}
        references: dict[str, Any] = {}
        for case in _cases_to_prepare(cases, todo, config, store, runs_dir):
            found = store.get("compile", case.name)
            compiles[case.name] = found if compile_record_usable(found, runs_dir) else \
                client.submit(compile_task, case, runs_dir, config.compile_timeout, pure=False,
                              key=f"compile-{case.name}-{time.time_ns()}")
            if config.reference == "nuts" and case.reference is None:
                found = store.get("reference", case.name)
                if reference_record_usable(found, runs_dir):
                    # given as it is, not as a task: a fit waiting on a task lets other
                    # models' later seeds run first, which defeats the seed-major order
                    references[case.name] = found
                    continue
                references[case.name] = fut = client.submit(
                    reference_or_skip, case, compiles[case.name], runs_dir,
                    config.reference_timeout, config.max_dim, pure=False,
                    key=f"reference-{case.name}-{time.time_ns()}")
                futures[fut] = (case, None)
        # the compiles and references computed here: the feeder submits a model's fits once
        # they are done (docs/batch.md#skip-after-timeout)
        waits = [fut for fut in compiles.values() if hasattr(fut, "done")]

        def submit_fit(case: ModelCase, spec: FitSpec, compiled: Any, reference: Any) -> Any:
            return client.submit(fit_or_skip, spec, case, compiled, runs_dir, config.timeout,
                                 config.draws, _dim_limit(config, spec.family), reference,
                                 config.skip_after_timeout, pure=False,
                                 key=f"fit-{spec.key}-{time.time_ns()}",
                                 priority=-spec.seed if config.skip_after_timeout else 0)

        feeder = FitFeeder(todo, lambda case: (compiles[case.name], references.get(case.name)),
                           submit_fit, lambda: fit_slots(client))
        # the progress counts fits and the NUTS references computed here
        n_reference_tasks = len(futures)
        bar = TaskProgress(len(work) + n_reference_tasks, enabled=progress,
                           already_done=len(work) - len(todo))
        pending = as_completed(waits + list(futures))

        def feed() -> None:   # fits into the free slots, watched with the rest
            for new, case, spec in feeder.refill():
                futures[new] = (case, spec)
                pending.add(new)

        feed()
        last_poll = 0.0
        for fut in pending:
            role = futures.pop(fut, None)
            if role is not None:   # a fit or a reference (a compile only wakes the feeder)
                case, spec = role
                record = _outcome(fut, case, spec, store)
                ok = record.get("status") in (OK_STATUSES if spec is not None else ("ok", "skipped"))
                if spec is not None:
                    feeder.finished_one()
                running = None
                if time.perf_counter() - last_poll > 1.0:  # tasks on workers, one per thread
                    last_poll = time.perf_counter()
                    running = min(sum(len(v) for v in client.processing().values()),
                                  sum(client.nthreads().values()))
                bar.update(done=1, failed=int(not ok), running=running)
            feed()
        if len(feeder):   # cannot happen: every fit waits on futures that wake this loop
            raise RuntimeError(f"{len(feeder)} fit(s) were never submitted")
    finally:
        if bar is not None:
            bar.close()
        if own_client:
            client.close()
            if cluster is not None:
                cluster.close()
    counts: dict[str, int] = {}
    for record in store.records("fit"):
        counts[record.get("status", "?")] = counts.get(record.get("status", "?"), 0) + 1
    store.sync()
    unreadable = store.unreadable()
    if unreadable:   # their tasks ran again in this batch (RunStore.get)
        from stanvi.log import get_logger  # noqa: PLC0415

        get_logger("batch").warning(f"{len(unreadable)} record file(s) could not be read; "
                                    f"they were moved to records/<kind>/unreadable/ and their "
                                    f"tasks run again: {'; '.join(unreadable[:5])}")
    return counts


def _outcome(fut, case: ModelCase, spec: FitSpec | None, store: RunStore) -> dict:
    """The task's record (a fit's, or with ``spec`` None the model's NUTS reference); a task
    that raised in Dask (a worker died under it too often, or a scheduler error) is recorded
    here as ``lost`` with the reason."""
    try:
        return fut.result()
    except Exception as exc:  # noqa: BLE001 — KilledWorker, CancelledError, ...
        kind, key = ("fit", spec.key) if spec is not None else ("reference", case.name)
        found = store.get(kind, key)
        if found is not None:
            return found
        identity = (fit_identity(spec, case) if spec is not None else
                    {"model": case.name, "source": case.source, "method": "nuts"})
        return write_record(store, kind, key, identity,
                            {"status": "lost", "message": f"{type(exc).__name__}: {exc}"})
