"""``stanvi report RUNS_DIR``: a static HTML page, CSV tables and plots from a batch's records
(issue P2-2, "Report").

Written to ``OUT`` (default ``RUNS_DIR/report``):

* ``fits.csv``: one row per fit record (identity, status, message, ELBOs, oracle calls, draw-level
  evaluations, times, k̂, accuracy medians);
* ``models.csv``: one row per (model, configuration) (:func:`stanvi.batch.summary.model_rows`);
* ``protocol.csv``: the TrustVI paper's protocol for every TrustVI configuration against every
  other configuration, one row per model (:func:`stanvi.batch.summary.protocol_pairs`);
* ``compiles.csv``: one row per model: compile status and reason, dimension;
* ``recommendations.csv``: per model the method to use and why (:mod:`stanvi.batch.recommend`);
* ``accuracy.png`` (accuracy against cost per method; only when some fit has reference draws),
  ``evaluations.png`` (the median ELBO gap against model evaluations per configuration:
  :mod:`stanvi.batch.report_curves`),
  ``cdf_speedups.png`` (the CDF of oracle-call ratios, the paper's Figure 4 style, with its
  headline marks at 12× and 36×; only with three models kept or more), ``traces.png`` (ELBO
  against oracle calls of each configuration's median run, for the models with the largest
  speed-ups and ELBO gaps: :func:`trace_models`, :func:`trace_figure`);
* ``index.html``: the page a person reads (:mod:`stanvi.batch.report_page`: a summary that says
  which method to use how often at what cost, the methods' table, failure reasons grouped, each
  model's recommendation with its figures; docs/batch.md#the-report).
"""

from __future__ import annotations

import csv
import html
import math
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.batch import report_page as rp
from stanvi.batch.recommend import headline, label, recommend
from stanvi.batch.report_curves import config_colours, evaluations_plot
from stanvi.batch.reference_job import NO_FAMILY
from stanvi.batch.runner import OK_STATUSES
from stanvi.batch.store import RunStore
from stanvi.batch.summary import (as_run, config_of, group_runs, model_rows, pair_summary,
                                  profile_of, protocol_pairs)

__all__ = ["write_report", "task_hours"]

FIT_COLUMNS = ("model", "source", "method", "profile", "family", "seed", "status", "final_elbo",
               "elbo", "elbo_se", "iterations", "draw_evaluations", "run_time", "compile_time",
               "khat", "verdict", "mean_error_sd", "w1_sd", "message", "incomplete")


def _fit_row(r: dict) -> dict[str, Any]:
    acc = (r.get("accuracy") or {}).get("constrained") or {}
    row = {k: r.get(k) for k in FIT_COLUMNS}
    row.update(profile=profile_of(r), mean_error_sd=acc.get("mean_error_sd_median"),
               w1_sd=acc.get("w1_sd_median"), message=(r.get("message") or "")[:300])
    return row


def task_hours(records: list[dict]) -> float:
    """Hours of task time of the records (each task's ``task_seconds``: its process's wall time,
    or the time until its timeout), summed over workers: what the tasks cost on one worker,
    whether the batch ran in one piece or in many."""
    return sum(float(r.get("task_seconds") or 0.0) for r in records) / 3600.0


def _write_csv(path: Path, rows: list[dict], columns: list[str] | tuple[str, ...]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})


