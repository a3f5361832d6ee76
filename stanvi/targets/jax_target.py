"""JaxTarget: a plain JAX log density of an unconstrained vector, as a batched Target.

Methods can use the JAX function itself (``target.jax_log_density``), which then runs entirely
on the accelerator when one is present; the numpy-facing batched methods (for tests, diagnostics
and the Target protocol) are ``jit(vmap(...))`` of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from stanvi.lazy_jax import jax, jnp
from stanvi.targets.base import BatchResult, OracleCounter, as_batch


class JaxTarget:
    """A target given as a JAX function ``log_density(z) -> scalar`` of z with shape (D,).

    Args:
        log_density: JAX-traceable log density (Jacobian terms, if any, included by the caller).
        dim: D.
        names: optional names of the D coordinates (default ``z.1`` … ``z.D``); they are also the
            constrained "variables" (each a scalar), since a JAX target has no constraints.
        name: a label for summaries.
    """

    def __init__(self, log_density: Callable[[jax.Array], jax.Array], dim: int, *,
                 names: list[str] | None = None, name: str = "jax_target") -> None:
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        if names is not None and len(names) != dim:
            raise ValueError(f"{len(names)} names given for dim={dim}")
        self.jax_log_density = log_density
        self._dim = int(dim)
        self._names = list(names) if names is not None else [f"z.{i + 1}" for i in range(dim)]
        self.name = name
        self.counter = OracleCounter()
        self.hvp_exact = True
        grad = jax.grad(log_density)
        self._value = jax.jit(jax.vmap(log_density))
        self._value_grad = jax.jit(jax.vmap(jax.value_and_grad(log_density)))
        self._hvp = jax.jit(jax.vmap(
            lambda z, v: (log_density(z), *jax.jvp(grad, (z,), (v,)))))

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def unconstrained_names(self) -> list[str]:
        return list(self._names)

    def __repr__(self) -> str:
        return f"JaxTarget({self.name!r}, dim={self.dim})"

    @staticmethod
    def _finalize(lp: np.ndarray, *arrays: np.ndarray) -> tuple[np.ndarray, ...]:
        ok = np.isfinite(lp)
        for a in arrays:
            ok &= np.isfinite(a).all(axis=1)
        lp = np.where(ok | np.isnan(lp), lp, -np.inf)
        fixed = tuple(np.where(ok[:, None], a, np.nan) for a in arrays)
        return (ok, lp, *fixed)

    def log_density(self, z: np.ndarray) -> BatchResult:
        z = as_batch(z, self._dim)
        lp = np.asarray(self._value(jnp.asarray(z)))
        self.counter.add("log_density", z.shape[0])
        ok, lp = self._finalize(lp)
        return BatchResult(lp, ok=ok, messages={int(i): "non-finite value" for i in np.flatnonzero(~ok)})

    def log_density_gradient(self, z: np.ndarray) -> BatchResult:
        z = as_batch(z, self._dim)
        lp, g = (np.asarray(a) for a in self._value_grad(jnp.asarray(z)))
        self.counter.add("gradient", z.shape[0])
        ok, lp, g = self._finalize(lp, g)
        return BatchResult(lp, gradient=g, ok=ok,
                           messages={int(i): "non-finite value" for i in np.flatnonzero(~ok)})

    def log_density_hvp(self, z: np.ndarray, v: np.ndarray) -> BatchResult:
        z = as_batch(z, self._dim)
        v = np.broadcast_to(np.asarray(v, dtype=np.float64), z.shape)
        lp, g, hv = (np.asarray(a) for a in self._hvp(jnp.asarray(z), jnp.asarray(v)))
        self.counter.add("hvp", z.shape[0])
        ok, lp, g, hv = self._finalize(lp, g, hv)
        return BatchResult(lp, gradient=g, hvp=hv, ok=ok,
                           messages={int(i): "non-finite value" for i in np.flatnonzero(~ok)})

    def constrain(self, z: np.ndarray, *, include_tp: bool = True, include_gq: bool = True,
                  seed: int | None = None) -> dict[str, np.ndarray]:
        z = as_batch(z, self._dim)
        return {name: z[:, i].copy() for i, name in enumerate(self._names)}

    def unconstrain(self, values: Mapping[str, Any]) -> np.ndarray:
        missing = [n for n in self._names if n not in values]
        if missing:
            raise ValueError(f"values missing for {missing}")
        return np.array([float(values[n]) for n in self._names])
