"""The state a :class:`~stanvi.targets.stan_target.StanTarget` shares with the XLA FFI handlers
(stanvi/stan/glue/stanvi_ffi.cpp): one int64 array per target whose slots hold the model handle,
the batched entry points, the thread count and the HVP mode, and into which the handlers count the
draws they evaluate; and :class:`SharedOracleCounter`, which adds those counts to the Python
side's.  The slot layout below is the C++ side's ``enum Slot`` (that file's comment still names
stan_target.py, where the layout used to live).
"""

from __future__ import annotations

import threading

import numpy as np

from stanvi.targets.base import OracleCounter

# Slots of the state shared with the XLA FFI handlers (stanvi/stan/glue/stanvi_ffi.cpp, enum Slot).
FFI_MAGIC = 0x5354414E56494646  # "STANVIFF"
(SLOT_MAGIC, SLOT_LOG_DENSITY, SLOT_GRADIENT, SLOT_HVP, SLOT_NANOSECONDS, SLOT_THREADS,
 SLOT_HVP_MODE, SLOT_MODEL, SLOT_DIM, SLOT_LOG_DENSITY_FN, SLOT_GRADIENT_FN, SLOT_HVP_FN,
 N_SLOTS) = range(13)
FFI_STATE_SLOTS = N_SLOTS  # checked against the handler object's kSlotCount when it is loaded
KIND_SLOT = {"log_density": SLOT_LOG_DENSITY, "gradient": SLOT_GRADIENT, "hvp": SLOT_HVP}


# Every state handed out stays allocated for the life of the process (~100 bytes each): an XLA
# executable that outlives its target then finds the model slot zeroed (the handler reports an
# error) instead of reading freed memory.
_FFI_STATES: list[np.ndarray] = []
_FFI_STATES_LOCK = threading.Lock()


def new_ffi_state() -> np.ndarray:
    """A new state (every slot 0, the HVP mode undecided), kept for the life of the process."""
    state = np.zeros(N_SLOTS, dtype=np.int64)
    state[SLOT_HVP_MODE] = -1
    with _FFI_STATES_LOCK:
        _FFI_STATES.append(state)
    return state


def release_ffi_state(state: np.ndarray) -> None:
    """Run when a StanTarget is collected, before its model is destroyed."""
    state[SLOT_MODEL] = 0


class SharedOracleCounter(OracleCounter):
    """An :class:`OracleCounter` that also counts the draws the XLA FFI handlers evaluate.

    The handlers add their draws and nanoseconds (atomically, in C++) to slots of the target's
    shared state; this counter's fields read as the Python-side counts plus those slots, so
    ``counter.gradient``, ``snapshot()``, ``seconds`` and ``reset()`` cover both paths.  Python
    never writes the C++ slots: ``reset()`` and assignments store the Python part as the
    difference to them."""

    def __init__(self, state: np.ndarray) -> None:
        object.__setattr__(self, "_shared", state)
        object.__setattr__(self, "_own", {"log_density": 0, "gradient": 0, "hvp": 0, "seconds": 0.0})
        super().__init__()

    def _shared_value(self, kind: str) -> int | float:
        if kind == "seconds":
            return int(self._shared[SLOT_NANOSECONDS]) * 1e-9
        return int(self._shared[KIND_SLOT[kind]])

    def _get(kind: str):  # noqa: N805  (builds the properties below)
        def get(self) -> int | float:
            return self._own[kind] + self._shared_value(kind)

        def set_(self, value: int | float) -> None:
            self._own[kind] = value - self._shared_value(kind)

        return property(get, set_)

    log_density = _get("log_density")
    gradient = _get("gradient")
    hvp = _get("hvp")
    seconds = _get("seconds")
    del _get

    def add(self, kind: str, n: int, seconds: float = 0.0) -> None:
        with self._lock:
            self._own[kind] += int(n)
            self._own["seconds"] += seconds
