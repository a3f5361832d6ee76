"""``stanvi report RUNS_DIR``: a static HTML page, CSV tables and plots from a batch's records
(issue P2-2, "Report").

Written to ``OUT`` (default ``RUNS_DIR/report``):

* ``fits.csv``: one row per fit record (identity, status, message, ELBOs, oracle calls, draw-level
  evaluations, times, k̂, accuracy medians);
* ``models.csv``: one row per (model, configuration) (:func:`stanvi.batch.summary.model_rows`);
* ``protocol.csv``: the TrustVI paper's protocol for every TrustVI configuration against every
  other configuration, one row per model (:func:`stanvi.batch.summary.protocol_pairs`);
* ``compiles.csv``: one row per model: compile status and reason, dimension;
* ``cdf_speedups.png`` (the CDF of oracle-call ratios, the paper's Figure 4 style, with its
  headline marks at 12× and 36×), ``accuracy.png`` (standardized mean error against W1/sd per
  model and configuration; only when some fit has reference draws), ``traces.png`` (ELBO
  against oracle calls of each configuration's median run, for the models with the largest
  speed-ups and ELBO gaps: :func:`trace_models`, :func:`trace_figure`);
* ``index.html`` showing all of it.
"""

from __future__ import annotations

import csv
import html
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.batch.reference_job import NO_FAMILY
from stanvi.batch.store import RunStore
from stanvi.batch.summary import (as_run, config_of, group_runs, model_rows, pair_summary,
                                  profile_of, protocol_pairs)

__all__ = ["write_report", "task_hours"]

FIT_COLUMNS = ("model", "source", "method", "profile", "family", "seed", "status", "final_elbo",
               "elbo", "elbo_se", "iterations", "draw_evaluations", "run_time", "compile_time",
               "khat", "verdict", "mean_error_sd", "w1_sd", "message")


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


