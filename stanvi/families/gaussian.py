"""Gaussian variational families in the unconstrained space (docs/algorithms.md#elbo).

A family is a small frozen (hashable) object whose methods are pure JAX functions of a flat
parameter vector λ, so that estimators can be ``jax.jit``-compiled with the family as a static
argument.  Sampling is reparameterized: ``z = g(λ, ε)`` with ``ε ~ N(0, I_D)``.

* :class:`MeanField`: λ = (μ, ω), σ = exp(ω), z = μ + σ ⊙ ε (docs/algorithms.md#meanfield).
* :class:`FullRank`: λ = (μ, vech(L)), z = μ + L ε with L lower triangular
  (docs/algorithms.md#fullrank).
  ``diagonal="stan"`` keeps Stan's parameterization (the diagonal is unconstrained and may be
  negative; entropy uses log|L_dd|); ``diagonal="log"`` stores ω with L_dd = exp(ω_d), which keeps
  the scale positive and the entropy linear (the variant stanvi uses for TrustVI and HFSGVI).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from stanvi.families.fullrank_rows import FullRankRows
from stanvi.families.host_math import FullRankHostMath, MeanFieldHostMath, tril_indices
from stanvi.families.protocol import GaussianDefaults
from stanvi.lazy_jax import jax, jnp

LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class MeanField(MeanFieldHostMath, GaussianDefaults):
    """Mean-field Gaussian N(μ, diag(exp(2ω))); λ = concat(μ, ω), length 2D."""

    dim: int
    name: str = "meanfield"

    @property
    def n_params(self) -> int:
        return 2 * self.dim

    @property
    def stan_name(self) -> str:
        """Stan's name of this family (its ADVI's ``normal_meanfield``)."""
        return "normal_meanfield"

    @property
    def min_curvature_draws(self) -> int:
        """The fewest base draws whose sampled ELBO Hessian can be nonsingular: one (every draw
        gives every coordinate its curvature)."""
        return 1

    @property
    def vector_scale(self) -> bool:
        """q's scale is a vector, one number per coordinate (the joint control variate can
        keep one per term, docs/jointcv.md#full-rank)."""
        return True

    def initial_params(self, mu0: np.ndarray, log_scale0: float = 0.0) -> np.ndarray:
        """λ₀ = (μ₀, ω₀·1): Stan ADVI uses ω₀ = 0 (docs/algorithms.md#advi-init), the TrustVI
        authors' code ω₀ = −1 (#trustvi-constants)."""
        return np.concatenate([np.asarray(mu0, dtype=float), np.full(self.dim, float(log_scale0))])

    def split(self, params: jax.Array) -> tuple[jax.Array, jax.Array]:
        return params[: self.dim], params[self.dim:]

    def sample(self, params: jax.Array, eps: jax.Array) -> jax.Array:
        """z = μ + exp(ω) ⊙ ε for each row of ``eps`` (n, D)."""
        mu, omega = self.split(params)
        return mu + jnp.exp(omega) * eps

    def entropy(self, params: jax.Array) -> jax.Array:
        """H(q) = D/2 (1 + log 2π) + Σ ω (docs/algorithms.md#meanfield)."""
        _, omega = self.split(params)
        return 0.5 * self.dim * (1.0 + LOG_2PI) + jnp.sum(omega)

    def log_q(self, params: jax.Array, z: jax.Array) -> jax.Array:
        """log q(z) for each row of z (n, D), normalized."""
        mu, omega = self.split(params)
        e = (z - mu) * jnp.exp(-omega)
        return -0.5 * jnp.sum(e * e, axis=-1) - jnp.sum(omega) - 0.5 * self.dim * LOG_2PI

    def mean(self, params: jax.Array) -> jax.Array:
        return self.split(params)[0]

    def covariance(self, params: jax.Array) -> jax.Array:
        return jnp.diag(jnp.exp(2.0 * self.split(params)[1]))

    def marginal_sd(self, params: np.ndarray) -> np.ndarray:
        """exp(ω), in NumPy: it is called on the host, outside compiled programs (an eager JAX
        operation is one more program to trace and load in a new process, issue 8 part 3)."""
        return np.exp(np.asarray(params, dtype=float)[self.dim:])

    def params_from_precision(self, mu: np.ndarray, precision: np.ndarray,
                              log_scale0: float) -> np.ndarray:
        """λ for N(μ, diag(1/Λ_ii)) — the mean-field optimum when p is Gaussian with precision Λ
        (Bishop 2006, §10.1.2) — with ω_i = ``log_scale0`` where Λ_ii is not positive."""
        d = np.diagonal(np.asarray(precision, dtype=float))
        ok = np.isfinite(d) & (d > 0)
        omega = np.where(ok, -0.5 * np.log(np.where(ok, d, 1.0)), float(log_scale0))
        return np.concatenate([np.asarray(mu, dtype=float), omega])

    def metric_scale(self, params: np.ndarray) -> np.ndarray:
        """Square roots of the diagonal of q's Fisher information in λ = (μ, ω):
        ``(1/σ, √2)`` (for N(μ, σ²), I_μμ = 1/σ², I_ωω = 2).  A trust region
        ``‖scale ⊙ s‖ ≤ δ`` then bounds the KL divergence of a step by about δ²/2 and measures a
        move of the mean in units of q's sd, whatever the units of the model's parameters
        (Amari 1998, natural gradient; Conn, Gould & Toint 2000, §6.7, scaled trust regions)."""
        omega = np.asarray(params, dtype=float)[self.dim:]
        return np.concatenate([np.exp(-omega), np.full(self.dim, math.sqrt(2.0))])


