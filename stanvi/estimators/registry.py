"""The estimators by name, above their implementations (docs/architecture.md#recipes).

A new gradient estimator is one module in ``stanvi/estimators/`` and one line here: ELBO
estimators (a class satisfying :class:`~stanvi.estimators.base.Estimator`) go in
:data:`ESTIMATORS`, which ``stanvi.fit`` consults for the estimator a method names
(``ESTIMATOR = "<name>"``) or a family needs (its ``gradient_estimator``) and hands over in the
run context (:func:`estimator_for`); per-term estimators of a subsampled target go in
:func:`make_estimator` (jointcv's ``estimator`` option).  MLMCVI builds its multilevel
estimator itself (:mod:`stanvi.estimators.mlmc`; the mixture's through the family's ELBO
estimator's ``multilevel``).
"""

from __future__ import annotations

import os
from typing import Any

from stanvi.estimators.base import Estimator, EstimatorFactory, family_estimator
from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.host import HostElboEstimator
from stanvi.estimators.incremental import Incremental
from stanvi.estimators.joint_cv import JointSAGA, JointSVRG
from stanvi.estimators.mixture_rb import MixtureEstimator
from stanvi.estimators.subsampled import Naive, SubsampledEstimator
from stanvi.estimators.taylor_cv import TaylorCV

ESTIMATORS: dict[str, EstimatorFactory] = {
    # the reparameterization-gradient estimator (Kingma & Welling 2014; Titsias &
    # Lázaro-Gredilla 2014), with HVPs by forward-over-reverse autodiff; every method so far
    "reparameterization": ElboEstimator,
    # the Gaussian mixture's (stanvi.families.mixture): reparameterized within a component,
    # Rao-Blackwellized over the component choice (Liu et al. 2019; docs/discrete.md); a family
    # names it as its ``gradient_estimator``
    "mixture_rb": MixtureEstimator,
}
DEFAULT_ESTIMATOR = "reparameterization"


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


def make_estimator(name: str, target, family, **options: Any) -> SubsampledEstimator:
    """The estimator ``name`` ('naive', 'cv', 'joint', 'inc') for (target, family); ``options``
    are passed to its constructor (e.g. ``variant``, ``hvp_scale``, ``svrg_period``)."""
    if name == "joint":
        variant = options.pop("variant", "saga")
        classes = {"saga": JointSAGA, "svrg": JointSVRG}
        if variant not in classes:
            raise ValueError(f"variant must be 'saga' or 'svrg', got {variant!r}")
        return classes[variant](target, family, **options)
    options.pop("variant", None)
    registry = {"naive": Naive, "cv": TaylorCV, "inc": Incremental}
    if name not in registry:
        raise ValueError(f"unknown estimator {name!r}; choose one of {sorted([*registry, 'joint'])}")
    return registry[name](target, family, **options)


SUBSAMPLED_ESTIMATORS = ("naive", "cv", "joint", "inc")
"""The names :func:`make_estimator` accepts (``joint`` with ``variant='saga'|'svrg'``)."""
