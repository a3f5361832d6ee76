"""ELBO estimators: the interface (:mod:`stanvi.estimators.base`), the registry
(:mod:`stanvi.estimators.registry`), the reparameterization estimator
(:mod:`stanvi.estimators.elbo`) and Stan ADVI's ``calc_grad`` (:mod:`stanvi.estimators.stan_advi`)."""

from stanvi.estimators.base import Estimator
from stanvi.estimators.registry import ESTIMATORS, estimator_for
from stanvi.estimators.elbo import (ElboEstimator, GradientEstimate, GradientFailure,
                                    gradient_with_redraws, standard_normal)

__all__ = ["ESTIMATORS", "ElboEstimator", "Estimator", "GradientEstimate", "GradientFailure",
           "estimator_for", "gradient_with_redraws", "standard_normal"]
