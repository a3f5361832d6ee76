"""ELBO estimators (see :mod:`stanvi.estimators.elbo`)."""

from stanvi.estimators.elbo import (ElboEstimator, GradientEstimate, GradientFailure,
                                    gradient_with_redraws, standard_normal)

__all__ = ["ElboEstimator", "GradientEstimate", "GradientFailure", "gradient_with_redraws",
           "standard_normal"]
