"""Per-draw ELBO gradients of the full-rank Gaussian family kept in factored form (issue 17
item 6; docs/algorithms.md#fullrank): what TrustVI's jackknife, split gain and refinement need of
an (n, P) matrix, in O(nD) memory."""

from __future__ import annotations

import numpy as np

from stanvi.families.host_math import tril_indices as _tril_indices


class FullRankRows:
    """The per-draw ELBO gradients of the full-rank family without the (n, P) matrix
    (issue 17 item 6: at D = 2,000, P = 2,003,000 and 256 draws it is 4 GB; the refinement's
    4,096 draws, 64 GB).

    For z = μ + L ε, ℓ(λ; ε) = log p(z) + H(q_λ), and with g = ∇log p(z) the gradient is
    ``G = c + (g, vech(S ⊙ g εᵀ))``: ``c = ∇H`` (the same for every draw: 1/L_dd on Stan's
    diagonal, 1 on the log diagonal), the lower triangle of the outer product g εᵀ row by row,
    and on the log diagonal (L_dd = e^{ω_d}) the chain-rule factor ``S_dd = e^{ω_d}`` (1 off the
    diagonal and on Stan's diagonal).  A draw is kept as (g_i, ε_i): O(nD) memory.

    Supports what the methods use of an (n, P) array: ``shape``, ``len``, row selection
    ``rows[a:b]`` / ``rows[index]``, ``mean(axis=0)``, and :meth:`jackknife_moments` for
    :func:`stanvi.optim.jackknife.jackknife_snr` (the centred statistics it needs, in O(nD²)
    time and O(nD + D²) memory).  ``dense()`` materializes the matrix (for tests)."""

    def __init__(self, family, params: np.ndarray, g: np.ndarray, eps: np.ndarray,
                 const: np.ndarray) -> None:
        self.family = family
        self.params = np.asarray(params, dtype=float)
        self.g = np.asarray(g, dtype=float)
        self.eps = np.asarray(eps, dtype=float)
        self.const = np.asarray(const, dtype=float)
        dim = family.dim
        self.diag_scale = (np.exp(self.params[dim:][np.arange(dim) * (np.arange(dim) + 3) // 2])
                           if family.diagonal == "log" else np.ones(dim))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.g.shape[0], self.family.n_params)

    def __len__(self) -> int:
        return self.g.shape[0]

    def __getitem__(self, index) -> FullRankRows:
        g, eps = self.g[index], self.eps[index]
        if g.ndim != 2:
            raise IndexError("select rows with a slice or an index array")
        return FullRankRows(self.family, self.params, g, eps, self.const)

    def _vech(self, M: np.ndarray) -> np.ndarray:
        """The L part of a gradient from its D×D matrix ``M`` (lower triangle, row by row,
        diagonal times the chain-rule factor)."""
        M = M.copy()
        d = np.arange(self.family.dim)
        M[d, d] *= self.diag_scale
        rows, cols = _tril_indices(self.family.dim)
        return M[rows, cols]

    def _unvech(self, v: np.ndarray) -> np.ndarray:
        rows, cols = _tril_indices(self.family.dim)
        M = np.zeros((self.family.dim, self.family.dim))
        M[rows, cols] = v
        return M

    def outer_mean(self) -> np.ndarray:
        """(1/n) Σ g_i ε_iᵀ (D, D)."""
        return self.g.T @ self.eps / self.g.shape[0]

    def mean(self, axis: int = 0) -> np.ndarray:
        """The mean gradient (P,): c + (ḡ, vech(S ⊙ (1/n) Σ g_i ε_iᵀ))."""
        if axis != 0:
            raise ValueError("only the mean over draws (axis=0) is available")
        return self.const + np.concatenate([self.g.mean(axis=0), self._vech(self.outer_mean())])

    def finite_rows(self) -> np.ndarray:
        """Rows whose every gradient entry is finite (as ``np.isfinite(G).all(axis=1)`` of the
        dense matrix, up to a conservative bound on the products g_a ε_b S_bb)."""
        ok = np.isfinite(self.g).all(axis=1) & np.isfinite(self.eps).all(axis=1)
        with np.errstate(over="ignore", invalid="ignore"):
            bound = (np.abs(self.g).max(axis=1, initial=0.0) * np.abs(self.eps).max(axis=1, initial=0.0)
                     * float(np.max(self.diag_scale, initial=1.0)))
        ok &= np.isfinite(bound) & bool(np.all(np.isfinite(self.const)))
        ok &= bool(np.all(np.isfinite(self.diag_scale)))
        return ok

    def dense(self) -> np.ndarray:
        """The (n, P) matrix (small D only)."""
        rows, cols = _tril_indices(self.family.dim)
        scale = np.where(rows == cols, self.diag_scale[rows], 1.0)
        L_part = self.g[:, rows] * self.eps[:, cols] * scale
        return self.const + np.concatenate([self.g, L_part], axis=1)

    def jackknife_moments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Ḡ, ‖G_i − Ḡ‖², (G_i − Ḡ)ᵀḠ) for :func:`~stanvi.optim.jackknife.jackknife_snr`.

        With M = (1/n) Σ g_j ε_jᵀ, W the lower triangle of Ḡ's L part as a matrix times S, and
        S² the squared chain-rule factors:

        * ``(G_i − Ḡ)ᵀḠ = (g_i − ḡ)ᵀḠ_μ + g_iᵀ W ε_i − mean_j g_jᵀ W ε_j``;
        * ``‖G_i − Ḡ‖² = ‖g_i − ḡ‖² + Σ_{a≥b} S²_ab (g_ia ε_ib − M_ab)²``, expanded as
          ``Σ_a g_ia² Σ_{b≤a} ε_ib² + Σ_a (S²_aa − 1) g_ia² ε_ia² − 2 g_iᵀ (S² ⊙ tril M) ε_i
          + ‖S ⊙ tril M‖²`` (clipped at 0 against rounding)."""
        n, dim = self.g.shape
        mean = self.mean(axis=0)
        g_c = self.g - self.g.mean(axis=0)
        W = np.tril(self._unvech(mean[dim:]))
        d = np.arange(dim)
        W[d, d] *= self.diag_scale
        t = np.einsum("ia,ia->i", self.g, self.eps @ W.T)
        gc_mean = g_c @ mean[:dim] + (t - t.mean())
        M = np.tril(self.outer_mean())
        s2 = self.diag_scale ** 2
        M2 = M.copy()
        M2[d, d] *= s2
        g2, e2 = self.g * self.g, self.eps * self.eps
        l_sq = (np.einsum("ia,ia->i", g2, np.cumsum(e2, axis=1))
                + (g2 * e2) @ (s2 - 1.0)
                - 2.0 * np.einsum("ia,ia->i", self.g, self.eps @ M2.T)
                + float(np.sum(M * M2)))
        sq_c = np.einsum("ij,ij->i", g_c, g_c) + np.maximum(l_sq, 0.0)
        return mean, sq_c, gc_mean
