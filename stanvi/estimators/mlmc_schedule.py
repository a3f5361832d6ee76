"""MLMCVI's learning-rate schedulers, the sample-size schedule they imply, and the cost formulas
(docs/mlmcvi.md#sample-size, docs/mlmcvi.md#schedulers, docs/mlmcvi.md#cost; Fujisawa & Sato,
*Multilevel Monte Carlo Variational Inference*, JMLR, Algorithm 1, Theorem 2, Lemma 2,
Appendix D).

Level ``t`` of the multilevel gradient is iteration ``t`` of the optimizer.  The scheduler
η_t (with η_{−1} = η_0 = 1) plays two roles at once (docs/mlmcvi.md#schedulers): it sets the
step size α_t = α_0 η_t, and the sample size of level t,

    N_0 given,   N_t = ⌈η_{t−1} N_0⌉   (t ≥ 1; Algorithm 1 line 8),

the integer form of Theorem 2's allocation N_{t+1} = (η_t/η_{t−1}) N_t (with N_1 = N_0,
Remark 1).  The ceiling uses a 1e−9 tolerance (docs/mlmcvi.md#sample-size: 0.1²·100 evaluates
to 1.0000000000000002 and must give 1, not 2).  Nothing is measured: "adaptive" sample sizes
follow the learning-rate schedule.

Cost in draw-level gradient evaluations (docs/mlmcvi.md#cost): iteration 0 costs N_0, iteration
t ≥ 1 costs 2 N_t (both terms of each coupled difference), so a run to level T costs
N_0 + 2 Σ_{t=1}^T N_t, against N (T + 1) for plain Monte Carlo with N draws per iteration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SCHEDULERS = ("step", "time", "exp", "constant")
_CEIL_TOL = 1e-9


@dataclass(frozen=True)
class Scheduler:
    """η_t of docs/mlmcvi.md#schedulers (Appendix D), with η_t = 1 for t ≤ 0 (the convention
    η_{−1} = η_0 = 1):

    * ``"step"``: η_t = β^⌊t/r⌋ (step decay; every experiment in the paper);
    * ``"time"``: η_t = 1/(1 + β t) (time-based; the only Robbins-Monro one);
    * ``"exp"``: η_t = exp(−β t);
    * ``"constant"``: η_t = 1 (then N_t = N_0 at every level: the MC baselines' Adam runs of
      the paper's §5.1 use a constant learning rate).
    """

    kind: str = "step"
    beta: float = 0.5
    r: int = 100

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {list(SCHEDULERS)}, got {self.kind!r}")
        if not self.beta > 0 or (self.kind == "step" and self.beta > 1):
            raise ValueError(f"scheduler beta must be > 0 (and <= 1 for step decay), "
                             f"got {self.beta}")
        if self.r < 1:
            raise ValueError(f"scheduler drop period r must be >= 1, got {self.r}")

    def eta(self, t: int) -> float:
        """η_t (docs/mlmcvi.md#schedulers)."""
        if t <= 0:
            return 1.0
        if self.kind == "step":
            return float(self.beta ** (t // self.r))
        if self.kind == "time":
            return 1.0 / (1.0 + self.beta * t)
        if self.kind == "exp":
            return math.exp(-self.beta * t)
        return 1.0

    def is_drop(self, t: int) -> bool:
        """True at the iterations where step decay lowers η (t = k·r, k ≥ 1)."""
        return self.kind == "step" and t >= self.r and t % self.r == 0


def sample_size(scheduler: Scheduler, t: int, n0: int) -> int:
    """N_t of Algorithm 1: N_0 at t = 0, else ⌈η_{t−1} N_0 − 1e−9⌉ (at least 1;
    docs/mlmcvi.md#sample-size)."""
    if t <= 0:
        return int(n0)
    return max(1, math.ceil(scheduler.eta(t - 1) * n0 - _CEIL_TOL))


def sample_sizes(scheduler: Scheduler, n0: int, last_level: int) -> np.ndarray:
    """N_0 … N_T as an integer array (length T + 1)."""
    return np.array([sample_size(scheduler, t, n0) for t in range(last_level + 1)], dtype=int)


def mlmc_cost(scheduler: Scheduler, n0: int, last_level: int) -> int:
    """Draw-level gradient evaluations of a run to level T: N_0 + 2 Σ_{t=1}^T N_t
    (docs/mlmcvi.md#cost)."""
    sizes = sample_sizes(scheduler, n0, last_level)
    return int(sizes[0] + 2 * sizes[1:].sum())


def mc_cost(n: int, last_level: int) -> int:
    """Plain Monte Carlo with n draws per iteration over the same T + 1 updates: n (T + 1)."""
    return int(n * (last_level + 1))


def cost_ratio(scheduler: Scheduler, n0: int, last_level: int) -> float:
    """MLMC's cost over plain MC's with N = N_0 (docs/mlmcvi.md#cost: below 1 only when the
    mean of η_{t−1} over the run is below about ½)."""
    return mlmc_cost(scheduler, n0, last_level) / mc_cost(n0, last_level)


def equal_cost_draws(scheduler: Scheduler, n0: int, last_level: int) -> int:
    """The draws per iteration at which plain MC (or RQMC) costs what MLMC costs over the same
    number of updates: round(cost / (T + 1)), at least 1 (docs/mlmcvi.md#baselines: 41 for the
    default schedule, 41,041 against 40,900 evaluations)."""
    return max(1, round(mlmc_cost(scheduler, n0, last_level) / (last_level + 1)))


def low_cost_ok(scheduler: Scheduler, n0: int, last_level: int) -> bool:
    """Lemma 2's "low total cost condition": T ≥ 2 and η_t ≤ 1 − 2/N_0 for every
    t ≥ ⌊T/2⌋ (up to T), under which the ceilings' extra samples stay within the budget
    N_0 Σ_t C_t (docs/mlmcvi.md#sample-size).  That budget is about twice plain MC's with
    N = N_0; see :func:`cost_ratio` for the comparison that matters to users."""
    if last_level < 2:
        return False
    bound = 1.0 - 2.0 / n0
    return all(scheduler.eta(t) <= bound for t in range(last_level // 2, last_level + 1))
