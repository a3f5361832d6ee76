"""Basis families (kernel approximations) of the weight-space model f(x) = Σ_i w_i φ_i(x),
w ~ N(0, S⁻¹) (docs/gp.md#bases and docs/gp.md#basis-protocol).

A basis evaluates any block of Φ (rows = inputs, columns = basis indices) and of the prior
precision S at a cost that depends only on the block's size, never on n or m: that is what lets
the QSGP estimator (:mod:`stanvi.gp.estimators`) run in O(1) per step.

Every basis takes its large arrays (the inducing inputs Z) as an explicit ``arrays`` argument,
so that jit-compiled steps receive them as arguments, not as constants baked into the program.
Column index ``m`` (one past the end) is the padding index of ``jnp.unique(..., fill_value=m)``:
every method returns finite values for it, and callers mask it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

from jax.scipy.special import ndtr

from stanvi.gp.kernels import SquaredExponential


@dataclass(frozen=True)
class RandomFourierFeatures:
    """Random Fourier features for the SE kernel (docs/gp.md#bases, stanvi's scaling):
    φ_i(x) = √(2/m) cos(ω_iᵀx + b_i), ω_i = ε_i/ℓ, ε_i ~ N(0, I_d), b_i ~ U[0, 2π), S = I/s_f².

    ε_i and b_i are regenerated from ``seed`` by ``fold_in(key, i)`` (docs/gp.md#jax-rules), so
    m = 10⁷ features need no m × d array.  Hyperparameters (ℓ, s_f²) are learnable.
    """

    m: int
    kernel: SquaredExponential = field(default_factory=SquaredExponential)
    seed: int = 0
    name: str = "rff"
    is_diagonal: bool = True
    per_basis_precision: bool = False
    learnable: bool = True

    def __post_init__(self) -> None:
        if int(self.m) < 1:
            raise ValueError(f"RandomFourierFeatures needs m >= 1, got {self.m}")

    @property
    def num_features(self) -> int:
        return int(self.m)

    def arrays(self, X: np.ndarray) -> dict:
        """No large arrays; an empty (0, d) array carries the input dimension d statically."""
        return {"shape_d": jnp.zeros((0, int(np.asarray(X).shape[1])))}

    def theta0(self, d: int) -> dict:
        return self.kernel.theta0(d)

    def columns(self, arrays: dict, cols: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(ε_cols (c, d), b_cols (c,)), regenerated from the seed: one threefry draw per
        column, z ~ N(0, I_{d+1}) from ``fold_in(key, i)``, ε = z[:d], b = 2π Φ_N(z[d])."""
        key = jax.random.PRNGKey(self.seed)
        d = arrays["shape_d"].shape[1]

        def one(c):
            z = jax.random.normal(jax.random.fold_in(key, c), (d + 1,))
            return z[:d], 2.0 * math.pi * ndtr(z[d])

        return jax.vmap(one)(cols)

    def features_at(self, coldata, X: jax.Array, theta: dict) -> jax.Array:
        """Φ[rows of X, columns whose data are ``coldata``]."""
        eps, b = coldata
        omega = eps / jnp.exp(theta["log_ell"])
        return math.sqrt(2.0 / self.m) * jnp.cos(X @ omega.T + b)

    def features(self, arrays: dict, X: jax.Array, cols: jax.Array, theta: dict) -> jax.Array:
        """Φ[rows of X, cols], shape (len(X), len(cols))."""
        return self.features_at(self.columns(arrays, cols), X, theta)

    def diag_precision(self, cols: jax.Array, theta: dict, log_s: jax.Array | None = None):
        """s_i = 1/s_f² for each column."""
        return jnp.broadcast_to(jnp.exp(-theta["log_sf2"]), cols.shape)

    def precision_diag(self, arrays: dict, cols, theta: dict, log_s=None):
        """S_ii for each column."""
        return self.diag_precision(cols, theta, log_s)

    def logdet_precision(self, theta: dict):
        """log|S| = −m log s_f² in closed form."""
        return -float(self.m) * theta["log_sf2"]

    def init_diag_sd(self, n: int, noise_var: float, theta: dict, arrays: dict,
                     X: np.ndarray) -> jax.Array:
        """Prop 1 initial c_rr with ‖φ_r‖² ≈ n/m (docs/gp.md#diag-init): same for all r."""
        s = float(np.exp(-np.asarray(theta["log_sf2"])))
        return jnp.full((self.m,), (n / (self.m * noise_var) + s) ** -0.5)


@dataclass(frozen=True)
class _KernelColumns:
    """Shared part of the bases whose columns are kernel functions at inputs Z: Φ = K(X, Z)."""

    kernel: SquaredExponential = field(default_factory=SquaredExponential)
    Z: np.ndarray | None = field(default=None, repr=False, compare=False, hash=False)

    def arrays(self, X: np.ndarray) -> dict:
        Z = np.asarray(X if self.Z is None else self.Z, dtype=float)
        if Z.ndim != 2 or Z.shape[1] != np.asarray(X).shape[1]:
            raise ValueError(f"inducing inputs Z must have shape (m, {np.asarray(X).shape[1]}), "
                             f"got {Z.shape}")
        return {"Z": jnp.asarray(Z)}

    def count(self, X: np.ndarray) -> int:
        return int((np.asarray(X) if self.Z is None else np.asarray(self.Z)).shape[0])

    def theta0(self, d: int) -> dict:
        return self.kernel.theta0(d)

    def columns(self, arrays: dict, cols: jax.Array) -> jax.Array:
        return arrays["Z"].at[cols].get(mode="clip")

    def features_at(self, coldata, X: jax.Array, theta: dict) -> jax.Array:
        return self.kernel.cross(X, coldata, theta)

    def features(self, arrays: dict, X: jax.Array, cols: jax.Array, theta: dict) -> jax.Array:
        return self.features_at(self.columns(arrays, cols), X, theta)

    def _init_norms(self, n: int, arrays: dict, X: np.ndarray, theta: dict,
                    rows: int = 1000, chunk: int = 4096) -> np.ndarray:
        """‖φ_r‖² estimated from one batch of ``rows`` random rows (docs/gp.md#diag-init)."""
        rng = np.random.default_rng(0)
        idx = rng.integers(0, n, size=min(rows, n)) if n > rows else np.arange(n)
        Xb = jnp.asarray(np.asarray(X)[idx])
        m = arrays["Z"].shape[0]
        out = np.empty(m)
        f = jax.jit(lambda c: jnp.sum(self.features(arrays, Xb, c, theta) ** 2, axis=0))
        for s in range(0, m, chunk):
            cols = np.arange(s, s + chunk)
            vals = np.asarray(f(jnp.asarray(np.minimum(cols, m - 1))))
            out[s:min(s + chunk, m)] = vals[: min(chunk, m - s)]
        return out * (n / len(idx))


@dataclass(frozen=True)
class InducingPoints(_KernelColumns):
    """Inducing points at Z (default Z = X, m = n): Φ = K(X, Z), S = K(Z, Z) + jitter·s_f²·I
    (docs/gp.md#bases; the paper's Table 3).  Dense S; hyperparameters are fixed (no empirical
    Bayes).  With Z = X the prior of f is the exact GP prior."""

    jitter: float = 1e-6
    name: str = "inducing"
    is_diagonal: bool = False
    per_basis_precision: bool = False
    learnable: bool = False

    def prior_precision(self, arrays: dict, ca: jax.Array, cb: jax.Array, theta: dict):
        """S[ca, cb] (dense block)."""
        Z = arrays["Z"]
        K = self.kernel.cross(Z.at[ca].get(mode="clip"), Z.at[cb].get(mode="clip"), theta)
        eye = (ca[:, None] == cb[None, :]).astype(K.dtype)
        return K + self.jitter * jnp.exp(theta["log_sf2"]) * eye

    def precision_diag(self, arrays: dict, cols, theta: dict, log_s=None):
        """S_ii = s_f² (1 + jitter) (SE kernel: k(z, z) = s_f²)."""
        return jnp.broadcast_to(jnp.exp(theta["log_sf2"]) * (1.0 + self.jitter), cols.shape)

    def logdet_precision_exact(self, arrays: dict, theta: dict, limit: int = 6000):
        """log|S| by Cholesky when m <= ``limit`` (a constant: hyperparameters are fixed),
        else None (the ELBO is then reported without this constant)."""
        m = arrays["Z"].shape[0]
        if m > limit:
            return None
        cols = jnp.arange(m)
        S = self.prior_precision(arrays, cols, cols, theta)
        return float(2.0 * jnp.sum(jnp.log(jnp.diag(jnp.linalg.cholesky(S)))))

    def init_diag_sd(self, n, noise_var, theta, arrays, X):
        norms = self._init_norms(n, arrays, X, theta)
        s = float(np.exp(np.asarray(theta["log_sf2"]))) * (1.0 + self.jitter)
        return jnp.asarray((norms / noise_var + s) ** -0.5)


@dataclass(frozen=True)
class RVM(_KernelColumns):
    """Relevance vector machine (QSRVM, docs/gp.md#bases): Φ = K(X, Z) (Z = X by default),
    S = diag(s) with one learned precision s_i > 0 per basis function (stored as log s_i, given
    sparse AdaGrad updates: docs/gp.md#jax-rules).  Relevance vectors are the bases with
    s_i < 1e4 (docs/gp.md#prediction)."""

    s0: float = 1.0
    name: str = "rvm"
    is_diagonal: bool = True
    per_basis_precision: bool = True
    learnable: bool = True

    def diag_precision(self, cols: jax.Array, theta: dict, log_s: jax.Array | None = None):
        return jnp.exp(log_s)

    def precision_diag(self, arrays: dict, cols, theta: dict, log_s=None):
        return jnp.exp(log_s)

    def logdet_precision(self, theta: dict):
        return None   # estimated by Prop 2 from the sampled columns

    def init_diag_sd(self, n, noise_var, theta, arrays, X):
        norms = self._init_norms(n, arrays, X, theta)
        return jnp.asarray((norms / noise_var + self.s0) ** -0.5)
