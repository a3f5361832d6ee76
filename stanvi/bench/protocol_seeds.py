"""``stanvi bench protocol --records DIR[,DIR...]``: the TrustVI paper's protocol
(docs/algorithms.md#benchmark-protocol) over batch stores, seed by seed
(docs/batch.md#protocol-by-seed).

The report's protocol table compares each model's median run over the seeds it has.  Where a
store holds more seeds of some models than of others (a protocol stopped part way through its
later seeds, as the T3-4 run was), that table mixes one-seed and three-seed comparisons.  This
prints each comparison for every seed alone over every model that has it, for the median run,
and, where only some models have every seed, the same over those models; beside it the
outcomes of each configuration per seed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stanvi.batch.report import protocol_comparisons
from stanvi.batch.summary import config_of, group_runs, pair_summary, protocol_pairs

__all__ = ["protocol_by_seed", "outcomes_by_seed", "table_text", "check_stores"]

#: fit records that are not runs (the report leaves them out too)
NOT_RUNS = ("skipped", "not_compiled")


def _seed(record: dict) -> int:
    return int(record.get("seed") or 0)


def outcomes_by_seed(records: Iterable[dict[str, Any]]) -> dict[tuple[str, int], Counter]:
    """(configuration, seed) → how many of its fit records have each status."""
    out: dict[tuple[str, int], Counter] = defaultdict(Counter)
    for r in records:
        if r.get("status") not in NOT_RUNS:
            out[(config_of(r), _seed(r))][r.get("status", "?")] += 1
    return dict(sorted(out.items()))


def protocol_by_seed(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per comparison (the report's :func:`protocol_comparisons`) and view: every
    model's median run over its seeds (the report's table), each seed alone over the models
    that have it, and, where fewer models have every seed, the models with every seed (median
    run, then each seed that more models have).  A row holds :func:`pair_summary`'s counts
    (``ratios`` left out)."""
    fits = [r for r in records if r.get("status") not in NOT_RUNS]
    configs = sorted({config_of(r) for r in fits})
    traced = {config_of(r) for r in fits if r.get("trace_points")}
    rows = []
    for tested, baseline in protocol_comparisons(configs, traced):
        mine = [r for r in fits if config_of(r) in (tested, baseline)]
        seeds = sorted({_seed(r) for r in mine})
        have: dict[str, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
        for r in mine:
            have[r["model"]][config_of(r)].add(_seed(r))
        every = {m for m, c in have.items()
                 if c[tested].issuperset(seeds) and c[baseline].issuperset(seeds)}
        views = [("every model, median run over its seeds", mine)]
        views += [(f"every model with seed {s}, seed {s}", [r for r in mine if _seed(r) == s])
                  for s in seeds]
        if len(seeds) > 1 and every and len(every) < len(have):
            with_all = [r for r in mine if r["model"] in every]
            views.append((f"the {len(every)} models with every seed, median run", with_all))
            # a seed that only those models have is already above
            views += [(f"the {len(every)} models with every seed, seed {s}",
                       [r for r in with_all if _seed(r) == s]) for s in seeds
                      if {m for m, c in have.items() if s in c[tested] | c[baseline]} != every]
        for view, recs in views:
            summary = pair_summary(protocol_pairs(group_runs(recs), tested, baseline))
            rows.append({"tested": tested, "baseline": baseline, "view": view,
                         **{k: v for k, v in summary.items() if k != "ratios"}})
    return rows


def _share(count: int, of: int) -> str:
    return f"{count} ({100 * count / of:.0f} %)" if of else str(count)


def table_text(rows: list[dict[str, Any]], outcomes: dict[tuple[str, int], Counter]) -> str:
    """The outcomes and the comparisons as text, shares of the kept models in percent."""
    lines = ["outcomes per configuration and seed:"]
    for (config, seed), counts in outcomes.items():
        lines.append(f"  {config:32s} seed {seed}: {sum(counts.values()):4d} runs  "
                     + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for r in rows:
        if r["view"].startswith("every model, median"):
            lines.append(f"\n{r['tested']} against {r['baseline']}:")
        median = "–" if r["median_ratio"] is None else f"{r['median_ratio']:.1f}×"
        lines.append(
            f"  {r['view']:48s} models {r['models']:4d}  better/tie/worse/not judged "
            f"{r['tested_better']}/{r['tie']}/{r['baseline_better']}/{r['not_judged']}  kept "
            f"{r['kept']}  fewer calls {_share(r['faster'], r['kept'])}  ≥12× "
            f"{_share(r['ge_12x'], r['kept'])}  ≥36× {_share(r['ge_36x'], r['kept'])}  "
            f"median ratio {median}")
    lines.append("better/tie/worse: final ELBO of the tested configuration's (median) run against "
                 "the baseline's, ties within 1 nat; kept: both runs took at least 5 iterations "
                 "(docs/algorithms.md#benchmark-protocol); the ratio: the baseline's oracle "
                 "calls to the threshold over the tested one's.")
    return "\n".join(lines)


def check_stores(dirs: Iterable[str | Path]) -> str:
    """:func:`table_text` over the fit records of batch stores."""
    from stanvi.batch.store import records_of_stores  # noqa: PLC0415

    records = records_of_stores(dirs)
    return table_text(protocol_by_seed(records), outcomes_by_seed(records))
