"""The TrustVI paper's benchmark protocol (Regier, Jordan & McAuliffe 2017, §5;
docs/algorithms.md#benchmark-protocol), the one home of its rules: shared by ``stanvi bench
methods`` (:mod:`stanvi.bench.methods_bench`), ``stanvi bench stopping``, ``stanvi bench peers``
and the batch runs and report (:mod:`stanvi.batch.child`, :mod:`stanvi.batch.summary`).

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

from stanvi.estimators.elbo import mean_of_valid

__all__ = ["RunSummary", "elbo_values", "final_elbos", "first_consistent", "median_run",
           "protocol_pair", "summarize_run"]


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


def _log_spaced(n: int, k: int) -> np.ndarray:
    if n <= k:
        return np.arange(n)
    idx = np.unique(np.round(np.geomspace(1, n, k)).astype(int) - 1)
    return np.unique(np.concatenate([[0], idx, [n - 1]]))


def elbo_values(est, params, eps, screen: int = 200) -> np.ndarray | None:
    """The per-draw ELBO terms ℓ(λ; ε_j) at ``params`` on the fixed draws ``eps``, the first
    ``screen`` evaluated first: None, and the rest not evaluated, where most of those fail.

    The screen: in the long benchmark process a C++ exception from the model cost about 1 ms
    (17.7 µs in a fresh process; the unwinder slows with every XLA compilation, 29.8 µs after
    300), so 2,000 throwing draws at each of 60 trace points of a diverged run took minutes."""
    head = np.asarray(est.values(params, eps[:screen]))
    if np.isfinite(head).sum() * 2 < len(head) * 0.8:  # well below half: no need for the rest
        return None
    return np.concatenate([head, np.asarray(est.values(params, eps[screen:]))]) \
        if len(eps) > screen else head


def _evaluate(est, params, eps, screen: int = 200) -> float:
    """The ELBO estimate at ``params`` with the fixed draws ``eps``.  Draws where the model
    cannot be evaluated (a ``reject()``, a domain error) are dropped, as Stan's ADVI does in
    its ELBO (docs/algorithms.md#failed-draws); if more than half of them fail, −inf (at once
    where most of the first ``screen`` fail: :func:`elbo_values`)."""
    vals = elbo_values(est, params, eps, screen)
    return -math.inf if vals is None else mean_of_valid(vals, len(vals) // 2 + 1)


def final_elbos(fit, eps) -> tuple[float, float, float]:
    """A fit's ELBO at its final parameters on the fixed draws ``eps``, both ways the batch
    records it, from one evaluation of the model (docs/batch.md#the-results-store): the plain
    mean with its standard error, a failing draw counting −inf (as
    :meth:`stanvi.fit_result.FitResult.elbo` counts it: the ELBO is then −inf, honestly, and
    the error NaN), and the protocol's final ELBO, failing draws dropped (:func:`_evaluate`;
    −inf for a failed run)."""
    vals = elbo_values(fit._estimator, fit.params, eps)
    if vals is None:
        return -math.inf, math.nan, -math.inf
    if np.isfinite(vals).all():
        plain, se = float(vals.mean()), float(vals.std(ddof=1) / math.sqrt(vals.size))
    else:
        plain, se = -math.inf, math.nan
    final = -math.inf if fit.status == "failed" else mean_of_valid(vals, len(vals) // 2 + 1)
    return plain, se, final


def summarize_run(fit, config: str, eps_final, eps_eval, trace_points: int,
                  final: float | None = None) -> RunSummary:
    """A fit as a :class:`RunSummary`: its final ELBO on ``eps_final`` (−inf when it failed;
    ``final``, where the caller has it already from the same draws: :func:`final_elbos`) and
    the evaluation ELBO on ``eps_eval`` at up to ``trace_points`` log-spaced trace rows."""
    est = fit._estimator
    tr = fit.trace
    kept = tr.kept_rows()
    idx = kept[_log_spaced(len(kept), trace_points)]
    elbos = np.array([_evaluate(est, tr.params_at(int(i)), eps_eval) for i in idx])
    col = lambda name: tr.column(name)[idx]  # noqa: E731
    draws = (col("gradient_draws") + col("hvp_draws") + col("log_density_draws")
             + np.nan_to_num(col("screening_draws")) + np.nan_to_num(col("redrawn_draws")))
    if final is None:
        final = -math.inf if fit.status == "failed" else _evaluate(est, fit.params, eps_final)
    o = fit.oracle
    return RunSummary(config=config, seed=fit.seed, status=fit.status, final_elbo=final,
                      iterations=len(tr) - 1, oracle=o["oracle_scaled"],
                      draw_evals=int(o["gradient_draws"] + o["hvp_draws"] + o["log_density_draws"]
                                     + o.get("screening_draws", 0) + o.get("redrawn_draws", 0)),
                      wall=fit.wall_time - fit.compile_time, trace_iter=idx,
                      trace_oracle=col("oracle_scaled"), trace_draws=draws,
                      trace_wall=col("wall_time") - np.nan_to_num(col("compile_time")),
                      trace_elbo=elbos,
                      grad_draws=int(o["gradient_draws"] + o.get("redrawn_draws", 0)),
                      hvp_draws=int(o["hvp_draws"]),
                      ld_draws=int(o["log_density_draws"] + o.get("screening_draws", 0)),
                      model_seconds=float(fit.info.get("model_seconds", np.nan)))
