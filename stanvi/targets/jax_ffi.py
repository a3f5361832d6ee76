"""XLA FFI custom calls for the JAX bridge: a StanTarget's batched calls run inside XLA.

``jax.pure_callback`` costs ~150 µs per call on its own (plus the bridge's Python), dominating a
batched call on a small model.  This module compiles ``stanvi/stan/glue/stanvi_ffi.cpp`` against
jaxlib's XLA FFI headers (:func:`jax.ffi.include_dir`) once per (compiler, jaxlib version,
source) into the compile cache, registers its three handlers as CPU custom-call targets, and
gives :mod:`stanvi.targets.jax_bridge` ``jax.ffi.ffi_call`` equivalents of its callbacks.

**One handler object serves every model.**  The handlers know nothing about Stan: each call
carries one attribute, the index of the target's shared state (:attr:`StanTarget._ffi_state`,
an int64 array holding the model handle, the library's ``stanvi_batch_*`` entry points, the
thread count, the HVP mode and the oracle counters) in the handler object's registry of states,
and calls the model library's batched entry points through those function pointers.  An index
(0 for a process's first target), not the state's address, so a program lowered in one process
is identical to the one lowered in the next, and JAX's persistent compilation cache serves it
(:mod:`stanvi.jax_config`); an address would differ from process to process and miss.  So
model libraries are unchanged and cached as before; a jaxlib upgrade rebuilds only this small
object (~5 s).

When the object cannot be built (no compiler, jaxlib without FFI headers, a jaxlib whose FFI
API does not match), :func:`ffi_available` is False with the reason in :func:`ffi_unavailable_reason`
and the bridge falls back to ``pure_callback``.  ``$STANVI_JAX_BRIDGE`` (``ffi``, ``callback`` or
``auto``, the default) or the ``backend=`` argument of :func:`~stanvi.targets.jax_bridge.jax_log_density`
chooses explicitly.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from stanvi.targets.ffi_state import FFI_STATE_SLOTS

FFI_SOURCE = Path(__file__).resolve().parents[1] / "stan" / "glue" / "stanvi_ffi.cpp"
TARGETS = {"log_density": ("stanvi_log_density", "StanviLogDensity"),
           "gradient": ("stanvi_gradient", "StanviGradient"),
           "hvp": ("stanvi_hvp", "StanviHvp")}
_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-w")

_lock = threading.Lock()
_state: dict[str, object] = {}


def _fingerprint(cxx_version: str, include_dir: str) -> str:
    h = hashlib.sha256(FFI_SOURCE.read_bytes())
    for part in (jax.__version__, jaxlib.__version__, cxx_version, include_dir, *_FLAGS):
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:16]


def _build() -> Path:
    """The handler object for this jaxlib and compiler, compiled once into the cache."""
    from stanvi.stan.cache import cache_root, lock_for  # noqa: PLC0415
    from stanvi.stan.toolchain import find_toolchain  # noqa: PLC0415

    include_dir = jax.ffi.include_dir()
    if not (Path(include_dir) / "xla" / "ffi" / "api" / "ffi.h").is_file():
        raise RuntimeError(f"jaxlib has no XLA FFI headers under {include_dir}")
    toolchain = find_toolchain()
    directory = cache_root() / "ffi"
    library = directory / f"stanvi_ffi-{_fingerprint(toolchain.cxx_version, include_dir)}.so"
    if library.is_file():   # built already (the cache may be read-only)
        return library
    directory.mkdir(parents=True, exist_ok=True)
    with lock_for(directory, library.stem):
        if not library.is_file():
            tmp = directory / f".{library.stem}.{os.getpid()}.so"
            res = subprocess.run([toolchain.cxx, *_FLAGS, f"-I{include_dir}", str(FFI_SOURCE),
                                  "-o", str(tmp)], capture_output=True, text=True)
            if res.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise RuntimeError("compiling the XLA FFI handlers failed:\n" + res.stderr[-3000:])
            os.replace(tmp, library)
    return library


def _load() -> None:
    """Build, load and register the handlers (once per process); records failure instead of
    raising."""
    with _lock:
        if _state:
            return
        try:
            library = _build()
            lib = ctypes.CDLL(str(library))
            slots = lib.stanvi_ffi_state_slots()
            if slots != FFI_STATE_SLOTS:
                raise RuntimeError(f"{library} has {slots} state slots, StanTarget "
                                   f"{FFI_STATE_SLOTS}")
            lib.stanvi_ffi_register_state.argtypes = [ctypes.c_int64, ctypes.c_void_p]
            lib.stanvi_ffi_register_state.restype = ctypes.c_int
            lib.stanvi_ffi_max_states.restype = ctypes.c_int64
            for name, symbol in TARGETS.values():
                jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(getattr(lib, symbol)),
                                            platform="cpu")
            _state.update(lib=lib, path=library, error=None)
        except Exception as exc:  # noqa: BLE001  (any failure means: use pure_callback)
            _state.update(lib=None, path=None, error=f"{type(exc).__name__}: {exc}")


def ffi_available() -> bool:
    """True when the FFI handlers are built and registered (building them on first call)."""
    _load()
    return _state["lib"] is not None


def ffi_unavailable_reason() -> str | None:
    """Why the FFI bridge cannot be used in this process, or None when it can."""
    _load()
    return _state["error"]  # type: ignore[return-value]


def resolve_backend(backend: str | None) -> str:
    """``"ffi"`` or ``"callback"`` for ``backend`` (None: ``$STANVI_JAX_BRIDGE``, default
    ``"auto"``).  ``"auto"`` is ``"ffi"`` when the handlers are available; an explicit ``"ffi"``
    that is not available raises RuntimeError with the reason."""
    choice = (backend or os.environ.get("STANVI_JAX_BRIDGE") or "auto").lower()
    if choice not in ("auto", "ffi", "callback"):
        raise ValueError(f"JAX bridge backend {choice!r} is not one of 'auto', 'ffi', 'callback'")
    if choice == "callback":
        return choice
    if ffi_available():
        return "ffi"
    if choice == "ffi":
        raise RuntimeError(f"the XLA FFI bridge is not available: {ffi_unavailable_reason()}")
    return "callback"


_indices: dict[int, int] = {}  # state address -> its index in the handler object's registry


def state_index(state_address: int) -> int:
    """The registry index of the state at ``state_address``, registering it on first use.

    Indices are handed out in order (0, 1, ...) and never reused: states live for the whole
    process (see :mod:`stanvi.targets.stan_target`), so an index always names the same state."""
    if not ffi_available():
        raise RuntimeError(f"the XLA FFI bridge is not available: {ffi_unavailable_reason()}")
    lib = _state["lib"]
    with _lock:
        index = _indices.get(state_address)
        if index is None:
            index = len(_indices)
            if lib.stanvi_ffi_register_state(index, state_address) != 0:  # type: ignore[union-attr]
                raise RuntimeError(f"the XLA FFI bridge holds at most "
                                   f"{lib.stanvi_ffi_max_states()} targets per process")  # type: ignore[union-attr]
            _indices[state_address] = index
    return index


def ffi_calls(state_address: int, owner: object = None):
    """``(log_density, value_grad, value_grad_hvp)``: functions of points z (..., D) (and
    directions v of the same shape) returning arrays like the bridge's callbacks, each one XLA
    custom call.  ``state_address`` is the target's shared state (see the module docstring);
    the functions keep ``owner`` (the target) alive, so a function traced from them never
    outlives the model it calls."""
    # the attribute is the state's registry index (see the module docstring); numpy scalars
    # carry their dtype into the attribute
    state = np.uint64(state_index(state_address))

    def scalar(z):
        return jax.ShapeDtypeStruct(z.shape[:-1], jnp.float64)

    def vector(z):
        return jax.ShapeDtypeStruct(z.shape, jnp.float64)

    def log_density(z):
        return jax.ffi.ffi_call(TARGETS["log_density"][0], scalar(z),
                                vmap_method="broadcast_all")(z, state=state)

    def value_grad(z):
        return tuple(jax.ffi.ffi_call(TARGETS["gradient"][0], (scalar(z), vector(z)),
                                      vmap_method="broadcast_all")(z, state=state))

    def value_grad_hvp(z, v):
        # not vmapped by XLA's rule: the bridge's custom_vmap batches it (see jax_bridge)
        return tuple(jax.ffi.ffi_call(TARGETS["hvp"][0], (scalar(z), vector(z), vector(z)))(
            z, v, state=state))

    for fn in (log_density, value_grad, value_grad_hvp):
        fn.owner = owner  # keeps the target (hence its model and state) alive
    return log_density, value_grad, value_grad_hvp
