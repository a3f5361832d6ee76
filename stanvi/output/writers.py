"""Writing a fit to disk: a Stan CSV file as CmdStan's ``variational`` method writes it
(docs/algorithms.md#advi-output and #output-format), the ArviZ DataTree as NetCDF (and Zarr
when ``zarr`` is installed), and :func:`save`, which writes both plus the summary and diagnostics.

Stan CSV layout:

* ``#`` comment lines with the configuration as CmdStan's ``variational`` method writes them
  (``model``, ``method = variational``, ``algorithm``, ``iter``, ``grad_samples``,
  ``elbo_samples``, ``eta``, ``adapt``, ``tol_rel_obj``, ``eval_elbo``, ``output_samples``, the
  data file, the seed), each only where it is true of the fit: every key for ADVI, ``algorithm``
  (the family), ``iter`` (the iteration limit) and ``output_samples`` for the other methods,
  unless ``cmdstan_compatible`` asks for every key cmdstanpy requires
  (:func:`cmdstan_variational_config`); then stanvi's own settings under ``stanvi_`` keys (its
  version, method, family, profile and every option as ``stanvi_option_NAME``) so that a
  reader taking the ``key = value`` lines as one flat dictionary, as cmdstanpy does, sees
  CmdStan's values;
* the header row: ``lp__,log_p__,log_g__`` then every constrained parameter, transformed
  parameter and generated quantity element, named as CmdStan names them (``theta.1``,
  ``Sigma.2.1``; column-major, first index fastest);
* CmdStan's ``# Stepsize adaptation complete.`` / ``# eta = ...`` block (ADVI's η; for another
  method only with ``cmdstan_compatible``);
* row 0: the mean of the approximation pushed through the constraining transform (generated
  quantities included), with ``lp__ = log_p__ = log_g__ = 0``;
* then one row per draw: ``lp__ = 0``, ``log_p__`` = log p(z) (Jacobian included),
  ``log_g__`` = −½‖ε‖² (Stan drops the constants; log q = log_g__ − H(q) + D/2);
* trailing ``# stanvi_...`` comments: the stopping status, oracle counts, times and Pareto k-hat.

``cmdstanpy.from_csv`` reads an ADVI fit's file, and any fit's written with
``cmdstan_compatible=True``, as a ``CmdStanVB`` (``variational_params_dict`` is row 0,
``stan_variable`` and ``variational_sample_pd`` the draws); it refuses the others, whose header
lacks the ADVI settings it requires (docs/algorithms.md#output-format).  ``stanio.read_csv``
reads every file; the draws are rows 1..S.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.output.arviz_attrs import jsonable
from stanvi.output.arviz_io import (log_g, mean_row, require_netcdf, require_zarr, save_netcdf,
                                    save_zarr)
from stanvi.errors import OutputError
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


def _fmt(x: float, sig_figs: int | None) -> str:
    if not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if sig_figs is None:
        r = repr(float(x))
        return r[:-2] if r.endswith(".0") else r
    return f"{x:.{sig_figs}g}"


# CmdStan's defaults for its ``variational`` method (CmdStan guide, "Variational inference
# algorithm configuration"); written where a stanvi method has no counterpart.
CMDSTAN_VARIATIONAL_DEFAULTS = {"iter": 10000, "grad_samples": 1, "elbo_samples": 100,
                                "eta": 1.0, "adapt_iter": 50, "tol_rel_obj": 0.01,
                                "eval_elbo": 100}

# stanvi option names that play the part of CmdStan's keys, per key, first match wins.
_CMDSTAN_COUNTERPARTS = {"iter": ("max_iterations", "max_iters"),
                         "grad_samples": ("grad_samples", "n_grad"),
                         "elbo_samples": ("elbo_samples", "elbo_draws"),
                         "tol_rel_obj": ("tol_rel_obj",),
                         "eval_elbo": ("eval_elbo", "elbo_every")}


def cmdstan_variational_config(fit, cmdstan_compatible: bool = False) -> dict[str, Any]:
    """CmdStan's ``variational`` configuration keys that are true of a fit: for ADVI all of
    them (its own values, ``eta`` its adapted step-size scale); for another method only
    ``algorithm`` (its family, when mean-field or full-rank) and ``iter`` (its iteration
    limit), since it has no gradient draws, ELBO draws, step size or relative tolerance in
    ADVI's sense (its own settings are the ``stanvi_option_*`` keys).

    With ``cmdstan_compatible`` every key cmdstanpy's ``from_csv`` requires is given: the
    option that plays a similar part (``n_grad`` for ``grad_samples``), else CmdStan's default
    (``eta`` 1, the mean-field ``algorithm`` for a mixture) — values the method did not use,
    written only so that readers of CmdStan output accept the file."""
    opts = jsonable(fit.options)
    opts = opts if isinstance(opts, dict) else {}
    advi = fit.method == "advi"
    config: dict[str, Any] = {}
    if fit.family_name in ("meanfield", "fullrank") or cmdstan_compatible:
        config["algorithm"] = (fit.family_name if fit.family_name in ("meanfield", "fullrank")
                               else "meanfield")
    for key, names in _CMDSTAN_COUNTERPARTS.items():
        if not (advi or cmdstan_compatible or key == "iter"):
            continue
        value = next((opts[n] for n in names if isinstance(opts.get(n), (int, float))
                      and not isinstance(opts.get(n), bool) and opts[n] > 0), None)
        if value is not None or cmdstan_compatible or advi:
            config[key] = CMDSTAN_VARIATIONAL_DEFAULTS[key] if value is None else value
    if advi or cmdstan_compatible:
        eta = fit.info.get("eta") if advi else None
        if eta is None and advi:
            eta = opts.get("eta")
        config["eta"] = float(eta) if isinstance(eta, (int, float)) and eta > 0 else 1.0
        config["adapt_engaged"] = int(bool(opts.get("adapt_engaged", False))) if advi else 0
        config["adapt_iter"] = opts.get("adapt_iter", CMDSTAN_VARIATIONAL_DEFAULTS["adapt_iter"])
    return config


def data_source(fit) -> str:
    """Where the fit's data came from: the data file's path when the fit was given one, else
    a short description (``"dict"``, ``"JSON text"``, ``""`` for no data)."""
    return str(fit.info.get("data_source", "") or "")


def _header_lines(fit, data_file: str | None, output_file: str | None,
                  cmdstan_compatible: bool = False) -> list[str]:
    """The configuration comments, as CmdStan's ``variational`` method writes them (the keys
    cmdstanpy's ``from_csv`` reads), then stanvi's own settings under ``stanvi_`` keys (so
    that a flat reading of ``key = value`` lines never confuses the two)."""
    from stanvi.version import __version__  # noqa: PLC0415

    model = str(getattr(fit.target, "name", "model"))
    n = int(np.shape(fit.log_p)[0])
    cfg = cmdstan_variational_config(fit, cmdstan_compatible)
    lines = [f"model = {model}_model", "method = variational", "  variational"]
    if "algorithm" in cfg:
        lines += [f"    algorithm = {cfg['algorithm']}", f"      {cfg['algorithm']}"]
    lines += [f"    {key} = {cfg[key]}" for key in ("iter", "grad_samples", "elbo_samples")
              if key in cfg]
    if "eta" in cfg:
        lines += [f"    eta = {_fmt(cfg['eta'], None)}", "    adapt",
                  f"      engaged = {cfg['adapt_engaged']}"]
        if cfg["adapt_engaged"]:   # CmdStan writes the adaptation's iter under adapt
            lines.append(f"      iter = {cfg['adapt_iter']}")
    if "tol_rel_obj" in cfg:
        lines.append(f"    tol_rel_obj = {_fmt(float(cfg['tol_rel_obj']), None)}")
    if "eval_elbo" in cfg:
        lines.append(f"    eval_elbo = {cfg['eval_elbo']}")
    lines += [
        f"    output_samples = {n}",
        "id = 1",
        "data",
        f"  file = {data_file if data_file is not None else data_source(fit)}",
        "random",
        f"  seed = {fit.seed}",
        "output",
        f"  file = {output_file or ''}",
        "stanvi",
        f"  stanvi_version = {__version__}",
        f"  stanvi_method = {fit.method}",
        f"  stanvi_family = {fit.family_name}",
        f"  stanvi_profile = {fit.profile}",
    ]
    opts = jsonable(fit.options)
    if isinstance(opts, dict):
        lines += [f"  stanvi_option_{k} = {v}" for k, v in opts.items()]
    return lines


def header_config(fit, data_file: str | None = None,
                  cmdstan_compatible: bool = False) -> dict[str, Any]:
    """The configuration the CSV's header states, as one flat dictionary of ``key = value``
    lines with numbers parsed, the way cmdstanpy's ``from_csv`` reads it
    (:attr:`~stanvi.output.cmdstanpy_accessors.CmdStanPyAccessors.metadata`)."""
    config: dict[str, Any] = {}
    for line in _header_lines(fit, data_file, None, cmdstan_compatible):
        key, sep, value = line.strip().partition(" = ")
        if not sep:
            continue
        for parse in (int, float):
            try:
                config[key] = parse(value)
                break
            except ValueError:
                continue
        else:
            config[key] = value
    return config


def _adaptation_lines(fit, cmdstan_compatible: bool = False) -> list[str]:
    """CmdStan's block after the header row (cmdstanpy reads ``eta`` from it): ADVI's adapted
    η; none for another method, which adapts no step size, unless ``cmdstan_compatible``."""
    config = cmdstan_variational_config(fit, cmdstan_compatible)
    if "eta" not in config:
        return []
    lines = ["Stepsize adaptation complete.", f"eta = {_fmt(config['eta'], None)}"]
    if fit.method != "advi":
        lines.append(f"({fit.method} adapts no step size: eta is CmdStan's default, written "
                     "for cmdstanpy)")
    return lines


def _footer_lines(fit, diagnostics) -> list[str]:
    lines = [f"stanvi_status = {fit.status}"]
    if fit.message:
        lines.append(f"stanvi_message = {' '.join(str(fit.message).split())}")
    lines += [f"stanvi_iterations = {max(len(fit.trace) - 1, 0)}"]
    lines += [f"stanvi_{k} = {_fmt(float(v), None)}" for k, v in fit.oracle.items()]
    lines += [f"stanvi_wall_time_seconds = {fit.wall_time:.3f}",
              f"stanvi_jax_compile_seconds = {fit.compile_time:.3f}",
              f"stanvi_setup_seconds = {fit.setup_time:.3f}"]
    if diagnostics is not None:
        lines += [f"stanvi_pareto_k = {diagnostics.khat:.4f}",
                  f"stanvi_pareto_k_threshold = {diagnostics.threshold:.4f}",
                  f"stanvi_verdict = {diagnostics.verdict}",
                  f"stanvi_means = {diagnostics.means}",
                  f"stanvi_ess_importance = {diagnostics.ess:.1f}",
                  f"stanvi_elbo = {_fmt(diagnostics.elbo, 10)}"]
    return lines


def write_csv(fit, path, *, sig_figs: int | None = None, data_file: str | None = None,
              cmdstan_compatible: bool = False) -> Path:
    """Write the fit as a Stan CSV file (layout: module docstring).

    Args:
        fit: a :class:`stanvi.Fit`.
        path: the file to write.
        sig_figs: significant figures (default: every digit needed to read the value back).
        data_file: recorded in the header's ``data file = ...`` line (default: the data
            file the fit was given, see :func:`data_source`).
        cmdstan_compatible: write every CmdStan ``variational`` key cmdstanpy's ``from_csv``
            requires, those the method has no counterpart of included
            (:func:`cmdstan_variational_config`); by default only the true ones.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    draws = {k: np.asarray(v) for k, v in fit.draws.items()}
    columns = list(STAN_COLUMNS) + csv_columns(draws)
    n = int(np.shape(fit.log_p)[0])
    body = np.empty((n + 1, len(columns)))
    body[0, :3] = 0.0
    if draws:
        mean = mean_row(fit)
        body[0, 3:] = _flatten({k: mean[k] for k in draws})[0]
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
        for line in _header_lines(fit, data_file, path.name, cmdstan_compatible):
            fh.write(f"# {line}\n")
        fh.write(",".join(columns) + "\n")
        for line in _adaptation_lines(fit, cmdstan_compatible):
            fh.write(f"# {line}\n")
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


