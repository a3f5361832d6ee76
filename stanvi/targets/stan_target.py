"""StanTarget: a compiled Stan model with its data, as a batched Target (docs/architecture.md#targets).

Log densities are Stan's ``log_prob<propto=false, jacobian=true>`` on the unconstrained space
(docs/algorithms.md#elbo), so ELBO values keep every constant.  Batches are one
multithreaded C++ call; single-point helpers (``*_at``) raise :class:`ModelEvaluationError` with
the model's own message.
"""

from __future__ import annotations

import functools
import json
import os
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import stanio

from stanvi.errors import ModelEvaluationError, StanDataError
from stanvi.stan.compiler import CompiledModel, compile_model
from stanvi.stan.data import DataLike, data_error_from_stan, data_to_dict, data_to_json
from stanvi.stan.library import (BatchedLibrary, LbfgsPaths, default_threads,
                                 load_bridgestan_model)
from stanvi.stan.names import Variable, group_names
from stanvi.targets.base import BatchResult, as_batch
# The state shared with the XLA FFI handlers and its slot layout (the C++ side's enum Slot, whose
# comment in stanvi/stan/glue/stanvi_ffi.cpp still points here) live in ffi_state.py.
from stanvi.targets.ffi_state import (FFI_MAGIC, SLOT_DIM, SLOT_GRADIENT_FN, SLOT_HVP_FN,
                                      SLOT_HVP_MODE, SLOT_LOG_DENSITY_FN, SLOT_MAGIC, SLOT_MODEL,
                                      SLOT_THREADS, SharedOracleCounter, new_ffi_state,
                                      release_ffi_state)
from stanvi.targets.ffi_state import FFI_STATE_SLOTS  # noqa: F401  (re-exported: it was here)
from stanvi.targets.hvp_choice import stored_hvp_choice, timed_hvp_choice


HVP_METHODS = ("auto", "exact", "finite_difference")
#: A batched call runs on all threads only when its work is at least this many seconds
#: (:meth:`StanTarget._threads_for`); below it TBB's start-up costs more than it saves.
PARALLEL_MIN_SECONDS = 1e-3
#: Gradients an L-BFGS path is expected to take, for the thread choice of :meth:`lbfgs_paths`
PATH_GRADIENTS_GUESS = 30


