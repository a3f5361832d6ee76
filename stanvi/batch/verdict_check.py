"""Is the verdict right?  Its agreement with the truth over batch records that have reference
draws, and its stability across seeds (issue T3-5 item 1; docs/diagnostics.md#checked).

* **Against the truth.**  A fit is *off* when its standardized mean error (the median over
  marginals of |mean_q − mean_ref| / sd_ref, :func:`stanvi.evaluation.accuracy.marginal_accuracy`)
  exceeds ``OFF_MEAN_ERROR`` = 0.2.  The verdict, read as the ordinal score good < use with care
  < unreliable, is scored by the area under its ROC curve (the Mann–Whitney probability that an
  off fit gets a worse verdict than a fit that is not, ties counted a half; Hanley & McNeil
  1982), with the confusion table per band.  k̂ alone is scored the same way for comparison.
* **Usable as it is.**  The verdict speaks of the whole of q, not only its means: *unreliable*
  also says that q's sds or tails are wrong (a mean-field q of a correlated posterior has its
  means right and its sds several times too small).  So it is also scored against a second
  truth, *not usable*: off, or marginals more than ``USABLE_W1`` = 0.2 sd away in the
  1-Wasserstein distance (median over marginals) — the bar :mod:`stanvi.evaluation.compare`
  and the batch report's recommendation set for the marginals.
* **The means, read apart.**  A record that keeps the reading of q's means and the figures
  today's rule decides it on (``verdict_figures['means']``: hold < plausible < doubtful,
  :func:`stanvi.diagnostics.verdict.means_reading`; :func:`means_of`) is scored against *off*
  the same way: that reading is the verdict's answer to the question *off* asks
  (docs/diagnostics.md#means).
* **Across seeds.**  Among model–method pairs whose seeds' ELBOs (each fit's fresh diagnostic
  estimate) agree within ``ELBO_AGREE`` = 0.1 nat, the fraction whose seeds all get the same
  verdict (and, over records that keep it, the same verdict and reading of the means).

Records written before "good" needed a decided band (stanvi.diagnostics.verdict) are read
with that rule applied (:func:`current_verdict`: a borderline "good" is "use with care"; the
record keeps ``borderline``, so this is exact).

:func:`check` takes the fit records of a batch store (``stanvi batch --reference ...``;
:class:`stanvi.batch.store.RunStore`); ``stanvi bench verdict --records DIR,...`` prints it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

OFF_MEAN_ERROR = 0.2
USABLE_W1 = 0.2
ELBO_AGREE = 0.1
BANDS = ("good", "use with care", "unreliable")
MEANS = ("hold", "plausible", "doubtful")


def roc_auc(score: Iterable[float], positive: Iterable[bool]) -> float:
    """P(score of a positive > score of a negative) + ½ P(tie): the area under the ROC curve;
    NaN without both classes."""
    s = np.asarray(list(score), dtype=float)
    y = np.asarray(list(positive), dtype=bool)
    pos, neg = s[y], s[~y]
    if not pos.size or not neg.size:
        return math.nan
    neg = np.sort(neg)
    below = np.searchsorted(neg, pos, side="left")
    ties = np.searchsorted(neg, pos, side="right") - below
    return float((below.sum() + 0.5 * ties.sum()) / (pos.size * neg.size))


def _accuracy(record: dict[str, Any], figure: str) -> float | None:
    """The record's ``figure`` against its reference (constrained draws, median over marginals;
    a flat record's own column), or None."""
    acc = (record.get("accuracy") or {}).get("constrained") or {}
    value = acc.get(f"{figure}_median", record.get(figure))
    return float(value) if value is not None and np.isfinite(value) else None


def mean_error(record: dict[str, Any]) -> float | None:
    """The record's standardized mean error against its reference, or None."""
    return _accuracy(record, "mean_error_sd")


def w1_error(record: dict[str, Any]) -> float:
    """The record's W1/sd against its reference (median over marginals; NaN if none)."""
    value = _accuracy(record, "w1_sd")
    return math.nan if value is None else value


