"""Reading a saved fit back: :func:`read` (``stanvi.read``) rebuilds a :class:`SavedFit` from the
NetCDF (or Zarr) DataTree that :meth:`stanvi.Fit.save` writes.

A saved fit has what the fit had, except the loaded model: its draws by Stan name, log p and
log q, the unconstrained draws, the variational parameters (so ``mean``, ``covariance`` and
``variational_params_dict``), the iteration trace (without the iterates, except the last),
oracle counts, times, status, options, and the diagnostics exactly as computed after the fit.
What needs the model (``elbo()`` with fresh draws, ``diagnostics(resample=...)`` beyond the stored
weights) says so.  Variables that a JAX target named ``z.1``, ``z.2`` come back as one vector
``z``, as the DataTree holds them.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stanvi.errors import StanviError
from stanvi.fit_result import Fit, FitTrace
from stanvi.output.diagnostics_io import diagnostics_from_dataset

if TYPE_CHECKING:
    from stanvi.reference.result import ReferenceFit


class SavedTarget:
    """The model side of a saved fit: its name, dimension, unconstrained coordinate names and
    data as saved.  It cannot evaluate the model (load the model for that)."""

    def __init__(self, name: str, unconstrained_names: list[str],
                 data: dict[str, np.ndarray], kinds: dict[str, str] | None = None) -> None:
        self.name = name
        self.unconstrained_names = list(unconstrained_names)
        self.dim = len(self.unconstrained_names)
        self._data = data
        self._kinds = dict(kinds or {})

    def variable_kinds(self) -> dict[str, str]:
        """Each variable's block ('parameter', 'transformed_parameter', 'generated_quantity'),
        as saved (empty when the fit's target did not know)."""
        return dict(self._kinds)

    def data_dict(self) -> dict[str, Any]:
        """The data saved with the fit (observed and constant data)."""
        return dict(self._data)

    def __repr__(self) -> str:
        return f"SavedTarget({self.name!r}, dim={self.dim})"


@dataclass(repr=False)
class SavedFit(Fit):
    """A :class:`~stanvi.fit_result.Fit` read from disk by :func:`read`; ``path`` is where from and
    ``tree`` the DataTree as saved."""

    path: Path | None = None
    tree: Any = field(default=None, repr=False)
    _mean_row: dict[str, np.ndarray] | None = field(default=None, repr=False)

    def elbo(self, n_draws: int = 10_000, seed: int | None = None) -> tuple[float, float]:
        """Not available without the model: the ELBO estimated after the fit is
        ``fit.diagnostics().elbo`` (± ``elbo_se``)."""
        raise StanviError("a fit read from disk cannot draw fresh ELBO estimates (the model is "
                          "not loaded); fit.diagnostics().elbo is the ELBO estimated after the "
                          "fit")

    def diagnostics(self, resample: bool = False, **kwargs):
        """The diagnostics as saved; ``resample=True`` adds PSIS-resampled draws from the saved
        weights."""
        if self._diagnostics is None:   # saved without them: from the output draws
            from stanvi.diagnostics.report import compute  # noqa: PLC0415

            self._diagnostics = compute(self.log_p, self.log_q, status=self.status,
                                        message=self.message, method=self.method)
        if not resample and not kwargs:
            return self._diagnostics
        from dataclasses import replace  # noqa: PLC0415

        from stanvi.diagnostics.psis import resample_indices  # noqa: PLC0415

        d = replace(self._diagnostics, warnings=list(self._diagnostics.warnings))
        if resample:
            seed = kwargs.get("seed")
            idx = resample_indices(d.log_weights, kwargs.get("n_resample"),
                                   seed=(self.seed if seed is None else seed) + 7919)
            d.resampled_indices = idx
            d.resampled = {k: np.asarray(v)[idx] for k, v in self.draws.items()}
        return d

    def to_arviz(self, **kwargs):
        """The DataTree as saved (a copy); the conversion options were fixed when it was
        written."""
        if kwargs:
            raise TypeError(f"a fit read from disk has its DataTree as saved; options "
                            f"{sorted(kwargs)} apply when converting a fresh fit")
        return self.tree.copy()

    def save(self, directory, **kwargs):
        """Write the saved fit again (Stan CSV from the stored mean row, NetCDF, summary,
        diagnostics): :func:`stanvi.output.writers.save`."""
        from stanvi.output.writers import save  # noqa: PLC0415

        if kwargs.get("tree_kwargs"):
            raise TypeError("a fit read from disk has its DataTree as saved: no tree_kwargs")
        return save(self, directory, **kwargs)

    def __repr__(self) -> str:
        return "Saved" + super().__repr__() + (f" from {str(self.path)!r}" if self.path else "")


# ---------------------------------------------------------------------- reading
def _netcdf_path(path: Path) -> Path:
    """The DataTree file for ``path``: itself (.nc, a Zarr store), the .nc beside a .csv, or the
    one .nc in a directory."""
    if path.suffix == ".zarr" or (path.is_dir() and (path / ".zgroup").exists()
                                  or (path.is_dir() and (path / "zarr.json").exists())):
        return path
    if path.suffix == ".csv":
        nc = path.with_suffix(".nc")
        if nc.exists():
            return nc
        raise FileNotFoundError(f"{path} is a Stan CSV; stanvi.read needs the DataTree written "
                                f"beside it ({nc.name}), which holds the trace and parameters "
                                f"(stanio.read_csv reads the CSV alone; cmdstanpy.from_csv an "
                                f"ADVI fit's, or one saved with cmdstan_compatible=True)")
    if path.is_dir():
        found = sorted(path.glob("*.nc"))
        if len(found) == 1:
            return found[0]
        raise FileNotFoundError(f"{path} holds {len(found)} .nc files; name one of them"
                                + (f": {', '.join(p.name for p in found[:5])}" if found else ""))
    if not path.exists():
        raise FileNotFoundError(f"no saved fit at {path}")
    return path


def _scalar(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value


def _trace_from(ds, last_params: np.ndarray) -> FitTrace:
    rows: list[dict[str, Any]] = []
    n = int(ds.sizes.get("iteration", 0))
    columns = {k: np.asarray(ds[k].values) for k in ds.data_vars}
    for i in range(n):
        row: dict[str, Any] = {}
        for k, col in columns.items():
            v = _scalar(col[i])
            if isinstance(v, str):
                if v != "":
                    row[k] = v
            elif isinstance(v, float) and math.isnan(v):
                continue          # not recorded at this row
            else:
                row[k] = v
        rows.append(row)
    trace = FitTrace(rows=rows, params=[None] * n)
    trace._last = np.asarray(last_params, dtype=float)
    return trace


def _options_from(method: str, profile: str, stored: dict) -> Any:
    """The method's Options rebuilt from the saved values, or the dict itself when this
    version's options differ."""
    from stanvi.methods import get_method, make_options  # noqa: PLC0415

    try:
        return make_options(get_method(method), profile, stored)
    except Exception:  # noqa: BLE001  (another stanvi version's options: keep them as saved)
        return stored


def _group(tree, name: str):
    return tree[name].to_dataset() if name in tree.children else None


def read(path: str | os.PathLike) -> SavedFit | ReferenceFit:
    """A fit saved by :meth:`stanvi.Fit.save` (or :func:`stanvi.output.writers.save`), read back.

    Args:
        path: the ``.nc`` file (or Zarr store) ``save`` wrote, the ``.csv`` beside it, or a
            directory holding exactly one ``.nc``.

    Returns:
        for Stan's NUTS, ADVI or Pathfinder run by stanvi (``ReferenceFit.save``), the
        :class:`~stanvi.reference.result.ReferenceFit` again; otherwise a :class:`SavedFit`: draws by Stan name, log p / log q, unconstrained draws, the
        variational parameters and family, the trace, oracle counts, times, status, options and
        the diagnostics as computed after the fit (see the module docstring for what needs the
        model).
    """
    from stanvi.output.arviz_io import load_datatree  # noqa: PLC0415
    from stanvi.families import make_family  # noqa: PLC0415

    nc = _netcdf_path(Path(path))
    tree = load_datatree(nc)
    a = dict(tree.attrs)
    if a.get("stanvi_reference"):   # Stan's algorithm run by stanvi (ReferenceFit.save)
        from stanvi.reference.result import ReferenceFit  # noqa: PLC0415

        return ReferenceFit.from_datatree(tree)
    if a.get("inference_library") != "stanvi":
        raise StanviError(f"{nc} is not a DataTree written by stanvi (inference_library = "
                          f"{a.get('inference_library')!r})")
    missing = [g for g in ("posterior", "sample_stats", "vi_trace", "vi_approximation")
               if g not in tree.children]
    if missing:
        raise StanviError(f"{nc} lacks the group(s) {missing} needed to read the fit back (it "
                          f"was written with include_trace=False or by an older stanvi)")
    post = _group(tree, "posterior")
    draws = {k: np.asarray(post[k].values)[0] for k in post.data_vars}
    moved = json.loads(a.get("moved_variables", "{}") or "{}")
    for group, mapping in moved.items():
        ds = _group(tree, group)
        for name, stan_name in (mapping or {}).items():
            if ds is not None and name in ds:
                draws[stan_name] = np.asarray(ds[name].values)[0]
    stats = _group(tree, "sample_stats")
    approx = _group(tree, "vi_approximation")
    params = np.asarray(approx["params"].values, dtype=float)
    unc_names = [str(v) for v in approx["unconstrained_parameter"].values]
    method, family_name = str(a["method"]), str(a["family"])
    profile = str(a.get("profile", ""))
    stored_options = json.loads(a.get("options", "{}") or "{}")
    options = _options_from(method, profile, stored_options)
    fam_kwargs = {}
    if family_name == "fullrank" and isinstance(stored_options, dict) \
            and "fullrank_diagonal" in stored_options:
        fam_kwargs["diagonal"] = stored_options["fullrank_diagonal"]
    fam_kwargs.update(json.loads(approx.attrs.get("family_options", "{}") or "{}"))  # mixture, lowrank
    family = make_family(family_name, len(unc_names), **fam_kwargs)
    data: dict[str, np.ndarray] = {}
    for g in ("observed_data", "constant_data"):
        ds = _group(tree, g)
        if ds is not None:
            data.update({k: np.asarray(ds[k].values) for k in ds.data_vars})
            data.update({k: np.asarray(v) for k, v in json.loads(ds.attrs.get("sizes", "{}")).items()})
    if "unconstrained_draws" in approx:
        unconstrained = np.asarray(approx["unconstrained_draws"].values, dtype=float)
    else:
        unconstrained = np.zeros((len(stats["lp"].values[0]), 0))
    mean_ds = _group(tree, "vi_mean")
    mean_row = ({k: np.asarray(mean_ds[k].values)[None, ...] for k in mean_ds.data_vars}
                if mean_ds is not None and mean_ds.data_vars else None)
    diag_ds = _group(tree, "vi_diagnostics")
    diagnostics = diagnostics_from_dataset(diag_ds, method) if diag_ds is not None else None
    oracle = json.loads(a.get("oracle_counts", "{}") or "{}")
    info = json.loads(a.get("info", "{}") or "{}")
    return SavedFit(
        method=method, family_name=family_name, profile=profile, options=options,
        seed=int(a["seed"]), params=params, family=family,
        target=SavedTarget(str(a.get("model", "")), unc_names, data,
                           json.loads(a.get("variable_kinds", "{}") or "{}")), draws=draws,
        unconstrained_draws=unconstrained,
        log_p=np.asarray(stats["lp"].values, dtype=float)[0],
        log_q=np.asarray(stats["lp_approx"].values, dtype=float)[0],
        trace=_trace_from(_group(tree, "vi_trace"), params), oracle=oracle,
        status=str(a["status"]), message=str(a.get("message", "")),
        wall_time=float(a["wall_time"]), setup_time=float(a["setup_time"]),
        compile_time=float(a.get("compile_time", 0.0)), info=info,
        _diagnostics=diagnostics, path=nc, tree=tree, _mean_row=mean_row)
