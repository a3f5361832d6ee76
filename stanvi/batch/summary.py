"""What a batch's records say, as tables (issue P2-2, "Report"): per-model rows, the TrustVI
paper's protocol over pairs of configurations, and the figures of the closing summary.

A *configuration* is ``method:profile:family`` (``trustvi:default:meanfield``).  Per model and
configuration, the runs over seeds are summarized as in ``stanvi bench methods``: the median run
is the one whose final ELBO (10,000 draws common to every run of the model) is the median, a
failed run ranking −∞ (:func:`stanvi.evaluation.protocol.median_run`).

The protocol (docs/algorithms.md#benchmark-protocol; Regier et al. 2017, §5): for a pair of
configurations on a model, the threshold is the worse of the two median runs' final ELBOs minus
1 nat; each run's cost is its oracle calls at the first trace point after which every evaluation
ELBO stays at or above the threshold (:func:`~stanvi.evaluation.protocol.first_consistent`); a
pair is excluded when either reaches it in fewer than 5 iterations, or when a median run failed;
final ELBOs within 1 nat are a tie.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np

from stanvi.batch.runner import OK_STATUSES as OK  # a method's normal outcomes
from stanvi.evaluation.protocol import (RunSummary, first_consistent, median_run,
                                        protocol_pair)

__all__ = ["config_of", "profile_of", "finite_or", "group_runs", "model_rows", "protocol_pairs", "pair_summary"]


def profile_of(record: dict) -> str:
    """The profile the record's fit ran with.  A batch that names none (``--methods hfsgvi``)
    runs the method's ``DEFAULT_PROFILE`` (HFSGVI's is ``paper``, ADVI's ``stan``; Pathfinder's
    is ``multi``, NUTS's ``diag``), so that is the label: a generic "default" would read as the
    method's profile of that name, which is another set of options."""
    if record.get("profile"):
        return str(record["profile"])
    from stanvi.batch.reference_job import PROFILES  # noqa: PLC0415
    from stanvi.methods import METHODS  # noqa: PLC0415

    method = record.get("method")
    if method in METHODS:
        return str(METHODS[method].DEFAULT_PROFILE)
    named = [p for p in PROFILES.get(method, ()) if p]
    return named[0] if named else "default"


def config_of(record: dict) -> str:
    """``method:profile:family``, the configuration a report groups runs by."""
    return f"{record['method']}:{profile_of(record)}:{record.get('family', 'meanfield')}"


def finite_or(value, default: float = -math.inf) -> float:
    """``value`` as a float, or ``default`` where it is missing (None: the store writes a
    non-finite figure as null) or not finite."""
    return float(value) if value is not None and math.isfinite(float(value)) else default


def as_run(record: dict) -> RunSummary:
    """A fit record as a :class:`RunSummary` (records without protocol figures — a fit that
    timed out, crashed or raised — are failed runs with an empty trace)."""
    tp = record.get("trace_points") or {}
    arr = lambda key: np.array([finite_or(v) for v in tp.get(key, [])], dtype=float)  # noqa: E731
    failed = record.get("status") not in OK
    return RunSummary(
        config=config_of(record), seed=int(record.get("seed", 0)),
        status=record.get("status", "?"),
        final_elbo=-math.inf if failed else finite_or(record.get("final_elbo")),
        iterations=int(record.get("iterations") or 0),
        oracle=float((record.get("oracle") or {}).get("oracle_scaled", math.nan)),
        draw_evals=int(record.get("draw_evaluations") or 0),
        wall=float(record.get("run_time") or math.nan),
        trace_iter=arr("iteration").astype(int) if tp else np.zeros(0, int),
        trace_oracle=arr("oracle"), trace_draws=arr("draws"), trace_wall=arr("run_time"),
        trace_elbo=arr("elbo"))


def group_runs(records: Iterable[dict]) -> dict[str, dict[str, list[dict]]]:
    """model → configuration → its fit records (skipped and not-compiled fits left out)."""
    out: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r.get("status") in ("skipped", "not_compiled"):
            continue
        out[r["model"]][config_of(r)].append(r)
    return {m: dict(c) for m, c in sorted(out.items())}


def _median(values) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.median(vals)) if vals else None


def _worst(values) -> float | None:
    """The largest of the runs' figures; inf where a run has none (it cannot count as
    accurate), None without runs."""
    vals = list(values)
    if not vals:
        return None
    if any(v is None or not math.isfinite(v) for v in vals):
        return math.inf
    return float(max(vals))


