"""The diagonal-plus-low-rank Gaussian family's reparameterization in NumPy, on the host
(docs/algorithms.md#lowrank, #host-path): draws, entropy and its derivatives, log q by the
Woodbury identity, and the pullbacks of the model's gradients and Hessian-vector products into
λ = (μ, ω, vec B), every piece O(n D k) time and memory (no D × D matrix).

For q = N(μ, Σ), Σ = diag(d²) + B Bᵀ, d = e^ω, B (D, k), and a base draw ε = (ε₁, ε₂) of width
D + k, z = μ + d ⊙ ε₁ + B ε₂.  With W = diag(d)⁻¹ B and C = I_k + WᵀW:

* H(q) = D/2 (1 + log 2π) + Σ ω + ½ log det C  (the matrix determinant lemma);
* ∇_B H = diag(d)⁻¹ W C⁻¹,  ∇_ω H = 1 − rowsum(W ⊙ W C⁻¹)  (= diag((I + WWᵀ)⁻¹) > 0);
* Σ⁻¹ = diag(d)⁻¹ (I − W C⁻¹ Wᵀ) diag(d)⁻¹  (Woodbury), so rᵀΣ⁻¹r = ‖y‖² − ‖C^{-1/2} Wᵀy‖²
  with y = r / d.

For one draw with g = ∇log p(z) the per-draw ELBO gradient is (g, d ⊙ ε₁ ⊙ g + ∇_ω H,
g ε₂ᵀ + ∇_B H); the tangent in direction v = (v_μ, v_ω, V_B) is u = v_μ + d ⊙ v_ω ⊙ ε₁ + V_B ε₂,
and the HVP pullback (hu = ∇²log p(z) u) is (hu, d ⊙ ε₁ ⊙ (hu + g ⊙ v_ω), hu ε₂ᵀ) averaged over the
draws plus ∇²H v (:meth:`LowRankHostMath.entropy_hvp_np`).

B is lower trapezoidal (B_ij = 0 for j > i; :func:`trapezoid_mask`): q depends on BBᵀ only,
so without it the ELBO is flat along the k(k − 1)/2 rotations B ↦ BR, its Hessian singular at
every optimum, and Newton-type methods step along the flat directions.  Every B = LQ with L lower
trapezoidal (the LQ decomposition), so the family is the same.  The stored entries above the
diagonal are ignored, and every gradient and Hessian-vector product is exactly zero there.
"""

from __future__ import annotations

import functools
import math

import numpy as np

_LOG_2PI = math.log(2.0 * math.pi)


@functools.lru_cache(maxsize=8)
def trapezoid_mask(dim: int, rank: int) -> np.ndarray:
    """The lower-trapezoidal mask (D, k) of B: entry (i, j) is free iff j ≤ i (the gauge fixing
    of docs/algorithms.md#lowrank; read-only, cached)."""
    mask = np.tri(dim, rank, dtype=float)
    mask.setflags(write=False)
    return mask


def lower_trapezoidal(B: np.ndarray) -> np.ndarray:
    """The lower-trapezoidal L of B = L O (O orthogonal; the QR factorization of Bᵀ): the same
    BBᵀ in the family's gauge."""
    return np.linalg.qr(B.T)[1].T