def current_verdict(record: dict[str, Any]) -> str | None:
    """The record's verdict under today's rule: "good" only with a decided band."""
    verdict = record.get("verdict")
    if verdict == "good" and (record.get("verdict_figures") or {}).get("borderline"):
        return "use with care"
    return verdict


def means_of(record: dict[str, Any]) -> str | None:
    """The record's reading of q's means under today's rule, re-derived from the figures it
    keeps: the Newton step's upper bound and median, and the curvature along the step
    (``newton_step_upper``, ``newton_step_median``, ``newton_curvature`` and its se;
    :func:`stanvi.diagnostics.verdict.curved_upper`); a record that keeps the bound it was
    decided on (``means_bound``) but no curvature (a q without the draws' ε, such as the
    low-rank family's, or no step at all) is read on the plain bound; None for a record with
    neither (written before they were kept).  *hold* stays; otherwise the means are *plausible* when the bound is at most the
    limit and neither a draw-level check the record keeps (failed draws, the PSIS shift where k̂
    trusts its weights) nor one it does not keep (q collapsed: the record says *doubtful*
    although its step passed on the bound it was written with and on today's) makes them
    *doubtful*."""
    from stanvi.diagnostics.verdict import (NEWTON_STEP_LIMIT, curved_upper,  # noqa: PLC0415
                                            means_reading_of)

    figures = record.get("verdict_figures") or {}
    means = figures.get("means")
    if means not in MEANS or not ("newton_curvature" in figures or "means_bound" in figures):
        return None
    verdict = current_verdict(record)
    if verdict != "unreliable":
        return "hold"
    from stanvi.batch.summary import finite_or  # noqa: PLC0415

    # the store writes a non-finite figure as null: an unknown curvature is NaN, an unknown
    # bound infinite (no finite bound was shown)
    upper = (finite_or(figures["newton_step_upper"], math.inf) if "newton_step_upper" in figures
             else math.nan)
    if "newton_curvature" in figures:
        bound = curved_upper(upper, finite_or(figures["newton_curvature"], math.nan),
                             finite_or(figures.get("newton_curvature_se"), math.nan),
                             finite_or(figures.get("newton_step_median"), math.nan))
    else:   # written by today's code without κ (no ε, or no step at all: NaN, doubtful)
        bound = upper
    # the bound the record's reading was decided on (before ``means_bound`` was kept: the plain one)
    written = finite_or(figures["means_bound"], math.inf) if "means_bound" in figures else upper
    if means == "doubtful" and max(written, bound) <= NEWTON_STEP_LIMIT:
        return "doubtful"          # the step passed on either bound: another reason
    khat = record.get("khat")
    return means_reading_of(verdict, float(bound),
                            failed_fraction=figures.get("failed_fraction") or 0.0,
                            mean_shift=figures.get("mean_shift") or 0.0,
                            khat=math.inf if khat is None else float(khat),
                            threshold=figures.get("threshold", -math.inf))


def config(record: dict[str, Any]) -> str:
    """method:profile:family, the configuration a record ran."""
    return f"{record.get('method')}:{record.get('profile')}:{record.get('family')}"


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """ROC AUC of the verdict and of k̂, and the confusion table, over ``rows`` (records with a
    verdict and a mean error)."""
    off = [mean_error(r) > OFF_MEAN_ERROR for r in rows]
    unusable = [o or not w1_error(r) <= USABLE_W1 for r, o in zip(rows, off)]
    score = [BANDS.index(r["verdict"]) for r in rows]
    khat = [r["khat"] if r.get("khat") is not None and np.isfinite(r["khat"]) else math.inf
            for r in rows]
    table = {band: {"off": 0, "not off": 0} for band in BANDS}
    for r, is_off in zip(rows, off):
        table[r["verdict"]]["off" if is_off else "not off"] += 1
    usable_table = {band: {"unusable": 0, "usable": 0} for band in BANDS}
    for r, bad in zip(rows, unusable):
        usable_table[r["verdict"]]["unusable" if bad else "usable"] += 1
    read = [(MEANS.index(means_of(r)), o) for r, o in zip(rows, off) if means_of(r)]
    means_table = {m: {"off": 0, "not off": 0} for m in MEANS}
    for level, is_off in read:
        means_table[MEANS[level]]["off" if is_off else "not off"] += 1
    return {"fits": len(rows), "off": int(sum(off)), "auc_verdict": roc_auc(score, off),
            "auc_khat": roc_auc(khat, off), "confusion": table,
            "unusable": int(sum(unusable)), "auc_verdict_usable": roc_auc(score, unusable),
            "confusion_usable": usable_table, "means_fits": len(read),
            "means_off": int(sum(o for _, o in read)),
            "auc_means": roc_auc([lv for lv, _ in read], [o for _, o in read]),
            "confusion_means": means_table}


