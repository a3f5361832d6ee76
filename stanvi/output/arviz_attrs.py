"""The metadata of a fit as netCDF-safe attributes, and its trace as columns: what the
DataTree (:mod:`stanvi.output.arviz_io`) and the Stan CSV (:mod:`stanvi.output.writers`) both write
(docs/algorithms.md#output-format).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np


def jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def options_json(options: Any) -> str:
    """The method's options as a JSON object string."""
    return json.dumps(jsonable(options), sort_keys=False)


def attr_value(value: Any) -> Any:
    """A netCDF-safe attribute value (str, int, float)."""
    if isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (int, float, str)):
        return value
    if value is None:
        return ""
    return json.dumps(jsonable(value))


def trace_columns(trace) -> dict[str, np.ndarray]:
    """The iteration trace's rows as columns: booleans, numbers (NaN where a row did not
    record the field; integers kept when every row has one) or strings."""
    rows = list(getattr(trace, "rows", []) or [])
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k not in keys:
                keys.append(k)
    cols: dict[str, np.ndarray] = {}
    for k in keys:
        vals = [r.get(k) for r in rows]
        present = [v for v in vals if v is not None]
        if present and all(isinstance(v, (bool, np.bool_)) for v in present):
            if len(present) == len(vals):
                cols[k] = np.array(vals, dtype=bool)
            else:  # missing booleans: 1/0 with NaN for "not recorded"
                cols[k] = np.array([np.nan if v is None else float(v) for v in vals])
        elif all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                 for v in present):
            cols[k] = np.array([np.nan if v is None else float(v) for v in vals], dtype=float)
            if (present and len(present) == len(vals)
                    and all(isinstance(v, (int, np.integer)) for v in present)):
                cols[k] = cols[k].astype(np.int64)
        else:
            cols[k] = np.array(["" if v is None else str(v) for v in vals], dtype=str)
    return cols


def fit_attrs(fit, diagnostics=None) -> dict[str, Any]:
    """The metadata of a fit as netCDF-safe attributes."""
    from stanvi.version import __version__  # noqa: PLC0415

    attrs: dict[str, Any] = {
        "inference_library": "stanvi",
        "inference_library_version": __version__,
        "stanvi_version": __version__,
        "model": str(getattr(fit.target, "name", "")),
        "method": fit.method,
        "family": fit.family_name,
        "profile": str(fit.profile),
        "options": options_json(fit.options),
        "seed": int(fit.seed),
        "status": fit.status,
        "message": fit.message or "",
        "iterations": max(len(fit.trace) - 1, 0),
        "num_draws": int(np.shape(fit.log_p)[0]),
        "unconstrained_dim": int(fit.unconstrained_draws.shape[1]),
        "wall_time": float(fit.wall_time),
        "compile_time": float(fit.compile_time),
        "setup_time": float(fit.setup_time),
        "run_time": float(fit.wall_time - fit.compile_time),
    }
    for k, v in fit.oracle.items():
        attrs[k] = v
    if "hvp_method" in fit.info:
        attrs["hvp_method"] = fit.info["hvp_method"]
    attrs["data_source"] = str(fit.info.get("data_source", "") or "")
    if hasattr(fit.target, "variable_kinds"):
        attrs["variable_kinds"] = json.dumps(fit.target.variable_kinds())
    attrs["oracle_counts"] = json.dumps(jsonable(dict(fit.oracle)))
    attrs["info"] = json.dumps(jsonable(dict(fit.info)))
    if diagnostics is not None:
        attrs.update({
            "pareto_k": float(diagnostics.khat),
            "pareto_k_threshold": float(diagnostics.threshold),
            "verdict": diagnostics.verdict,
            "means": str(getattr(diagnostics, "means", "")),
            "ess_importance": float(diagnostics.ess),
            "pareto_k_se": float(getattr(diagnostics, "khat_se", float("nan"))),
            "n_diagnostic_draws": int(diagnostics.n_draws),
            "failed_fraction": float(getattr(diagnostics, "failed_fraction", 0.0)),
            "failure_message": str(getattr(diagnostics, "failure_message", "")),
            "elbo": float(diagnostics.elbo),
            "elbo_se": float(diagnostics.elbo_se),
        })
    return {k: attr_value(v) for k, v in attrs.items()}