def _save(plt, fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> str:
    """Label a one-panel figure, add its legend (if anything is labelled), write it as PNG and
    close it; returns the file name."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


ACCURACY_CAP = 100.0   # accuracy-plot axes end here (larger values drawn on the edge)
FRONT_PLOTS = ("accuracy.png", "evaluations.png")   # shown under the methods' table


def _plots(out: Path, grouped, rows, pairs_by_name) -> list[str]:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    made = []
    colours = config_colours(plt, grouped)
    kept = {name: [p for p in pairs if p.get("quality") and not p["excluded"]]
            for name, pairs in pairs_by_name.items()}
    if any(len(k) >= 3 for k in kept.values()):   # a CDF of fewer models says nothing
        made.append(_cdf_plot(plt, out, kept))
    else:
        (out / "cdf_speedups.png").unlink(missing_ok=True)

    if any(r["mean_error_sd"] is not None and r.get("median_run_time") for r in rows):
        made.append(_accuracy_plot(plt, out, rows, colours))
    else:   # nothing to plot: no stale figure from an earlier report in the same directory
        (out / "accuracy.png").unlink(missing_ok=True)

    curve = evaluations_plot(plt, out, grouped, colours)
    made += [curve] if curve else []

    chosen = trace_models(rows, pairs_by_name)
    if chosen:
        fig = trace_figure(plt, grouped, chosen, colours)
        fig.savefig(out / "traces.png", dpi=100)
        plt.close(fig)
        made.append("traces.png")
    return made


def _cdf_plot(plt, out: Path, kept: dict[str, list[dict]]) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, pairs in kept.items():
        ratios = np.sort([p["ratio"] for p in pairs])
        if ratios.size:
            ax.step(np.concatenate([[ratios[0]], ratios]),
                    np.concatenate([[0], np.arange(1, ratios.size + 1) / ratios.size]),
                    where="post", label=f"{name} (n={ratios.size})")
    for mark in (12, 36):
        ax.axvline(mark, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    return _save(plt, fig, ax, out / "cdf_speedups.png",
                 "oracle-call ratio (baseline / TrustVI) to the threshold",
                 "fraction of models with ratio ≤ x",
                 "Speed-ups (paper: ≥12× on 50%, ≥36× on 25% vs ADVI)")


def _accuracy_plot(plt, out: Path, rows, colours: dict[str, tuple]) -> str:
    """Accuracy against cost, per method: each model's median run (small dots) and the
    method's median over models (a large marker), run time per fit against W1 / sd_ref (the
    standardized mean error where a run has no W1), in the report's colour per method."""
    from stanvi.batch.recommend import W1_OK, label  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.5))
    cap = ACCURACY_CAP
    for cfg in sorted({r["config"] for r in rows}):
        pts = np.array([(r["median_run_time"], r["w1_sd"] if r["w1_sd"] is not None
                         else r["mean_error_sd"]) for r in rows
                        if r["config"] == cfg and r["mean_error_sd"] is not None
                        and r.get("median_run_time")], dtype=float).reshape(-1, 2)
        if not len(pts):
            continue
        pts[:, 1] = np.clip(pts[:, 1], 1e-3, cap)
        ax.scatter(pts[:, 0], pts[:, 1], s=8, alpha=0.35, color=colours[cfg])
        ax.scatter(np.median(pts[:, 0]), np.median(pts[:, 1]), s=90, edgecolor="black",
                   color=colours[cfg], label=f"{label(cfg)} ({len(pts)} models with a reference)")
    ax.axhline(W1_OK, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    return _save(plt, fig, ax, out / "accuracy.png", "run time per fit (s, median over seeds)",
                 "W1 / posterior sd (median over marginals)",
                 f"Accuracy against cost: dots are models, large markers the median model\n"
                 f"(dotted: W1 {W1_OK} sd, the report's bar; values capped at {cap:g})")


def protocol_comparisons(configs: list[str], traced: set[str]) -> list[tuple[str, str]]:
    """The (tested, baseline) pairs of the paper's protocol in a report: every TrustVI
    configuration against every other traced configuration (stanvi's methods; Stan's own
    report only their end) of the same family, or of a method without one: a full-rank fit
    against a mean-field one would compare the families, not the methods
    (docs/batch.md#the-report)."""
    def family(config: str) -> str:
        return config.rsplit(":", 1)[-1]

    return [(tested, baseline) for tested in configs if tested.startswith("trustvi:")
            for baseline in configs
            if not baseline.startswith("trustvi:") and baseline in traced
            and (family(tested) == family(baseline) or "none" in (family(tested),
                                                                   family(baseline)))]


# ELBO gaps beyond this many nats (a run that never left a start at −1e300) would flatten every
# other line of a panel: such models are not chosen for the trace panels to fill them
MAX_PANEL_GAP = 1e4


def trace_models(rows: list[dict], pairs_by_name: dict[str, list[dict]], n: int = 6) -> list[str]:
    """The models of the trace panels: first those with the largest oracle-call ratio over the
    protocol's kept pairs (the speed-ups the paper's figures show, every configuration reaching
    the threshold), then, to fill ``n`` panels, those where the configurations' median final
    ELBOs differ most (gaps up to ``MAX_PANEL_GAP`` nats)."""
    speed: dict[str, float] = {}
    for pairs in pairs_by_name.values():
        for p in pairs:
            if p.get("quality") and not p["excluded"] and math.isfinite(p["ratio"]):
                speed[p["model"]] = max(speed.get(p["model"], 0.0), float(p["ratio"]))
    chosen = sorted(speed, key=lambda m: (-speed[m], m))[:n]
    spread: dict[str, float] = {}
    for r in rows:
        if r["gap_to_best"] is not None and r["model"] not in speed:
            spread[r["model"]] = max(spread.get(r["model"], 0.0), r["gap_to_best"])
    fill = [m for m in sorted(spread, key=lambda m: (-spread[m], m)) if spread[m] <= MAX_PANEL_GAP]
    return chosen + fill[:n - len(chosen)]


def trace_figure(plt, grouped, chosen: list[str], colours: dict[str, tuple] | None = None):
    """ELBO against oracle calls of each configuration's median run, one panel per model in
    ``chosen``; a configuration has the same colour in every panel, and one legend (above the
    panels) names every configuration drawn, so a panel where a configuration failed (and has no
    line) does not shift the others' colours; ``colours``: the report's colour per
    configuration (:func:`~stanvi.batch.report_curves.config_colours`), shared by its plots."""
    from stanvi.evaluation.protocol import median_run  # noqa: PLC0415

    colour = colours or config_colours(plt, {model: grouped[model] for model in chosen})
    fig, axes = plt.subplots(2, 3, figsize=(11, 7), squeeze=False)
    drawn: dict[str, Any] = {}
    for ax, model in zip(axes.flat, chosen):
        best = -math.inf
        finals = []
        for cfg, recs in sorted(grouped[model].items()):
            med = median_run([as_run(r) for r in recs])
            if math.isfinite(med.final_elbo):
                finals.append(med.final_elbo)
            if med.trace_elbo.size and np.any(np.isfinite(med.trace_elbo)):
                (line,) = ax.plot(np.maximum(med.trace_oracle, 1e-1), med.trace_elbo,
                                  marker=".", ms=3, lw=1, color=colour[cfg], label=cfg)
                drawn.setdefault(cfg, line)
                best = max(best, np.nanmax(np.where(np.isfinite(med.trace_elbo),
                                                    med.trace_elbo, -np.inf)))
        if math.isfinite(best):   # every final ELBO in view, at least 50 nats below the best
            worst = min((f for f in finals if f > best - MAX_PANEL_GAP), default=best)
            ax.set_ylim(min(best - 50, worst - 0.1 * (best - worst)), best + 5)
        ax.set_xscale("log")
        ax.set_title(model, fontsize=8)
        ax.set_xlabel("oracle calls", fontsize=7)
        ax.set_ylabel("ELBO (2,000 common draws)", fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(chosen):]:
        ax.axis("off")
    if drawn:
        fig.legend(list(drawn.values()), list(drawn), loc="upper center",
                   ncol=min(len(drawn), 4), fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


PROTOCOL_COLUMNS = [("Comparison", "comparison", None), ("Models", "models", None),
                    ("TrustVI better", "tested_better", None), ("Tie", "tie", None),
                    ("Baseline better", "baseline_better", None),
                    ("A median run failed", "not_judged", None), ("Kept", "kept", None),
                    ("TrustVI faster", "faster", None), ("≥ 12× fewer calls", "ge_12x", None),
                    ("≥ 36×", "ge_36x", None),
                    ("Median ratio", "median_ratio",
                     lambda v: "–" if v is None else f"{v:.3g}×")]


def write_report(runs_dir: str | Path, out: str | Path | None = None,
                 family: str | None = None) -> Path:
    """Write the report of ``runs_dir`` to ``out`` (default ``runs_dir/report``); returns the
    path of ``index.html``.  With ``family`` (``"meanfield"``, ``"fullrank"``, ...) only the fits
    of that variational family enter the report, beside those of methods that have no family
    (family ``"none"``: Pathfinder, NUTS), so one runs directory can hold a mean-field and a
    full-rank batch and give a report of each."""
    store = RunStore(runs_dir)
    out = Path(out) if out is not None else Path(runs_dir) / "report"
    out.mkdir(parents=True, exist_ok=True)
    fits = [r for r in store.records("fit")
            if family is None or r.get("family") in (family, NO_FAMILY)]
    compiles = list(store.records("compile"))
    unreadable = store.unreadable()   # set aside while reading (issue T3-2 items 5, 7)
    if unreadable:
        from stanvi.log import get_logger  # noqa: PLC0415

        get_logger("batch").warning(f"{len(unreadable)} record file(s) could not be read and "
                                    f"were moved aside: {'; '.join(unreadable[:5])}")
    dims = {c["model"]: c.get("dim") for c in compiles if c.get("dim") is not None}
    grouped = group_runs(fits)
    rows = model_rows(grouped, dims)
    configs = sorted({config_of(r) for r in fits})
    pairs_by_name, protocol_rows, summaries = {}, [], []
    # the protocol compares runs along their traces: configurations whose records carry the
    # protocol's trace points (stanvi's methods; not Stan's own, which report only their end)
    traced = {config_of(r) for r in fits if r.get("trace_points")}
    for tested, baseline in protocol_comparisons(configs, traced):
        pairs = protocol_pairs(grouped, tested, baseline)
        if pairs:
            name = f"{tested} vs {baseline}"
            pairs_by_name[name] = pairs
            protocol_rows += pairs
            s = pair_summary(pairs)
            summaries.append({"comparison": name, **{k: v for k, v in s.items()
                                                     if k != "ratios"}})
    _write_csv(out / "fits.csv", [_fit_row(r) for r in fits], FIT_COLUMNS)
    model_cols = list(rows[0]) if rows else ["model"]
    _write_csv(out / "models.csv", rows, model_cols)
    pcols = ("model", "tested", "baseline", "quality", "threshold", "oracle_a", "oracle_b",
             "ratio", "excluded")
    _write_csv(out / "protocol.csv", protocol_rows, pcols)
    ccols = ("model", "source", "status", "dim", "message", "compile_seconds")
    _write_csv(out / "compiles.csv", compiles, ccols)
    images = _plots(out, grouped, rows, pairs_by_name)

    references = {r["model"]: r for r in store.records("reference")}
    rows_of: dict[str, list[dict]] = {}
    for r in rows:
        rows_of.setdefault(r["model"], []).append(r)
    recommendations = {}
    for model in grouped:
        ref = references.get(model)
        recommendations[model] = recommend(rows_of.get(model, []), None if ref is None
                                           else bool(ref.get("trustworthy")))
    _write_csv(out / "recommendations.csv",
               [{"model": m, **rec} for m, rec in recommendations.items()],
               ("model", "config", "level", "why"))
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        "<title>Which variational method to use: stanvi batch report</title>",
        f"<style>{rp.STYLE}</style></head><body>",
        f"<h1>Which method to use</h1><p class='why'>stanvi batch report of "
        f"<code>{html.escape(Path(runs_dir).name)}</code>: {len(compiles)} models found, "
        f"{sum(c.get('status') == 'ok' for c in compiles)} compiled and loaded, {len(fits)} "
        f"fits; task time summed over workers: fits {task_hours(fits):.2f} h, compiles "
        f"{task_hours(compiles):.2f} h"
        + (f", NUTS references {task_hours(list(references.values())):.2f} h"
           if references else "") + ".</p>",
        f"<p id='summary'>{html.escape(rp.summary_text(recommendations, len(grouped), references))}"
        "</p>",
        *(() if not unreadable else (
            f"<p class='warn'><b>{len(unreadable)} record file(s) could not be read</b> and were "
            f"moved to <code>records/&lt;kind&gt;/unreadable/</code>; rerun the batch command "
            f"to run their tasks again: " + "; ".join(html.escape(u) for u in unreadable)
            + "</p>",)),
        "<h2>Methods over all models</h2><p class='why'>Medians over models of each model's "
        "median over seeds; accuracy against the reference draws, in posterior sds (median "
        "over marginals, constrained space). Click a header to sort.</p>",
        rp.table(rp.method_rows(rows, recommendations), rp.METHOD_COLUMNS),
        *rp.trusted_methods_table(rows, recommendations, references),
        *(f"<img src='{img}' alt='{img}'>" for img in images if img in FRONT_PLOTS),
    ]
    failures = rp.failure_rows(fits, OK_STATUSES)
    if failures:
        page += ["<h2>Why fits failed</h2><p class='why'>Failed fits grouped by method, status "
                 "and the kind of message (numbers and names blanked); a failure on a model that "
                 "no method fitted is more likely the model's (or its data's) than the "
                 "method's.</p>",
                 rp.table(failures, rp.FAILURE_COLUMNS)]
    page.append("<h2>Per model</h2><p class='why'>Each model's recommendation and the figures "
                "that decide it; open a model for its table.</p>")
    for model in grouped:
        rec = recommendations[model]
        ref = references.get(model)
        ref_text = ("" if ref is None else
                    " NUTS reference: trustworthy." if ref.get("trustworthy") else
                    f" NUTS reference: {html.escape(ref.get('status', '?'))}, not trustworthy "
                    f"({html.escape(ref.get('message') or '')}).")
        model_rows_ = [{**r, "method": label(r["config"]), "ok_runs": f"{r['ok']} / {r['runs']}"}
                       for r in rows_of.get(model, [])]
        page.append(
            f"<details id='{rp.model_anchor(model)}'><summary><b>{html.escape(model)}</b> "
            f"(D = {dims.get(model, '?')}): "
            f"{html.escape(headline(rec))}"
            f"</summary><p class='why'>{html.escape(rec['why'])}.{ref_text}</p>"
            f"{rp.table(model_rows_, rp.MODEL_COLUMNS)}</details>")
    if summaries:
        page += ["<h2>The TrustVI paper's protocol</h2><p class='why'>Median runs over seeds; "
                 "a tie is within 1 nat; the ratio is the baseline's oracle calls over "
                 "TrustVI's to the threshold (the worse final ELBO − 1 nat), over the models "
                 "kept (both runs took at least 5 iterations).</p>",
                 rp.table([{**x, "comparison": " vs ".join(label(c) for c in
                                                           x["comparison"].split(" vs "))}
                           for x in summaries], PROTOCOL_COLUMNS)]
    page += [f"<img src='{img}' alt='{img}'>" for img in images if img not in FRONT_PLOTS]
    failed_compiles = [c for c in compiles if c.get("status") != "ok"]
    if failed_compiles:
        page += ["<h2>Models that did not compile or load</h2>",
                 rp.table([{**c, "message": (c.get("message") or "")[:200]}
                           for c in failed_compiles],
                          [("Model", "model", None), ("Status", "status", None),
                           ("Reason", "message", None)])]
    page += ["<p class='why'>Tables for machines: <a href='fits.csv'>fits.csv</a>, "
             "<a href='models.csv'>models.csv</a>, <a href='recommendations.csv'>"
             "recommendations.csv</a>, <a href='protocol.csv'>protocol.csv</a>, "
             "<a href='compiles.csv'>compiles.csv</a>.</p>",
             f"<script>{rp.SORT_SCRIPT}</script>", "</body></html>"]
    index = out / "index.html"
    index.write_text("\n".join(page))
    return index
