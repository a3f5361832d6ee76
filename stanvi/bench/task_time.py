"""``stanvi bench task-time --records DIR[,DIR...]``: where a batch run's task time went, per
configuration, from its records (docs/batch.md#partial-records).

A fit task's time is its method's fit and the evaluation the record needs after it: the output
draws (constrained, with their log densities), the ELBO on the common draws, the k̂ verdict and
the protocol's trace.  Each record written since 2026-12-02 holds the seconds of each stage
(``stage_seconds``); older ones hold only the task's total (``task_seconds``) and the fit's own
``wall_time``.  The table sums them per configuration: task hours, the fits' own wall hours, the
hours of each stage where recorded, the hours spent on tasks stopped at their timeout (a
``timeout`` record, or a partial record with ``incomplete``, whose fit had finished), so a
reader sees what a cheaper evaluation or a longer timeout would buy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stanvi.batch.summary import config_of

__all__ = ["STAGES", "task_time_table", "table_text", "check_stores"]

#: The stages of a fit record, in the order they run (:func:`stanvi.batch.child.fit_job`)
STAGES = ("fit", "elbo", "verdict", "trace")


def task_time_table(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration (and a last row ``all``): ``tasks``, ``task_h`` (the tasks'
    ``task_seconds``), ``wall_h`` (the fits' own ``wall_time``), ``staged`` (records with
    ``stage_seconds``) and ``<stage>_h`` summed over them, ``timeouts`` and ``timeout_h`` (tasks
    stopped at their timeout before their fit finished), ``incomplete`` and ``incomplete_h``
    (partial records: the fit finished, the timeout or a crash stopped its evaluation).
    Skipped and not-compiled fits are left out."""
    rows: dict[str, dict[str, Any]] = defaultdict(lambda: {
        "tasks": 0, "task_h": 0.0, "wall_h": 0.0, "staged": 0,
        **{f"{s}_h": 0.0 for s in STAGES}, "timeouts": 0, "timeout_h": 0.0,
        "incomplete": 0, "incomplete_h": 0.0})
    for r in records:
        if r.get("status") in ("skipped", "not_compiled"):
            continue
        hours = float(r.get("task_seconds") or 0.0) / 3600.0
        for key in (config_of(r), "all"):
            row = rows[key]
            row["tasks"] += 1
            row["task_h"] += hours
            row["wall_h"] += float(r.get("wall_time") or 0.0) / 3600.0
            stages = r.get("stage_seconds") or {}
            if stages:
                row["staged"] += 1
                for s in STAGES:
                    row[f"{s}_h"] += float(stages.get(s) or 0.0) / 3600.0
            if r.get("status") == "timeout":
                row["timeouts"] += 1
                row["timeout_h"] += hours
            if r.get("incomplete"):
                row["incomplete"] += 1
                row["incomplete_h"] += hours
    ordered = sorted((k for k in rows if k != "all"), key=lambda k: -rows[k]["task_h"])
    return [{"config": k, **rows[k]} for k in ordered + (["all"] if "all" in rows else [])]


def table_text(rows: list[dict[str, Any]]) -> str:
    """The table as text: hours to two decimals, counts as integers."""
    head = (f"{'configuration':32s} {'tasks':>6s} {'task h':>7s} {'wall h':>6s} {'staged':>6s} "
            + " ".join(f"{'[' + s + '] h':>9s}" for s in STAGES)
            + f" {'timeouts':>8s} {'(h)':>6s} {'incompl.':>8s} {'(h)':>6s}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['config']:32s} {r['tasks']:6d} {r['task_h']:7.2f} {r['wall_h']:6.2f} "
                     f"{r['staged']:6d} "
                     + " ".join(f"{r[s + '_h']:9.2f}" for s in STAGES)
                     + f" {r['timeouts']:8d} {r['timeout_h']:6.2f} {r['incomplete']:8d}"
                     f" {r['incomplete_h']:6.2f}")
    lines.append("task h: the tasks' own time (one worker's hours); wall h: the fits' wall time; "
                 "[stage] h: over the 'staged' records (written with stage_seconds); timeouts: "
                 "stopped before their fit finished; incompl.: partial records (the fit "
                 "finished, its evaluation was stopped).")
    return "\n".join(lines)


def check_stores(dirs: Iterable[str | Path]) -> str:
    """:func:`table_text` over the fit records of batch stores."""
    from stanvi.batch.store import records_of_stores  # noqa: PLC0415

    records = records_of_stores(dirs)
    return table_text(task_time_table(records))
