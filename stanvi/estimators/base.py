"""The estimator interface: what a method asks of an ELBO estimator
(docs/architecture.md#recipes); the registry that names the implementations is
:mod:`stanvi.estimators.registry`, above them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np



class Estimator(Protocol):
    """The ELBO pieces the methods and ``Fit`` use, for one (family, log density) pair, on the
    flat variational parameters ``params`` (P,) and base draws ``eps`` (n, D); numpy results.
    :class:`~stanvi.estimators.elbo.ElboEstimator` is the reparameterization implementation."""

    family: Any
    log_density: Callable

    @property
    def compile_seconds(self) -> float:
        """JAX compilation time spent so far (reported apart from run time)."""

    def values(self, params, eps, *, bucketed: bool = False) -> np.ndarray:
        """ℓ(λ; ε_j) per draw (n,)."""

    def values_and_grads(self, params, eps, *, bucketed: bool = False
                         ) -> tuple[np.ndarray, np.ndarray]:
        """ℓ per draw and the per-draw gradients ∇_λ ℓ (n, P)."""

    def hvp(self, params, eps, direction) -> np.ndarray:
        """∇²L̂(λ) v on the fixed draws ``eps``."""

    def pair_differences(self, new, old, eps, *, bucketed: bool = False) -> np.ndarray:
        """Matched-pair ELBO changes ℓ(λ'; ε_i) − ℓ(λ; ε_i)."""

    def log_p_and_q(self, params, eps, *, bucketed: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draws z, log p(z) and log q(z) (output draws, importance ratios)."""


EstimatorFactory = Callable[..., Estimator]


def family_estimator(family) -> str | None:
    """The estimator ``family`` needs in place of the method's (its ``gradient_estimator``,
    stanvi.families.protocol), or None: the method's own is valid for it."""
    return getattr(family, "gradient_estimator", None)