def default_basename(fit) -> str:
    """``MODEL-METHOD-FAMILY-seedSEED``, e.g. ``eight_schools_noncentered-trustvi-meanfield-seed1``:
    runs that differ in method, family or seed get different files."""
    return (f"{getattr(fit.target, 'name', '') or 'model'}-{fit.method}-{fit.family_name}"
            f"-seed{fit.seed}")


def output_paths(directory, base: str, *, zarr: bool = False) -> dict[str, Path]:
    """The files :func:`save` writes for ``base`` in ``directory``, by kind."""
    directory = Path(directory)
    paths = {"csv": directory / f"{base}.csv", "netcdf": directory / f"{base}.nc"}
    if zarr:
        paths["zarr"] = directory / f"{base}.zarr"
    paths["summary"] = directory / f"{base}_summary.csv"
    paths["diagnostics"] = directory / f"{base}_diagnostics.txt"
    return paths


def _can_create_file(directory: Path) -> bool:
    """Whether a file can be created (and removed) in ``directory``: tried, not asked of
    ``os.access``, which says yes to root everywhere (``--output /proc/x`` used to fail only
    after the fit; issue T3-2 item 10)."""
    probe = directory / f".stanvi-write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError:
        return False
    return True


def check_writable(directory, base: str, *, zarr: bool = False, overwrite: bool = False) -> None:
    """Raise before any work is done when :func:`save` could not write: ``directory`` is a file
    or not writable (FileExistsError / PermissionError), ``zarr`` is asked for and not installed
    (ImportError), NetCDF's package is not installed (:class:`~stanvi.errors.MissingExtraError`
    naming the ``netcdf`` extra), or (without ``overwrite``) one of the files exists
    (FileExistsError naming it)."""
    if zarr:
        require_zarr()
    require_netcdf()
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise FileExistsError(f"output directory {directory} is an existing file; give a "
                              f"directory (it is created if needed)")
    probe = directory
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir() or not _can_create_file(probe):
        raise PermissionError(f"cannot write to {directory}: {probe} is not a writable "
                              f"directory")
    if not overwrite:
        existing = [p for p in output_paths(directory, base, zarr=zarr).values() if p.exists()]
        if existing:
            raise FileExistsError(f"{existing[0]} exists; pass overwrite=True (stanvi fit: "
                                  f"--overwrite) to replace it, or choose another basename "
                                  f"(--name)")


