"""Loading a model library: the BridgeStan ABI through the `bridgestan` client, and stanvi's batched
entry points through ctypes on the same model handle.

A batch of B points is one C++ call that loops over rows in parallel (TBB) and reports a status per
row; a row whose evaluation throws gets ``-inf`` / ``NaN`` and its message, the rest of the batch is
unaffected.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MESSAGE_BYTES = 512  # per failed row

# Array arguments are passed as raw addresses (``_ptr``): numpy's ndpointer checks cost more than
# the C++ call itself for small batches.  Every array passed is created or validated here
# (float64 / int32, C-contiguous).
_f64 = ctypes.c_void_p
_i32 = ctypes.c_void_p


def _ptr(arr: np.ndarray) -> int:
    return arr.__array_interface__["data"][0]
_c_bool, _c_int, _vp = ctypes.c_bool, ctypes.c_int, ctypes.c_void_p

_SIGNATURES = {
    "stanvi_hvp_is_exact": [],
    "stanvi_batch_log_density": [_vp, _c_bool, _c_bool, _c_int, _f64, _f64, _i32, ctypes.c_char_p,
                                 _c_int, _c_int],
    "stanvi_batch_gradient": [_vp, _c_bool, _c_bool, _c_int, _f64, _f64, _f64, _i32,
                              ctypes.c_char_p, _c_int, _c_int],
    "stanvi_batch_hvp": [_vp, _c_bool, _c_bool, _c_int, _f64, _f64, _f64, _f64, _f64, _i32,
                         ctypes.c_char_p, _c_int, _c_int, _c_bool],
    "stanvi_multi_gradient": [_vp, _c_bool, _c_bool, _c_int, _f64, _f64, _f64, _i32,
                              ctypes.c_char_p, _c_int, _c_int],
    "stanvi_multi_hvp": [_vp, _c_bool, _c_bool, _c_int, _f64, _f64, _f64, _f64, _f64, _i32,
                         ctypes.c_char_p, _c_int, _c_int, _c_bool],
    "stanvi_batch_constrain": [_vp, _c_bool, _c_bool, _c_int, _f64, _f64, ctypes.c_uint, _i32,
                               ctypes.c_char_p, _c_int, _c_int],
    "stanvi_lbfgs_paths": [_vp, _c_int, _f64, _c_int, _c_int, ctypes.c_double, ctypes.c_double,
                           _c_int, _f64, _f64, ctypes.c_double, _f64, _f64, _i32, _vp, _i32,
                           ctypes.c_char_p, _c_int, _c_int],
}

#: The C++ L-BFGS paths' settings: SciPy's L-BFGS-B defaults (maxcor, ftol, gtol), as the
#: Python paths (stanvi.optim.lbfgsb.DEFAULTS) use them
LBFGS_DEFAULTS = {"history": 10, "ftol": 2.2204460492503131e-09, "gtol": 1e-5}
#: stanvi_lbfgs_paths' path statuses (0–2 as SciPy's L-BFGS-B reports them)
PATH_STATUSES = ("converged", "max_iterations", "line_search_failed", "stopped", "failed")


@dataclass
class LbfgsPaths:
    """The end of each of n L-BFGS paths (:meth:`BatchedLibrary.lbfgs_paths`)."""

    x: np.ndarray            # (n, D) last iterates
    log_density: np.ndarray  # (n,) log p there (−inf for a failed path)
    iterations: np.ndarray   # (n,) int
    evaluations: np.ndarray  # (n,) int: gradients evaluated, the initial point's included
    status: np.ndarray       # (n,) int: an index into PATH_STATUSES
    messages: dict[int, str]  # path -> why it failed


def default_threads() -> int:
    """Threads per batched call: ``$STANVI_NUM_THREADS`` or the number of CPUs."""
    env = os.environ.get("STANVI_NUM_THREADS")
    return max(1, int(env)) if env else (os.cpu_count() or 1)


@dataclass
class RowStatus:
    """Per-row outcome of a batched call."""

    ok: np.ndarray                 # (B,) bool
    messages: dict[int, str]       # row -> the model's message, for failed rows
    gq_only: np.ndarray | None = None  # (B,) bool: constrain rows where only the generated
                                       # quantities failed (parameters and TPs were written)


class BatchedLibrary:
    """ctypes bindings for the stanvi batched entry points of one loaded library."""

    def __init__(self, library: str | os.PathLike) -> None:
        self.path = str(Path(library).resolve())
        try:
            self._lib = ctypes.CDLL(self.path)
        except OSError as exc:
            from stanvi.errors import ToolchainError  # noqa: PLC0415

            raise ToolchainError(f"cannot load the model library {self.path}: {exc}; delete it "
                                 "(or its cache directory) to rebuild") from None
        missing = [name for name in (*_SIGNATURES, "stanvi_hvp_is_exact")
                   if not hasattr(self._lib, name)]
        if missing:
            from stanvi.errors import ToolchainError  # noqa: PLC0415

            raise ToolchainError(
                f"the model library {self.path} lacks stanvi's entry point(s) "
                f"{', '.join(missing)}: it was built by another version of stanvi's bridge (or "
                f"is not a stanvi model library); recompile the model with this stanvi "
                f"(stanvi.compile / stanvi fit MODEL.stan), or delete the library's cache "
                f"directory to rebuild it")
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self._lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        self.hvp_exact = bool(self._lib.stanvi_hvp_is_exact())
        self._buffers = threading.local()

    def function_address(self, name: str) -> int:
        """The address of one of the library's C entry points (for the XLA FFI handlers, which
        call the batched entry points through function pointers)."""
        return int(ctypes.cast(getattr(self._lib, name), ctypes.c_void_p).value)

    def _message_buffer(self, n: int) -> ctypes.Array:
        """A per-thread message buffer of at least n rows, reused across calls (the C++ side
        writes only the rows that fail, and only those rows are read back)."""
        buf = getattr(self._buffers, "buf", None)
        if buf is None or len(buf) < n * MESSAGE_BYTES:
            buf = ctypes.create_string_buffer(max(n, 256) * MESSAGE_BYTES)
            self._buffers.buf = buf
        return buf

    @staticmethod
    def _status(status: np.ndarray, buffer: ctypes.Array, n_failed: int) -> RowStatus:
        ok = status == 0
        messages: dict[int, str] = {}
        if n_failed:
            base = ctypes.addressof(buffer)
            for row in np.flatnonzero(~ok):
                text = ctypes.string_at(base + int(row) * MESSAGE_BYTES)
                messages[int(row)] = text.decode("utf-8", "replace")
        return RowStatus(ok=ok, messages=messages, gq_only=status == 3)

    def log_density(self, model: int, z: np.ndarray, *, propto: bool, jacobian: bool,
                    threads: int) -> tuple[np.ndarray, RowStatus]:
        z = np.ascontiguousarray(z, dtype=np.float64)  # callers pass (n, D) rows
        n = z.shape[0]
        lp = np.empty(n)
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        failed = self._lib.stanvi_batch_log_density(model, propto, jacobian, n, _ptr(z), _ptr(lp),
                                                     _ptr(status), buf,
                                                     MESSAGE_BYTES, threads)
        return lp, self._status(status, buf, failed)

    def gradient(self, model: int, z: np.ndarray, *, propto: bool, jacobian: bool,
                 threads: int) -> tuple[np.ndarray, np.ndarray, RowStatus]:
        z = np.ascontiguousarray(z, dtype=np.float64)  # callers pass (n, D) rows
        n = z.shape[0]
        lp = np.empty(n)
        grad = np.empty_like(z)
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        failed = self._lib.stanvi_batch_gradient(model, propto, jacobian, n, _ptr(z), _ptr(lp),
                                                  _ptr(grad), _ptr(status),
                                                  buf, MESSAGE_BYTES, threads)
        return lp, grad, self._status(status, buf, failed)

    def hvp(self, model: int, z: np.ndarray, v: np.ndarray, *, propto: bool, jacobian: bool,
            threads: int, finite_difference: bool = False
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, RowStatus]:
        """(log p, gradient, H v) per row; ``finite_difference`` forces central differences of
        gradients even in the exact (nested autodiff) build."""
        z = np.ascontiguousarray(z, dtype=np.float64)  # callers pass (n, D) rows
        v = np.ascontiguousarray(v, dtype=np.float64)
        if v.shape != z.shape:
            raise ValueError(f"directions {v.shape} do not match points {z.shape}")
        n = z.shape[0]
        lp = np.empty(n)
        grad = np.empty_like(z)
        hvp = np.empty_like(z)
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        failed = self._lib.stanvi_batch_hvp(model, propto, jacobian, n, _ptr(z), _ptr(v), _ptr(lp),
                                             _ptr(grad), _ptr(hvp), _ptr(status),
                                             buf, MESSAGE_BYTES, threads, finite_difference)
        return lp, grad, hvp, self._status(status, buf, failed)

    @staticmethod
    def _handles(models) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(models, dtype=np.uint64))

    def multi_gradient(self, models, z: np.ndarray, *, propto: bool, jacobian: bool,
                       threads: int) -> tuple[np.ndarray, np.ndarray, RowStatus]:
        """Like :meth:`gradient`, but row i is evaluated by model handle ``models[i]``: several
        instances of this library's model (different data, the same number of unconstrained
        parameters) in one multithreaded call."""
        z = np.ascontiguousarray(z, dtype=np.float64)
        handles = self._handles(models)
        n = z.shape[0]
        if handles.shape != (n,):
            raise ValueError(f"{handles.shape[0]} model handles for {n} rows")
        lp = np.empty(n)
        grad = np.empty_like(z)
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        failed = self._lib.stanvi_multi_gradient(_ptr(handles), propto, jacobian, n, _ptr(z),
                                                  _ptr(lp), _ptr(grad), _ptr(status), buf,
                                                  MESSAGE_BYTES, threads)
        return lp, grad, self._status(status, buf, failed)

    def multi_hvp(self, models, z: np.ndarray, v: np.ndarray, *, propto: bool, jacobian: bool,
                  threads: int, finite_difference: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, RowStatus]:
        """Like :meth:`hvp`, row i evaluated by model handle ``models[i]``."""
        z = np.ascontiguousarray(z, dtype=np.float64)
        v = np.ascontiguousarray(v, dtype=np.float64)
        handles = self._handles(models)
        n = z.shape[0]
        if v.shape != z.shape or handles.shape != (n,):
            raise ValueError(f"directions {v.shape} / {handles.shape[0]} handles do not match "
                             f"points {z.shape}")
        lp = np.empty(n)
        grad = np.empty_like(z)
        hvp = np.empty_like(z)
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        failed = self._lib.stanvi_multi_hvp(_ptr(handles), propto, jacobian, n, _ptr(z), _ptr(v),
                                             _ptr(lp), _ptr(grad), _ptr(hvp), _ptr(status), buf,
                                             MESSAGE_BYTES, threads, finite_difference)
        return lp, grad, hvp, self._status(status, buf, failed)

    def lbfgs_paths(self, model: int, inits: np.ndarray, *, max_iters: int,
                    centres: np.ndarray | None = None, inv_sd: np.ndarray | None = None,
                    radius: float = 0.0, threads: int, **settings) -> LbfgsPaths:
        """Independent L-BFGS paths maximizing log p from the rows of ``inits``: L-BFGS-B's
        algorithm without bounds, in C++ (glue/stanvi_lbfgs.hpp; ``settings``:
        :data:`LBFGS_DEFAULTS`), one path per thread, a path
        ending at its first iterate within ``radius`` (root mean square over coordinates, in
        units of 1/``inv_sd``) of a row of ``centres`` (docs/algorithms.md#second-start)."""
        opts = {**LBFGS_DEFAULTS, **settings}
        inits = np.ascontiguousarray(inits, dtype=np.float64)
        n, d = inits.shape
        if centres is None or len(centres) == 0:
            centres, inv_sd = np.zeros((0, d)), np.ones(d)
        centres = np.ascontiguousarray(centres, dtype=np.float64).reshape(-1, d)
        inv_sd = np.ascontiguousarray(np.broadcast_to(inv_sd, (d,)), dtype=np.float64)
        x = np.empty_like(inits)
        lp = np.empty(n)
        iterations = np.empty(n, dtype=np.int32)
        evaluations = np.empty(n, dtype=np.int64)
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        self._lib.stanvi_lbfgs_paths(
            model, n, _ptr(inits), int(max_iters), int(opts["history"]), float(opts["ftol"]),
            float(opts["gtol"]), centres.shape[0], _ptr(centres), _ptr(inv_sd), float(radius),
            _ptr(x), _ptr(lp), _ptr(iterations), _ptr(evaluations), _ptr(status), buf,
            MESSAGE_BYTES, threads)
        failed = status == PATH_STATUSES.index("failed")
        base = ctypes.addressof(buf)
        messages = {int(i): ctypes.string_at(base + int(i) * MESSAGE_BYTES).decode(
            "utf-8", "replace") for i in np.flatnonzero(failed)}
        return LbfgsPaths(x, lp, iterations, evaluations, status, messages)

    def constrain(self, model: int, z: np.ndarray, n_out: int, *, include_tp: bool,
                  include_gq: bool, seed: int, threads: int) -> tuple[np.ndarray, RowStatus]:
        z = np.ascontiguousarray(z, dtype=np.float64)  # callers pass (n, D) rows
        n = z.shape[0]
        out = np.empty((n, n_out))
        status = np.empty(n, dtype=np.int32)
        buf = self._message_buffer(n)
        failed = self._lib.stanvi_batch_constrain(model, include_tp, include_gq, n, _ptr(z), _ptr(out),
                                                   seed & 0xFFFFFFFF, _ptr(status), buf, MESSAGE_BYTES,
                                                   threads)
        return out, self._status(status, buf, failed)


def load_bridgestan_model(library: str | os.PathLike, data_json: str, seed: int):
    """A ``bridgestan.StanModel`` on our library (the reload warning is expected and silenced:
    libraries are content-addressed, so a loaded path never changes on disk)."""
    import bridgestan  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return bridgestan.StanModel(str(library), data_json, seed=seed, warn=False)
