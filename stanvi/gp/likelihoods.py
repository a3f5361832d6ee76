"""Likelihoods of the basis-function GP models (docs/gp.md#likelihoods,
docs/gp.md#site-functions, docs/gp.md#prediction).

Each likelihood gives, for a datum y and the Gaussian marginal f ~ N(a, s²) of the latent value
under q (s a *standard deviation*, not the paper's variance: docs/gp.md#lower-bound):

* ``expected_log_site(y, a, s, theta)``: F(a, s) = E[log g(y | a + s z)], z ~ N(0, 1);
* ``log_predictive(y, mean, var_f, theta)``: log p(y* | x*) = log E[g(y* | f)]
  (docs/gp.md#prediction);

both elementwise.  Only log-concave likelihoods can be used by QSGP: the stochastic lower bound
(docs/gp.md#lower-bound) rests on the concavity of F; :class:`StudentT` exists to be refused
with that reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import erf, log_ndtr

from stanvi.gp.quadrature import expected_log_sigmoid, expected_sigmoid

_LOG_2PI = math.log(2.0 * math.pi)


def _no_hyperparameters() -> dict:
    """θ of a likelihood without hyperparameters of its own."""
    return {}


def _finite(y) -> np.ndarray:
    y = np.asarray(y, dtype=float)
    if not np.all(np.isfinite(y)):
        raise ValueError(f"y has {int(np.sum(~np.isfinite(y)))} non-finite values")
    return y


@dataclass(frozen=True)
class Gaussian:
    """y ~ N(f, σ²); learnable noise variance σ² (``log_noise``), initial ``noise`` (default
    0.1, the variance, not the sd)."""

    noise: float = 0.1
    learn_noise: bool = True
    name: str = "gaussian"
    is_log_concave: bool = True
    task: str = "regression"

    def theta0(self) -> dict:
        return {"log_noise": jnp.asarray(math.log(self.noise))}

    def check_y(self, y: np.ndarray) -> np.ndarray:
        return _finite(y)

    @staticmethod
    def noise_var(theta: dict) -> jax.Array:
        return jnp.exp(theta["log_noise"])

    def init_noise_var(self, theta: dict) -> float:
        return float(np.exp(np.asarray(theta["log_noise"])))

    def expected_log_site(self, y, a, s, theta):
        """−½ log(2πσ²) − ((y − a)² + s²)/(2σ²) (docs/gp.md#site-functions)."""
        v = self.noise_var(theta)
        return -0.5 * (_LOG_2PI + jnp.log(v)) - ((y - a) ** 2 + s * s) / (2.0 * v)

    def log_predictive(self, y, mean, var_f, theta):
        v = var_f + self.noise_var(theta)
        return -0.5 * (_LOG_2PI + jnp.log(v)) - (y - mean) ** 2 / (2.0 * v)

    def sample(self, key, f, theta):
        return f + jnp.sqrt(self.noise_var(theta)) * jax.random.normal(key, f.shape)


@dataclass(frozen=True)
class Laplace:
    """y ~ Laplace(f, b) (robust regression); learnable scale b (``log_b``), initial ``b``."""

    b: float = 0.1
    name: str = "laplace"
    is_log_concave: bool = True
    task: str = "regression"

    def theta0(self) -> dict:
        return {"log_b": jnp.asarray(math.log(self.b))}

    def check_y(self, y):
        return _finite(y)

    def init_noise_var(self, theta: dict) -> float:
        """b², the curvature scale used for the Prop 1 initialisation (our choice)."""
        return float(np.exp(2.0 * np.asarray(theta["log_b"])))

    def expected_log_site(self, y, a, s, theta):
        """−log(2b) − [s√(2/π) e^{−δ²/(2s²)} + δ erf(δ/(s√2))]/b, δ = y − a
        (docs/gp.md#site-functions)."""
        b = jnp.exp(theta["log_b"])
        s = jnp.maximum(s, 1e-12)
        d = y - a
        e_abs = s * math.sqrt(2.0 / math.pi) * jnp.exp(-d * d / (2.0 * s * s)) + d * erf(
            d / (s * math.sqrt(2.0)))
        return -jnp.log(2.0 * b) - e_abs / b

    def log_predictive(self, y, mean, var_f, theta):
        """log p(y*) = v/(2b²) − log 4b + log[e^{−δ/b} erfc((v/b − δ)/√(2v)) + e^{δ/b}
        erfc((v/b + δ)/√(2v))], in log space with log_ndtr (docs/gp.md#prediction)."""
        b = jnp.exp(theta["log_b"])
        v = jnp.maximum(var_f, 1e-300)
        sd = jnp.sqrt(v)
        d = y - mean
        # erfc(x/√2) = 2 Φ(−x)
        t1 = -d / b + log_ndtr(-(v / b - d) / sd) + math.log(2.0)
        t2 = d / b + log_ndtr(-(v / b + d) / sd) + math.log(2.0)
        return v / (2.0 * b * b) - jnp.log(4.0 * b) + jnp.logaddexp(t1, t2)

    def sample(self, key, f, theta):
        return f + jnp.exp(theta["log_b"]) * jax.random.laplace(key, f.shape)


@dataclass(frozen=True)
class BernoulliLogit:
    """y ∈ {−1, +1} (0/1 accepted and mapped), p(y | f) = σ(y f).  ``nodes``: Gauss–Hermite
    nodes (docs/gp.md#site-functions: 32 by default, 101 in the paper's runs)."""

    nodes: int = 32
    name: str = "bernoulli_logit"
    is_log_concave: bool = True
    task: str = "classification"

    theta0 = staticmethod(_no_hyperparameters)

    def check_y(self, y):
        y = np.asarray(y, dtype=float)
        vals = set(np.unique(y).tolist())
        if vals <= {0.0, 1.0}:
            return 2.0 * y - 1.0
        if not vals <= {-1.0, 1.0}:
            raise ValueError(f"BernoulliLogit needs y in {{-1, +1}} (or {{0, 1}}), got values "
                             f"{sorted(vals)[:5]}")
        return y

    def init_noise_var(self, theta: dict) -> float:
        """4 = 1/max σ'' (the logistic curvature bound), for the Prop 1 initialisation."""
        return 4.0

    def expected_log_site(self, y, a, s, theta):
        return expected_log_sigmoid(y * a, s, self.nodes)

    def prob(self, mean, var_f):
        """p(y* = +1) = E σ(f), f ~ N(mean, var_f) (docs/gp.md#prediction)."""
        return expected_sigmoid(mean, jnp.sqrt(var_f), self.nodes)

    def log_predictive(self, y, mean, var_f, theta):
        return jnp.log(jnp.clip(expected_sigmoid(y * mean, jnp.sqrt(var_f), self.nodes),
                                1e-300, 1.0))

    def sample(self, key, f, theta):
        return jnp.where(jax.random.uniform(key, f.shape) < jax.nn.sigmoid(f), 1.0, -1.0)


@dataclass(frozen=True)
class StudentT:
    """Student-t noise.  Not log-concave: QSGP's lower bound (docs/gp.md#lower-bound) does not
    hold for it, so every QSGP fit refuses it (docs/gp.md#likelihoods)."""

    df: float = 4.0
    scale: float = 0.1
    name: str = "student_t"
    is_log_concave: bool = False
    task: str = "regression"
    theta0 = staticmethod(_no_hyperparameters)
    check_y = staticmethod(_finite)
