"""Quadruply stochastic Gaussian processes (Evans & Nair 2020; docs/gp.md#model):
basis-function GP models — random Fourier features, inducing points at the training inputs, the
relevance vector machine — with Gaussian, Laplace and logistic likelihoods, mean-field / chevron
/ full covariance factors, and the QSGP estimator whose per-step cost does not depend on n or m.

``stanvi.fit(model, method="qsgp")`` fits a :class:`BasisGP`; ``method="exact"`` gives the
closed-form posterior (Gaussian likelihood, small m) and ``method="svi"`` the O(m)-per-step
doubly-stochastic baseline.  See docs/gp.md.
"""

from stanvi.gp.basis import InducingPoints, RandomFourierFeatures, RVM
from stanvi.gp.dispatch import GP_METHODS, MethodNotApplicable, fit_gp
from stanvi.gp.families import Chevron, FullCholesky, MeanField, VParams
from stanvi.gp.kernels import SquaredExponential
from stanvi.gp.likelihoods import BernoulliLogit, Gaussian, Laplace, StudentT
from stanvi.gp.model import (BasisGP, inducing_regression, init_exact_gp_subset, rff_classification,
                             rff_regression, rvm_regression)
from stanvi.gp.predict import Prediction
from stanvi.gp.qsgp import Options as QSGPOptions
from stanvi.gp.result import GPFit

__all__ = ["BasisGP", "BernoulliLogit", "Chevron", "FullCholesky", "GPFit", "GP_METHODS",
           "Gaussian", "InducingPoints", "Laplace", "MeanField", "MethodNotApplicable",
           "Prediction", "QSGPOptions", "RVM", "RandomFourierFeatures", "SquaredExponential",
           "StudentT", "VParams", "fit_gp", "inducing_regression", "init_exact_gp_subset",
           "rff_classification", "rff_regression", "rvm_regression"]
