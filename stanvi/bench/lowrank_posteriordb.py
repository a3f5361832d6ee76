"""``stanvi bench lowrank --records DIR_OR_FITS_CSV[,...]``: issue T3-6's posteriordb targets from
batch records, or from a report's ``fits.csv`` where a run's raw records are gone
(docs/benchmarks.md#lowrank-posteriordb).

Per posterior, the median over seeds of each configuration's W1/sd and standardized mean error
against the reference draws (median over marginals, constrained space) and of its model
evaluations per fit (``draw_evaluations``: everything the method evaluated; the diagnostics'
draws are not in it); then, over the posteriors that every compared configuration fitted, the
median of those medians and the three targets:

* TrustVI low-rank's W1/sd within 1.5× TrustVI full-rank's (posteriors with D ≤ 100: all 46);
* TrustVI low-rank's W1/sd below multi-path Pathfinder's;
* TrustVI low-rank's evaluations per fit at most 2× TrustVI mean-field's.

The posterior-level ratios are printed too (how many posteriors meet each target one by one).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.batch.verdict_check import config, fit_records, mean_error, w1_error

LOWRANK = "trustvi:default:lowrank"
FULLRANK = "trustvi:default:fullrank"
MEANFIELD = "trustvi:default:meanfield"
PATHFINDER = "pathfinder:multi:none"
COLUMNS = (LOWRANK, FULLRANK, PATHFINDER, MEANFIELD)


OK = ("converged", "max_iters", "max_oracle", "ok")


def per_posterior(records: Iterable[dict[str, Any]], ok: tuple[str, ...] = OK,
                  extra: dict[str, Any] | None = None) -> dict[str, dict[str, dict[str, float]]]:
    """{configuration: {posterior: {"w1", "mean_error", "evaluations", "seeds", *extra}}}:
    medians over the seeds whose status is in ``ok`` and that have a reference accuracy;
    ``extra`` maps more figures' names to functions of a record."""
    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        if r.get("status") in ok and mean_error(r) is not None:
            runs[(config(r), r.get("model"))].append(r)
    figures = {"w1": w1_error, "mean_error": mean_error,
               "evaluations": lambda r: r.get("draw_evaluations") or 0, **(extra or {})}
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    for (cfg, model), rs in runs.items():
        out[cfg][model] = {k: float(np.median([f(r) for r in rs])) for k, f in figures.items()}
        out[cfg][model]["seeds"] = len(rs)
    return out


def targets(table: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """The medians over the posteriors common to every configuration present, and the targets."""
    present = [c for c in COLUMNS if table.get(c)]
    common = sorted(set.intersection(*(set(table[c]) for c in present))) if present else []
    med = {c: {k: float(np.median([table[c][p][k] for p in common])) if common else math.nan
               for k in ("w1", "mean_error", "evaluations")} for c in present}
    out: dict[str, Any] = {"posteriors": len(common), "medians": med}

    def ratio(a: str, b: str, key: str) -> float:
        return med[a][key] / med[b][key] if a in med and b in med and med[b][key] else math.nan

    def count(a: str, b: str, key: str, bound: float) -> int:
        if a not in med or b not in med:
            return 0
        return sum(table[a][p][key] <= bound * table[b][p][key] for p in common)

    out["w1_vs_fullrank"] = ratio(LOWRANK, FULLRANK, "w1")
    out["w1_vs_pathfinder"] = ratio(LOWRANK, PATHFINDER, "w1")
    out["evaluations_vs_meanfield"] = ratio(LOWRANK, MEANFIELD, "evaluations")
    # the other reading of "evaluations per fit <= 2x mean-field's": each posterior's own ratio
    per = ([table[LOWRANK][p]["evaluations"] / table[MEANFIELD][p]["evaluations"]
            for p in common if table[MEANFIELD][p]["evaluations"]]
           if LOWRANK in med and MEANFIELD in med else [])
    out["evaluations_vs_meanfield_per_posterior"] = float(np.median(per)) if per else math.nan
    out["posteriors_within_1.5x_fullrank_w1"] = count(LOWRANK, FULLRANK, "w1", 1.5)
    out["posteriors_below_pathfinder_w1"] = count(LOWRANK, PATHFINDER, "w1", 1.0)
    out["posteriors_within_2x_meanfield_evaluations"] = count(LOWRANK, MEANFIELD,
                                                              "evaluations", 2.0)
    return out


NUMERIC = ("mean_error_sd", "w1_sd", "draw_evaluations")


def csv_records(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a report's ``fits.csv`` (``stanvi report``) as flat records: the report of a
    run whose raw records are gone (posteriordb_runs/posteriordb_meanfield)."""
    import csv  # noqa: PLC0415

    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for key in NUMERIC:
            r[key] = float(r[key]) if r.get(key) not in (None, "") else None
    return rows


def check_stores(sources: Iterable[str | Path]) -> tuple[dict, dict]:
    """(per-posterior table, targets) over the fit records of batch stores and, for the
    configurations none of the stores has, the rows of reports' ``fits.csv`` files."""
    sources = [str(s) for s in sources]
    records = fit_records(s for s in sources if not s.endswith(".csv"))
    have = {config(r) for r in records}
    for src in (s for s in sources if s.endswith(".csv")):   # configurations no store has
        records += [r for r in csv_records(src) if config(r) not in have]
    table = per_posterior(records)
    return table, targets(table)


def report_text(table: dict, figures: dict) -> str:
    """The medians per configuration, the three targets and the posteriors one by one."""
    med = figures["medians"]
    lines = [f"over the {figures['posteriors']} posteriors every configuration fitted (median "
             "over posteriors of the median over seeds):",
             f"{'configuration':28s} {'W1/sd':>7s} {'mean err':>9s} {'evaluations':>12s}"]
    lines += [f"{c:28s} {m['w1']:7.3f} {m['mean_error']:9.3f} {m['evaluations']:12,.0f}"
              for c, m in med.items()]
    n = figures["posteriors"]
    lines += ["",
              f"low-rank W1/sd / full-rank's: {figures['w1_vs_fullrank']:.2f} (target <= 1.5; "
              f"{figures['posteriors_within_1.5x_fullrank_w1']} of {n} posteriors within 1.5x)",
              f"low-rank W1/sd / multi-path Pathfinder's: {figures['w1_vs_pathfinder']:.2f} "
              f"(target < 1; {figures['posteriors_below_pathfinder_w1']} of {n} posteriors "
              "at or below)",
              f"low-rank evaluations / mean-field's: {figures['evaluations_vs_meanfield']:.2f} "
              f"(target <= 2; {figures['posteriors_within_2x_meanfield_evaluations']} of {n} "
              "posteriors within 2x; the median of the posteriors' own ratios: "
              f"{figures['evaluations_vs_meanfield_per_posterior']:.2f})", "",
              f"{'posterior':44s}" + "".join(f"{c.split(':')[-1] if c.startswith('trustvi') else 'pathfinder':>12s}"
                                             for c in med) + "   (W1/sd)"]
    posteriors = sorted(set.intersection(*(set(table[c]) for c in med))) if med else []
    lines += [f"{p:44s}" + "".join(f"{table[c][p]['w1']:12.3f}" for c in med) for p in posteriors]
    return "\n".join(lines)
