"""``stanvi bench score-peers --records DIR[,DIR...]``: BaM and GSM beside TrustVI full-rank and
multi-path Pathfinder from batch records, and BaM low-rank (pBaM) beside TrustVI low-rank where
the records have both (issue T3-7; docs/benchmarks.md#bam-and-gsm-posteriordb).

Per configuration, over the posteriors with reference draws: fits that ended normally, then the
median, over the posteriors every configuration fitted, of each posterior's median over seeds of

* the final W1/sd and standardized mean error against the reference draws (median over
  marginals, constrained space; :mod:`stanvi.batch.verdict_check`'s readers);
* the model evaluations per fit (``draw_evaluations``: everything the method evaluated, its warm
  start included; the diagnostics' draws not);
* the evaluations to reach the run's own final accuracy: the first trace point after which the
  ELBO on the batch's 2,000 common draws stays within ``REACHED_NATS`` of the run's last one
  (:func:`stanvi.evaluation.protocol.first_consistent`); for a method that reports only its
  end (Pathfinder), its evaluations.

Then, posterior by posterior, where BaM or GSM beats TrustVI in the same family: a W1/sd at
least 10 % lower, or the same accuracy (within 10 %) for fewer evaluations.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.batch.summary import as_run
from stanvi.batch.verdict_check import config, fit_records, mean_error
from stanvi.bench.lowrank_posteriordb import per_posterior
from stanvi.evaluation.protocol import first_consistent

REACHED_NATS = 0.1
TRUSTVI = "trustvi:default:fullrank"
#: (TrustVI's configuration, the peer compared with it): full rank, and on the low-rank family
#: BaM's pBaM against TrustVI low-rank (when the records have them)
PAIRS = ((TRUSTVI, "bam:default:fullrank"), (TRUSTVI, "gsm:default:fullrank"),
         ("trustvi:default:lowrank", "bam:default:lowrank"))
OK = ("converged", "max_iters")


def evaluations_to_final(record: dict[str, Any]) -> float:
    """Model evaluations until the ELBO stays within ``REACHED_NATS`` of the run's last traced
    ELBO (its total where the record has no trace)."""
    run = as_run(record)
    finite = np.isfinite(run.trace_elbo)
    if not finite.any():
        return float(record.get("draw_evaluations") or math.nan)
    last = float(run.trace_elbo[np.flatnonzero(finite)[-1]])
    i = first_consistent(run, last - REACHED_NATS)
    return float(run.trace_draws[i]) if i is not None else float(record["draw_evaluations"])


def table(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{configuration: {posterior: medians over its normal seeds}} (and the fit counts)."""
    records = list(records)
    out = per_posterior(records, OK, {"to_final": evaluations_to_final})
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in records:
        counts[config(r)][1] += 1
        counts[config(r)][0] += r.get("status") in OK and mean_error(r) is not None
    for cfg, (ok, total) in counts.items():
        out[cfg]["__fits__"] = {"ok": ok, "total": total}
    return out


def summary_text(tab: dict[str, dict[str, dict[str, float]]]) -> str:
    """The per-configuration medians over the posteriors every configuration fitted, and the
    posteriors where a peer beats TrustVI."""
    sets = [set(v) - {"__fits__"} for v in tab.values()]
    common = set.intersection(*sets) if sets else set()
    lines = [f"medians over the {len(common)} posteriors every configuration fitted",
             "| configuration | fits ok / all | posteriors | W1/sd | mean error/sd | evaluations "
             "per fit | evaluations to its final accuracy |", "|---|---|---|---|---|---|---|"]
    for cfg in sorted(tab):
        per = {m: v for m, v in tab[cfg].items() if m in common}
        fits = tab[cfg].get("__fits__", {"ok": 0, "total": 0})
        med = {k: float(np.median([v[k] for v in per.values()])) if per else math.nan
               for k in ("w1", "mean_error", "evaluations", "to_final")}
        lines.append(f"| {cfg} | {fits['ok']} / {fits['total']} | {len(tab[cfg]) - 1} | "
                     f"{med['w1']:.3f} | "
                     f"{med['mean_error']:.3f} | {med['evaluations']:,.0f} | "
                     f"{med['to_final']:,.0f} |")
    for ours, peer in PAIRS:
        base, other = tab.get(ours, {}), tab.get(peer, {})
        if not base or not other:
            continue
        common = sorted(set(base) & set(other) - {"__fits__"})
        better = [m for m in common if other[m]["w1"] < 0.9 * base[m]["w1"]]
        cheaper = [m for m in common if m not in better
                   and other[m]["w1"] <= 1.1 * base[m]["w1"]
                   and other[m]["evaluations"] < base[m]["evaluations"]]
        lines += ["", f"{peer} against {ours} on {len(common)} posteriors: W1/sd ≥ 10 % "
                  f"lower on {len(better)}, as accurate (within 10 %) for fewer evaluations on "
                  f"{len(cheaper)}"]
        lines += [f"  {m}: W1/sd {other[m]['w1']:.3f} vs {base[m]['w1']:.3f}, evaluations "
                  f"{other[m]['evaluations']:,.0f} vs {base[m]['evaluations']:,.0f}"
                  for m in better + cheaper]
    return "\n".join(lines)


def check_stores(dirs: Iterable[str | Path]) -> str:
    """:func:`summary_text` over the fit records of batch stores."""
    return summary_text(table(fit_records(dirs)))