def _plots(out: Path, grouped, rows, pairs_by_name) -> list[str]:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    made = []
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, pairs in pairs_by_name.items():
        ratios = np.sort([p["ratio"] for p in pairs if p.get("quality") and not p["excluded"]])
        if ratios.size:
            ax.step(np.concatenate([[ratios[0]], ratios]),
                    np.concatenate([[0], np.arange(1, ratios.size + 1) / ratios.size]),
                    where="post", label=f"{name} (n={ratios.size})")
    for mark in (12, 36):
        ax.axvline(mark, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    made.append(_save(plt, fig, ax, out / "cdf_speedups.png",
                      "oracle-call ratio (baseline / TrustVI) to the threshold",
                      "fraction of models with ratio ≤ x",
                      "Speed-ups (paper: ≥12× on 50%, ≥36× on 25% vs ADVI)"))

    if any(r["mean_error_sd"] is not None and r["w1_sd"] is not None for r in rows):
        made.append(_accuracy_plot(plt, out, rows))
    else:   # nothing to plot: no stale figure from an earlier report in the same directory
        (out / "accuracy.png").unlink(missing_ok=True)

    chosen = trace_models(rows, pairs_by_name)
    if chosen:
        fig = trace_figure(plt, grouped, chosen)
        fig.savefig(out / "traces.png", dpi=100)
        plt.close(fig)
        made.append("traces.png")
    return made


def _accuracy_plot(plt, out: Path, rows) -> str:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    cap = ACCURACY_CAP
    for cfg in sorted({r["config"] for r in rows}):
        pts = np.array([(r["mean_error_sd"], r["w1_sd"]) for r in rows
                        if r["config"] == cfg and r["mean_error_sd"] is not None
                        and r["w1_sd"] is not None], dtype=float).reshape(-1, 2)
        if len(pts):
            over = (pts > cap).any(axis=1)
            shown = np.minimum(pts, cap)
            dots = ax.scatter(shown[~over, 0], shown[~over, 1], s=14, label=cfg, alpha=0.75)
            if over.any():   # off the scale: drawn on its edge, as triangles
                ax.scatter(shown[over, 0], shown[over, 1], s=22, marker="^", alpha=0.75,
                           color=dots.get_facecolor()[0] if len(dots.get_offsets()) else None)
    ax.set_xscale("symlog", linthresh=0.01)
    ax.set_yscale("symlog", linthresh=0.01)
    ax.set_xlim(0, cap * 1.5)
    ax.set_ylim(0, cap * 1.5)
    return _save(plt, fig, ax, out / "accuracy.png",
                 "median standardized mean error |mean − ref| / sd_ref", "median W1 / sd_ref",
                 f"Accuracy against reference draws (constrained space), per model\n"
                 f"(runs with a normal outcome; ▲ = beyond {cap:g}, drawn at {cap:g})")


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


def trace_figure(plt, grouped, chosen: list[str]):
    """ELBO against oracle calls of each configuration's median run, one panel per model in
    ``chosen``; a configuration has the same colour in every panel, and one legend (above the
    panels) names every configuration drawn, so a panel where a configuration failed (and has no
    line) does not shift the others' colours."""
    from stanvi.evaluation.protocol import median_run  # noqa: PLC0415

    configs = sorted({cfg for model in chosen for cfg in grouped[model]})
    palette = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
    colour = {cfg: palette(i % palette.N) for i, cfg in enumerate(configs)}
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


def _table(rows: list[dict], columns, *, limit: int | None = None, cls: str = "") -> str:
    def cell(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.4g}" if math.isfinite(v) else str(v)
        return html.escape(str(v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in columns) + "</tr>"
                   for r in (rows if limit is None else rows[:limit]))
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


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
    for tested in (c for c in configs if c.startswith("trustvi:")):
        for baseline in (c for c in configs if not c.startswith("trustvi:") and c in traced):
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

    by_config: dict[str, list[dict]] = {}
    for r in fits:
        by_config.setdefault(config_of(r), []).append(r)
    status_counts = {c: Counter(r.get("status") for r in rs) for c, rs in by_config.items()}
    status_rows = [{"config": c, **{k: str(v) for k, v in sorted(s.items())},
                    "task_hours": f"{task_hours(by_config[c]):.2f}"}
                   for c, s in sorted(status_counts.items())]
    status_cols = (["config"] + sorted({k for s in status_counts.values() for k in s})
                   + ["task_hours"])
    compiled = sum(c.get("status") == "ok" for c in compiles)
    page = [
        "<!doctype html><html><head><meta charset='utf-8'><title>stanvi batch report</title>",
        "<style>body{font-family:sans-serif;margin:1.5em;max-width:1400px}table{border-collapse:"
        "collapse;font-size:12px;margin:0.5em 0}td,th{border:1px solid #ccc;padding:2px 6px}"
        "th{background:#eee}img{max-width:100%;border:1px solid #ddd;margin:0.5em 0}</style>",
        "</head><body>",
        f"<h1>stanvi batch report</h1><p>Runs directory: <code>{html.escape(str(runs_dir))}"
        f"</code>. Models: {len(compiles)} found, {compiled} compiled and loaded; fits: "
        f"{len(fits)} records. Task time, summed over workers (the batch's wall time on one "
        f"worker): fits {task_hours(fits):.2f} h, compiles {task_hours(compiles):.2f} h. "
        f"Tables: <a href='fits.csv'>fits.csv</a>, "
        f"<a href='models.csv'>models.csv</a>, <a href='protocol.csv'>protocol.csv</a>, "
        f"<a href='compiles.csv'>compiles.csv</a>.</p>",
        *(() if not unreadable else (
            f"<p><b>{len(unreadable)} record file(s) could not be read</b> and were moved to "
            f"<code>records/&lt;kind&gt;/unreadable/</code>; rerun the batch command to run "
            f"their tasks again: " + "; ".join(html.escape(u) for u in unreadable) + "</p>",)),
        "<h2>Fit outcomes by configuration</h2>", _table(status_rows, status_cols, cls="status"),
        "<h2>The TrustVI paper's protocol</h2><p>Median runs over seeds; a tie is within 1 nat; "
        "ratios are the baseline's oracle calls over TrustVI's to the threshold (the worse "
        "final ELBO − 1 nat), over the pairs kept.</p>",
        _table(summaries, ["comparison", "models", "judged", "tested_better", "tie",
                           "baseline_better", "kept", "faster", "ge_12x", "ge_36x",
                           "median_ratio"], cls="protocol"),
        *(f"<img src='{img}' alt='{img}'>" for img in images),
        *(() if "accuracy.png" in images else (
            "<p>No accuracy plot: none of these fits has reference draws (posteriordb's "
            "posteriors with a reference posterior have them; example-models has none).</p>",)),
        "<h2>Per model</h2>", _table(rows, model_cols, cls="models"),
        "<h2>Models that did not compile or load</h2>",
        _table([c for c in compiles if c.get("status") != "ok"], ccols, cls="compiles"),
        # for tests in a browser: how many images decoded, once the page has loaded
        "<script>window.addEventListener('load', () => { document.body.dataset.imagesLoaded = "
        "[...document.images].filter(i => i.complete && i.naturalWidth > 0).length; });"
        "</script>",
        "</body></html>"]
    index = out / "index.html"
    index.write_text("\n".join(page))
    return index
