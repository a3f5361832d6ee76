"""Stan ADVI's two decision rules, line for line (docs/algorithms.md#advi): the step-size scale
η chosen by ``advi::adapt_eta`` (:func:`select_eta`), and the convergence test of
``advi::stochastic_gradient_ascent``: the relative ELBO change over a circular buffer, its mean
and "median" against ``tol_rel_obj`` (:class:`RelativeTolerance`; Kucukelbir et al. 2017, JMLR
18(14))."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from stanvi.errors import VIError

DBL_MAX = sys.float_info.max
ETA_GRID: tuple[float, ...] = (100.0, 10.0, 1.0, 0.1, 0.01)   # adapt_eta's eta_sequence


def rel_difference(prev: float, curr: float) -> float:
    """|(curr − prev) / prev| with IEEE semantics (÷0 gives inf or NaN, as in C++) [S]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.abs((np.float64(curr) - np.float64(prev)) / np.float64(prev)))


def circ_buff_median(values: Sequence[float]) -> float:
    """Stan's buffer "median": the element at index ⌊n/2⌋ after ``nth_element`` (the upper
    median for even n, no averaging) [S]."""
    v = sorted(values)
    return float(v[len(v) // 2])


class Check(NamedTuple):
    elbo: float
    rel_change: float
    rel_mean: float
    rel_median: float
    converged_mean: bool
    converged_median: bool

    @property
    def converged(self) -> bool:
        return self.converged_mean or self.converged_median


class RelativeTolerance:
    """The convergence bookkeeping of ``stochastic_gradient_ascent`` (docs/algorithms.md#advi-convergence).

    ``elbo`` starts at 0.0 ([S]; so the first relative change is exactly 1.0) or at [R]'s
    pre-loop ELBO.  Each :meth:`update` pushes ``rel_difference(elbo, elbo_prev)`` =
    |(elbo_prev − elbo)/elbo| (denominator: the *current* ELBO) into a circular buffer of
    capacity ``cb_size`` and tests its mean and upper median against ``tol``.
    """

    def __init__(self, cb_size: int, tol: float, elbo0: float = 0.0) -> None:
        self.buffer: deque[float] = deque(maxlen=cb_size)
        self.tol = tol
        self.elbo = float(elbo0)
        self.elbo_best = -DBL_MAX

    def update(self, elbo: float) -> Check:
        elbo_prev, self.elbo = self.elbo, float(elbo)
        if self.elbo > self.elbo_best:
            self.elbo_best = self.elbo
        delta = rel_difference(self.elbo, elbo_prev)
        self.buffer.append(delta)
        mean = sum(self.buffer, 0.0) / len(self.buffer)   # std::accumulate, in buffer order
        median = circ_buff_median(self.buffer)
        return Check(self.elbo, delta, mean, median, mean < self.tol, median < self.tol)


def select_eta(elbo_init: float, run_trial: Callable[[float], float],
               etas: Sequence[float] = ETA_GRID) -> float:
    """Stan's ``adapt_eta`` decision rule (docs/algorithms.md#advi-eta; [S] ``advi::adapt_eta``), line for line.

    ``run_trial(eta)`` runs one trial from q₀ and returns its ELBO: −DBL_MAX when ``calc_ELBO``
    threw, otherwise ``calc_ELBO``'s value *as it is*, −∞ or NaN included (Stan maps only a
    thrown ``calc_ELBO`` to −DBL_MAX).  The comparisons are IEEE ones, as in C++, so:

    * a NaN trial ELBO never stops the search and becomes ``elbo_best``;
    * with ``elbo_init = −∞``, a first trial at −∞ stops at once with ``eta_best = 0`` (−∞ <
      −DBL_MAX and −DBL_MAX > −∞); the SGD phase then fails Stan's ``check_positive`` on η.

    Returns η (possibly 0, see above).  Raises :class:`VIError` ("All proposed step-sizes
    failed") when the last eta does not beat ``elbo_init``.
    """
    elbo_best, eta_best = -DBL_MAX, 0.0
    last = len(etas) - 1
    for index, eta in enumerate(etas):
        elbo = float(run_trial(eta))
        if elbo < elbo_best and elbo_best > elbo_init:
            return eta_best
        if index < last:
            elbo_best, eta_best = elbo, eta
        elif elbo > elbo_init:
            return eta
        else:
            raise VIError("stan::variational::advi::adapt_eta: All proposed step-sizes failed. "
                          "Your model may be either severely ill-conditioned or misspecified.")
    raise AssertionError("unreachable")  # pragma: no cover
