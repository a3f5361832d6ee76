"""ctypes bindings of the services library (``stanvi/stan/glue/stanvi_services.cpp``).

:meth:`ServicesLib.call` runs one of Stan's algorithms on a model and returns a :class:`RawRun`: the draws Stan wrote (column names and a row-major matrix), the diagnostic rows
(ADVI's ELBO trace), the logger's messages and the counting model's evaluation counts.  The
algorithm-specific modules (:mod:`.nuts`, :mod:`.advi`, :mod:`.pathfinder`) build on it.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stanvi.errors import StanviError
from stanvi.stan.compiler import CompiledModel, compile_model
from stanvi.stan.data import DataLike, data_error_from_stan, data_to_json
from stanvi.stan.services_build import services_library


class ReferenceRunError(StanviError):
    """Stan's own algorithm failed (no valid initial point, sampler or optimizer error)."""


@dataclass
class RawRun:
    """What one call of a Stan service returned.

    ``counts`` = (log-density-only evaluations, gradient evaluations, Hessian-vector products),
    counted by the C++ ``CountingModel`` wrapper around every call the algorithm made.
    """

    names: list[str]
    draws: np.ndarray          # (rows, len(names))
    diagnostics: np.ndarray    # (rows, cols) or (0, 0)
    messages: str
    counts: tuple[int, int, int]


_vp, _cp = ctypes.c_void_p, ctypes.c_char_p
_u, _i, _d = ctypes.c_uint, ctypes.c_int, ctypes.c_double

# Argument types of each entry point after (data_json, init_json, seed); all end with char** err.
_SIGNATURES = {
    # chain, dense, init_radius, num_warmup, num_samples, num_thin, stepsize, stepsize_jitter,
    # max_depth, delta, gamma, kappa, t0, init_buffer, term_buffer, window
    "stanvi_nuts": [_u, _i, _d, _i, _i, _i, _d, _d, _i, _d, _d, _d, _d, _u, _u, _u],
    # fullrank, init_radius, grad_samples, elbo_samples, max_iterations, tol_rel_obj, eta,
    # adapt_engaged, adapt_iterations, eval_elbo, output_samples
    "stanvi_advi": [_i, _d, _i, _i, _i, _d, _d, _i, _i, _i, _i],
    # init_radius, history_size, init_alpha, tol_obj, tol_rel_obj, tol_grad, tol_rel_grad,
    # tol_param, num_iterations, num_elbo_draws, num_draws, num_multi_draws, num_paths,
    # psis_resample, calculate_lp
    "stanvi_pathfinder": [_d, _i, _d, _d, _d, _d, _d, _d, _i, _i, _i, _i, _i, _i, _i],
}


