"""The Gaussian families' reparameterization in NumPy, on the host: draws, entropy, log q, and
the pullbacks that turn the model's gradients and Hessian-vector products at the draws into the
ELBO's gradient and Hessian-vector product in the variational parameters λ
(docs/algorithms.md#host-path, #meanfield, #fullrank).

Why a second, NumPy form of what :mod:`stanvi.families.gaussian` writes in JAX.  For a Stan
model the log density is evaluated in C++ over a whole batch of draws; what remains is a few
vector operations per call, which NumPy does in microseconds, while every JAX program a fit
needs costs tens of milliseconds to trace, lower and load in a new process (eight schools:
1.1 of a 1.8 s TrustVI fit was JAX compilation; issue T3-1).  The host estimator
(:class:`stanvi.estimators.host.HostElboEstimator`) calls these pieces; the JAX estimator keeps
the JAX forms, for JAX-native targets (on an accelerator).  ``tests/estimators/test_host_estimator.py``
checks every piece against the JAX estimator's autodiff to rounding.

For one base draw ε, z = g(λ, ε) and ℓ(λ; ε) = log p(z) + H(q_λ) (the reparameterized ELBO
integrand, Kingma & Welling 2014, Eq. 10; Kucukelbir et al. 2017, Eq. 7).  With
g = ∇log p(z) and a direction v in λ:

* the per-draw gradient ∇_λ ℓ = J(ε)ᵀ g + ∇H, with J = ∂z/∂λ;
* the tangent u = J(ε) v (the direction in z of the model HVP);
* the HVP ∇²_λ ℓ v = J(ε)ᵀ (∇²log p(z) u) + (∂J/∂λ · v)ᵀ g + ∇²H v — the second term is
  the curvature of z in λ (the log-scale parameters), the third the entropy's (zero on the log
  scale, −1/L_dd² on Stan's full-rank diagonal).
"""

from __future__ import annotations

import functools
import math

import numpy as np

_LOG_2PI = math.log(2.0 * math.pi)
#: The Stein model of the ELBO Hessian is formed as a matrix (``stein_model_matrix``) for at
#: most this many variational parameters (full rank up to D = 21, mean-field up to D = 128):
#: a product is then one matrix-vector product instead of ~10 array operations over the draws.
STEIN_MATRIX_MAX_PARAMS = 256


