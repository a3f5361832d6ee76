"""The TrustVI paper's benchmark protocol (Regier, Jordan & McAuliffe 2017, §5;
docs/algorithms.md#benchmark-protocol), the one home of its rules: shared by ``stanvi bench
methods`` (:mod:`stanvi.bench.methods_bench`), ``stanvi bench stopping`` and the batch report
(:mod:`stanvi.batch.summary`).

* A run is summarized as a :class:`RunSummary`: its final ELBO on draws common to every run of
  the model (a failed run is −∞) and evaluation ELBOs at trace points, each with its iteration,
  oracle calls, draw-level evaluations and run time.
* :func:`median_run`: the run whose final ELBO is the median of the seeds (3rd of 5; ties by
  seed), failures ranking lowest.
* :func:`first_consistent`: the first trace point after which every evaluation ELBO stays at or
  above a threshold.
* :func:`protocol_pair`: a pair of median runs: a tie is within 1 nat; the threshold is the worse
  final ELBO − 1 nat; each run's cost is its oracle calls at its first consistent point; a pair is
  excluded when a median run failed, when either reaches the threshold in fewer than 5
  iterations, or when neither reaches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RunSummary", "first_consistent", "median_run", "protocol_pair"]


@dataclass
class RunSummary:
    config: str
    seed: int
    status: str
    final_elbo: float
    iterations: int
    oracle: float
    draw_evals: int
    wall: float
    trace_iter: np.ndarray = field(repr=False)
    trace_oracle: np.ndarray = field(repr=False)
    trace_draws: np.ndarray = field(repr=False)
    trace_wall: np.ndarray = field(repr=False)
    trace_elbo: np.ndarray = field(repr=False)
    grad_draws: int = 0
    hvp_draws: int = 0
    ld_draws: int = 0
    model_seconds: float = float("nan")


def median_run(runs: list[RunSummary]) -> RunSummary:
    """The run whose final ELBO is the median (3rd of 5; ties by seed); failures rank −inf."""
    order = sorted(runs, key=lambda r: (r.final_elbo, -r.seed))
    return order[(len(order) - 1) // 2] if len(order) % 2 else order[len(order) // 2 - 1]


def first_consistent(run: RunSummary, threshold: float) -> int | None:
    """Index into the trace points of the first point after which every evaluated ELBO is
    ≥ threshold (docs/algorithms.md#benchmark-protocol); None if there is none."""
    above = run.trace_elbo >= threshold
    if not above.size or not above[-1]:   # no trace points (e.g. Stan's own algorithms)
        return None
    bad = np.flatnonzero(~above)
    return 0 if len(bad) == 0 else int(bad[-1]) + 1


def protocol_pair(a: RunSummary, b: RunSummary) -> dict[str, Any]:
    """The protocol's comparison of median runs ``a`` (the method under test) and ``b``: quality
    (``a_better``/``tie``/``b_better`` by more than 1 nat), the threshold, each one's oracle
    calls to reach it consistently, the ratio b/a and the exclusion reason ('' if kept;
    ``quality`` None when a median run failed)."""
    if not (math.isfinite(a.final_elbo) and math.isfinite(b.final_elbo)):
        return {"excluded": "a median run failed", "quality": None}
    diff = a.final_elbo - b.final_elbo
    quality = "a_better" if diff > 1 else "b_better" if diff < -1 else "tie"
    thr = min(a.final_elbo, b.final_elbo) - 1.0
    ta, tb = first_consistent(a, thr), first_consistent(b, thr)
    ra = math.inf if ta is None else float(a.trace_oracle[ta])
    rb = math.inf if tb is None else float(b.trace_oracle[tb])
    ia = None if ta is None else int(a.trace_iter[ta])
    ib = None if tb is None else int(b.trace_iter[tb])
    excluded = ("fewer than 5 iterations" if (ia is not None and ia <= 4)
                or (ib is not None and ib <= 4) else
                "neither reaches the threshold" if ta is None and tb is None else "")
    ratio = rb / ra if ra > 0 else math.inf
    return {"quality": quality, "threshold": thr, "oracle_a": ra, "oracle_b": rb,
            "ratio": ratio, "excluded": excluded}
