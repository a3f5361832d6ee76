"""The diagonal-plus-low-rank Gaussian family (docs/algorithms.md#lowrank):

    q_λ = N(μ, diag(d²) + B Bᵀ),   d = e^ω,   B of shape D × k,

λ = (μ (D), ω (D), vec B row by row (D k)), P = D(k + 2) parameters.  Sampling is
reparameterized with base draws of width D + k (``base_dim``): z = μ + d ⊙ ε₁ + B ε₂,
ε = (ε₁, ε₂) ~ N(0, I_{D+k}), so z − μ has covariance diag(d²) + BBᵀ exactly.  log q uses the
Woodbury identity and the entropy the matrix determinant lemma (with W = diag(d)⁻¹B,
C = I_k + WᵀW):

    log det Σ = 2 Σ ω + log det C,    H(q) = D/2 (1 + log 2π) + Σ ω + ½ log det C.

B is kept lower trapezoidal (B_ij = 0 for j > i, the entries above the diagonal are stored and
ignored): the same family (every B = LQ with L lower trapezoidal), without the k(k − 1)/2 flat
directions B ↦ BR along which the ELBO does not change and its Hessian is singular
(:mod:`stanvi.families.lowrank_host`).

Every piece is O(D k²) time and O(D k) memory per draw; only :meth:`LowRank.covariance` (for
tests and small D) forms the D × D matrix.  The NumPy pieces the host path and the methods use
are in :mod:`stanvi.families.lowrank_host`.

The default rank is :func:`default_rank` (min(10, max(1, ⌊D/2⌋))); B starts at a small fixed
pseudo-random matrix (:meth:`LowRank.initial_factor`), because B = 0 is a stationary point of
the ELBO in B (the gradient there, E[g ε₂ᵀ] + Σ⁻¹B, is zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from stanvi.families.lowrank_host import LowRankHostMath, lower_trapezoidal, trapezoid_mask
from stanvi.families.lowrank_start import gaussian_deficit, reverse_kl_params
from stanvi.families.protocol import GaussianDefaults
from stanvi.lazy_jax import jax, jnp

LOG_2PI = math.log(2.0 * math.pi)
#: The largest rank :func:`default_rank` chooses.
DEFAULT_MAX_RANK = 10
#: B₀ = INIT_FACTOR · e^{ω₀} · R/√k with R a fixed standard-normal matrix: q₀'s marginal variances
#: exceed e^{2ω₀} by about INIT_FACTOR² (1 %).
INIT_FACTOR = 0.1
#: The Laplace warm start forms the D × D precision only up to this dimension
#: (:meth:`LowRank.params_from_precision`); above it, q₀ is centred at the mode with the default
#: scales (docs/algorithms.md#lowrank).
DENSE_PRECISION_MAX_DIM = 2000


def default_rank(dim: int) -> int:
    """The rank when none is given: min(10, max(1, ⌊D/2⌋)) (docs/algorithms.md#lowrank); up to
    D = 100 a fit from the Laplace start chooses one at most this
    (:mod:`stanvi.families.lowrank_rank`)."""
    return int(min(DEFAULT_MAX_RANK, max(1, int(dim) // 2)))


@dataclass(frozen=True)
class LowRank(LowRankHostMath, GaussianDefaults):
    """Gaussian N(μ, diag(e^{2ω}) + B Bᵀ) with B of shape (dim, rank) (module docstring)."""

    dim: int
    rank: int | None = None
    name: str = "lowrank"
    #: how the Laplace start fits the family to N(mode, H⁻¹): "reverse_kl" (default: the member
    #: nearest it in KL(q ‖ ·), :mod:`stanvi.families.lowrank_start`, with the PPCA start as
    #: TrustVI's fallback when its run ends uncertified) or "ppca" (probabilistic PCA of H⁻¹,
    #: :meth:`params_from_covariance`, alone); docs/algorithms.md#lowrank-start
    laplace_fit: str = "reverse_kl"
    # poor trust-region steps here come from (d, B)'s non-concave, nearly flat directions (at
    # rank ~D/2 the family has as many parameters as full rank), which HVPs do not cure and
    # pay for with n·k model evaluations per product (docs/algorithms.md#lowrank)
    stein_model_gives_way: ClassVar[bool] = False

    def __post_init__(self) -> None:
        rank = default_rank(self.dim) if self.rank is None else self.rank
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
            raise ValueError(f"lowrank: rank must be a positive integer, got {self.rank!r}")
        if rank > self.dim:
            raise ValueError(f"lowrank: rank {rank} exceeds the dimension {self.dim} (use "
                             f"family='fullrank')")
        object.__setattr__(self, "rank", int(rank))
        if self.laplace_fit not in ("ppca", "reverse_kl"):
            raise ValueError(f"lowrank: laplace_fit must be 'ppca' or 'reverse_kl', got "
                             f"{self.laplace_fit!r}")

    # ------------------------------------------------------------------ protocol
    @property
    def n_params(self) -> int:
        return self.dim * (self.rank + 2)

    @property
    def base_dim(self) -> int:
        """Width of a base draw ε = (ε₁, ε₂): D + k."""
        return self.dim + self.rank

    @property
    def min_curvature_draws(self) -> int:
        """Draws for a nonsingular sampled Hessian: a row of B has Hessian Σ_j ε₂ⱼ ε₂ⱼᵀ (k × k),
        singular for fewer than k draws; 2(k + 1), as the full-rank family's 2(D + 1)."""
        return 2 * (self.rank + 1)

    @property
    def vector_scale(self) -> bool:
        """q's scale is not one number per coordinate (docs/jointcv.md#full-rank)."""
        return False

    def family_options(self) -> dict[str, Any]:
        """``{"rank": k}`` (and ``laplace_fit`` when not the default): a saved fit rebuilds the
        same family."""
        return {"rank": self.rank, **({"laplace_fit": self.laplace_fit}
                                      if self.laplace_fit != "reverse_kl" else {})}

    def log_g_offset(self, params) -> float:
        """D/2 log 2π: Stan's ``log_g__`` as log q without the N(0, I) constant (the map
        ε ↦ z is not square, so −½‖ε‖² is not log q up to a constant)."""
        return 0.5 * self.dim * LOG_2PI

    def log_scale_index(self) -> np.ndarray:
        """Positions of ω in λ (MLMCVI's scale-collapse check)."""
        return np.arange(self.dim, 2 * self.dim)

    # ------------------------------------------------------------------ initialization
    def initial_factor(self, log_scale0: float) -> np.ndarray:
        """B₀ (D, k) = INIT_FACTOR · e^{log_scale0} · R/√k, R standard normal from NumPy's
        generator with seed 0 (the start depends on D, k and log_scale0 only)."""
        R = np.random.default_rng(0).standard_normal((self.dim, self.rank))
        R = R * trapezoid_mask(self.dim, self.rank)
        return INIT_FACTOR * math.exp(float(log_scale0)) * R / math.sqrt(self.rank)

    def pack(self, mu: np.ndarray, omega: np.ndarray, B: np.ndarray) -> np.ndarray:
        """λ = (μ, ω, vec B row by row), with d = e^ω: the layout the NumPy pieces read back."""
        return np.concatenate([np.asarray(mu, dtype=float), np.asarray(omega, dtype=float),
                               np.asarray(B, dtype=float).ravel()])

    def initial_params(self, mu0: np.ndarray, log_scale0: float = 0.0) -> np.ndarray:
        """λ₀ = (μ₀, ω₀·1, vec B₀) (:meth:`initial_factor`)."""
        return self.pack(mu0, np.full(self.dim, float(log_scale0)),
                         self.initial_factor(log_scale0))

    def diagonal_params(self, mu: np.ndarray, log_sd: np.ndarray) -> np.ndarray:
        """λ of N(μ, diag(e^{2 log_sd})) plus the small B₀ of :meth:`initial_factor` at the
        median log sd (B = 0 is a stationary point of the ELBO in B)."""
        log_sd = np.asarray(log_sd, dtype=float)
        return self.pack(mu, log_sd, self.initial_factor(float(np.median(log_sd))))

    def params_from_covariance(self, mu: np.ndarray, cov: np.ndarray) -> np.ndarray:
        """λ of a diagonal-plus-rank-k fit of a dense covariance (small D): B from its top k
        eigenpairs, U_k (Λ_k − s I)^{1/2} with s the mean of the other eigenvalues (probabilistic
        PCA, Tipping & Bishop 1999, Eq. 15; Pathfinder's factored inverse Hessian is of the same
        form), and d² = diag(Σ) − rowsum(B²), floored at 1e-3 diag(Σ), so the marginal variances
        are Σ's."""
        cov = 0.5 * (np.asarray(cov, dtype=float) + np.asarray(cov, dtype=float).T)
        vals, vecs = np.linalg.eigh(cov)
        order = np.argsort(vals)[::-1]
        vals, vecs = vals[order], vecs[:, order]
        k = self.rank
        rest = vals[k:]
        s = float(rest.mean()) if rest.size else 0.0
        B = vecs[:, :k] * np.sqrt(np.maximum(vals[:k] - max(s, 0.0), 0.0))
        B = lower_trapezoidal(B)
        var = np.diagonal(cov)
        d2 = np.maximum(var - np.sum(B * B, axis=1), 1e-3 * var)
        return self.pack(mu, 0.5 * np.log(d2), B)

    def params_from_precision(self, mu: np.ndarray, precision: np.ndarray,
                              log_scale0: float) -> np.ndarray:
        """The Laplace start's λ from the precision Λ at the mode (D ≤
        ``DENSE_PRECISION_MAX_DIM``): :meth:`params_from_covariance` of Λ⁻¹ when Λ is positive
        definite, moved to the reverse-KL fit with ``laplace_fit="reverse_kl"``, else the
        mean-field rule d = 1/√Λ_ii (``exp(log_scale0)`` where Λ_ii ≤ 0) with the default B₀
        (the first of :meth:`laplace_starts`)."""
        return self.laplace_starts(mu, precision, log_scale0)[0]

    def laplace_starts(self, mu: np.ndarray, precision: np.ndarray, log_scale0: float
                       ) -> tuple[np.ndarray, np.ndarray | None]:
        """(the Laplace start, its fallback): with ``laplace_fit="reverse_kl"`` and a positive
        definite Λ, (the reverse-KL fit, the PPCA fit it started from) — TrustVI runs from the
        PPCA fit when the run from the reverse-KL one ends uncertified, at a stationary point
        of the non-concave (ω, B) landscape below the one the PPCA start reaches
        (docs/algorithms.md#lowrank-start); else (the start, None).  One PPCA fit serves both."""
        prec = 0.5 * (np.asarray(precision, dtype=float) + np.asarray(precision, dtype=float).T)
        try:
            np.linalg.cholesky(prec)
            cov = np.linalg.inv(prec)
            if np.all(np.isfinite(cov)):
                out = self.params_from_covariance(mu, cov)
                if np.all(np.isfinite(out)):
                    if self.laplace_fit != "reverse_kl":
                        return out, None
                    start = reverse_kl_params(self, mu, prec, out)
                    return start, (out if not np.array_equal(start, out) else None)
        except np.linalg.LinAlgError:
            pass
        diag = np.diagonal(prec)
        ok = np.isfinite(diag) & (diag > 0)
        omega = np.where(ok, -0.5 * np.log(np.where(ok, diag, 1.0)), float(log_scale0))
        return self.pack(mu, omega, self.initial_factor(float(np.median(omega)))), None

    def laplace_deficit(self, params: np.ndarray, precision: np.ndarray) -> float | None:
        """KL(q ‖ N(μ, Λ⁻¹)) of the Laplace start λ = ``params`` (its mean the mode): the ELBO
        its low-rank compression of the Laplace Gaussian gives up
        (:func:`stanvi.families.lowrank_start.gaussian_deficit`); the second-start check
        discounts it from the fit's climb (docs/algorithms.md#second-start)."""
        return gaussian_deficit(self, params, precision)

    @property
    def dense_precision_max_dim(self) -> int:
        """Above this D the Laplace warm start does not form the precision
        (:func:`stanvi.methods.warm_start.laplace_q` then calls :meth:`params_from_mode`)."""
        return DENSE_PRECISION_MAX_DIM

    def params_from_mode(self, mu: np.ndarray, log_scale0: float) -> np.ndarray:
        """The Laplace start without a Hessian (large D): q₀ centred at the mode ``mu`` with the
        default scales of :meth:`initial_params`."""
        return self.initial_params(mu, log_scale0)

    # ------------------------------------------------------------------ JAX pieces
    def split(self, params: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(μ, ω, B (D, k)), B's entries above the diagonal zeroed (module docstring)."""
        D, k = self.dim, self.rank
        i = jax.lax.broadcasted_iota(jnp.int32, (D, k), 0)
        j = jax.lax.broadcasted_iota(jnp.int32, (D, k), 1)
        return params[:D], params[D:2 * D], jnp.where(j <= i, params[2 * D:].reshape(D, k), 0.0)

    def sample(self, params: jax.Array, eps: jax.Array) -> jax.Array:
        """z = μ + e^ω ⊙ ε₁ + B ε₂ for each row of ``eps`` (n, D + k)."""
        mu, omega, B = self.split(params)
        return mu + jnp.exp(omega) * eps[:, : self.dim] + eps[:, self.dim:] @ B.T

    def _chol_core(self, omega: jax.Array, B: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(W = e^{−ω} ⊙ B, the Cholesky factor L of C = I + WᵀW), L = Rᵀ from the QR
        factorization of [I_k; W] with R's diagonal made positive, not the Cholesky factor of
        C formed explicitly (which loses the smaller rows of W below C's rounding where d spans
        many orders of magnitude: the host path's :meth:`_core` says more)."""
        W = B * jnp.exp(-omega)[:, None]
        R = jnp.linalg.qr(jnp.concatenate([jnp.eye(self.rank), W]), mode="r")
        sign = jnp.where(jnp.diagonal(R) < 0.0, -1.0, 1.0)
        return W, (R * sign[:, None]).T

    def entropy(self, params: jax.Array) -> jax.Array:
        """H(q) = D/2 (1 + log 2π) + Σ ω + ½ log det(I_k + WᵀW) (docs/algorithms.md#lowrank)."""
        _, omega, B = self.split(params)
        _, chol = self._chol_core(omega, B)
        return (0.5 * self.dim * (1.0 + LOG_2PI) + jnp.sum(omega)
                + jnp.sum(jnp.log(jnp.diagonal(chol))))

    def log_q(self, params: jax.Array, z: jax.Array) -> jax.Array:
        """log q(z) for each row of z (n, D): rᵀΣ⁻¹r = ‖y‖² − ‖L_C⁻¹ Wᵀy‖², y = e^{−ω} ⊙ r
        (Woodbury), log det Σ = 2Σω + 2 Σ log diag L_C (docs/algorithms.md#lowrank)."""
        mu, omega, B = self.split(params)
        W, chol = self._chol_core(omega, B)
        y = (z - mu) * jnp.exp(-omega)
        t = jax.scipy.linalg.solve_triangular(chol, (y @ W).T, lower=True).T
        quad = jnp.sum(y * y, axis=-1) - jnp.sum(t * t, axis=-1)
        return (-0.5 * quad - jnp.sum(omega) - jnp.sum(jnp.log(jnp.diagonal(chol)))
                - 0.5 * self.dim * LOG_2PI)

    # ------------------------------------------------------------------ moments (NumPy)
    def mean(self, params) -> np.ndarray:
        return np.asarray(params, dtype=float)[: self.dim]

    def covariance(self, params) -> np.ndarray:
        """diag(d²) + BBᵀ (D, D): for tests and small D only."""
        _, d, B = self.parts_np(params)
        return np.diag(d * d) + B @ B.T

    def marginal_sd(self, params: np.ndarray) -> np.ndarray:
        """sqrt(d² + rowsum(B²)), in NumPy."""
        _, d, B = self.parts_np(params)
        return np.sqrt(d * d + np.sum(B * B, axis=1))

    def metric_scale(self, params: np.ndarray) -> np.ndarray:
        """Square roots of a diagonal stand-in for q's Fisher information in λ
        (docs/algorithms.md#lowrank): for μ_i the exact Fisher diagonal √(Σ⁻¹)_ii; for ω_i
        √2, the mean-field value (:meth:`stanvi.families.gaussian.MeanField.metric_scale`; the
        exact √2 h_i, h_i = d_i²(Σ⁻¹)_ii ∈ (0, 1], is small where B carries coordinate i, and
        steps that large on a nearly flat ω_i let MLMCVI's noisy iterates collapse d_i); for
        B_ij √(Σ⁻¹)_ii, the curvature scale of the ELBO in B_ij near q ≈ p (the Fisher diagonal
        itself vanishes at B = 0).  diag(Σ⁻¹) = h/d² by Woodbury, O(D k²).  Rescaling model
        coordinate i by c rescales μ_i, B_i· and 1/√(Σ⁻¹)_ii alike."""
        _, d, _ = self.parts_np(params)
        h = self.entropy_grad_np(params)[self.dim:2 * self.dim]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            root = np.sqrt(h) / d
        root = np.where(np.isfinite(root) & (root > 0), root, 1.0)
        return np.concatenate([root, np.full(self.dim, math.sqrt(2.0)),
                               np.repeat(root, self.rank)])
