"""A fit's diagnostics in its ArviZ DataTree, the ``vi_diagnostics`` group, and back: the log
importance ratios of the diagnostic draws and the PSIS log weights, with the scalar figures
(k̂, its band and what decided it, the means' reading) as attributes (docs/quickstart.md#arviz;
stanvi's fits, :mod:`stanvi.output.arviz_io`, and Stan's ADVI and Pathfinder run through
``stanvi.fit``, :mod:`stanvi.reference.result_io`).
"""

from __future__ import annotations

import json
import math

import numpy as np

from stanvi.diagnostics.report import Diagnostics
from stanvi.output.arviz_attrs import attr_value

__all__ = ["diagnostics_dataset", "diagnostics_from_dataset"]


def diagnostics_dataset(diag: Diagnostics):
    """``vi_diagnostics``: the log importance ratios of the diagnostic draws and the PSIS log
    weights, with the scalar diagnostics as attributes."""
    from xarray import Dataset  # noqa: PLC0415

    data_vars = {"log_weights": ("draw", np.asarray(diag.log_weights, dtype=float))}
    if diag.log_ratios is not None:
        data_vars["log_ratios"] = ("diagnostic_draw", np.asarray(diag.log_ratios, dtype=float))
    attrs = {k: attr_value(v) for k, v in diag.to_dict().items() if k != "warnings"}
    attrs["warnings"] = json.dumps(list(diag.warnings))
    return Dataset(data_vars, coords={"draw": np.arange(len(diag.log_weights))}, attrs=attrs)


def diagnostics_from_dataset(ds, method: str) -> Diagnostics:
    """The :class:`~stanvi.diagnostics.report.Diagnostics` that :func:`diagnostics_dataset`
    wrote (a fit saved before a figure was kept: its default)."""
    a = dict(ds.attrs)
    log_ratios = np.asarray(ds["log_ratios"].values, dtype=float) if "log_ratios" in ds else None
    return Diagnostics(
        khat=float(a["khat"]), threshold=float(a["threshold"]), verdict=str(a["verdict"]),
        ess=float(a["ess"]), ess_raw=float(a["ess_raw"]), n_draws=int(a["n_draws"]),
        n_failed=int(a["n_failed"]), elbo=float(a["elbo"]), elbo_se=float(a["elbo_se"]),
        log_weights=np.asarray(ds["log_weights"].values, dtype=float), log_ratios=log_ratios,
        khat_se=float(a.get("khat_se", math.nan)),
        failed_fraction=float(a.get("failed_fraction", 0.0)),
        failure_message=str(a.get("failure_message", "")),
        n_output_draws=int(a.get("n_output_draws", 0)), status=str(a.get("status", "")),
        message=str(a.get("message", "")), method=str(a.get("method", method)),
        warnings=list(json.loads(a.get("warnings", "[]"))),
        borderline=bool(a.get("borderline", False)),
        mean_shift=float(a.get("mean_shift", math.nan)),
        mean_shift_at=int(a.get("mean_shift_at", -1)),
        # a fit saved before the means were read: the verdict's own reading where it passes q
        means=str(a.get("means", "hold" if a["verdict"] != "unreliable" else "doubtful")))
