"""What ``stanvi bench peers`` prints and draws (:mod:`stanvi.bench.peers`): a table per model,
the medians over models, TrustVI's ratios to single-path Pathfinder (issue T3-1's targets:
model evaluations, warm wall time, new-process wall time), and the accuracy against evaluations
plot."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

RATIO_METHODS = ("trustvi", "trustvi-fullrank")
BASE = "pathfinder"


def _fmt(x, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def print_model(res: dict[str, Any]) -> None:
    """One model's medians, a row per method."""
    head = f"\n{res['model']} (D = {res['dim']})"
    if "nuts" in res:
        n = res["nuts"]
        head += (f": NUTS {n['wall']:.2f} s, {n['gradient_evaluations']} gradients, max R-hat "
                 f"{_fmt(n.get('max_r_hat'), '.3f')}, divergences {n['divergences']}")
    print(head)
    print(f"  {'method':18s} {'wall s':>8s} {'new proc':>8s} {'evals':>9s} {'hvp':>7s} "
          f"{'ELBO gap':>9s} {'mean err/sd':>11s} {'W1/sd':>7s} {'k-hat':>6s} failed statuses")
    for method, m in res["medians"].items():
        print(f"  {method:18s} {_fmt(m.get('wall'), '8.3f')} {_fmt(m.get('new_process'), '8.2f')} "
              f"{_fmt(m.get('evaluations'), '9.0f')} {_fmt(m.get('hvp'), '7.0f')} "
              f"{_fmt(m.get('elbo_gap'), '9.2f')} {_fmt(m.get('mean_error_sd'), '11.3f')} "
              f"{_fmt(m.get('w1_sd'), '7.3f')} {_fmt(m.get('khat'), '6.2f')} {m.get('failed')} "
              f"{','.join(m.get('statuses') or [])}")


# the figure of single-path Pathfinder's that a stanvi figure is divided by
BASE_FIGURE = {"new_process_verdict": "new_process"}


def ratios(results: list[dict[str, Any]], method: str, figure: str) -> list[float]:
    """Per model: ``method``'s median ``figure`` over single-path Pathfinder's (for
    ``new_process_verdict``, a new process that also computes stanvi's k̂ verdict, over
    Pathfinder's ``new_process``: Pathfinder computes none)."""
    base_figure = BASE_FIGURE.get(figure, figure)
    out = []
    for r in results:
        a, b = r["medians"].get(method, {}), r["medians"].get(BASE, {})
        if a.get(figure) is not None and b.get(base_figure) and b[base_figure] > 0:
            out.append(a[figure] / b[base_figure])
    return out


def overall(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Medians over models of each method's per-model medians, and TrustVI's ratios."""
    methods = list(dict.fromkeys(m for r in results for m in r["medians"]))
    table: dict[str, dict[str, Any]] = {}
    for method in methods:
        meds = [r["medians"][method] for r in results if method in r["medians"]]
        row: dict[str, Any] = {"models": len(meds)}
        for k in ("wall", "verdict_wall", "new_process", "new_process_verdict", "evaluations",
                  "elbo_gap", "mean_error_sd", "w1_sd", "khat"):
            vals = [m[k] for m in meds if m.get(k) is not None]
            row[k] = float(np.median(vals)) if vals else None
        if method in RATIO_METHODS:
            for figure in ("evaluations", "wall", "new_process", "new_process_verdict"):
                rs = ratios(results, method, figure)
                row[f"ratio_{figure}"] = float(np.median(rs)) if rs else None
                row[f"ratio_{figure}_models"] = len(rs)
        table[method] = row
    return table


def print_overall(results: list[dict[str, Any]]) -> None:
    """The medians over models, TrustVI's ratios to single-path Pathfinder, and who wins."""
    table = overall(results)
    print(f"\nOver {len(results)} models (median of per-model medians):")
    for method, row in table.items():
        print(f"  {method:18s} wall {_fmt(row['wall'], '.3f')} s  new process "
              f"{_fmt(row['new_process'], '.2f')} s  evals {_fmt(row['evaluations'], '.0f')}  "
              f"ELBO gap {_fmt(row['elbo_gap'], '.2f')}  mean err/sd "
              f"{_fmt(row['mean_error_sd'], '.3f')}  W1/sd {_fmt(row['w1_sd'], '.3f')}")
    for method in RATIO_METHODS:
        row = table.get(method)
        if not row:
            continue
        print(f"  {method} / single-path Pathfinder, median over models: evaluations "
              f"{_fmt(row['ratio_evaluations'], '.2f')}x ({row['ratio_evaluations_models']} "
              f"models), warm wall {_fmt(row['ratio_wall'], '.2f')}x, new process "
              f"{_fmt(row['ratio_new_process'], '.2f')}x (with the k-hat verdict "
              f"{_fmt(row['ratio_new_process_verdict'], '.2f')}x; its warm time "
              f"{_fmt(row['verdict_wall'], '.3f')} s)")
    methods = list(table)
    for figure in ("evaluations", "wall", "mean_error_sd", "w1_sd"):
        wins = {m: 0 for m in methods}
        for r in results:
            vals = {m: r["medians"][m].get(figure) for m in methods if m in r["medians"]}
            vals = {m: v for m, v in vals.items() if v is not None}
            if vals:
                wins[min(vals, key=vals.get)] += 1
        print(f"  best {figure:14s}: " + ", ".join(f"{m} {n}" for m, n in wins.items()))


def plot_accuracy(results: list[dict[str, Any]], path: Path) -> None:
    """Accuracy against evaluations: per model and method, the median W1/sd (left) and
    standardized mean error (right) against the median model evaluations, log-log, with each
    method's median over models as a large marker."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    methods = list(dict.fromkeys(m for r in results for m in r["medians"]))
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    for ax, figure, label in ((axes[0], "w1_sd", "W1 / reference sd (median over marginals)"),
                              (axes[1], "mean_error_sd",
                               "|mean error| / reference sd (median over marginals)")):
        for i, method in enumerate(methods):
            pts = [(r["medians"][method].get("evaluations"), r["medians"][method].get(figure))
                   for r in results if method in r["medians"]]
            pts = [(x, y) for x, y in pts if x and y is not None and x > 0 and y > 0]
            if not pts:
                continue
            xs, ys = np.array(pts).T
            color = f"C{i}"
            ax.scatter(xs, ys, s=14, alpha=0.5, color=color, label=f"{method} ({len(pts)})")
            ax.scatter([np.median(xs)], [np.median(ys)], s=160, marker="X", color=color,
                       edgecolor="black", zorder=5)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("model evaluations per fit (median over seeds)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("Accuracy against model evaluations (X: median over models)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
