"""The report's accuracy-against-evaluations curves (stanvi/batch/report_curves.py)."""

from __future__ import annotations

import math

import numpy as np

from stanvi.batch.report_curves import curves, gap_curve


def test_gap_curve_reads_the_last_point_at_or_below_each_count():
    grid = np.array([5.0, 10.0, 15.0, 100.0, 1000.0])
    gap = gap_curve(np.array([100.0, 10.0]), np.array([-1.0, -7.0]), best=-0.5, grid=grid)
    # before the first point: inf; from 10 evaluations the second point's gap, from 100 the
    # first's (the points are sorted by evaluations)
    assert gap.tolist() == [math.inf, 6.5, 6.5, 0.5, 0.5]
    # a non-finite ELBO is an infinite gap; a point above "best" is a gap of 0
    gap = gap_curve(np.array([1.0, 2.0]), np.array([-np.inf, 3.0]), best=2.0,
                    grid=np.array([1.0, 2.0]))
    assert gap.tolist() == [math.inf, 0.0]


def _rec(model, method, seed, final, draws, elbo):
    return {"model": model, "method": method, "profile": "default", "family": "fullrank",
            "seed": seed, "status": "converged", "final_elbo": final,
            "draw_evaluations": int(draws[-1]) if draws else 500,
            "trace_points": {"iteration": list(range(len(draws))), "oracle": draws,
                             "draws": draws, "run_time": [0.0] * len(draws), "elbo": elbo}
            if draws else None}


def test_curves_are_medians_over_models_of_the_median_runs():
    grouped = {}
    for model, shift in (("a", 0.0), ("b", 10.0), ("c", 20.0)):
        grouped[model] = {
            "trustvi:default:fullrank": [_rec(model, "trustvi", s, -1.0 - shift + 0.1 * s,
                                              [100, 1000], [-50.0 - shift, -1.0 - shift + 0.1 * s])
                                         for s in range(3)],
            "pathfinder:multi:none": [_rec(model, "pathfinder", s, -3.0 - shift, [], [])
                                      for s in range(3)]}
    lines, points = curves(grouped)
    line = lines["trustvi:default:fullrank"]
    from stanvi.batch.report_curves import GRID  # noqa: PLC0415

    # best per model is TrustVI's median seed (-0.9 - shift); at 100..999 evaluations the gap is
    # 49.1 on every model, from 1000 on 0 (its own median run)
    assert np.all(np.isinf(line[GRID < 100]))
    assert np.allclose(line[(GRID >= 100) & (GRID < 1000)], 49.1)
    assert np.allclose(line[GRID >= 1000], 0.0)
    # Pathfinder has no trace: one point, its median evaluations and final gap (2.1 nats)
    assert points == {"pathfinder:multi:none": (500.0, points["pathfinder:multi:none"][1])}
    assert math.isclose(points["pathfinder:multi:none"][1], 2.1)


def test_a_traced_configuration_is_one_curve_with_its_untraced_models_by_their_end():
    """A partial record kept without its trace enters its configuration's curve at its end,
    instead of a second "(end only)" marker for that configuration; a configuration with no
    finite ELBO at all (multi-path Pathfinder) is named as not shown."""
    from stanvi.batch.report_curves import GRID, without_elbo  # noqa: PLC0415

    grouped = {}
    for model, traced in (("a", True), ("b", False), ("c", False)):
        draws, elbo = ([100, 1000], [-50.0, -1.0]) if traced else ([], [])
        recs = [_rec(model, "trustvi", s, -1.0, draws, elbo) for s in range(3)]
        if not traced:   # ended at 2000 evaluations, 3 nats below the best (Pathfinder's)
            for r in recs:
                r.update(final_elbo=-4.0, draw_evaluations=2000)
        grouped[model] = {
            "trustvi:default:fullrank": recs,
            "pathfinder:single:none": [_rec(model, "pathfinder", s, -1.0, [], [])
                                       for s in range(3)],
            "pathfinder:multi:none": [_rec(model, "pathfinder", s, None, [], [])
                                      for s in range(3)]}
        for r in grouped[model]["pathfinder:multi:none"]:
            r.update(profile="multi", final_elbo=None)
    lines, points = curves(grouped)
    assert set(points) == {"pathfinder:single:none"}
    line = lines["trustvi:default:fullrank"]
    # model a: 49 nats from 100 evaluations, 0 from 1000; b and c: inf before 2000, then 3 nats
    # (without them the curve would be a's alone: 0 from 1000 on)
    assert np.all(np.isinf(line[GRID < 2000]))
    assert np.allclose(line[GRID >= 2000], 3.0)
    assert without_elbo(grouped) == ["pathfinder:multi:none"]


def test_a_configuration_has_the_report_s_colour_in_the_evaluations_plot(tmp_path):
    """The evaluations plot draws each configuration, line or end point, in the colour the
    report gives it (the accuracy plot and the trace panels use the same map), not in the
    next colour of its own cycle: before, TrustVI's line and Pathfinder's point were both blue."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.colors import to_rgba  # noqa: PLC0415

    from stanvi.batch.report_curves import config_colours, evaluations_plot  # noqa: PLC0415

    grouped = {m: {"trustvi:default:fullrank": [_rec(m, "trustvi", s, -1.0, [100, 1000],
                                                     [-9.0, -1.0]) for s in range(3)],
                   "pathfinder:single:none": [_rec(m, "pathfinder", s, -2.0, [], [])
                                              for s in range(3)]} for m in ("a", "b")}
    colours = config_colours(plt, {"x": {"advi:stan:meanfield": [], **grouped["a"]}})
    assert len(set(colours.values())) == 3
    figures = []

    class KeepOpen:   # pyplot, with the figure kept for the test
        def __getattr__(self, name):
            return getattr(plt, name)

        def subplots(self, *a, **k):
            figures.append(plt.subplots(*a, **k))
            return figures[-1]

        def close(self, fig):
            pass

    assert evaluations_plot(KeepOpen(), tmp_path, grouped, colours) == "evaluations.png"
    (fig, ax) = figures[-1]
    try:
        (line,) = ax.get_lines()[:1]
        assert to_rgba(line.get_color()) == to_rgba(colours["trustvi:default:fullrank"])
        (point,) = ax.collections
        assert tuple(point.get_facecolor()[0]) == to_rgba(colours["pathfinder:single:none"])
    finally:
        plt.close(fig)