class StanTarget:
    """A Stan model plus data, evaluated through its compiled library.

    Args:
        model: a :class:`CompiledModel`, a library path (``.so``), or a ``.stan`` path (compiled
            and cached on first use).
        data: a dict, a JSON path or a JSON string; None for a model without data.
        seed: seed for the model's constructor (data-block RNG use) and default RNG seeds.
        threads: threads per batched call (default ``$STANVI_NUM_THREADS`` or all CPUs).
        progress: show compilation progress when ``model`` needs compiling.
        hvp_method: how Hessian-vector products are computed: ``"exact"`` (one nested-autodiff
            ``fvar<var>`` sweep; needs the exact build), ``"finite_difference"`` (central
            differences of two reverse-mode gradients, plus the gradient itself), or ``"auto"``
            (default): finite differences when the exact sweep costs more than twice as much, as
            it does for some Stan Math functions (e.g. ``bernoulli_logit_glm``: ~24× a
            gradient).  The choice is made once per (compiled library, data) — timed on 16 fixed
            points the first time that pair is loaded — and stored next to the library
            (``hvp_choice.json``), so every later load, in any process and under any load, makes
            the same choice and the same seed gives the same result (see
            :meth:`_stored_hvp_choice`).  TrustVI only needs a bounded symmetric Hessian model,
            so either is valid; the choice is in :attr:`hvp_method_used`.
    """

    # batches are evaluated on the host (C++), so a method's estimator can run in NumPy around
    # them (stanvi.estimators.base.host_path; docs/algorithms.md#host-path)
    evaluates_on_host = True

    def __init__(self, model: CompiledModel | str | os.PathLike, data: DataLike = None, *,
                 seed: int = 0, threads: int | None = None, progress: bool = True,
                 hvp_method: str = "auto") -> None:
        if hvp_method not in HVP_METHODS:
            raise ValueError(f"hvp_method={hvp_method!r} is not one of {list(HVP_METHODS)}")
        if isinstance(model, CompiledModel):
            compiled = model
        elif str(model).endswith(".stan") or "{" in str(model):
            compiled = compile_model(model, progress=progress)
        else:
            compiled = None
        library = compiled.library if compiled else Path(model)
        if not Path(library).is_file():
            raise FileNotFoundError(f"model library not found: {library}")
        self.compiled = compiled
        self.library_path = Path(library)
        self.data_json = data_to_json(data)
        self.seed = int(seed)
        # State shared with the XLA FFI handlers (see SharedOracleCounter and jax_ffi.py).
        self._ffi_state = new_ffi_state()
        weakref.finalize(self, release_ffi_state, self._ffi_state)
        self.threads = threads or default_threads()
        self.counter = SharedOracleCounter(self._ffi_state)
        self._row_seconds: dict[str, float] = {}   # per kind, for _threads_for
        self._batched = BatchedLibrary(library)
        if hvp_method == "exact" and not self._batched.hvp_exact:
            raise ValueError(f"hvp_method='exact' needs the nested-autodiff build, but "
                             f"{self.library_path.name} is the finite-difference build")
        self._hvp_fd = {"exact": False, "finite_difference": True}.get(
            hvp_method, None if self._batched.hvp_exact else True)
        try:
            self._bs = load_bridgestan_model(library, self.data_json, self.seed)
        except RuntimeError as exc:
            raise data_error_from_stan(str(exc), self._model_name_guess(),
                                       self.data_json) from None
        self._handle = int(self._bs.model)
        self._dim = self._bs.param_unc_num()
        self._ffi_state[SLOT_MODEL] = self._handle
        self._ffi_state[SLOT_DIM] = self._dim
        if self._hvp_fd is None and self._dim > 0:  # "auto": one stored choice per library+data
            self._hvp_fd = self._stored_hvp_choice() == "finite_difference"
        for slot, fn in ((SLOT_LOG_DENSITY_FN, "stanvi_batch_log_density"),
                         (SLOT_GRADIENT_FN, "stanvi_batch_gradient"),
                         (SLOT_HVP_FN, "stanvi_batch_hvp")):
            self._ffi_state[slot] = self._batched.function_address(fn)
        self._ffi_state[SLOT_MAGIC] = FFI_MAGIC
        self._unc_names = [n for n in self._bs.param_unc_names() if n] if self._dim else []
        self._names = {(tp, gq): [n for n in self._bs.param_names(include_tp=tp, include_gq=gq) if n]
                       for tp in (False, True) for gq in (False, True)}
        self._variables = {key: group_names(names) for key, names in self._names.items()}

    # ------------------------------------------------------------------ description
    def _model_name_guess(self) -> str:
        return self.compiled.name if self.compiled else self.library_path.stem.removeprefix("lib")

    @property
    def name(self) -> str:
        """The model's name (without stanc's ``_model`` suffix)."""
        return self._bs.name().removesuffix("_model")

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def unconstrained_names(self) -> list[str]:
        return list(self._unc_names)

    @property
    def threads(self) -> int:
        """Threads per batched call (TBB), used by the direct calls and the JAX bridge alike."""
        return int(self._ffi_state[SLOT_THREADS])

    @threads.setter
    def threads(self, value: int) -> None:
        if int(value) < 1:
            raise ValueError(f"threads must be >= 1, got {value}")
        self._ffi_state[SLOT_THREADS] = int(value)

    @property
    def _hvp_fd(self) -> bool | None:
        """Finite-difference HVPs? None while ``"auto"`` has not decided (kept in the shared
        state: the FFI handler decides the same way when its call comes first)."""
        mode = int(self._ffi_state[SLOT_HVP_MODE])
        return None if mode < 0 else bool(mode)

    @_hvp_fd.setter
    def _hvp_fd(self, value: bool | None) -> None:
        self._ffi_state[SLOT_HVP_MODE] = -1 if value is None else int(bool(value))

    @property
    def ffi_state_address(self) -> int:
        """Address of the state the XLA FFI handlers read (model handle, entry points, threads,
        HVP mode) and count into.  It stays allocated for the life of the process; once this
        target is collected its model slot is zero and the handlers report an error."""
        return int(self._ffi_state.ctypes.data)

    @property
    def hvp_exact(self) -> bool:
        """True when HVPs come from nested autodiff, False for the finite-difference build."""
        return self._batched.hvp_exact

    @property
    def hvp_method_used(self) -> str | None:
        """``"exact"`` or ``"finite_difference"``; None while ``"auto"`` has not decided yet."""
        return None if self._hvp_fd is None else ("finite_difference" if self._hvp_fd else "exact")

    def _stored_hvp_choice(self) -> str:
        """``hvp_method="auto"``: the choice stored for this (library, data), or, the first time,
        the timed choice (:meth:`_timed_hvp_choice`), stored for every later load
        (:func:`stanvi.targets.hvp_choice.stored_hvp_choice`)."""
        return stored_hvp_choice(self.library_path, self.data_json, self._dim,
                                 self._timed_hvp_choice)

    def _timed_hvp_choice(self, z: np.ndarray, v: np.ndarray) -> tuple[bool, float, float]:
        """Both HVP methods timed on the rows of z: (finite differences?, exact seconds,
        finite-difference seconds); see :func:`stanvi.targets.hvp_choice.timed_hvp_choice`."""

        def hvp(zs: np.ndarray, vs: np.ndarray, finite_difference: bool):
            return self._batched.hvp(self._handle, zs, vs, propto=False, jacobian=True,
                                     threads=self.threads, finite_difference=finite_difference)

        return timed_hvp_choice(hvp, z, v)

    def _choose_hvp_method(self, z: np.ndarray, v: np.ndarray) -> None:
        """Fallback for a target whose "auto" choice was not made at load (none here today)."""
        self._hvp_fd = self._timed_hvp_choice(z, v)[0]

    def variables(self, *, include_tp: bool = True, include_gq: bool = True) -> list[Variable]:
        """The model's constrained variables (name, shape), parameters first."""
        return list(self._variables[(include_tp, include_gq)])

    def variable_kinds(self) -> dict[str, str]:
        """Each variable's block: 'parameter', 'transformed_parameter' or 'generated_quantity'."""
        params = {v.name for v in self._variables[(False, False)]}
        with_tp = {v.name for v in self._variables[(True, False)]}
        kinds = {}
        for v in self._variables[(True, True)]:
            kinds[v.name] = ("parameter" if v.name in params else
                             "transformed_parameter" if v.name in with_tp else "generated_quantity")
        return kinds

    @functools.cached_property
    def jax_log_density(self):
        """This target's log density as a JAX-differentiable function of one point (D,); see
        :mod:`stanvi.targets.jax_bridge` (XLA FFI custom calls where available, else
        ``pure_callback``; ``$STANVI_JAX_BRIDGE`` chooses)."""
        return self.jax_log_density_with(None)

    def jax_log_density_with(self, backend: str | None = None):
        """:attr:`jax_log_density` through a chosen bridge: ``"ffi"`` (XLA custom calls),
        ``"callback"`` (``pure_callback``) or ``"auto"``/None (``$STANVI_JAX_BRIDGE``, default
        FFI when available); see :mod:`stanvi.targets.jax_bridge`."""
        from stanvi.targets.jax_bridge import jax_log_density  # noqa: PLC0415  (imports JAX)
        from stanvi.targets.jax_ffi import resolve_backend  # noqa: PLC0415

        resolved = resolve_backend(backend)
        bridges = self.__dict__.setdefault("_jax_bridges", {})
        if resolved not in bridges:
            bridges[resolved] = jax_log_density(self, backend=resolved)
        return bridges[resolved]

    def data_dict(self) -> dict[str, Any]:
        return data_to_dict(self.data_json or None)

    def __repr__(self) -> str:
        return f"StanTarget({self.name!r}, dim={self.dim}, library={str(self.library_path)!r})"

    # ------------------------------------------------------------------ batched evaluation
    def _prepare(self, z: np.ndarray) -> np.ndarray:
        return as_batch(z, self._dim)

    @staticmethod
    def _nan_rows(z: np.ndarray, lp: np.ndarray) -> None:
        """NaN in, NaN out: a row with a NaN coordinate gets a NaN log density, not -inf."""
        if np.isnan(z.sum()):  # cheap test first; the row-wise one only when needed
            lp[np.isnan(z).any(axis=1)] = np.nan

    def _threads_for(self, kind: str, rows: int) -> int:
        """Threads for a batched call of ``rows`` points: all of :attr:`threads` when the call's
        work (rows × the last measured seconds per row of this kind) is at least
        ``PARALLEL_MIN_SECONDS``, else one.  Waking TBB's workers for a small batch costs more
        than it saves, and the workers then spin for a while, taking the CPU from the caller's
        own arithmetic (on 2 cores a Laplace warm start's L-BFGS ran 3× slower after batched
        calls; issue T3-1).  Each row is computed alone, so the result does not depend on it."""
        threads = self.threads
        if threads <= 1 or rows < 2:
            return 1
        per_row = self._row_seconds.get(kind)
        if per_row is None or rows * per_row >= PARALLEL_MIN_SECONDS:
            return threads
        return 1

    def _counted(self, kind: str, z: np.ndarray, call, *args, **kwargs):
        """``call(handle, z, *args, ...)`` on the library, counted in ``self.counter`` as
        ``len(z)`` draws of ``kind`` with the seconds spent in C++."""
        rows = z.shape[0]
        threads = self._threads_for(kind, rows)
        t0 = time.perf_counter()
        out = call(self._handle, z, *args, propto=False, jacobian=True, threads=threads,
                   **kwargs)
        seconds = time.perf_counter() - t0
        self.counter.add(kind, rows, seconds)
        if rows:   # the single-thread seconds per row, about (TBB's overhead aside)
            self._row_seconds[kind] = seconds * threads / rows
        return out

    def log_density(self, z: np.ndarray) -> BatchResult:
        z = self._prepare(z)
        lp, st = self._counted("log_density", z, self._batched.log_density)
        self._nan_rows(z, lp)
        return BatchResult(lp, ok=st.ok, messages=st.messages)

    def log_density_gradient(self, z: np.ndarray) -> BatchResult:
        z = self._prepare(z)
        lp, grad, st = self._counted("gradient", z, self._batched.gradient)
        self._nan_rows(z, lp)
        return BatchResult(lp, gradient=grad, ok=st.ok, messages=st.messages)

    def log_density_hvp(self, z: np.ndarray, v: np.ndarray) -> BatchResult:
        z = self._prepare(z)
        v = np.broadcast_to(np.asarray(v, dtype=np.float64), z.shape).copy(order="C")
        if self._hvp_fd is None:
            self._choose_hvp_method(z, v)
        lp, grad, hvp, st = self._counted("hvp", z, self._batched.hvp, v,
                                          finite_difference=self._hvp_fd)
        self._nan_rows(z, lp)
        return BatchResult(lp, gradient=grad, hvp=hvp, ok=st.ok, messages=st.messages)

    def lbfgs_paths(self, inits: np.ndarray, *, max_iters: int, centres=None, inv_sd=None,
                    radius: float = 0.0) -> LbfgsPaths:
        """Independent L-BFGS paths maximizing log p from the rows of ``inits``, in C++
        (L-BFGS-B's algorithm without bounds: :meth:`BatchedLibrary.lbfgs_paths`), their
        gradients counted; a path ends early near a row of ``centres``."""
        inits = self._prepare(inits)
        threads = self._threads_for("gradient", inits.shape[0] * PATH_GRADIENTS_GUESS)
        t0 = time.perf_counter()
        paths = self._batched.lbfgs_paths(self._handle, inits, max_iters=max_iters,
                                          centres=centres, inv_sd=inv_sd, radius=radius,
                                          threads=threads)
        self.counter.add("gradient", int(paths.evaluations.sum()), time.perf_counter() - t0)
        return paths

    # ------------------------------------------------------------------ single points (raise)
    def _raise_if_failed(self, result: BatchResult, what: str, z: np.ndarray) -> None:
        if not result.ok[0]:
            msg = result.messages.get(0, "non-finite value")
            raise ModelEvaluationError(f"model '{self.name}' failed to evaluate the {what} at "
                                       f"{np.array2string(np.asarray(z), precision=4)}: {msg}")

    def log_density_at(self, z: np.ndarray) -> float:
        """log p at one point; raises ModelEvaluationError if the model throws there."""
        r = self.log_density(z)
        self._raise_if_failed(r, "log density", z)
        return float(r.log_density[0])

    def gradient_at(self, z: np.ndarray) -> tuple[float, np.ndarray]:
        """(log p, gradient) at one point; raises ModelEvaluationError if the model throws."""
        r = self.log_density_gradient(z)
        self._raise_if_failed(r, "gradient", z)
        return float(r.log_density[0]), r.gradient[0]

    def hvp_at(self, z: np.ndarray, v: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
        """(log p, gradient, H v) at one point; raises ModelEvaluationError if the model throws."""
        r = self.log_density_hvp(z, v)
        self._raise_if_failed(r, "Hessian-vector product", z)
        return float(r.log_density[0]), r.gradient[0], r.hvp[0]

    # ------------------------------------------------------------------ constrained space
    def constrain_flat(self, z: np.ndarray, *, include_tp: bool = True, include_gq: bool = True,
                       seed: int | None = None) -> tuple[np.ndarray, BatchResult]:
        """Flat constrained rows (B, K) in Stan's column order, plus per-row status."""
        out, st = self._constrain_rows(z, include_tp, include_gq, seed)
        return out, BatchResult(np.zeros(out.shape[0]), ok=st.ok, messages=st.messages)

    def _constrain_rows(self, z: np.ndarray, include_tp: bool, include_gq: bool,
                        seed: int | None):
        """One batched constrain call: flat rows (B, K) and the library's RowStatus."""
        z = self._prepare(z)
        k = len(self._names[(include_tp, include_gq)])
        return self._batched.constrain(self._handle, z, k, include_tp=include_tp,
                                       include_gq=include_gq,
                                       seed=self.seed if seed is None else int(seed),
                                       threads=self.threads)

    def constrain(self, z: np.ndarray, *, include_tp: bool = True, include_gq: bool = True,
                  seed: int | None = None) -> dict[str, np.ndarray]:
        """Constrained variables by Stan name, each (B, *shape).  Generated quantities draw from
        an RNG seeded by (seed, row), so results do not depend on the thread count.  Where the
        generated quantities throw, only they are NaN: the draw's parameters and transformed
        parameters are kept, as Stan's writers keep them (see :meth:`constrain_reporting`)."""
        return self.constrain_reporting(z, include_tp=include_tp, include_gq=include_gq,
                                        seed=seed)[0]

    def constrain_reporting(self, z: np.ndarray, *, include_tp: bool = True,
                            include_gq: bool = True, seed: int | None = None
                            ) -> tuple[dict[str, np.ndarray], int, str]:
        """:meth:`constrain`, plus the number of rows whose generated quantities could not be
        computed and the model's first message for them ('' if none)."""
        flat, st = self._constrain_rows(z, include_tp, include_gq, seed)
        gq_rows = np.flatnonzero(st.gq_only) if st.gq_only is not None else np.array([], int)
        message = st.messages.get(int(gq_rows[0]), "") if len(gq_rows) else ""
        values = {v.name: v.extract(flat) for v in self._variables[(include_tp, include_gq)]}
        return values, int(len(gq_rows)), message.strip()

    def unconstrain(self, values: Mapping[str, Any]) -> np.ndarray:
        """The unconstrained vector (D,) for constrained parameter values given by name."""
        try:
            return self._bs.param_unconstrain_json(stanio.dump_stan_json(dict(values)))
        except RuntimeError as exc:
            raise StanDataError(f"cannot unconstrain the given values for model '{self.name}': "
                                f"{exc}") from None

    def initial_point(self, seed: int | None = None, *, init_radius: float = 2.0,
                      inits: Mapping[str, Any] | None = None, max_tries: int = 100) -> np.ndarray:
        """Stan's initialization: user values where given, uniform(-r, r) on the unconstrained
        scale elsewhere, retried until the log density and gradient are finite (up to 100 times),
        as ``stan::services::util::initialize`` does."""
        rng = self._bs.new_rng(self.seed if seed is None else int(seed))
        theta_json = json.dumps({}) if inits is None else stanio.dump_stan_json(dict(inits))
        try:
            return self._bs.param_initialize(rng, theta_json, init_radius=init_radius,
                                             max_tries=max_tries)
        except RuntimeError as exc:
            raise ModelEvaluationError(f"model '{self.name}': {exc}") from None