@functools.lru_cache(maxsize=8)
def tril_indices(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column indices of the lower triangle, row by row (the order of λ's L part)."""
    return np.tril_indices(dim)


@functools.lru_cache(maxsize=8)
def _diagonal_positions(dim: int) -> np.ndarray:
    """Where L_dd sits in λ's L part (row by row): d(d + 3)/2."""
    d = np.arange(dim)
    return d * (d + 3) // 2


class MeanFieldHostMath:
    """NumPy pieces of :class:`~stanvi.families.gaussian.MeanField`: λ = (μ, ω), z = μ + e^ω ⊙ ε
    (docs/algorithms.md#meanfield)."""

    dim: int

    def _mu_sigma(self, params) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(params, dtype=float)
        return p[: self.dim], np.exp(p[self.dim:])

    def sample_np(self, params, eps: np.ndarray) -> np.ndarray:
        """z = μ + e^ω ⊙ ε for each row of ``eps`` (n, D)."""
        mu, sigma = self._mu_sigma(params)
        return mu + sigma * np.asarray(eps, dtype=float)

    def noise_np(self, params, eps: np.ndarray) -> np.ndarray:
        """z − μ = e^ω ⊙ ε for each row of ``eps`` (n, D)."""
        return np.exp(np.asarray(params, dtype=float)[self.dim:]) * eps

    def noise_rows_np(self, params_rows: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """z_i − μ_i = e^{ω_i} ⊙ ε_i with a λ per row (``params_rows`` (n, P))."""
        return np.exp(np.atleast_2d(params_rows)[:, self.dim:]) * eps

    def diagonal_params(self, mu: np.ndarray, log_sd: np.ndarray) -> np.ndarray:
        """λ of N(μ, diag(e^{2 log_sd})): (μ, log_sd)."""
        return np.concatenate([np.asarray(mu, dtype=float), np.asarray(log_sd, dtype=float)])

    def pullback_rows_at(self, params_rows: np.ndarray, eps: np.ndarray,
                         g: np.ndarray) -> np.ndarray:
        """:meth:`pullback_rows` with a λ per row (``params_rows`` (n, P)): (g, g ⊙ σ_i ⊙ ε + 1)."""
        sigma = np.exp(np.atleast_2d(params_rows)[:, self.dim:])
        return np.concatenate([g, g * sigma * eps + 1.0], axis=1)

    def entropy_np(self, params) -> float:
        """H(q) = D/2 (1 + log 2π) + Σ ω."""
        return 0.5 * self.dim * (1.0 + _LOG_2PI) + float(np.sum(np.asarray(params)[self.dim:]))

    def log_q_eps_np(self, params, eps: np.ndarray) -> np.ndarray:
        """log q(z) at the draws z = μ + σ ⊙ ε of ``eps`` (n, D): log φ(ε) − Σ ω."""
        eps = np.asarray(eps, dtype=float)
        return (-0.5 * np.einsum("ij,ij->i", eps, eps) - float(np.sum(np.asarray(params)[self.dim:]))
                - 0.5 * self.dim * _LOG_2PI)

    def entropy_grad_np(self, params) -> np.ndarray:
        """∇_λ H = (0, 1)."""
        return np.concatenate([np.zeros(self.dim), np.ones(self.dim)])

    def pullback_rows(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Per-draw ELBO gradients (n, 2D): (g, g ⊙ σ ⊙ ε + 1)."""
        _, sigma = self._mu_sigma(params)
        return np.concatenate([g, g * sigma * eps + 1.0], axis=1)

    def pullback_mean(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The mean of :meth:`pullback_rows` over the draws (2D,)."""
        _, sigma = self._mu_sigma(params)
        return np.concatenate([g.mean(axis=0), sigma * (g * eps).mean(axis=0) + 1.0])

    def tangent(self, params, eps: np.ndarray, v: np.ndarray) -> np.ndarray:
        """u = J(ε) v = v_μ + σ ⊙ ε ⊙ v_ω per draw (n, D)."""
        _, sigma = self._mu_sigma(params)
        v = np.asarray(v, dtype=float)
        return v[: self.dim] + eps * (sigma * v[self.dim:])

    def hvp_pullback(self, params, eps: np.ndarray, g: np.ndarray, hu: np.ndarray,
                     v: np.ndarray) -> np.ndarray:
        """The mean over draws of ∇²_λ ℓ v from g = ∇log p(z) and hu = ∇²log p(z) u:
        (hu, σ ⊙ ε ⊙ hu + g ⊙ σ ⊙ ε ⊙ v_ω)."""
        _, sigma = self._mu_sigma(params)
        v_omega = np.asarray(v, dtype=float)[self.dim:]
        se = eps * sigma
        return np.concatenate([hu.mean(axis=0), (se * (hu + g * v_omega)).mean(axis=0)])


    def stein_hvp_operator(self, params, eps: np.ndarray, g: np.ndarray):
        """v ↦ B v, a model of the fixed-sample ELBO Hessian from the gradients ``g`` at the
        draws alone: the per-draw model Hessians ∇²log p(z_j) replaced by their Stein estimate
        Ĥ = sym((1/n) Σ g_j ε_jᵀ diag(1/σ)) (:func:`stein_hessian`), exact for a Gaussian log p
        with moment-matched draws; the rest as :meth:`hvp_pullback`, in closed form through the
        draws' mean m and second moment C: (Ĥ(v_μ + σ⊙m⊙v_ω), σ⊙m⊙Ĥv_μ + σ⊙((Ĥ∘C)(σ⊙v_ω)) +
        σ⊙mean(g⊙ε)⊙v_ω).  O(D²) per product, no model evaluation (docs/algorithms.md#stein-model)."""
        _, sigma = self._mu_sigma(params)
        n = eps.shape[0]
        hz = stein_hessian(g.T @ eps / n, lambda m: m / sigma[None, :])
        mean = eps.mean(axis=0)
        hc = hz * (eps.T @ eps / n)
        ge = sigma * (g * eps).mean(axis=0)
        dim = self.dim

        def hvp(v):
            v = np.asarray(v, dtype=float)
            vm, vo = v[:dim], v[dim:]
            top = hz @ (vm + sigma * mean * vo)
            bottom = sigma * mean * (hz @ vm) + sigma * (hc @ (sigma * vo)) + ge * vo
            return np.concatenate([top, bottom])
        return hvp

    def stein_model_matrix(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray | None:
        """The matrix (P, P) of :meth:`stein_hvp_operator`, P = 2D: [[Ĥ, Ĥ diag(σ⊙m)],
        [diag(σ⊙m) Ĥ, diag(σ) (Ĥ∘C) diag(σ) + diag(σ⊙mean(g⊙ε))]] (symmetric), or ``None``
        above :data:`STEIN_MATRIX_MAX_PARAMS` (docs/algorithms.md#stein-model)."""
        if 2 * self.dim > STEIN_MATRIX_MAX_PARAMS:
            return None
        _, sigma = self._mu_sigma(params)
        n = eps.shape[0]
        hz = stein_hessian(g.T @ eps / n, lambda m: m / sigma[None, :])
        sm = sigma * eps.mean(axis=0)
        dim = self.dim
        out = np.empty((2 * dim, 2 * dim))
        out[:dim, :dim] = hz
        out[:dim, dim:] = hz * sm[None, :]
        out[dim:, :dim] = sm[:, None] * hz
        out[dim:, dim:] = sigma[:, None] * (hz * (eps.T @ eps / n)) * sigma[None, :]
        d = np.arange(dim)
        out[dim + d, dim + d] += sigma * (g * eps).mean(axis=0)
        return out


class FullRankHostMath:
    """NumPy pieces of :class:`~stanvi.families.gaussian.FullRank`: λ = (μ, vech L), z = μ + Lε,
    the diagonal stored as ω = log L_dd (``diagonal="log"``) or as it is (``"stan"``)
    (docs/algorithms.md#fullrank).  The L part of a gradient is the lower triangle of
    (1/n) Σ g_i ε_iᵀ row by row, its diagonal times L_dd on the log scale (the chain rule).
    The class it is mixed into provides ``lower_factor(params)``, L in NumPy."""

    dim: int
    diagonal: str

    def _diag_values(self, params) -> np.ndarray:
        """The stored diagonal entries (ω_d or L_dd) of λ."""
        d = np.arange(self.dim)
        return np.asarray(params, dtype=float)[self.dim:][d * (d + 3) // 2]

    def _chain(self, params) -> np.ndarray:
        """∂L_dd/∂(stored diagonal): L_dd on the log scale, 1 on Stan's."""
        stored = self._diag_values(params)
        return np.exp(stored) if self.diagonal == "log" else np.ones(self.dim)

    def _vech(self, M: np.ndarray, chain: np.ndarray) -> np.ndarray:
        M = np.array(M, dtype=float)
        d = np.arange(self.dim)
        M[d, d] *= chain
        rows, cols = tril_indices(self.dim)
        return M[rows, cols]

    def _log_abs_diag_np(self, params) -> np.ndarray:
        stored = self._diag_values(params)
        if self.diagonal == "log":
            return stored
        # Stan skips exact zeros on the diagonal in the entropy (normal_fullrank::entropy)
        return np.where(stored == 0.0, 0.0, np.log(np.abs(np.where(stored == 0.0, 1.0, stored))))

    def sample_np(self, params, eps: np.ndarray) -> np.ndarray:
        """z = μ + L ε for each row of ``eps`` (n, D)."""
        return np.asarray(params, dtype=float)[: self.dim] + np.asarray(eps) @ self.lower_factor(params).T

    def noise_np(self, params, eps: np.ndarray) -> np.ndarray:
        """z − μ = L ε for each row of ``eps`` (n, D)."""
        return np.asarray(eps) @ self.lower_factor(params).T

    def noise_rows_np(self, params_rows: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """z_i − μ_i = L_i ε_i with a λ per row (``params_rows`` (n, P)): the n factors built
        at once (n, D, D), as :meth:`lower_factor` builds one."""
        params_rows = np.atleast_2d(np.asarray(params_rows, dtype=float))
        rows, cols = tril_indices(self.dim)
        lower = np.zeros((params_rows.shape[0], self.dim, self.dim))
        lower[:, rows, cols] = params_rows[:, self.dim:self.dim + rows.size]
        if self.diagonal == "log":
            d = np.arange(self.dim)
            lower[:, d, d] = np.exp(lower[:, d, d])
        return np.einsum("nij,nj->ni", lower, np.asarray(eps, dtype=float))

    def diagonal_params(self, mu: np.ndarray, log_sd: np.ndarray) -> np.ndarray:
        """λ of N(μ, diag(e^{2 log_sd})): L diagonal, its stored diagonal log_sd (the log
        scale) or e^{log_sd} (Stan's)."""
        d = np.arange(self.dim)
        params = np.zeros(self.dim + self.dim * (self.dim + 1) // 2)
        params[: self.dim] = mu
        log_sd = np.asarray(log_sd, dtype=float)
        params[self.dim + d * (d + 3) // 2] = log_sd if self.diagonal == "log" else np.exp(log_sd)
        return params

    def pullback_rows_at(self, params_rows: np.ndarray, eps: np.ndarray,
                         g: np.ndarray) -> np.ndarray:
        """:meth:`pullback_rows` with a λ per row (``params_rows`` (n, P)): row i's L part is
        the lower triangle of g_i ε_iᵀ, its diagonal times row i's ∂L_dd/∂(stored diagonal),
        plus row i's entropy gradient."""
        params_rows = np.atleast_2d(np.asarray(params_rows, dtype=float))
        d = np.arange(self.dim)
        stored = params_rows[:, self.dim:][:, d * (d + 3) // 2]           # (n, D)
        if self.diagonal == "log":
            chain, h_diag = np.exp(stored), np.ones_like(stored)
        else:
            safe = np.where(stored == 0.0, 1.0, stored)
            chain, h_diag = np.ones_like(stored), np.where(stored == 0.0, 0.0, 1.0 / safe)
        rows, cols = tril_indices(self.dim)
        on_diag = rows == cols
        lower = g[:, rows] * eps[:, cols] * np.where(on_diag, chain[:, rows], 1.0)
        lower = lower + np.where(on_diag, h_diag[:, rows], 0.0)
        return np.concatenate([g, lower], axis=1)

    def entropy_np(self, params) -> float:
        """H(q) = D/2 (1 + log 2π) + Σ log|L_dd|."""
        return 0.5 * self.dim * (1.0 + _LOG_2PI) + float(np.sum(self._log_abs_diag_np(params)))

    def log_q_eps_np(self, params, eps: np.ndarray) -> np.ndarray:
        """log q(z) at the draws z = μ + L ε of ``eps`` (n, D): log φ(ε) − Σ log|L_dd| (no
        triangular solve, and no SciPy import on a first fit)."""
        eps = np.asarray(eps, dtype=float)
        return (-0.5 * np.einsum("ij,ij->i", eps, eps)
                - float(np.sum(self._log_abs_diag_np(params))) - 0.5 * self.dim * _LOG_2PI)

    def entropy_grad_np(self, params) -> np.ndarray:
        """∇_λ H: 1 at the log diagonal, 1/L_dd at Stan's (0 where L_dd = 0), 0 elsewhere."""
        stored = self._diag_values(params)
        if self.diagonal == "log":
            diag = np.ones(self.dim)
        else:
            diag = np.where(stored == 0.0, 0.0, 1.0 / np.where(stored == 0.0, 1.0, stored))
        out = np.zeros(self.dim + self.dim * (self.dim + 1) // 2)
        d = np.arange(self.dim)
        out[self.dim + d * (d + 3) // 2] = diag
        return out

    def pullback_rows(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Per-draw ELBO gradients (n, P), dense: O(nD²) memory, for small D (the methods use
        the factored form, :class:`stanvi.families.fullrank_rows.FullRankRows`)."""
        rows, cols = tril_indices(self.dim)
        chain = self._chain(params)
        scale = np.where(rows == cols, chain[rows], 1.0)
        return self.entropy_grad_np(params) + np.concatenate(
            [g, g[:, rows] * eps[:, cols] * scale], axis=1)

    def pullback_mean(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The mean ELBO gradient over the draws (P,)."""
        outer = g.T @ eps / g.shape[0]
        return self.entropy_grad_np(params) + np.concatenate(
            [g.mean(axis=0), self._vech(outer, self._chain(params))])

    def _direction_factor(self, params, v: np.ndarray) -> np.ndarray:
        """V = ∂L/∂λ · v as a lower-triangular matrix (D, D)."""
        rows, cols = tril_indices(self.dim)
        V = np.zeros((self.dim, self.dim))
        V[rows, cols] = np.asarray(v, dtype=float)[self.dim:]
        d = np.arange(self.dim)
        V[d, d] *= self._chain(params)
        return V

    def tangent(self, params, eps: np.ndarray, v: np.ndarray) -> np.ndarray:
        """u = J(ε) v = v_μ + V ε per draw (n, D)."""
        v = np.asarray(v, dtype=float)
        return v[: self.dim] + eps @ self._direction_factor(params, v).T

    def hvp_pullback(self, params, eps: np.ndarray, g: np.ndarray, hu: np.ndarray,
                     v: np.ndarray) -> np.ndarray:
        """The mean over draws of ∇²_λ ℓ v from g = ∇log p(z) and hu = ∇²log p(z) u: the
        gradient pullback of hu, plus on the log diagonal the curvature of L_dd = e^{ω_d}
        (g_d ε_d L_dd v_ωd), or on Stan's diagonal the entropy's (−v_dd / L_dd²)."""
        n = eps.shape[0]
        chain = self._chain(params)
        out = np.concatenate([hu.mean(axis=0), self._vech(hu.T @ eps / n, chain)])
        d = np.arange(self.dim)
        where = self.dim + d * (d + 3) // 2
        v_diag = np.asarray(v, dtype=float)[where]
        if self.diagonal == "log":
            out[where] += (g * eps).mean(axis=0) * chain * v_diag
        else:
            stored = self._diag_values(params)
            safe = np.where(stored == 0.0, 1.0, stored)
            out[where] -= np.where(stored == 0.0, 0.0, v_diag / (safe * safe))
        return out


    def stein_hvp_operator(self, params, eps: np.ndarray, g: np.ndarray):
        """v ↦ B v, the fixed-sample ELBO Hessian model of
        :meth:`MeanFieldHostMath.stein_hvp_operator` for the full-rank family: Ĥ =
        sym((1/n) Σ g_j ε_jᵀ L⁻¹) in place of every ∇²log p(z_j), then :meth:`hvp_pullback`
        per draw (O(n D²) per product, no model evaluation; docs/algorithms.md#stein-model)."""
        lower = self.lower_factor(params)
        n = eps.shape[0]
        hz = stein_hessian(g.T @ eps / n,
                           lambda m: np.linalg.solve(lower.T, m.T).T)

        def hvp(v):
            u = self.tangent(params, eps, v)
            return self.hvp_pullback(params, eps, g, u @ hz, v)
        return hvp

    def stein_model_matrix(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray | None:
        """The matrix (P, P) of :meth:`stein_hvp_operator`, or ``None`` above
        :data:`STEIN_MATRIX_MAX_PARAMS`.  Through the draws' mean m and second moment
        S = (1/n) Σ ε_j ε_jᵀ, with c_rc = ∂L_rc/∂λ_rc (L_rr's chain factor on the diagonal,
        1 elsewhere): B_μμ = Ĥ, B_μ,rc = Ĥ_·r m_c c_rc, B_ab,rc = c_ab c_rc Ĥ_ar S_cb, plus
        :meth:`hvp_pullback`'s diagonal terms (docs/algorithms.md#stein-model)."""
        dim = self.dim
        rows, cols = tril_indices(dim)
        size = dim + rows.size
        if size > STEIN_MATRIX_MAX_PARAMS:
            return None
        lower = self.lower_factor(params)
        n = eps.shape[0]
        hz = stein_hessian(g.T @ eps / n, lambda m: np.linalg.solve(lower.T, m.T).T)
        mean = eps.mean(axis=0)
        chain = self._chain(params)
        c = np.ones(rows.size)
        diag_at = _diagonal_positions(dim)
        c[diag_at] = chain
        out = np.empty((size, size))
        out[:dim, :dim] = hz
        out[:dim, dim:] = hz[:, rows] * (mean[cols] * c)[None, :]
        out[dim:, :dim] = out[:dim, dim:].T
        second = eps.T @ eps / n
        out[dim:, dim:] = np.outer(c, c) * hz[rows[:, None], rows[None, :]] \
            * second[cols[:, None], cols[None, :]]
        where = dim + diag_at
        if self.diagonal == "log":
            out[where, where] += (g * eps).mean(axis=0) * chain
        else:
            stored = self._diag_values(params)
            safe = np.where(stored == 0.0, 1.0, stored)
            out[where, where] -= np.where(stored == 0.0, 0.0, 1.0 / (safe * safe))
        return out


def stein_hessian(a: np.ndarray, inverse_factor_t) -> np.ndarray:
    """E_q[∇²log p] from first derivatives alone (Stein's lemma / Price's theorem for a Gaussian
    q = N(μ, Σ), Σ = A Aᵀ: E[∇²log p(z)] = E[∇log p(z) (z − μ)ᵀ] Σ⁻¹ = E[g εᵀ] A⁻¹; Opper &
    Archambeau 2009, Eq. 11; Rezende, Mohamed & Wierstra 2014, App. B), symmetrized:
    ``a`` = (1/n) Σ g_j ε_jᵀ (D, D), ``inverse_factor_t(M)`` = M A⁻¹."""
    h = inverse_factor_t(a)
    return 0.5 * (h + h.T)
