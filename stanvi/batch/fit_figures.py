"""The figures a batch fit record holds beside the fit itself, computed alike for stanvi's
fits (:func:`stanvi.batch.child.fit_job`) and Stan's own algorithms
(:func:`stanvi.batch.reference_job.reference_fit_job`; docs/batch.md#the-results-store): the
draws common to every run of a model, on which the ELBO is compared, and the accuracy of the
output draws against reference draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["COMMON_DRAWS_SEED", "ELBO_DRAWS", "EVAL_DRAWS", "RecordStages", "common_draws",
           "fit_accuracy"]

#: The number of common draws a fit's ELBO is computed on
ELBO_DRAWS = 10_000
#: The first this many of them give the protocol's evaluation ELBO along the trace
EVAL_DRAWS = 2_000
COMMON_DRAWS_SEED = 20261124   # the common draws of every run of a model (as the benches use)


def common_draws(n: int, width: int):
    """The ``n`` base draws (an (n, width) array) common to every run of a model (seed
    ``COMMON_DRAWS_SEED``, as the benches use): the record's ELBO is computed on them."""
    import jax  # noqa: PLC0415

    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415

    return standard_normal(jax.random.PRNGKey(COMMON_DRAWS_SEED), n, width)


def fit_accuracy(job: dict, draws_by_label: dict, unconstrained: dict | None) -> dict | None:
    """The accuracy figures of a fit's output draws against the job's reference draws
    (:mod:`stanvi.evaluation.accuracy`), in constrained and, where both sides have them,
    unconstrained space; None without reference draws."""
    from stanvi.evaluation.accuracy import marginal_accuracy, read_reference_npz  # noqa: PLC0415

    ref_path = job.get("reference_npz")
    if not ref_path or not Path(ref_path).is_file():
        return None
    ref_c, ref_u = read_reference_npz(ref_path)
    accuracy = {"constrained": marginal_accuracy(draws_by_label, ref_c)}
    if ref_u and unconstrained is not None:
        accuracy["unconstrained"] = marginal_accuracy(unconstrained, ref_u)
    return accuracy


class RecordStages:
    """The stages of a fit record as they are done (docs/batch.md#partial-records): each one's
    seconds go to the record's ``stage_seconds`` (what the task's time went to), and the record
    so far is reported through ``partial(record, stages done)`` (None: not reported)."""

    def __init__(self, record: dict[str, Any],
                 partial: Callable[[dict[str, Any], list[str]], None] | None,
                 since: float | None = None) -> None:
        """``since``: when the first stage began (``time.perf_counter()``; default now)."""
        self.record, self.partial, self.names = record, partial, []
        self.record["stage_seconds"] = {}
        self._since = time.perf_counter() if since is None else since

    def done(self, name: str, report: bool = True) -> None:
        """Stage ``name`` is done: time it, and report the record unless ``report`` is False
        (the last stage: the result follows)."""
        now = time.perf_counter()
        self.record["stage_seconds"][name] = now - self._since
        self._since = now
        self.names.append(name)
        if report and self.partial is not None:
            self.partial(self.record, list(self.names))
