"""The reference Gaussian of docs/mlmcvi.md#reference-gaussian for the MLMCVI tests:
p = N(μ*, P⁻¹) with D = 10, μ* = linspace(−2, 2, 10), P tridiagonal (2 on the diagonal, −0.5 off
it), as a target whose batched gradient is plain NumPy (fast: the statistical tests make ~10⁵
calls), with the exact free energy F = −ELBO and its gradient in every coordinate system of
:class:`stanvi.estimators.mlmc.Coordinates`, and the closed-form level variance V(λ, λ') of the
direct-scale mean-field case."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.targets.base import BatchResult
from stanvi.targets.jax_target import JaxTarget

jax.config.update("jax_enable_x64", True)

D = 10
MU = np.linspace(-2.0, 2.0, D)
P = 2.0 * np.eye(D) - 0.5 * (np.eye(D, k=1) + np.eye(D, k=-1))


def _jax_lp(z):
    r = z - jnp.asarray(MU)
    return -0.5 * r @ (jnp.asarray(P) @ r)


class GaussianTarget(JaxTarget):
    """log p(z) = −½ (z − μ*)ᵀ P (z − μ*) (unnormalized), gradients in NumPy; counts draws."""

    def __init__(self) -> None:
        super().__init__(_jax_lp, D, name="mlmc_gaussian")

    def log_density_gradient(self, z: np.ndarray) -> BatchResult:
        z = np.atleast_2d(np.asarray(z, dtype=float))
        r = z - MU
        g = -r @ P
        self.counter.add("gradient", len(z))
        return BatchResult(0.5 * np.sum(r * g, axis=1), gradient=g, ok=np.ones(len(z), bool))


def scale_matrix(coords, theta):
    """(m, L) of θ in JAX (mean-field: L = diag(scale))."""
    theta = jnp.asarray(theta)
    m = theta[:D]
    if not coords.fullrank:
        s = theta[D:]
        return m, jnp.diag(jnp.exp(s) if coords.scale == "log" else s)
    rows, cols = np.tril_indices(D)
    L = jnp.zeros((D, D)).at[rows, cols].set(theta[D:])
    if coords.scale == "log":
        d = np.arange(D)
        L = L.at[d, d].set(jnp.exp(L[d, d]))
    return m, L


def free_energy(coords, theta) -> jax.Array:
    """F(θ) = −E_q log p − H(q) up to a constant: ½[(m−μ)ᵀP(m−μ) + tr(P LLᵀ)] − Σ log|L_ii|."""
    m, L = scale_matrix(coords, theta)
    r = m - jnp.asarray(MU)
    Pj = jnp.asarray(P)
    return 0.5 * (r @ Pj @ r + jnp.sum(Pj * (L @ L.T))) - jnp.sum(jnp.log(jnp.abs(jnp.diag(L))))


def grad_free_energy(coords, theta) -> np.ndarray:
    return np.asarray(jax.grad(lambda t: free_energy(coords, t))(jnp.asarray(theta)))


def optimum_free_energy() -> float:
    """min F over the mean-field family: m = μ*, s_i = P_ii^{−1/2}."""
    return float(0.5 * D + 0.5 * np.sum(np.log(np.diag(P))))


def mf_excess(theta_direct: np.ndarray) -> float:
    """F − F*_MF for a direct-scale mean-field θ = (m, v), exact
    (docs/mlmcvi.md#reference-gaussian)."""
    m, v = theta_direct[:D], theta_direct[D:]
    r = m - MU
    f = -np.sum(np.log(np.abs(v))) + 0.5 * (r @ P @ r + np.sum(np.diag(P) * v * v))
    return float(f - optimum_free_energy())


def level_variance(theta: np.ndarray, theta_prev: np.ndarray) -> float:
    """V(λ, λ') = 2 Σ_ij P_ij² δs_j² + Σ_i P_ii² δs_i² + ‖P δm‖² (direct-scale MF;
    docs/mlmcvi.md#reference-gaussian)."""
    delta = np.asarray(theta) - np.asarray(theta_prev)
    dm, ds = delta[:D], delta[D:]
    return float(2 * np.sum(P ** 2 * ds[None, :] ** 2) + np.sum(np.diag(P) ** 2 * ds ** 2)
                 + np.sum((P @ dm) ** 2))


V0 = float(2 * np.sum(P ** 2) + np.sum(np.diag(P) ** 2) + np.sum((P @ MU) ** 2))
"""V_0 at λ_0 = (m = 0, s = 1): 158.0617 exactly (docs/mlmcvi.md#reference-gaussian)."""

# c_min ‖δ‖² ≤ V(λ, λ') ≤ c_max ‖δ‖² (direct scale, exact; docs/mlmcvi.md#reference-gaussian)
_col = 2 * np.sum(P ** 2, axis=0) + np.diag(P) ** 2
_sv = np.linalg.svd(P, compute_uv=False)
C_MAX = float(max(_sv.max() ** 2, _col.max()))
C_MIN = float(min(_sv.min() ** 2, _col.min()))
