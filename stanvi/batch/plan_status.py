"""What a batch has done and what it has left, read from its store without running anything:
``stanvi batch SOURCE ... --out RUNS --plan`` (docs/batch.md#plan).

A long batch is run in pieces, across sessions and machines, and the progress bar of a running
one counts tasks, not models.  Counting the records alone misleads: a model the batch has not
reached yet has no records at all, so a count over the records' models says nothing of it
(the T3-4 state of 2026-12-06, 20:11 read "every model found has its records" with 58
runnable models of example-models' ``knitr/``, ``misc/`` and ``regression_tests/`` not yet
reached).  The plan starts from the models of the source, as the batch does
(:func:`stanvi.batch.runner.plan`), and asks the store for each of their tasks.

Tasks of a model not yet compiled are counted as planned: those on a model that does not
compile, does not load or is over ``--max-dim`` become skip records at once when the batch
reaches them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from stanvi.batch.discover import ModelCase
    from stanvi.batch.runner import BatchConfig

__all__ = ["plan_status", "format_plan_status"]


def plan_status(cases: Sequence["ModelCase"], runs_dir: str | Path,
                config: "BatchConfig") -> dict[str, Any]:
    """Per configuration and per model, the fit tasks of the batch (``cases``, ``config``: a
    :class:`~stanvi.batch.runner.BatchConfig`) and how many have a record in ``runs_dir``; with
    ``config.reference``, the runnable models without a reference record.  A runs directory
    that does not exist is read as empty (and is not created)."""
    from dataclasses import asdict  # noqa: PLC0415

    from stanvi.batch.runner import plan, task_done  # noqa: PLC0415
    from stanvi.batch.store import RunStore  # noqa: PLC0415
    from stanvi.batch.summary import config_of  # noqa: PLC0415

    work = plan(cases, config)
    runs = Path(runs_dir).expanduser()
    store = RunStore(runs) if (runs / "records").is_dir() else None
    planned, done = Counter(), Counter()
    per_model: dict[str, list[int]] = {c.name: [0, 0] for c in cases}
    for case, spec in work:
        have = store is not None and task_done(store, spec.key, config)
        config_name = config_of(asdict(spec))   # as the report names it
        planned[config_name] += 1
        done[config_name] += have
        per_model[case.name][0] += 1
        per_model[case.name][1] += have
    out = {"models": len(cases), "runnable": sum(c.skip is None for c in cases),
           "planned": sum(planned.values()), "done": sum(done.values()),
           "by_config": {k: {"planned": planned[k], "done": done[k]} for k in sorted(planned)},
           "complete": sum(1 for n, d in per_model.values() if n and d == n),
           "partial": [m for m, (n, d) in per_model.items() if 0 < d < n],
           "untouched": [m for m, (n, d) in per_model.items() if n and d == 0]}
    if config.reference:
        def over_max_dim(name: str) -> bool:   # its reference is skipped, with no record
            dim = ((store.get("compile", name) or {}).get("dim") if store is not None
                   else None)
            return config.max_dim is not None and dim is not None and dim > config.max_dim

        runnable = [c for c in cases if c.skip is None and c.reference is None
                    and not over_max_dim(c.name)]
        out["references_planned"] = len(runnable)
        out["references_missing"] = [c.name for c in runnable
                                     if store is None or not store.has("reference", c.name)]
    return out


def format_plan_status(status: dict[str, Any], shown: int = 10) -> str:
    """:func:`plan_status` as the lines ``stanvi batch --plan`` prints; ``shown``: how many
    model names to list per group."""
    def names(models: list[str]) -> str:
        more = len(models) - shown
        return ", ".join(models[:shown]) + (f", ... ({more} more)" if more > 0 else "")

    left = status["planned"] - status["done"]
    lines = [f"fit tasks: {status['planned']:,} planned, {status['done']:,} in the store, "
             f"{left:,} to run"]
    for name, c in status["by_config"].items():
        if c["planned"] > c["done"]:
            lines.append(f"  {name}: {c['planned'] - c['done']:,} to run of {c['planned']:,}")
    lines.append(f"models: {status['models']:,} ({status['runnable']:,} runnable): "
                 f"{status['complete']:,} with every fit task in the store, "
                 f"{len(status['partial']):,} with some, {len(status['untouched']):,} with none")
    if status["partial"]:
        lines.append(f"  with some: {names(status['partial'])}")
    if status["untouched"]:
        lines.append(f"  not reached: {names(status['untouched'])}")
    if "references_missing" in status:
        missing = status["references_missing"]
        planned = status["references_planned"]
        lines.append(f"NUTS references: {planned - len(missing):,} of the {planned:,} runnable "
                     f"models without reference draws (and not over --max-dim) have a record, "
                     f"{len(missing):,} to run" + (f" ({names(missing)})" if missing else ""))
    if left:
        lines.append("(tasks on models not yet compiled include those that become skip records "
                     "at once: a model that does not compile or load, or is over --max-dim)")
    return "\n".join(lines)
