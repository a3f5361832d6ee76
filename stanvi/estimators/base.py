"""The estimator interface: what a method asks of an ELBO estimator, and the registry that lets
``stanvi.fit`` pick one by name (DESIGN.md, "Layers").

A new gradient estimator (a control variate, multilevel Monte Carlo, Rao-Blackwellization) is one
module in ``stanvi/estimators/`` whose class satisfies :class:`Estimator` (adding what its method
needs) and is listed in :data:`ESTIMATORS` under a name, plus one method module in
``stanvi/methods/`` that declares ``ESTIMATOR = "<name>"``; ``stanvi.fit`` builds the estimator
the method names (:func:`estimator_for`) and hands it over in the run context.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from stanvi.discrete.mixture_elbo import MixtureEstimator
from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.host import HostElboEstimator


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

ESTIMATORS: dict[str, EstimatorFactory] = {
    # the reparameterization-gradient estimator (Kingma & Welling 2014; Titsias &
    # Lázaro-Gredilla 2014), with HVPs by forward-over-reverse autodiff; every method so far
    "reparameterization": ElboEstimator,
    # the Gaussian mixture's (stanvi.families.mixture): reparameterized within a component,
    # Rao-Blackwellized over the component choice (Liu et al. 2019; spec
    # rao_blackwellized_discrete.md §5a); a family names it as its ``gradient_estimator``
    "mixture_rb": MixtureEstimator,
}
DEFAULT_ESTIMATOR = "reparameterization"


def family_estimator(family) -> str | None:
    """The estimator ``family`` needs in place of the method's (its ``gradient_estimator``,
    stanvi.families.protocol), or None: the method's own is valid for it."""
    return getattr(family, "gradient_estimator", None)


def host_path(target, family, name: str = DEFAULT_ESTIMATOR) -> bool:
    """Whether the reparameterization estimator of (target, family) runs on the host in NumPy
    (:class:`~stanvi.estimators.host.HostElboEstimator`): the target evaluates its batches on
    the host (a Stan model: ``evaluates_on_host``), the family has the NumPy pieces
    (:mod:`stanvi.families.host_math`), and ``$STANVI_HOST_PATH`` is not ``0``
    (docs/algorithms.md#host-path).  A JAX-native target keeps the JAX estimator, which runs on
    an accelerator when one is present."""
    return (name == DEFAULT_ESTIMATOR and family_estimator(family) is None
            and bool(getattr(target, "evaluates_on_host", False))
            and hasattr(family, "hvp_pullback")
            and os.environ.get("STANVI_HOST_PATH", "1").strip() != "0")


def estimator_for(target, family, name: str = DEFAULT_ESTIMATOR, *,
                  host: bool = False) -> Estimator:
    """The estimator ``name`` of (target, family), built once and kept on the target, so
    repeated fits of the same model (seeds, benchmarks) compile their JAX functions only once.
    A family that names its own estimator (:func:`family_estimator`) gets that one.  ``host``:
    the caller can use the host estimator (its loop is Python, not one compiled JAX program);
    it is built where :func:`host_path` allows."""
    if host and host_path(target, family, name):
        cache = target.__dict__.setdefault("_stanvi_estimators", {})
        est = cache.get(("host", family))
        if est is None:
            est = cache[("host", family)] = HostElboEstimator(family, target)
        return est
    name = family_estimator(family) or name
    try:
        factory = ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted(ESTIMATORS)}") from None
    cache = target.__dict__.setdefault("_stanvi_estimators", {})
    est = cache.get((name, family))
    if est is None:
        est = cache[(name, family)] = factory(family, target.jax_log_density,
                                              counter=getattr(target, "counter", None))
    return est