class ServicesLib:
    """A loaded services library."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        for name, extra in _SIGNATURES.items():
            f = getattr(lib, name)
            f.restype = _vp
            f.argtypes = [_cp, _cp, _u, *extra, ctypes.POINTER(_vp)]
        for name, restype in [("stanvi_result_num_rows", ctypes.c_long),
                              ("stanvi_result_num_cols", _i), ("stanvi_result_names", _cp),
                              ("stanvi_result_messages", _cp),
                              ("stanvi_result_num_diagnostic_values", ctypes.c_long),
                              ("stanvi_result_num_diagnostic_rows", ctypes.c_long)]:
            getattr(lib, name).restype = restype
            getattr(lib, name).argtypes = [_vp]
        lib.stanvi_result_copy_draws.argtypes = [_vp, ctypes.POINTER(_d)]
        lib.stanvi_result_copy_diagnostics.argtypes = [_vp, ctypes.POINTER(_d)]
        lib.stanvi_result_counts.argtypes = [_vp, ctypes.POINTER(ctypes.c_long)]
        for name in ("stanvi_result_copy_draws", "stanvi_result_copy_diagnostics",
                     "stanvi_result_counts", "stanvi_result_free",
                     "stanvi_services_free_error_msg"):
            getattr(lib, name).restype = None
        lib.stanvi_result_free.argtypes = [_vp]
        lib.stanvi_services_free_error_msg.argtypes = [_vp]
        self.lib = lib

    def call(self, entry: str, data_json: str, init_json: str | None, seed: int,
             *args) -> RawRun:
        """Run ``entry`` (a key of ``_SIGNATURES``); raises RuntimeError with Stan's message."""
        err = ctypes.c_void_p()
        handle = getattr(self.lib, entry)(
            data_json.encode(), init_json.encode() if init_json else None, seed & 0xFFFFFFFF,
            *args, ctypes.byref(err))
        if not handle:
            message = "unknown error"
            if err.value:
                message = ctypes.string_at(err.value).decode(errors="replace")
                self.lib.stanvi_services_free_error_msg(err)
            raise RuntimeError(message)
        lib = self.lib
        try:
            rows, cols = lib.stanvi_result_num_rows(handle), lib.stanvi_result_num_cols(handle)
            names = lib.stanvi_result_names(handle).decode().split(",") if cols else []
            draws = np.empty(rows * cols, dtype=np.float64)
            if draws.size:
                lib.stanvi_result_copy_draws(handle, draws.ctypes.data_as(ctypes.POINTER(_d)))
            draws = draws.reshape(rows, cols) if cols else np.empty((0, 0))
            n_diag = lib.stanvi_result_num_diagnostic_values(handle)
            diag_rows = lib.stanvi_result_num_diagnostic_rows(handle)
            diagnostics = np.empty(n_diag, dtype=np.float64)
            if n_diag:
                lib.stanvi_result_copy_diagnostics(
                    handle, diagnostics.ctypes.data_as(ctypes.POINTER(_d)))
            diagnostics = (diagnostics.reshape(diag_rows, n_diag // diag_rows)
                           if diag_rows and n_diag % diag_rows == 0 else np.empty((0, 0)))
            counts = (ctypes.c_long * 3)()
            lib.stanvi_result_counts(handle, counts)
            messages = lib.stanvi_result_messages(handle).decode(errors="replace")
        finally:
            lib.stanvi_result_free(handle)
        return RawRun(names, draws, diagnostics, messages, (counts[0], counts[1], counts[2]))


_libs: dict[Path, ServicesLib] = {}
_libs_lock = threading.Lock()


def load_services(path: Path) -> ServicesLib:
    """The loaded library at ``path`` (loaded once per process)."""
    with _libs_lock:
        if path not in _libs:
            _libs[path] = ServicesLib(path)
        return _libs[path]


def prepare(model, data: DataLike, progress: bool) -> tuple[CompiledModel, str, ServicesLib]:
    """Compile (cached) the model, serialize the data and load its services library."""
    compiled = model if isinstance(model, CompiledModel) else compile_model(model,
                                                                            progress=progress)
    data_json = data_to_json(data)
    return compiled, data_json, load_services(services_library(compiled, progress=progress))


def raise_run_error(exc: RuntimeError, algorithm: str, model_name: str,
                    data_json: str | None = None):
    """Stan's failure as a stanvi error: bad data → StanDataError (missing data said so, given
    the data as passed), else ReferenceRunError."""
    message = str(exc)
    if message.startswith("Error in model construction"):
        raise data_error_from_stan(message, model_name, data_json) from None
    raise ReferenceRunError(f"Stan's {algorithm} failed on model '{model_name}': {message}") \
        from None


def check_settings(given: dict, defaults: dict, algorithm: str) -> dict:
    """``defaults`` updated with ``given``; a TypeError names any unknown setting."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise TypeError(f"unknown {algorithm} setting(s): {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(defaults)}")
    return {**defaults, **given}


def init_to_json(init) -> str | None:
    """Initial values as Stan reads them: None, a dict of constrained values, or a JSON path
    or string (as for data)."""
    return None if init is None else data_to_json(init)
