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
