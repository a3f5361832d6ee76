"""The Target protocol: what every variational method may ask of a model (docs/architecture.md#targets).

A target is a log density ``log p(z)`` on an unconstrained space R^D (Jacobian included, as
Stan's ``log_prob<propto=false, jacobian=true>``), evaluated over a *batch* of points at once.
Methods never talk to Stan directly: everything goes through a target, so oracle calls are
counted in one place (:class:`OracleCounter`).

Batched calls never raise for a single bad draw.  A row whose evaluation throws (a domain error,
``reject()``) or is not finite comes back as ``-inf`` log density / ``NaN`` gradient and HVP, with
``ok[i] = False``, and ``BatchResult.messages[i]`` holds the model's message.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, runtime_checkable

import numpy as np


@dataclass
class OracleCounter:
    """Per-draw counts of model evaluations, by kind.

    A batch of B points adds B to the kind it evaluates.  A gradient call that also returns the
    log density counts once, as a gradient; an HVP call that also returns the gradient counts once,
    as an HVP.  Methods convert these draw counts into the TrustVI paper's oracle units
    (Regier, Jordan & McAuliffe 2017, §5; docs/algorithms.md#oracle-calls).  Thread-safe.
    """

    log_density: int = 0
    gradient: int = 0
    hvp: int = 0
    seconds: float = 0.0  # wall time inside the model's batched calls (where the target times them)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, kind: str, n: int, seconds: float = 0.0) -> None:
        with self._lock:
            setattr(self, kind, getattr(self, kind) + int(n))
            self.seconds += seconds

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"log_density": self.log_density, "gradient": self.gradient, "hvp": self.hvp}

    def reset(self) -> None:
        with self._lock:
            self.log_density = self.gradient = self.hvp = 0
            self.seconds = 0.0


@dataclass(frozen=True)
class BatchResult:
    """Result of a batched evaluation.

    Attributes:
        log_density: shape (B,); ``-inf`` where the row failed.
        gradient: shape (B, D) or None; ``NaN`` rows where the row failed.
        hvp: shape (B, D) or None; ``NaN`` rows where the row failed.
        ok: shape (B,) bool; False where the model threw or returned a non-finite value.
        messages: row -> the model's message, for the failed rows.
    """

    log_density: np.ndarray
    gradient: np.ndarray | None = None
    hvp: np.ndarray | None = None
    ok: np.ndarray | None = None
    messages: dict[int, str] = field(default_factory=dict)


@runtime_checkable
class Target(Protocol):
    """A log density on R^D that a variational method can evaluate in batches."""

    counter: OracleCounter

    @property
    def dim(self) -> int:
        """Number of unconstrained parameters D."""

    @property
    def unconstrained_names(self) -> list[str]:
        """Names of the D unconstrained coordinates."""

    def log_density(self, z: np.ndarray) -> BatchResult:
        """log p at each row of ``z`` (B, D)."""

    def log_density_gradient(self, z: np.ndarray) -> BatchResult:
        """log p and its gradient at each row of ``z`` (B, D)."""

    def log_density_hvp(self, z: np.ndarray, v: np.ndarray) -> BatchResult:
        """log p, its gradient and the Hessian-vector product H(z_i) v_i for each row."""

    def constrain(self, z: np.ndarray, *, include_tp: bool = True, include_gq: bool = True,
                  seed: int | None = None) -> dict[str, np.ndarray]:
        """Map unconstrained draws (B, D) to constrained variables by name, each of shape
        (B, *var_shape); generated quantities use an RNG seeded by ``seed``."""

    def unconstrain(self, values: Mapping[str, Any]) -> np.ndarray:
        """Map one set of constrained values by name to an unconstrained vector (D,)."""


def as_batch(z: np.ndarray, dim: int) -> np.ndarray:
    """Return ``z`` as a C-contiguous float64 array of shape (B, dim); a single point (dim,) is
    promoted to a batch of one.  Raises ValueError naming the expected shape otherwise."""
    arr = np.ascontiguousarray(np.asarray(z, dtype=np.float64))
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise ValueError(f"expected points of shape (B, {dim}) or ({dim},), got {np.shape(z)}")
    return arr
