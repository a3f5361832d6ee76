"""Small subsampled problems with exact −ELBO gradients, for the joint-CV tests
(docs/jointcv.md#model).

* Logistic regression ``y_n ~ Bern(sigmoid(x_nᵀz))``, ``z ~ N(0, I)``: for a Gaussian q (mean-field
  or full-rank) each a_n = x_nᵀz is N(x_nᵀμ, ‖Lᵀx_n‖²), so −ELBO is a sum of 1-D expectations,
  computed with 80-point Gauss–Hermite quadrature and differentiated by JAX (exact to ~1e-12).
* Linear-Gaussian ``y_n ~ N(x_nᵀz, τ²)``: every k_n is quadratic (the joint CV's zero-variance
  case, docs/jointcv.md#joint-estimator).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# the simulated logistic data of docs/jointcv.md#simulated-data
from stanvi.bench.jointcv_bench import simulate as simulate_logistic
from stanvi.targets.subsampled import JaxPerDatumTarget, logistic_regression_target

_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(80)
_WEIGHTS = _WEIGHTS / math.sqrt(2 * math.pi)


def logistic_problem(n: int = 60, d: int = 4, seed: int = 0):
    X, y = simulate_logistic(n, d, seed)
    return logistic_regression_target(X, y), X, y


def exact_neg_elbo(family, X: np.ndarray, y: np.ndarray):
    """−ELBO(w) of the logistic model, by Gauss–Hermite (a JAX function of the flat params)."""
    Xj, yj = jnp.asarray(X), jnp.asarray(y)
    nodes, weights = jnp.asarray(_NODES), jnp.asarray(_WEIGHTS)
    d = X.shape[1]

    def neg_elbo(params):
        mu = params[:d]
        cov = family.covariance(params)
        m = Xj @ mu
        s = jnp.sqrt(jnp.einsum("ni,ij,nj->n", Xj, cov, Xj))
        a = m[:, None] + s[:, None] * nodes[None, :]
        e_softplus = jnp.sum(jnp.logaddexp(0.0, a) * weights, axis=1)
        e_lik = jnp.sum(yj * m - e_softplus)
        e_prior = -0.5 * d * math.log(2 * math.pi) - 0.5 * (mu @ mu + jnp.trace(cov))
        return -(e_lik + e_prior + family.entropy(params))

    return jax.jit(neg_elbo), jax.jit(jax.grad(neg_elbo))


def linear_gaussian_problem(n: int = 40, d: int = 3, tau: float = 0.7, seed: int = 1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    y = X @ rng.standard_normal(d) + tau * rng.standard_normal(n)

    def log_lik(z, datum):
        x, yy = datum
        return -0.5 * ((yy - x @ z) / tau) ** 2 - math.log(tau * math.sqrt(2 * math.pi))

    def log_prior(z):
        return -0.5 * z @ z - 0.5 * d * math.log(2 * math.pi)

    return JaxPerDatumTarget(log_lik, log_prior, (X, y), d, name="linear_gaussian"), X, y, tau


def linear_gaussian_mu_gradient(X, y, tau, mu) -> np.ndarray:
    """∂(−ELBO)/∂μ = −Xᵀ(y − Xμ)/τ² + μ (exact, any q with mean μ)."""
    return -X.T @ (y - X @ mu) / tau ** 2 + mu
