"""The per-element summary table shared by stanvi's fits and Stan's reference runs."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stanvi.stan.names import element_labels


def summary_table(draws: Mapping[str, np.ndarray], percentiles: tuple[float, ...] = (5, 50, 95)):
    """A pandas DataFrame of mean, sd and percentiles per scalar element, one row per element
    named like cmdstanpy (``beta[1]``, ``Sigma[2,1]``); ``draws`` maps Stan names to arrays of
    shape ``(n_draws, *shape)``.  Non-finite draws are left out of each element's statistics."""
    import pandas as pd  # noqa: PLC0415

    rows, index = [], []
    for name, arr in draws.items():
        flat = arr.reshape(arr.shape[0], -1, order="F")
        for j, label in enumerate(element_labels(name, arr.shape[1:])):
            col = flat[:, j]
            finite = col[np.isfinite(col)]
            stats = [finite.mean() if len(finite) else np.nan,
                     finite.std(ddof=1) if len(finite) > 1 else np.nan]
            stats += (list(np.percentile(finite, percentiles)) if len(finite)
                      else [np.nan] * len(percentiles))
            rows.append(stats)
            index.append(label)
    columns = ["mean", "sd"] + [f"{p:g}%" for p in percentiles]
    return pd.DataFrame(rows, index=index, columns=columns)