def stability(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Model–method pairs with ≥ 2 seeds whose ELBOs agree within ``ELBO_AGREE``, and how many
    of them got one verdict on every seed."""
    by_pair: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        if r.get("verdict") in BANDS:
            by_pair[(r.get("model"), config(r))].append(r)
    agreeing = same = read_pairs = same_read = 0
    flipped = []
    for (model, cfg), runs in sorted(by_pair.items()):
        elbos = [r.get("elbo") for r in runs]
        if len(runs) < 2 or any(e is None or not np.isfinite(e) for e in elbos):
            continue
        if max(elbos) - min(elbos) > ELBO_AGREE:
            continue
        agreeing += 1
        verdicts = sorted({r["verdict"] for r in runs})
        same += len(verdicts) == 1
        if all(means_of(r) for r in runs):
            read_pairs += 1
            readings = sorted({f"{r['verdict']} (means {means_of(r)})" for r in runs})
            same_read += len(readings) == 1
            verdicts = readings
        if len(verdicts) > 1:
            flipped.append(f"{model} {cfg}: {', '.join(verdicts)}")
    return {"pairs": agreeing, "same": same,
            "fraction": same / agreeing if agreeing else math.nan, "flipped": flipped,
            "means_pairs": read_pairs, "same_with_means": same_read,
            "fraction_with_means": same_read / read_pairs if read_pairs else math.nan}


def check(records: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """:func:`agreement` over every fit record with a verdict and a reference, and per
    configuration; :func:`stability` over every fit record with a verdict."""
    records = [{**r, "verdict": current_verdict(r)} for r in records
               if r.get("verdict") in BANDS]
    judged = [r for r in records if mean_error(r) is not None]
    per = defaultdict(list)
    for r in judged:
        per[config(r)].append(r)
    return {"all": agreement(judged), "by_config": {c: agreement(rs) for c, rs in sorted(per.items())},
            "stability": stability(records)}


def fit_records(dirs: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The fit records of batch stores (``posteriordb_runs/records/<run>``).  A fit scored
    against a NUTS reference that failed its checks (the store's reference record says
    ``trustworthy: false``) keeps its verdict, for the seeds' agreement, but loses its accuracy:
    the truth it would be judged against is not one."""
    from stanvi.batch.store import RunStore  # noqa: PLC0415

    records: list[dict] = []
    for d in dirs:
        store = RunStore(d)
        untrusted = {r.get("model") for r in store.records("reference")
                     if r.get("status") == "ok" and not r.get("trustworthy")}
        records += [r if r.get("model") not in untrusted else {**r, "accuracy": None}
                    for r in store.records("fit") if r.get("kind", "fit") == "fit"]
    return records


def drawn_in_common(records: Iterable[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    """The records whose verdict was drawn on the diagnostic draws common to every fit
    (:data:`stanvi.diagnostics.draws.DIAGNOSTIC_SEED`; docs/diagnostics.md#common-draws), in a
    store written partly before them: a record of a seed other than ``DIAGNOSTIC_SEED``
    finished (``finished``, unix seconds) before ``since`` was judged on its own seed's draws
    and is left out; a ``DIAGNOSTIC_SEED`` record drew the same draws under both rules and
    stays."""
    from stanvi.diagnostics.draws import DIAGNOSTIC_SEED  # noqa: PLC0415

    return [r for r in records if str(r.get("seed")) == str(DIAGNOSTIC_SEED)
            or float(r.get("finished") or 0.0) >= since]


def check_stores(dirs: list[str | Path], common_draws_since: float | None = None) -> dict[str, Any]:
    """:func:`check` over the fit records of batch stores (only those of
    :func:`drawn_in_common` when ``common_draws_since`` is given)."""
    records = fit_records(dirs)
    if common_draws_since is not None:
        records = drawn_in_common(records, common_draws_since)
    return check(records)


def _line(label: str, a: dict[str, Any], usable: bool | str) -> str:
    if usable == "means":
        counts = "  ".join(f"{a['confusion_means'][m]['off']:5d}/{a['confusion_means'][m]['not off']:<5d}"
                           for m in MEANS)
        return f"{label:34s} {a['means_fits']:5d} {a['means_off']:6d}  {a['auc_means']:6.3f}   {counts}"
    if usable:
        counts = "  ".join(f"{a['confusion_usable'][b]['unusable']:5d}/{a['confusion_usable'][b]['usable']:<5d}"
                           for b in BANDS)
        return f"{label:34s} {a['fits']:5d} {a['unusable']:6d}  {a['auc_verdict_usable']:6.3f}   {counts}"
    counts = "  ".join(f"{a['confusion'][b]['off']:5d}/{a['confusion'][b]['not off']:<5d}"
                       for b in BANDS)
    return (f"{label:34s} {a['fits']:5d} {a['off']:6d}  {a['auc_verdict']:6.3f}  "
            f"{a['auc_khat']:6.3f}   {counts}")


def report_text(figures: dict[str, Any]) -> str:
    """The figures for a person: per configuration against each truth, then the seeds'
    stability."""
    bands = "   good        care        unreliable"
    lines = [f"off: standardized mean error > {OFF_MEAN_ERROR} against the reference. AUC: the "
             "verdict's (good < use with care < unreliable); AUC k: k-hat's. Per band: off/not off",
             f"{'configuration':34s} {'fits':>5s} {'off':>6s}  {'AUC':>6s}  {'AUC k':>6s}{bands}"]
    lines += [_line(c, a, False) for c, a in figures["by_config"].items()]
    lines.append(_line("all", figures["all"], False))
    lines += ["", f"not usable: off, or W1 > {USABLE_W1} sd (median over marginals). Per band: "
              "not usable/usable",
              f"{'configuration':34s} {'fits':>5s} {'unus.':>6s}  {'AUC':>6s}{bands}"]
    lines += [_line(c, a, True) for c, a in figures["by_config"].items()]
    lines.append(_line("all", figures["all"], True))
    if figures["all"]["means_fits"]:
        lines += ["", f"the means read apart (hold < plausible < doubtful) against off, over the "
                  f"records that keep the reading. Per reading: off/not off",
                  f"{'configuration':34s} {'fits':>5s} {'off':>6s}  {'AUC':>6s}"
                  "   hold        plausible   doubtful"]
        lines += [_line(c, a, "means") for c, a in figures["by_config"].items()
                  if a["means_fits"]]
        lines.append(_line("all", figures["all"], "means"))
    st = figures["stability"]
    lines.append(f"same verdict on every seed: {st['same']} of {st['pairs']} model-method pairs "
                 f"whose ELBOs agree within {ELBO_AGREE} nat ({100 * st['fraction']:.0f}%)")
    if st["means_pairs"]:
        lines.append(f"same verdict and reading of the means on every seed: "
                     f"{st['same_with_means']} of {st['means_pairs']} such pairs whose records "
                     f"keep the reading ({100 * st['fraction_with_means']:.0f}%)")
    lines += [f"  flipped: {f}" for f in st["flipped"][:20]]
    return "\n".join(lines)
