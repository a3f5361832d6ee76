"""The per-element summary table shared by stanvi's fits and Stan's reference runs.

The statistics are arviz-stats' (``arviz_stats.base.array_stats``: mean, sd with ``ddof=1``,
quantiles with numpy's linear interpolation), the same functions ``arviz_stats.summary`` uses on
a fit's DataTree; the rows are named and ordered as cmdstanpy names Stan's elements
(``beta[1]``, ``Sigma[2,1]``, column-major), which is also how the DataTree's 1-based
coordinates label them in ``arviz_stats.summary`` (there with a space after the comma).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np

from stanvi.stan.names import element_labels


def _flat(draws: Mapping[str, np.ndarray]) -> tuple[list[str], np.ndarray]:
    """(element labels, draws as an (n_draws, n_elements) float array in Stan's order)."""
    labels: list[str] = []
    cols = []
    for name, arr in draws.items():
        arr = np.asarray(arr, dtype=float)
        cols.append(arr.reshape(arr.shape[0], -1, order="F"))
        labels += element_labels(name, arr.shape[1:])
    n = cols[0].shape[0] if cols else 0
    return labels, (np.concatenate(cols, axis=1) if cols else np.zeros((n, 0)))


def summary_table(draws: Mapping[str, np.ndarray], percentiles: tuple[float, ...] = (5, 50, 95)):
    """A pandas DataFrame of mean, sd and percentiles per scalar element, one row per element
    named like cmdstanpy (``beta[1]``, ``Sigma[2,1]``); ``draws`` maps Stan names to arrays of
    shape ``(n_draws, *shape)``.  Non-finite draws (±inf, NaN) are left out of each element's
    statistics; an element with no finite draw gets NaN, one with a single finite draw NaN sd."""
    import pandas as pd  # noqa: PLC0415
    from arviz_stats.base import array_stats  # noqa: PLC0415

    percentiles = tuple(float(p) for p in percentiles)
    if any(not 0 <= p <= 100 for p in percentiles):
        raise ValueError(f"percentiles must lie in [0, 100], got {percentiles}")
    labels, x = _flat(draws)
    x = np.where(np.isfinite(x), x, np.nan)
    columns = ["mean", "sd"] + [f"{p:g}%" for p in percentiles]
    if x.shape[1] == 0:
        return pd.DataFrame(np.zeros((0, len(columns))), columns=columns)
    n_finite = np.sum(~np.isnan(x), axis=0)
    with warnings.catch_warnings():   # all-NaN columns: NaN results, said in the docstring
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.asarray(array_stats.mean(x, axis=0, skipna=True), dtype=float)
        sd = np.asarray(array_stats.std(x, axis=0, skipna=True), dtype=float)
        quantiles = (np.asarray(array_stats.quantile(x, [p / 100 for p in percentiles], axis=0,
                                                     skipna=True), dtype=float)
                     if percentiles else np.zeros((x.shape[1], 0)))
    quantiles = quantiles.reshape(x.shape[1], len(percentiles))
    mean = np.where(n_finite > 0, mean, np.nan)
    sd = np.where(n_finite > 1, sd, np.nan)
    quantiles = np.where((n_finite > 0)[:, None], quantiles, np.nan)
    table = np.column_stack([mean, sd, quantiles])
    return pd.DataFrame(table, index=labels, columns=columns)


def summary_text(fit, var_names=None, max_rows: int = 40) -> str:
    """``fit.summary(var_names=...)`` as ``stanvi fit`` prints it: 4 significant figures, at
    most ``max_rows`` rows (any fit with a ``summary`` method: stanvi's, Stan's)."""
    import pandas as pd  # noqa: PLC0415

    with pd.option_context("display.max_rows", max_rows, "display.width", 120):
        return fit.summary(var_names=var_names).to_string(float_format=lambda x: f"{x:.4g}",
                                                          max_rows=max_rows)
