"""Gaussian targets with known variational optima, for method tests
(docs/algorithms.md#gaussian-closed-forms).

Target ``log p(z) = log N(z; m, Σ)`` (normalized, log Z = 0), precision ``Λ = Σ⁻¹``.

* Mean-field ELBO at (μ, ω):  −½[(μ−m)ᵀΛ(μ−m) + Σ Λ_ii σ_i²] − ½ log|2πΣ| + D/2 (1 + log 2π) + Σ ω;
  optimum μ* = m, σ*_i² = 1/Λ_ii, ELBO* = −½(log|Σ| + Σ log Λ_ii).  The *gap* ELBO* − ELBO is
  computed in closed form here, so checks of a method's final iterate carry no evaluation noise.
* Full-rank: the gap is KL(q‖p) = ½[tr(ΛC) − D − log det(ΛC) + (μ−m)ᵀΛ(μ−m)].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import jax
import jax.numpy as jnp
import numpy as np

jax.config.update("jax_enable_x64", True)


@dataclass(frozen=True, eq=False)
class GaussianProblem:
    m: np.ndarray
    S: np.ndarray
    label: str

    @property
    def dim(self) -> int:
        return len(self.m)

    @cached_property
    def precision(self) -> np.ndarray:
        return np.linalg.inv(self.S)

    @cached_property
    def log_density(self):
        """The normalized JAX log density (one function object per problem, so that repeated
        fits reuse JAX's compilation caches)."""
        lam = jnp.asarray(self.precision)
        mj = jnp.asarray(self.m)
        const = -0.5 * (np.linalg.slogdet(self.S)[1] + self.dim * math.log(2 * math.pi))

        def lp(z):
            r = z - mj
            return -0.5 * r @ (lam @ r) + const

        return lp

    @property
    def mf_sigma(self) -> np.ndarray:
        """σ*_i = 1/√Λ_ii, the mean-field optimum's scales."""
        return 1.0 / np.sqrt(np.diag(self.precision))

    def assert_mf_optimum(self, family, params: np.ndarray, gap_tol: float) -> float:
        """The final mean-field iterate is within ``gap_tol`` nats of the optimal ELBO (exact
        closed form).  The implied bounds on μ and σ are checked first, so that a failure says
        which part is off: (μ−m)ᵀΛ(μ−m) ≤ 2·gap ⇒ |μ_i − m_i| ≤ √(2·gap·Σ_ii), and each σ term
        ½(x − 1 − log x), x = Λ_ii σ_i² = (σ_i/σ*_i)², is ≤ gap.  Returns the gap."""
        d = self.dim
        assert np.all(np.isfinite(params))
        mu, sigma = params[:d], np.exp(params[d:])
        ratio = np.abs(mu - self.m) / np.sqrt(2 * gap_tol * np.diag(self.S))
        assert np.all(ratio <= 1), f"{self.label}: μ off: max |μ−m|/bound = {ratio.max():.3g}"
        x = (sigma / self.mf_sigma) ** 2
        assert np.all(0.5 * (x - 1 - np.log(x)) <= gap_tol), (
            f"{self.label}: σ off: σ/σ* in [{np.sqrt(x).min():.4g}, {np.sqrt(x).max():.4g}]")
        g = gap(self, family, params)
        assert -1e-9 <= g <= gap_tol, f"{self.label}: ELBO gap {g:.4g} > {gap_tol:.4g}"
        return g

    def kl(self, mean: np.ndarray, cov: np.ndarray) -> float:
        """KL(N(mean, cov) ‖ N(m, Σ)) (the full-rank gap)."""
        A = self.precision @ cov
        d = mean - self.m
        return float(0.5 * (np.trace(A) - self.dim - np.linalg.slogdet(A)[1]
                            + d @ self.precision @ d))


def make_problem(dim: int, correlated: bool, seed: int = 0) -> GaussianProblem:
    """Means ~ N(0, 2²); marginal sds log-uniform in [0.3, 3]; correlated: AR(1), ρ = 0.9
    (condition numbers in the hundreds)."""
    rng = np.random.default_rng(seed + 1000 * dim)
    sd = np.exp(rng.uniform(math.log(0.3), math.log(3.0), dim))
    m = rng.normal(0.0, 2.0, dim)
    if correlated:
        idx = np.arange(dim)
        R = 0.9 ** np.abs(np.subtract.outer(idx, idx))
    else:
        R = np.eye(dim)
    S = sd[:, None] * R * sd[None, :]
    return GaussianProblem(m, S, f"D={dim} {'AR(1) 0.9' if correlated else 'diagonal'}")


def optimum_params(problem: GaussianProblem, family) -> np.ndarray:
    """The family's exact optimum for ``problem`` in the family's own parameterization."""
    from stanvi.families import MeanField  # noqa: PLC0415

    if isinstance(family, MeanField):
        return np.concatenate([problem.m, np.log(problem.mf_sigma)])
    L = np.linalg.cholesky(problem.S)
    rows, cols = np.tril_indices(problem.dim)
    vech = L[rows, cols]
    if family.diagonal == "log":
        vech = np.where(rows == cols, np.log(np.where(rows == cols, vech, 1.0)), vech)
    return np.concatenate([problem.m, vech])


def closed_form_elbo(problem: GaussianProblem, family, params) -> jax.Array:
    """E_q log p + H(q) in closed form (JAX, differentiable in ``params``)."""
    lam = jnp.asarray(problem.precision)
    d = family.mean(params) - jnp.asarray(problem.m)
    C = family.covariance(params)
    const = -0.5 * (np.linalg.slogdet(problem.S)[1] + problem.dim * math.log(2 * math.pi))
    return -0.5 * (d @ lam @ d + jnp.sum(lam * C)) + const + family.entropy(params)


def gap(problem: GaussianProblem, family, params) -> float:
    """ELBO* − ELBO(params), exact."""
    opt = optimum_params(problem, family)
    return float(closed_form_elbo(problem, family, jnp.asarray(opt))
                 - closed_form_elbo(problem, family, jnp.asarray(params)))


def noise_gap_bound(problem: GaussianProblem, family, estimator, n_draws: int,
                    n_mc: int = 20_000) -> float:
    """5σ bound on the ELBO loss ½ ξᵀ(−H)⁻¹ξ caused by Monte Carlo noise ξ (covariance C/n) in a
    stochastic gradient of ``n_draws`` draws at the optimum: with M = (−H)^{-1/2} C (−H)^{-1/2},
    the loss has mean tr(M)/(2n) and standard deviation √(2 tr M²)/(2n) (a weighted χ²).  H is
    the exact Hessian of the closed-form ELBO and C the per-draw gradient covariance, estimated
    from ``n_mc`` draws (for the mean-field family, tr M = 2D when Σ is diagonal)."""
    opt = jnp.asarray(optimum_params(problem, family))
    H = np.asarray(jax.hessian(lambda p: closed_form_elbo(problem, family, p))(opt))
    eps = np.asarray(jax.random.normal(jax.random.PRNGKey(12345), (n_mc, problem.dim)))
    _, G = estimator.values_and_grads(np.asarray(opt), eps)
    C = np.cov(G, rowvar=False)
    w, V = np.linalg.eigh(-H)
    assert w.min() > 0, "the optimum must be a strict maximum"
    W = V / np.sqrt(w)
    M = W.T @ C @ W
    return float((np.trace(M) + 5 * math.sqrt(2 * np.sum(M * M))) / (2 * n_draws))
