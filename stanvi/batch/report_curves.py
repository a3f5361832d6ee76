"""The report's accuracy-against-evaluations curves (``evaluations.png``; docs/batch.md#the-report):
per configuration, the median over models of the ELBO gap of its median run against the model
evaluations it had made, with the configurations that report only their end (Stan's
Pathfinder) as single points.

The gap at x evaluations is best − ELBO of the last trace point at or below x, where best is the
largest final ELBO of any configuration's median run on that model (all on the batch's common
draws). The ELBO gap is the difference of KL(q‖p) between the two: the accuracy measure every
configuration shares, and the only one the trace keeps along the way. Before a run's first
trace point its gap is infinite, so a median is drawn only where at least half the models have
a point.
"""

from __future__ import annotations

import math

import numpy as np

from stanvi.batch.summary import as_run
from stanvi.evaluation.protocol import median_run

GRID = np.logspace(1, 7, 121)
"""Model evaluations at which the curves are read (10 to 10⁷, 20 points a decade)."""
GAP_FLOOR = 1e-2
"""Gaps below this many nats are drawn at it (the log axis)."""


def gap_curve(draws: np.ndarray, elbo: np.ndarray, best: float,
              grid: np.ndarray = GRID) -> np.ndarray:
    """best − the ELBO of the last trace point with at most x evaluations, for each x in
    ``grid`` (inf before the first point; a point whose ELBO is not finite counts as inf)."""
    order = np.argsort(draws, kind="stable")
    draws, elbo = np.asarray(draws, float)[order], np.asarray(elbo, float)[order]
    idx = np.searchsorted(draws, grid, side="right") - 1
    gap = np.full(grid.shape, math.inf)
    ok = idx >= 0
    vals = best - elbo[idx[ok]]
    gap[ok] = np.where(np.isfinite(vals), np.maximum(vals, 0.0), math.inf)
    return gap


def curves(grouped: dict[str, dict[str, list[dict]]]) -> tuple[dict, dict]:
    """({config: median gap over models on GRID}, {config: (median evaluations, median final
    gap)} for configurations none of whose median runs has trace points).

    A configuration is drawn one way only: where some of its median runs have a trace, a model
    whose median run has none (a partial record, kept without its trace) enters its curve by
    its end alone, as a trace of one point, so that no configuration is also drawn as a point
    that stands for a few models."""
    traced: dict[str, list[np.ndarray]] = {}
    ends: dict[str, list[tuple[float, float]]] = {}
    for model, configs in grouped.items():
        meds = {cfg: median_run([as_run(r) for r in recs]) for cfg, recs in configs.items()}
        finals = [m.final_elbo for m in meds.values() if math.isfinite(m.final_elbo)]
        if not finals:
            continue
        best = max(finals)
        for cfg, med in meds.items():
            if med.trace_draws.size:
                traced.setdefault(cfg, []).append(gap_curve(med.trace_draws, med.trace_elbo,
                                                            best))
            elif math.isfinite(med.final_elbo):
                ends.setdefault(cfg, []).append((med.draw_evals, best - med.final_elbo))
    for cfg in set(traced) & set(ends):   # its untraced models: a one-point trace at the end
        traced[cfg] += [gap_curve(np.array([evals]), np.array([-gap]), best=0.0)
                        for evals, gap in ends.pop(cfg)]
    lines = {cfg: np.median(np.vstack(gs), axis=0) for cfg, gs in traced.items()}
    points = {cfg: (float(np.median([e for e, _ in pts])), float(np.median([g for _, g in pts])))
              for cfg, pts in ends.items()}
    return lines, points


def without_elbo(grouped: dict[str, dict[str, list[dict]]]) -> list[str]:
    """The configurations with runs none of which has a finite final ELBO (multi-path
    Pathfinder: its draws are resampled from several paths' Gaussians, so there is no one q
    whose ELBO the batch could evaluate); the plot names them instead of leaving them out
    silently."""
    runs: dict[str, bool] = {}
    for configs in grouped.values():
        for cfg, recs in configs.items():
            finite = any(math.isfinite(as_run(r).final_elbo) for r in recs)
            runs[cfg] = runs.get(cfg, False) or finite
    return sorted(cfg for cfg, any_finite in runs.items() if not any_finite)


def config_colours(plt, grouped: dict[str, dict[str, list[dict]]]) -> dict[str, tuple]:
    """One colour per configuration of the report, the same in every plot (a configuration
    drawn blue in one figure and orange in the next was read as another method): tab10 by
    sorted name, tab20 past ten configurations."""
    configs = sorted({cfg for configs in grouped.values() for cfg in configs})
    palette = plt.get_cmap("tab10" if len(configs) <= 10 else "tab20")
    return {cfg: palette(i % palette.N) for i, cfg in enumerate(configs)}


def evaluations_plot(plt, out, grouped, colours: dict[str, tuple] | None = None) -> str | None:
    """Write ``evaluations.png``; None (and no file) when no configuration has a trace."""
    from stanvi.batch.recommend import label  # noqa: PLC0415

    colours = colours or config_colours(plt, grouped)
    lines, points = curves(grouped)
    path = out / "evaluations.png"
    if not lines:
        path.unlink(missing_ok=True)
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cfg, gap in sorted(lines.items()):
        shown = np.isfinite(gap)
        ax.plot(GRID[shown], np.maximum(gap[shown], GAP_FLOOR), lw=1.5, label=label(cfg),
                color=colours[cfg])
    for cfg, (evals, gap) in sorted(points.items()):
        ax.scatter([evals], [max(gap, GAP_FLOOR)], s=60, marker="D", edgecolor="black",
                   color=colours[cfg], label=f"{label(cfg)} (end only)")
    ax.axhline(1.0, color="grey", ls=":", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("model evaluations (gradients, HVPs and densities, per draw)")
    ax.set_ylabel("ELBO gap to the best method (nats)")
    ax.set_title(f"Accuracy against evaluations: median over models ({len(grouped)})\n"
                 "of each configuration's median run (dotted: 1 nat)", fontsize=9)
    unshown = without_elbo(grouped)
    if unshown:
        ax.text(0.01, 0.01, "not shown, no ELBO (resampled draws): "
                + ", ".join(label(c) for c in unshown), transform=ax.transAxes, fontsize=7,
                va="bottom", ha="left", color="dimgrey")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name
