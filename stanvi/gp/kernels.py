"""Kernels for the basis-function GP models of :mod:`stanvi.gp` (docs/gp.md#bases).

Hyperparameters live in a dict ``theta`` of JAX arrays in log space (``log_ell``, ``log_sf2``),
so that they can be learned by empirical Bayes (type-II maximum likelihood) with unconstrained
gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class SquaredExponential:
    """k(x, z) = s_f² exp(−‖(x − z)/ℓ‖² / 2), isotropic (one ℓ) or ARD (one ℓ per input).

    Args:
        lengthscale: initial ℓ (default 1.0, a scalar also for ARD: every input starts equal).
        variance: initial s_f² (default 1.0).
        ard: one lengthscale per input dimension.
    """

    lengthscale: float = 1.0
    variance: float = 1.0
    ard: bool = False

    def __post_init__(self) -> None:
        if not (self.lengthscale > 0 and self.variance > 0):
            raise ValueError(f"SquaredExponential needs lengthscale > 0 and variance > 0, got "
                             f"{self.lengthscale}, {self.variance}")

    def theta0(self, d: int) -> dict[str, jax.Array]:
        """Initial hyperparameters (log ℓ of length d for ARD, else 1; log s_f²)."""
        size = d if self.ard else 1
        return {"log_ell": jnp.full((size,), math.log(self.lengthscale)),
                "log_sf2": jnp.asarray(math.log(self.variance))}

    @staticmethod
    def cross(X1: jax.Array, X2: jax.Array, theta: dict) -> jax.Array:
        """K(X1, X2), shape (a, b)."""
        ell = jnp.exp(theta["log_ell"])
        A = X1 / ell
        B = X2 / ell
        d2 = (jnp.sum(A * A, axis=1)[:, None] + jnp.sum(B * B, axis=1)[None, :]
              - 2.0 * A @ B.T)
        return jnp.exp(theta["log_sf2"]) * jnp.exp(-0.5 * jnp.maximum(d2, 0.0))

    @staticmethod
    def diag(X: jax.Array, theta: dict) -> jax.Array:
        """k(x, x) for each row: s_f²."""
        return jnp.full((X.shape[0],), jnp.exp(theta["log_sf2"]))
