"""A :class:`~stanvi.reference.result.ReferenceFit` as a DataTree and back, so that
``stanvi.read`` reads what ``ReferenceFit.save`` wrote (issue T3-5 item 2;
docs/stan_reference.md#through-fit).

The tree has ``posterior`` (chains × draws by Stan name, Stan's 1-based coordinates) and
``sample_stats`` (Stan's columns, renamed as ArviZ names them: ``lp__`` → ``lp`` …), and on the
root ``inference_library = "stanvi"`` with ``stanvi_reference`` = the algorithm, which is how
``stanvi.read`` tells it from a stanvi fit, and everything else the run reported: model name,
chains, evaluation counts, wall time, settings, Stan's messages, NUTS's sampler diagnostics, ADVI's
ELBO trace and mean (JSON where not a number or a string).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

#: Stan's column names → the names ArviZ gives them in ``sample_stats``
RENAME = {"lp__": "lp", "accept_stat__": "acceptance_rate", "stepsize__": "step_size",
          "treedepth__": "tree_depth", "n_leapfrog__": "n_steps", "divergent__": "diverging",
          "energy__": "energy", "lp_approx__": "lp_approx", "log_p__": "log_p",
          "log_g__": "log_g", "path__": "path"}
#: (log p, log q) columns of the variational algorithms' draws
RATIO_COLUMNS = {"stan-advi": ("log_p__", "log_g__"), "pathfinder": ("lp__", "lp_approx__")}


def _json(value: Any) -> str:
    def plain(v):
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple, np.ndarray)):
            return [plain(x) for x in np.asarray(v, dtype=object).tolist()] \
                if isinstance(v, np.ndarray) else [plain(x) for x in v]
        if isinstance(v, (np.integer, np.floating, np.bool_)):
            return v.item()
        return v
    return json.dumps(plain(value))


def _by_chain(arr: np.ndarray, chains: int) -> np.ndarray:
    arr = np.asarray(arr)
    return arr.reshape(chains, arr.shape[0] // chains, *arr.shape[1:])


def to_datatree(fit):
    """The run (a :class:`~stanvi.reference.result.ReferenceFit`) as a DataTree (module
    docstring)."""
    from arviz_base import from_dict  # noqa: PLC0415

    stats = {RENAME.get(k, k): _by_chain(v, fit.chains) for k, v in fit.stan_columns.items()}
    if "diverging" in stats:
        stats["diverging"] = stats["diverging"].astype(bool)
    dims, coords = {}, {}
    for name, arr in fit.draws.items():   # Stan's 1-based indices, as stanvi's own trees
        dims[name] = [f"{name}_dim_{k}" for k in range(arr.ndim - 1)]
        for k, n in enumerate(arr.shape[1:]):
            coords[f"{name}_dim_{k}"] = np.arange(1, n + 1)
    group_attrs = {"inference_library": "stanvi", "algorithm": fit.algorithm}
    tree = from_dict({"posterior": {k: _by_chain(v, fit.chains) for k, v in fit.draws.items()},
                      "sample_stats": stats}, dims=dims, coords=coords,
                     attrs={"posterior": group_attrs, "sample_stats": group_attrs})
    attrs = {"inference_library": "stanvi", "stanvi_reference": fit.algorithm,
             "model": fit.model_name, "chains": int(fit.chains), "wall_time": float(fit.wall_time),
             "settings": _json(fit.settings), "messages": _json(fit.messages)}
    for key in ("gradient_evaluations", "density_evaluations"):
        if getattr(fit, key) is not None:
            attrs[key] = int(getattr(fit, key))
    for key in ("sampler_diagnostics", "elbo_trace", "mean"):
        if getattr(fit, key) is not None:
            attrs[key] = _json(getattr(fit, key))
    tree.attrs = attrs
    if fit.has_proposal_density and (fit.fresh_verdict is not None
                                     or fit.saved_diagnostics is not None):
        # the verdict on fresh draws of q (needs the model): kept for the run read back
        from xarray import DataTree  # noqa: PLC0415

        from stanvi.output.diagnostics_io import diagnostics_dataset  # noqa: PLC0415

        tree["vi_diagnostics"] = DataTree(diagnostics_dataset(fit.diagnostics()))
    return tree


def fields_from_datatree(tree) -> dict[str, Any]:
    """The fields of the :class:`~stanvi.reference.result.ReferenceFit` that
    :func:`to_datatree` wrote (``ReferenceFit.from_datatree`` builds it)."""
    a = dict(tree.attrs)
    post = tree["posterior"].to_dataset()
    stats = tree["sample_stats"].to_dataset()

    def flat(values) -> np.ndarray:   # chain after chain, as the run had them
        arr = np.asarray(values)
        return arr.reshape((-1,) + arr.shape[2:])
    inverse = {v: k for k, v in RENAME.items()}
    columns = {inverse.get(k, k): flat(stats[k].values) for k in stats.data_vars}
    if "divergent__" in columns:
        columns["divergent__"] = columns["divergent__"].astype(float)
    algorithm = str(a["stanvi_reference"])
    ratio = RATIO_COLUMNS.get(algorithm.split("-multi")[0])
    loaded = {k: json.loads(a[k]) for k in ("sampler_diagnostics", "elbo_trace", "mean") if k in a}
    saved = None
    if "vi_diagnostics" in tree.children:
        from stanvi.output.diagnostics_io import diagnostics_from_dataset  # noqa: PLC0415

        saved = diagnostics_from_dataset(tree["vi_diagnostics"].to_dataset(), algorithm)
    return dict(
        algorithm=algorithm, model_name=str(a["model"]),
        draws={k: flat(post[k].values) for k in post.data_vars}, stan_columns=columns,
        chains=int(a["chains"]), gradient_evaluations=a.get("gradient_evaluations"),
        density_evaluations=a.get("density_evaluations"), wall_time=float(a["wall_time"]),
        settings=json.loads(a.get("settings", "{}")), messages=json.loads(a.get("messages", "[]")),
        sampler_diagnostics=loaded.get("sampler_diagnostics"),
        elbo_trace=np.asarray(loaded["elbo_trace"], dtype=float) if "elbo_trace" in loaded else None,
        mean={k: np.asarray(v) for k, v in loaded["mean"].items()} if "mean" in loaded else None,
        log_p=columns.get(ratio[0]) if ratio else None,
        log_q=columns.get(ratio[1]) if ratio else None, saved_diagnostics=saved)