class LowRankHostMath:
    """NumPy pieces of :class:`~stanvi.families.lowrank.LowRank` (module docstring).  The class it
    is mixed into provides ``dim`` (D) and ``rank`` (k)."""

    dim: int
    rank: int

    # ------------------------------------------------------------------ layout
    def parts_np(self, params) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(μ (D,), d = e^ω (D,), B (D, k)) of λ."""
        p = np.asarray(params, dtype=float)
        D, k = self.dim, self.rank
        return p[:D], np.exp(p[D:2 * D]), p[2 * D:].reshape(D, k) * trapezoid_mask(D, k)

    def _core(self, d: np.ndarray, B: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(W = B/d, C⁻¹ (k, k), the Cholesky factor L of C = I + WᵀW); NaN factors where W is
        not finite (a trial step whose d underflows or whose B overflows), so that the step is
        rejected rather than raised.

        L is Rᵀ from the QR factorization of M = [I_k; W] (MᵀM = C), its diagonal made
        positive, not the Cholesky factor of C formed as I + WᵀW: forming WᵀW squares W's
        condition, and where d spans many orders of magnitude (a collapsed d_i ~ 1e-17 beside
        one ~ 1e-8) the smaller rows' part of C falls below C's rounding, so log det C and the
        solves with C came out wrong by nats (posteriordb's kidscore_interaction: an ELBO 8 nats
        above the full-rank optimum; tests/families/test_lowrank.py).  Householder QR is
        backward stable column by column: O((D + k) k²), as forming C was."""
        with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
            W = B / d[:, None]
        nan = np.full((self.rank, self.rank), np.nan)
        if not np.all(np.isfinite(W)):
            return W, nan, nan
        R = np.linalg.qr(np.vstack([np.eye(self.rank), W]), mode="r")
        sign = np.where(np.diagonal(R) < 0.0, -1.0, 1.0)
        chol = (R * sign[:, None]).T
        if not (np.all(np.isfinite(chol)) and np.all(np.diagonal(chol) > 0.0)):
            return W, nan, nan
        ci = np.linalg.solve(chol.T, np.linalg.solve(chol, np.eye(self.rank)))
        return W, 0.5 * (ci + ci.T), chol

    def split_eps(self, eps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(ε₁ (n, D), ε₂ (n, k)) of base draws (n, D + k)."""
        eps = np.asarray(eps, dtype=float)
        return eps[..., : self.dim], eps[..., self.dim:]

    # ------------------------------------------------------------------ draws, density
    def noise_np(self, params, eps: np.ndarray) -> np.ndarray:
        """z − μ = d ⊙ ε₁ + B ε₂ for each row of ``eps`` (n, D + k)."""
        _, d, B = self.parts_np(params)
        e1, e2 = self.split_eps(np.atleast_2d(eps))
        return d * e1 + e2 @ B.T

    def sample_np(self, params, eps: np.ndarray) -> np.ndarray:
        """z = μ + d ⊙ ε₁ + B ε₂ for each row of ``eps`` (n, D + k)."""
        return np.asarray(params, dtype=float)[: self.dim] + self.noise_np(params, eps)

    def noise_rows_np(self, params_rows: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """z_i − μ_i with a λ per row (``params_rows`` (n, P)); O(n D k)."""
        rows = np.atleast_2d(np.asarray(params_rows, dtype=float))
        D, k = self.dim, self.rank
        e1, e2 = self.split_eps(np.atleast_2d(eps))
        B = rows[:, 2 * D:].reshape(-1, D, k) * trapezoid_mask(D, k)
        return np.exp(rows[:, D:2 * D]) * e1 + np.einsum("ndk,nk->nd", B, e2)

    def entropy_np(self, params) -> float:
        """H(q) = D/2 (1 + log 2π) + Σ ω + ½ log det(I_k + WᵀW) (module docstring)."""
        p = np.asarray(params, dtype=float)
        _, d, B = self.parts_np(p)
        _, _, chol = self._core(d, B)
        return (0.5 * self.dim * (1.0 + _LOG_2PI) + float(np.sum(p[self.dim:2 * self.dim]))
                + float(np.sum(np.log(np.diagonal(chol)))))

    def log_q_np(self, params, z: np.ndarray) -> np.ndarray:
        """log q(z) for each row of z (n, D) by Woodbury and the determinant lemma."""
        p = np.asarray(params, dtype=float)
        mu, d, B = self.parts_np(p)
        W, _, chol = self._core(d, B)
        y = (np.atleast_2d(z) - mu) / d
        t = np.linalg.solve(chol, (y @ W).T).T          # C^{-1/2}-whitened Wᵀy (n, k)
        quad = np.einsum("ij,ij->i", y, y) - np.einsum("ij,ij->i", t, t)
        return (-0.5 * quad - float(np.sum(p[self.dim:2 * self.dim]))
                - float(np.sum(np.log(np.diagonal(chol)))) - 0.5 * self.dim * _LOG_2PI)

    def log_q_eps_np(self, params, eps: np.ndarray) -> np.ndarray:
        """log q(z) at the draws z = μ + d ⊙ ε₁ + B ε₂ of ``eps`` (n, D + k), from ε itself:
        with A = [diag(d), B], (z − μ)ᵀΣ⁻¹(z − μ) = ‖Pε‖² for P the projection onto A's row
        space, whose complement is spanned by N = [−W; I_k] (NᵀN = C), so the quadratic form is
        ‖ε‖² − (ε₂ − Wᵀε₁)ᵀ C⁻¹ (ε₂ − Wᵀε₁).  Unlike the Woodbury form of :meth:`log_q_np` it
        stays accurate when some d_i ≪ ‖B_i‖ (W = B/d large: there ‖y‖² − ‖t‖² cancels
        catastrophically)."""
        p = np.asarray(params, dtype=float)
        _, d, B = self.parts_np(p)
        W, _, chol = self._core(d, B)
        e1, e2 = self.split_eps(np.atleast_2d(eps))
        t = np.linalg.solve(chol, (e2 - e1 @ W).T).T
        quad = np.einsum("ij,ij->i", e1, e1) + np.einsum("ij,ij->i", e2, e2) \
            - np.einsum("ij,ij->i", t, t)
        return (-0.5 * quad - float(np.sum(p[self.dim:2 * self.dim]))
                - float(np.sum(np.log(np.diagonal(chol)))) - 0.5 * self.dim * _LOG_2PI)

    def precision_rows(self, params, U: np.ndarray) -> np.ndarray:
        """Σ⁻¹ u for each row u of ``U`` (n, D): Woodbury, O(n D k)."""
        _, d, B = self.parts_np(params)
        W, ci, _ = self._core(d, B)
        y = np.atleast_2d(U) / d
        return (y - ((y @ W) @ ci) @ W.T) / d

    # ------------------------------------------------------------------ entropy derivatives
    def entropy_grad_np(self, params) -> np.ndarray:
        """∇_λ H = (0, 1 − rowsum(W ⊙ W C⁻¹), vec(diag(d)⁻¹ W C⁻¹))."""
        _, d, B = self.parts_np(params)
        W, ci, _ = self._core(d, B)
        wci = W @ ci
        mask = trapezoid_mask(self.dim, self.rank)
        return np.concatenate([np.zeros(self.dim), 1.0 - np.sum(W * wci, axis=1),
                               (wci / d[:, None] * mask).ravel()])

    def entropy_hvp_np(self, params, v: np.ndarray) -> np.ndarray:
        """∇²_λ H v, the directional derivative of :meth:`entropy_grad_np` in v = (v_μ, v_ω,
        V_B): dW = V_B/d − v_ω ⊙ W, dC⁻¹ = −C⁻¹(dWᵀW + WᵀdW)C⁻¹, d(WC⁻¹) = dW C⁻¹ + W dC⁻¹;
        dG_ω = −rowsum(dW ⊙ WC⁻¹ + W ⊙ d(WC⁻¹)), dG_B = (d(WC⁻¹) − v_ω ⊙ WC⁻¹)/d.  O(D k²)."""
        D, k = self.dim, self.rank
        _, d, B = self.parts_np(params)
        W, ci, _ = self._core(d, B)
        v = np.asarray(v, dtype=float)
        mask = trapezoid_mask(D, k)
        v_omega, v_b = v[D:2 * D], v[2 * D:].reshape(D, k) * mask
        wci = W @ ci
        dW = v_b / d[:, None] - v_omega[:, None] * W
        dC = dW.T @ W
        dC = dC + dC.T
        d_wci = dW @ ci - wci @ (dC @ ci)
        g_omega = -np.sum(dW * wci + W * d_wci, axis=1)
        g_b = (d_wci - v_omega[:, None] * wci) / d[:, None] * mask
        return np.concatenate([np.zeros(D), g_omega, g_b.ravel()])

    # ------------------------------------------------------------------ pullbacks
    def pullback_rows(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Per-draw ELBO gradients (n, P): (g, d ⊙ ε₁ ⊙ g, g ε₂ᵀ) + ∇H.  O(n D k) memory."""
        _, d, _ = self.parts_np(params)
        e1, e2 = self.split_eps(eps)
        g = np.asarray(g, dtype=float)
        mask = trapezoid_mask(self.dim, self.rank)
        outer = (g[:, :, None] * e2[:, None, :] * mask).reshape(g.shape[0], -1)
        return self.entropy_grad_np(params) + np.concatenate([g, g * d * e1, outer], axis=1)

    def pullback_rows_at(self, params_rows: np.ndarray, eps: np.ndarray,
                         g: np.ndarray) -> np.ndarray:
        """:meth:`pullback_rows` with a λ per row (``params_rows`` (n, P))."""
        rows = np.atleast_2d(np.asarray(params_rows, dtype=float))
        eps = np.atleast_2d(np.asarray(eps, dtype=float))
        g = np.atleast_2d(np.asarray(g, dtype=float))
        return np.concatenate([self.pullback_rows(rows[i], eps[i:i + 1], g[i:i + 1])
                               for i in range(rows.shape[0])])

    def pullback_mean(self, params, eps: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The mean ELBO gradient over the draws (P,): (ḡ, d ⊙ mean(g ⊙ ε₁), Gᵀε₂/n) + ∇H."""
        _, d, _ = self.parts_np(params)
        e1, e2 = self.split_eps(eps)
        g = np.asarray(g, dtype=float)
        n = g.shape[0]
        return self.entropy_grad_np(params) + np.concatenate(
            [g.mean(axis=0), d * (g * e1).mean(axis=0),
             (g.T @ e2 / n * trapezoid_mask(self.dim, self.rank)).ravel()])

    def tangent(self, params, eps: np.ndarray, v: np.ndarray) -> np.ndarray:
        """u = J(ε) v = v_μ + d ⊙ v_ω ⊙ ε₁ + V_B ε₂ per draw (n, D)."""
        D, k = self.dim, self.rank
        _, d, _ = self.parts_np(params)
        e1, e2 = self.split_eps(eps)
        v = np.asarray(v, dtype=float)
        return v[:D] + e1 * (d * v[D:2 * D]) + e2 @ (v[2 * D:].reshape(D, k)
                                                     * trapezoid_mask(D, k)).T

    def hvp_pullback(self, params, eps: np.ndarray, g: np.ndarray, hu: np.ndarray,
                     v: np.ndarray) -> np.ndarray:
        """The mean over draws of ∇²_λ ℓ v from g = ∇log p(z) and hu = ∇²log p(z) u:
        (mean hu, d ⊙ mean(ε₁ ⊙ (hu + g ⊙ v_ω)), huᵀε₂/n) + ∇²H v."""
        D = self.dim
        _, d, _ = self.parts_np(params)
        e1, e2 = self.split_eps(eps)
        v_omega = np.asarray(v, dtype=float)[D:2 * D]
        n = hu.shape[0]
        out = np.concatenate([hu.mean(axis=0), d * (e1 * (hu + g * v_omega)).mean(axis=0),
                              (hu.T @ e2 / n * trapezoid_mask(D, self.rank)).ravel()])
        return out + self.entropy_hvp_np(params, v)

    # ------------------------------------------------------------------ Stein model
    def stein_hvp_operator(self, params, eps: np.ndarray, g: np.ndarray):
        """v ↦ B v, the fixed-sample ELBO Hessian model of
        :meth:`~stanvi.families.host_math.MeanFieldHostMath.stein_hvp_operator` for this family:
        every ∇²log p(z_j) replaced by the Stein estimate Ĥ = sym(M Σ⁻¹), M = (1/n) Σ g_j y_jᵀ,
        y_j = z_j − μ (Stein's lemma, E[∇²log p] = E[g (z − μ)ᵀ] Σ⁻¹), never formed
        (docs/algorithms.md#lowrank, #stein-model).

        With n ≤ ``4(k + 1)`` draws that are not moment matched (n ≤ D + k + 1), Ĥ is applied to
        each draw's tangent: U Ĥ = ((U Gᵀ)(YΣ⁻¹) + (U (YΣ⁻¹)ᵀ) G)/2n, O(n² D) per product.
        Otherwise the draws' second moments are taken as I (exact for moment-matched draws, and
        the expected ELBO Hessian's model otherwise), keeping their means m₁, m₂:
        (Ĥū, d ⊙ (m₁ ⊙ Ĥv_μ + diag(Ĥ) ⊙ d ⊙ v_ω), Ĥv_μ m₂ᵀ + Ĥ V) with
        ū = v_μ + d ⊙ m₁ ⊙ v_ω + V m₂, plus :meth:`hvp_pullback`'s curvature and entropy terms:
        k + 2 applications of Ĥ, O(n D k) per product."""
        eps = np.asarray(eps, dtype=float)
        g = np.asarray(g, dtype=float)
        n = eps.shape[0]
        D, k = self.dim, self.rank
        ys = self.precision_rows(params, self.noise_np(params, eps))   # rows y_j Σ⁻¹
        if n <= D + k + 1 and n <= 4 * (k + 1):
            def hvp(v):
                u = self.tangent(params, eps, v)
                hu = 0.5 * ((u @ g.T) @ ys + (u @ ys.T) @ g) / n
                return self.hvp_pullback(params, eps, g, hu, v)
            return hvp

        _, d, _ = self.parts_np(params)
        mask = trapezoid_mask(D, k)
        e1, e2 = self.split_eps(eps)
        m1, m2 = e1.mean(axis=0), e2.mean(axis=0)
        h_diag = np.einsum("ji,ji->i", g, ys) / n

        def apply(X):
            """Ĥ X for X (D, m)."""
            return 0.5 * (g.T @ (ys @ X) + ys.T @ (g @ X)) / n

        zero = np.zeros((n, D))

        def hvp(v):
            v = np.asarray(v, dtype=float)
            v_mu, v_omega, V = v[:D], v[D:2 * D], v[2 * D:].reshape(D, k) * mask
            u_bar = v_mu + d * m1 * v_omega + V @ m2
            H = apply(np.column_stack([u_bar, v_mu, V]))
            h_ubar, h_mu, h_v = H[:, 0], H[:, 1], H[:, 2:]
            out = np.concatenate([h_ubar, d * (m1 * h_mu + h_diag * d * v_omega),
                                  ((np.outer(h_mu, m2) + h_v) * mask).ravel()])
            return out + self.hvp_pullback(params, eps, g, zero, v)
        return hvp

    def stein_model_matrix(self, params, eps: np.ndarray, g: np.ndarray) -> None:
        """None: the family uses :meth:`stein_hvp_operator` (a P × P matrix, P = D(k + 2), is
        what this family exists to avoid)."""
        return None