@dataclass(frozen=True)
class FullRank(FullRankHostMath, GaussianDefaults):
    """Full-rank Gaussian N(μ, L Lᵀ); λ = concat(μ, the lower triangle of L row by row)."""

    dim: int
    diagonal: str = "stan"
    name: str = "fullrank"

    @property
    def stan_name(self) -> str:
        """Stan's name of this family (its ADVI's ``normal_fullrank``; Stan stores L itself,
        the ``"stan"`` diagonal)."""
        return "normal_fullrank"

    @property
    def min_curvature_draws(self) -> int:
        """The fewest base draws whose sampled ELBO Hessian can be nonsingular: 2(D + 1).  With
        m draws the sampled Hessian of a row of L is a sum of m terms ε εᵀ, of rank ≤ m: for
        m ≤ D it is singular (docs/algorithms.md#fullrank)."""
        return 2 * (self.dim + 1)

    @property
    def vector_scale(self) -> bool:
        """q's scale is a matrix L, not a vector (docs/jointcv.md#full-rank)."""
        return False

    def __post_init__(self) -> None:
        if self.diagonal not in ("stan", "log"):
            raise ValueError(f"diagonal must be 'stan' or 'log', got {self.diagonal!r}")

    @property
    def n_params(self) -> int:
        return self.dim + self.dim * (self.dim + 1) // 2

    def _tril(self) -> tuple[np.ndarray, np.ndarray]:
        return tril_indices(self.dim)   # cached: a fit asks thousands of times

    def initial_params(self, mu0: np.ndarray, log_scale0: float = 0.0) -> np.ndarray:
        """λ₀ = (μ₀, L₀ = exp(ω₀) I); Stan ADVI starts full-rank from L₀ = I
        (docs/algorithms.md#advi-init)."""
        rows, cols = self._tril()
        diag = rows == cols
        vech = np.zeros(len(rows))
        vech[diag] = float(log_scale0) if self.diagonal == "log" else math.exp(log_scale0)
        return np.concatenate([np.asarray(mu0, dtype=float), vech])

    def cholesky(self, params: jax.Array) -> jax.Array:
        """The lower-triangular factor L (D, D).

        Entry (i, j ≤ i) is ``params[D + i(i+1)/2 + j]``; the index grid is computed in the
        program from ``iota`` (no D²-sized index constants baked into compiled programs: at
        D = 2,000 two int64 index arrays of D(D+1)/2 entries are 32 MB and slow XLA's
        compilation, issue 17 item 6)."""
        i, j, lower = tril_grid(self.dim)
        vech = params[self.dim:]
        raw = jnp.where(lower, vech[jnp.where(lower, i * (i + 1) // 2 + j, 0)], 0.0)
        if self.diagonal == "log":
            raw = jnp.where(i == j, jnp.exp(raw), raw)
        return raw

    def diagonal_index(self) -> jax.Array:
        """Positions of L's diagonal within the vech part of λ: ``d(d+3)/2`` for d = 0..D−1."""
        d = jnp.arange(self.dim)
        return d * (d + 3) // 2

    def sample(self, params: jax.Array, eps: jax.Array) -> jax.Array:
        return params[: self.dim] + eps @ self.cholesky(params).T

    def _log_abs_diag(self, params: jax.Array) -> jax.Array:
        d = params[self.dim:][self.diagonal_index()]
        if self.diagonal == "log":
            return d
        # Stan skips exact zeros on the diagonal in the entropy (normal_fullrank::entropy).
        return jnp.where(d == 0.0, 0.0, jnp.log(jnp.abs(jnp.where(d == 0.0, 1.0, d))))

    def entropy(self, params: jax.Array) -> jax.Array:
        """H(q) = D/2 (1 + log 2π) + Σ log|L_dd| (docs/algorithms.md#fullrank)."""
        return 0.5 * self.dim * (1.0 + LOG_2PI) + jnp.sum(self._log_abs_diag(params))

    def log_q(self, params: jax.Array, z: jax.Array) -> jax.Array:
        L = self.cholesky(params)
        diff = (z - params[: self.dim]).T
        e = jax.scipy.linalg.solve_triangular(L, diff, lower=True).T
        return (-0.5 * jnp.sum(e * e, axis=-1) - jnp.sum(self._log_abs_diag(params))
                - 0.5 * self.dim * LOG_2PI)

    def mean(self, params: jax.Array) -> jax.Array:
        return params[: self.dim]

    def covariance(self, params: jax.Array) -> jax.Array:
        L = self.cholesky(params)
        return L @ L.T

    def lower_factor(self, params: np.ndarray) -> np.ndarray:
        """L (D, D) as :meth:`cholesky` builds it, in NumPy, for use on the host outside
        compiled programs: calling :meth:`cholesky` on an array runs about a dozen eager JAX
        operations, each a program to trace, lower and load in a new process (~0.3 s of a first
        full-rank fit, issue 8 part 3).  With ``diagonal="stan"`` the entries are λ's exactly;
        with ``"log"`` the diagonal is NumPy's exp(ω), which may differ from XLA's in the last
        bit."""
        params = np.asarray(params, dtype=float)
        rows, cols = self._tril()
        lower = np.zeros((self.dim, self.dim))
        lower[rows, cols] = params[self.dim:self.dim + rows.size]
        if self.diagonal == "log":
            d = np.arange(self.dim)
            lower[d, d] = np.exp(lower[d, d])
        return lower

    def marginal_sd(self, params: np.ndarray) -> np.ndarray:
        """sqrt(diag(L Lᵀ)), in NumPy (:meth:`lower_factor`)."""
        lower = self.lower_factor(params)
        return np.sqrt(np.sum(lower * lower, axis=1))

    def params_from_precision(self, mu: np.ndarray, precision: np.ndarray,
                              log_scale0: float) -> np.ndarray:
        """λ for N(μ, Λ⁻¹) (L = chol(Λ⁻¹)) when the precision Λ is positive definite; otherwise
        the mean-field rule (diagonal L with 1/√Λ_ii, ``exp(log_scale0)`` where Λ_ii ≤ 0)."""
        prec = 0.5 * (np.asarray(precision, dtype=float) + np.asarray(precision, dtype=float).T)
        rows, cols = self._tril()
        try:
            L = np.linalg.cholesky(np.linalg.inv(prec))
            if not np.all(np.isfinite(L)):
                raise np.linalg.LinAlgError("non-finite factor")
        except np.linalg.LinAlgError:
            d = np.diagonal(prec)
            ok = np.isfinite(d) & (d > 0)
            L = np.diag(np.where(ok, 1.0 / np.sqrt(np.where(ok, d, 1.0)), math.exp(log_scale0)))
        vech = L[rows, cols].copy()
        if self.diagonal == "log":
            vech[rows == cols] = np.log(vech[rows == cols])
        return np.concatenate([np.asarray(mu, dtype=float), vech])

    def params_from_moments(self, mu: np.ndarray, cov: np.ndarray) -> np.ndarray:
        """λ for N(μ, Σ) with L = chol(Σ) (Σ symmetrized first); raises
        ``np.linalg.LinAlgError`` when Σ is not positive definite.  The family's answer to a
        method that updates (μ, Σ) in closed form (methods bam and gsm, docs/methods.md#bam)."""
        cov = np.asarray(cov, dtype=float)
        L = np.linalg.cholesky(0.5 * (cov + cov.T))
        if not np.all(np.isfinite(L)):
            raise np.linalg.LinAlgError("non-finite Cholesky factor")
        rows, cols = self._tril()
        vech = L[rows, cols].copy()
        if self.diagonal == "log":
            vech[rows == cols] = np.log(vech[rows == cols])
        return np.concatenate([np.asarray(mu, dtype=float), vech])

    def inner_meanfield(self) -> MeanField:
        """The mean-field family of the same dimension: λ_mf = (μ, ω) is the member
        :meth:`from_meanfield` maps to, with the same q and ELBO (docs/algorithms.md#second-start)."""
        return MeanField(self.dim)

    def meanfield_member(self, params: np.ndarray) -> np.ndarray:
        """The mean-field λ = (μ, ω) nearest q in KL(q_mf ‖ q): the same mean and the
        conditional variances 1/Λ_ii, Λ = (L Lᵀ)⁻¹ (Bishop 2006, §10.1.2), Λ_ii the squared
        norm of column i of L⁻¹ (a triangular solve: no inverse of L Lᵀ is formed)."""
        from scipy.linalg import solve_triangular  # noqa: PLC0415

        lower = self.lower_factor(params)
        inv = solve_triangular(lower, np.eye(self.dim), lower=True)
        prec = np.sum(inv * inv, axis=0)
        ok = np.isfinite(prec) & (prec > 0)
        omega = np.where(ok, -0.5 * np.log(np.where(ok, prec, 1.0)), 0.0)
        return np.concatenate([np.asarray(params, dtype=float)[:self.dim], omega])

    def from_meanfield(self, params: np.ndarray) -> np.ndarray:
        """λ of N(μ, diag(exp(2ω))) from the mean-field λ = (μ, ω): L = diag(exp(ω))."""
        p = np.asarray(params, dtype=float)
        rows, cols = self._tril()
        diag = rows == cols
        vech = np.zeros(len(rows))
        omega = p[self.dim:]
        vech[diag] = omega if self.diagonal == "log" else np.exp(omega)
        return np.concatenate([p[:self.dim], vech])

    def factored_rows(self, params: np.ndarray, g: np.ndarray, eps: np.ndarray,
                      entropy_grad: np.ndarray) -> FullRankRows:
        """The per-draw ELBO gradients (n, P) in factored form, O(nD) memory
        (:class:`~stanvi.families.fullrank_rows.FullRankRows`; docs/algorithms.md#fullrank)."""
        return FullRankRows(self, params, g, eps, entropy_grad)

    def metric_scale(self, params: np.ndarray) -> np.ndarray:
        """A diagonal, per-coordinate scale-invariant stand-in for q's Fisher information (see
        :meth:`MeanField.metric_scale`): with ``s_i`` the sd of coordinate i under q (row norm
        of L), ``1/s_i`` for μ_i and for the off-diagonal entries of row i of L, and for the
        diagonal ``√2`` (log parameterization: ω_i = log L_ii) or ``√2/|L_ii|`` (Stan's).
        Rescaling a model coordinate by c rescales μ_i, row i of L and s_i alike, so steps
        measured in this norm do not depend on the model's units."""
        p = np.asarray(params, dtype=float)
        rows, cols = self._tril()
        vech = p[self.dim:].copy()
        diag = rows == cols
        if self.diagonal == "log":
            vech[diag] = np.exp(vech[diag])
        L = np.zeros((self.dim, self.dim))
        L[rows, cols] = vech
        sd = np.sqrt(np.sum(L * L, axis=1))
        sd = np.where(sd > 0, sd, 1.0)
        tri = 1.0 / sd[rows]
        if self.diagonal == "log":
            tri[diag] = math.sqrt(2.0)
        else:
            d = np.abs(vech[diag])
            tri[diag] = math.sqrt(2.0) / np.where(d > 0, d, sd)
        return np.concatenate([1.0 / sd, tri])


def tril_grid(dim: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Row and column index grids (D, D) and the lower-triangle mask, from ``iota``."""
    i = jax.lax.broadcasted_iota(jnp.int64, (dim, dim), 0)
    j = jax.lax.broadcasted_iota(jnp.int64, (dim, dim), 1)
    return i, j, j <= i


FAMILIES = {"meanfield": MeanField, "fullrank": FullRank}


def make_family(name: str, dim: int, **kwargs) -> MeanField | FullRank:
    """A family by name ('meanfield', 'fullrank', 'mixture': stanvi.families.mixture, or
    'lowrank': stanvi.families.lowrank)."""
    try:
        cls = FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown family {name!r}; choose one of {sorted(FAMILIES)}") from None
    return cls(dim, **kwargs)
