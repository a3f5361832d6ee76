"""Writing a fit to disk: a Stan CSV file as CmdStan's ``variational`` method writes it
(docs/algorithms.md#advi-output and #output-format), the ArviZ DataTree as NetCDF (and Zarr
when ``zarr`` is installed), and :func:`save`, which writes both plus the summary and diagnostics.

Stan CSV layout:

* ``#`` comment lines with the configuration (CmdStan's ``key = value`` style: model, method,
  algorithm, output_samples, seed, data file, then stanvi's own method, profile and options);
* the header row: ``lp__,log_p__,log_g__`` then every constrained parameter, transformed
  parameter and generated quantity element, named as CmdStan names them (``theta.1``,
  ``Sigma.2.1``; column-major, first index fastest);
* row 0: the mean of the approximation pushed through the constraining transform (generated
  quantities included), with ``lp__ = log_p__ = log_g__ = 0``;
* then one row per draw: ``lp__ = 0``, ``log_p__`` = log p(z) (Jacobian included),
  ``log_g__`` = −½‖ε‖² (Stan drops the constants; log q = log_g__ − H(q) + D/2);
* trailing ``#`` comments: the stopping status, oracle counts, times and Pareto k-hat.

``stanio.read_csv`` and cmdstanpy-style readers parse it; the draws are rows 1..S.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.arviz_io import _jsonable, log_g, save_netcdf, save_zarr
from stanvi.stan.names import element_labels

STAN_COLUMNS = ("lp__", "log_p__", "log_g__")


def csv_columns(draws: dict[str, np.ndarray]) -> list[str]:
    """The constrained column names (CmdStan style) for draws by variable name."""
    cols: list[str] = []
    for name, arr in draws.items():
        cols += element_labels(name, np.shape(arr)[1:], style="dots")
    return cols


def _flatten(draws: dict[str, np.ndarray]) -> np.ndarray:
    n = next(iter(draws.values())).shape[0] if draws else 0
    parts = [np.asarray(a, dtype=float).reshape(n, -1, order="F") for a in draws.values()]
    return np.concatenate(parts, axis=1) if parts else np.zeros((n, 0))


def mean_row(fit) -> dict[str, np.ndarray]:
    """The constrained transform of the approximation's mean (tp and gq included), as a batch of
    one draw by variable name (Stan's row 0)."""
    mu = np.asarray(fit.family.mean(np.asarray(fit.params)), dtype=float)[None, :]
    try:
        out = fit.target.constrain(mu, include_tp=True, include_gq=True, seed=fit.seed)
    except TypeError:  # a target without the Stan keywords
        out = fit.target.constrain(mu)
    return {k: np.asarray(v) for k, v in out.items()}


def _fmt(x: float, sig_figs: int | None) -> str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if sig_figs is None:
        r = repr(float(x))
        return r[:-2] if r.endswith(".0") else r
    return f"{x:.{sig_figs}g}"


def _header_lines(fit, data_file: str | None) -> list[str]:
    from stanvi.version import __version__  # noqa: PLC0415

    model = str(getattr(fit.target, "name", "model"))
    n = int(np.shape(fit.log_p)[0])
    lines = [
        f"stanvi_version = {__version__}",
        f"model = {model}_model",
        "method = variational",
        "  variational",
        f"    algorithm = {fit.family_name}",
        f"      {fit.family_name}",
        f"    output_samples = {n}",
        "  stanvi",
        f"    method = {fit.method}",
        f"    profile = {fit.profile}",
        "    options",
    ]
    opts = _jsonable(fit.options)
    if isinstance(opts, dict):
        lines += [f"      {k} = {v}" for k, v in opts.items()]
    lines += ["data", f"  file = {data_file or ''}", "random", f"  seed = {fit.seed}"]
    return lines


def _footer_lines(fit, diagnostics) -> list[str]:
    lines = [f"status = {fit.status}"]
    if fit.message:
        lines.append(f"message = {' '.join(str(fit.message).split())}")
    lines += [f"iterations = {max(len(fit.trace) - 1, 0)}"]
    lines += [f"{k} = {_fmt(float(v), None)}" for k, v in fit.oracle.items()]
    lines += [f"wall_time_seconds = {fit.wall_time:.3f}",
              f"jax_compile_seconds = {fit.compile_time:.3f}",
              f"setup_seconds = {fit.setup_time:.3f}"]
    if diagnostics is not None:
        lines += [f"pareto_k = {diagnostics.khat:.4f}",
                  f"pareto_k_threshold = {diagnostics.threshold:.4f}",
                  f"verdict = {diagnostics.verdict}",
                  f"ess_importance = {diagnostics.ess:.1f}",
                  f"elbo = {_fmt(diagnostics.elbo, 10)}"]
    return lines


def write_csv(fit, path, *, sig_figs: int | None = None, data_file: str | None = None) -> Path:
    """Write the fit as a Stan CSV file (layout: module docstring).

    Args:
        fit: a :class:`stanvi.Fit`.
        path: the file to write.
        sig_figs: significant figures (default: every digit needed to read the value back).
        data_file: recorded in the header's ``data file = ...`` line.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draws = {k: np.asarray(v) for k, v in fit.draws.items()}
    columns = list(STAN_COLUMNS) + csv_columns(draws)
    n = int(np.shape(fit.log_p)[0])
    body = np.empty((n + 1, len(columns)))
    body[0, :3] = 0.0
    body[0, 3:] = _flatten(mean_row(fit))[0] if draws else []
    body[1:, 0] = 0.0
    body[1:, 1] = np.asarray(fit.log_p, dtype=float)
    body[1:, 2] = log_g(fit)
    body[1:, 3:] = _flatten(draws)
    diag = None
    if hasattr(fit, "diagnostics"):
        try:
            diag = fit.diagnostics()
        except Exception:  # noqa: BLE001
            diag = None
    with path.open("w") as fh:
        for line in _header_lines(fit, data_file):
            fh.write(f"# {line}\n")
        fh.write(",".join(columns) + "\n")
        for row in body.tolist():
            fh.write(",".join(_fmt(x, sig_figs) for x in row) + "\n")
        for line in _footer_lines(fit, diag):
            fh.write(f"# {line}\n")
    return path


def read_csv(path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(column names, mean row, draws) from a Stan variational CSV file."""
    import stanio  # noqa: PLC0415

    header, data = stanio.read_csv(str(path))
    data = data[0]
    return header.split(","), data[0], data[1:]


def save(fit, directory, *, basename: str | None = None, zarr: bool = False,
         data_file: str | None = None, tree_kwargs: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write a fit to ``directory``: ``<name>.csv`` (Stan CSV), ``<name>.nc`` (the ArviZ DataTree
    as NetCDF), ``<name>.zarr`` when ``zarr=True`` (needs the zarr package), ``<name>_summary.csv``
    (the summary table) and ``<name>_diagnostics.txt``.  Returns the paths by kind."""
    from stanvi.arviz_io import to_datatree  # noqa: PLC0415

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    base = basename or f"{getattr(fit.target, 'name', 'model')}-{fit.method}"
    tree = to_datatree(fit, **(tree_kwargs or {}))  # first: it validates tree_kwargs
    paths: dict[str, Path] = {}
    paths["csv"] = write_csv(fit, directory / f"{base}.csv", data_file=data_file)
    paths["netcdf"] = save_netcdf(tree, directory / f"{base}.nc")
    if zarr:
        paths["zarr"] = save_zarr(tree, directory / f"{base}.zarr")
    paths["summary"] = directory / f"{base}_summary.csv"
    fit.summary().to_csv(paths["summary"])
    if hasattr(fit, "diagnostics"):
        paths["diagnostics"] = directory / f"{base}_diagnostics.txt"
        paths["diagnostics"].write_text(str(fit.diagnostics()) + "\n")
    return paths