def save(fit, directory, *, basename: str | None = None, zarr: bool = False,
         data_file: str | None = None, tree_kwargs: dict[str, Any] | None = None,
         overwrite: bool = False, cmdstan_compatible: bool = False) -> dict[str, Path]:
    """Write a fit to ``directory``: ``<name>.csv`` (Stan CSV), ``<name>.nc`` (the ArviZ DataTree
    as NetCDF, which :func:`stanvi.read` reads back), ``<name>.zarr`` when ``zarr=True`` (needs
    the zarr package), ``<name>_summary.csv`` (the summary table) and
    ``<name>_diagnostics.txt``.  Returns the paths by kind.

    Args:
        basename: ``<name>``; default :func:`default_basename` (model, method, family, seed).
        data_file: the data file named in the CSV (default: the one the fit was given).
        tree_kwargs: options of :func:`stanvi.output.arviz_io.to_datatree`.
        overwrite: replace existing files; by default an existing file is an error
            (FileExistsError), raised before anything is written.
        cmdstan_compatible: the CSV's header for cmdstanpy (:func:`write_csv`).
    """
    directory = Path(directory)
    base = basename or default_basename(fit)
    check_writable(directory, base, zarr=zarr, overwrite=overwrite)
    tree = fit.to_arviz(**(tree_kwargs or {}))  # first: it validates tree_kwargs
    directory.mkdir(parents=True, exist_ok=True)
    paths = output_paths(directory, base, zarr=zarr)
    writers = {"csv": lambda p: write_csv(fit, p, data_file=data_file,
                                          cmdstan_compatible=cmdstan_compatible),
               "netcdf": lambda p: save_netcdf(tree, p),
               "zarr": lambda p: save_zarr(tree, p),
               "summary": lambda p: fit.summary().to_csv(p),
               "diagnostics": lambda p: p.write_text(str(fit.diagnostics()) + "\n")}
    failed: dict[str, str] = {}
    for kind, path in paths.items():
        # each file on its own: one that cannot be written (a 1,000-character variable name
        # exceeds NetCDF's NC_MAX_NAME) costs that file only (issue T3-2 item 9)
        try:
            writers[kind](path)
        except Exception as exc:  # noqa: BLE001 — the reason goes into the error
            failed[kind] = f"{type(exc).__name__}: {exc}"
            _remove_partial(path)
    if failed:
        saved = {k: p for k, p in paths.items() if k not in failed}
        raise OutputError(
            "could not write " + "; ".join(f"{paths[k].name} ({why})" for k, why in
                                           failed.items())
            + (f"; written: {', '.join(p.name for p in saved.values())}" if saved else ""),
            saved=saved, failed=failed)
    return paths


def _remove_partial(path: Path) -> None:
    """Remove what a failed writer left behind (a file, or a Zarr directory)."""
    import shutil  # noqa: PLC0415

    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