def _accuracy(record: dict, figure: str) -> float | None:
    acc = ((record.get("accuracy") or {}).get("constrained") or {})
    return acc.get(f"{figure}_median")


def model_rows(grouped: dict[str, dict[str, list[dict]]], dims: dict[str, int]) -> list[dict]:
    """One row per (model, configuration): runs, successes, failures with reasons, median final
    ELBO, the median run's draw-level evaluations and run time to within 1 nat of the model's
    best median ELBO, k̂ verdict of the median run, and the median and the worst accuracy over
    the runs with a normal outcome (``OK_STATUSES``)."""
    rows = []
    for model, configs in grouped.items():
        medians = {cfg: median_run([as_run(r) for r in recs]) for cfg, recs in configs.items()}
        best = max((m.final_elbo for m in medians.values()), default=-math.inf)
        for cfg, recs in sorted(configs.items()):
            med = medians[cfg]
            med_rec = next(r for r in recs if int(r.get("seed", 0)) == med.seed)
            t = first_consistent(med, best - 1.0) if (
                math.isfinite(med.final_elbo) and med.trace_elbo.size) else None
            failures = sorted({f"{r['status']}: {(r.get('message') or '')[:160]}"
                               for r in recs if r.get("status") not in OK})
            rows.append({
                "model": model, "dim": dims.get(model), "config": cfg, "runs": len(recs),
                "ok": sum(r.get("status") in OK for r in recs),
                "converged": sum(r.get("status") == "converged" for r in recs),
                "median_final_elbo": med.final_elbo if math.isfinite(med.final_elbo) else None,
                "best_elbo": best if math.isfinite(best) else None,
                "gap_to_best": (best - med.final_elbo) if math.isfinite(med.final_elbo) else None,
                "draws_to_1nat": float(med.trace_draws[t]) if t is not None else None,
                "seconds_to_1nat": float(med.trace_wall[t]) if t is not None else None,
                "median_draw_evaluations": _median([r.get("draw_evaluations") for r in recs]),
                "median_run_time": _median([r.get("run_time") for r in recs]),
                "khat": med_rec.get("khat"), "verdict": med_rec.get("verdict"),
                # accuracy of the runs with a normal outcome; failed runs are in `failures`
                "mean_error_sd": _median([_accuracy(r, "mean_error_sd") for r in recs
                                          if r.get("status") in OK]),
                "w1_sd": _median([_accuracy(r, "w1_sd") for r in recs if r.get("status") in OK]),
                # the worst seed's, which the recommendation judges (stanvi.batch.recommend)
                "worst_mean_error_sd": _worst([_accuracy(r, "mean_error_sd") for r in recs
                                               if r.get("status") in OK]),
                "worst_w1_sd": _worst([_accuracy(r, "w1_sd") for r in recs
                                       if r.get("status") in OK]),
                "failures": " | ".join(failures)})
    return rows


def protocol_pairs(grouped: dict[str, dict[str, list[dict]]], tested: str, baseline: str
                   ) -> list[dict]:
    """The protocol's comparison of configuration ``tested`` with ``baseline`` on every model
    that ran both."""
    out = []
    for model, configs in grouped.items():
        if tested in configs and baseline in configs:
            a = median_run([as_run(r) for r in configs[tested]])
            b = median_run([as_run(r) for r in configs[baseline]])
            out.append({"model": model, "tested": tested, "baseline": baseline,
                        **protocol_pair(a, b)})
    return out


def pair_summary(pairs: list[dict]) -> dict[str, Any]:
    """Counts as the paper reports them (its §5): better / tie / worse on final ELBO (and the
    models not judged, where a median run failed), and over the pairs kept, faster, ≥ 12× and
    ≥ 36× fewer oracle calls, and the median ratio."""
    judged = [p for p in pairs if p.get("quality")]
    kept = [p for p in judged if not p["excluded"]]
    ratios = np.array([p["ratio"] for p in kept], dtype=float)
    return {"models": len(pairs), "judged": len(judged), "not_judged": len(pairs) - len(judged),
            "tested_better": sum(p["quality"] == "a_better" for p in judged),
            "tie": sum(p["quality"] == "tie" for p in judged),
            "baseline_better": sum(p["quality"] == "b_better" for p in judged),
            "kept": len(kept), "faster": int(np.sum(ratios > 1)),
            "ge_12x": int(np.sum(ratios >= 12)), "ge_36x": int(np.sum(ratios >= 36)),
            "median_ratio": float(np.median(ratios)) if ratios.size else None,
            "ratios": sorted(float(r) for r in ratios)}
