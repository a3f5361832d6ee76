"""Handing a batch's fits to Dask a few at a time, in the batch's order
(docs/batch.md#skip-after-timeout).

Submitting every fit at once leaves their order to Dask, and Dask does not keep it: with
its scheduler-side queue (``distributed.scheduler.worker-saturation``), the fits it counts as
"root-ish" wait on the scheduler until the workers have nothing else, while fits submitted
later, once the fits' task group depends on a few compile or reference tasks, go straight to
the workers' own queues and run first.  In the T3-4 paper protocol (2026-12-07) that ran seed 1
of 34 models before their seed 0, priorities notwithstanding.  :class:`FitFeeder` keeps the
order itself: it holds the fits back, and whenever fewer than ``2 × threads`` are on the
cluster submits the first one, in the batch's order, whose model's compile and NUTS reference
are done.  So Dask never holds more than a worker's next task, and the order of the rest is
this list's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stanvi.batch.discover import ModelCase
from stanvi.batch.tasks import FitSpec

__all__ = ["FitFeeder", "fit_slots"]


def fit_slots(client: Any) -> int:
    """How many fits the cluster holds at once: two per worker thread (one running, one
    next), at least 2."""
    return max(2, 2 * sum(client.nthreads().values()))


def settled(value: Any) -> Any:
    """A finished future's result, so that the fit does not depend on it in Dask; anything
    else (a record, an erred future whose error the fit then carries) as it is."""
    if getattr(value, "status", None) == "finished":
        return value.result()
    return value


def is_done(value: Any) -> bool:
    """Whether ``value`` (a record, or a future) is no longer running."""
    done = getattr(value, "done", None)
    return done() if callable(done) else True


class FitFeeder:
    """The fits of a batch, submitted in ``todo``'s order as slots on the cluster free up.

    ``needs(case)`` gives the compile and reference (records or futures) the case's fits
    take; ``submit(case, spec, compiled, reference)`` submits one fit and returns its
    future; ``slots()`` is how many fits the cluster should hold at once."""

    def __init__(self, todo: Sequence[tuple[ModelCase, FitSpec]],
                 needs: Callable[[ModelCase], tuple[Any, Any]],
                 submit: Callable[[ModelCase, FitSpec, Any, Any], Any],
                 slots: Callable[[], int]) -> None:
        self._waiting = list(todo)
        self._needs = needs
        self._submit = submit
        self._slots = slots
        self.in_flight = 0

    def __len__(self) -> int:
        """The fits not submitted yet."""
        return len(self._waiting)

    def finished_one(self) -> None:
        """A submitted fit has finished: its slot is free."""
        self.in_flight -= 1

    def refill(self) -> list[tuple[Any, ModelCase, FitSpec]]:
        """Submit fits, first ready first, until the cluster holds ``slots()`` of them; the
        (future, case, spec) submitted."""
        out = []
        if not self._waiting:
            return out
        free = self._slots() - self.in_flight
        index = 0
        while free > 0 and index < len(self._waiting):
            case, spec = self._waiting[index]
            compiled, reference = self._needs(case)
            if not (is_done(compiled) and is_done(reference)):
                index += 1
                continue
            del self._waiting[index]
            out.append((self._submit(case, spec, settled(compiled), settled(reference)),
                        case, spec))
            self.in_flight += 1
            free -= 1
        return out
