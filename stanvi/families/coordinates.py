"""MLMCVI's optimization coordinates of the Gaussian families (docs/mlmcvi.md#per-draw-gradient,
docs/mlmcvi.md#resolutions): the location, then the scale as a log scale or as the scale itself,
with the draws, the per-draw gradients and the entropy's gradient in them.  The family's own
reparameterization in another parameterization, so it lives with the families
(docs/architecture.md#layers).
"""

from __future__ import annotations

import numpy as np

from stanvi.families.gaussian import FullRank, MeanField

SCALE_PARAMS = ("log", "direct")


class Coordinates:
    """The optimization coordinates θ of a Gaussian family (docs/mlmcvi.md#per-draw-gradient,
    docs/mlmcvi.md#resolutions): the location m, then the scale block as a log scale (``"log"``,
    stanvi's default) or as the scale itself (``"direct"``, the paper's theory).  Mean-field:
    θ = (m, ω) or (m, v), K = 2D; full-rank: θ = (m, vech(L)) row by row like
    :class:`~stanvi.families.gaussian.FullRank`, the diagonal stored as ω_i (L_ii = e^ω_i) or as
    L_ii, K = D + D(D+1)/2.

    Conversions to and from the family's own layout (:meth:`to_family`, :meth:`from_family`)
    keep q the same; a direct scale's sign is immaterial (q depends on |v|, or on LLᵀ).

    Another reparameterized family with NumPy pullbacks (the low-rank family,
    docs/algorithms.md#lowrank) is optimized in its own parameters with its log scale
    (``scale="log"`` only): θ = λ, the per-draw gradient of −ELBO is minus the family's
    ``pullback_rows``, the scale block its ``log_scale_index``."""

    def __init__(self, family, scale: str = "log") -> None:
        if scale not in SCALE_PARAMS:
            raise ValueError(f"scale_param must be one of {list(SCALE_PARAMS)}, got {scale!r}")
        self.native = not isinstance(family, (MeanField, FullRank))
        if self.native and not (hasattr(family, "pullback_rows")
                                and hasattr(family, "log_scale_index")):
            raise TypeError(f"MLMC gradients support the Gaussian families, not {family!r}")
        if self.native and scale != "log":
            raise ValueError(f"the {family.name} family is optimized in its own log-scale "
                             f"parameters: scale_param must be 'log', got {scale!r}")
        self.family = family
        self.scale = scale
        self.dim = family.dim
        self.fullrank = isinstance(family, FullRank)
        self.n_params = family.n_params
        if self.fullrank:
            self._rows, self._cols = np.tril_indices(self.dim)
            self._diag = np.flatnonzero(self._rows == self._cols)

    # ------------------------------------------------------------------ layout
    def scale_index(self) -> np.ndarray:
        """Positions in θ of the per-coordinate scale parameters (ω_i or v_i / L_ii): the
        coordinates the collapse-risk check of docs/mlmcvi.md#scale-collapse watches."""
        if self.native:
            return self.family.log_scale_index()
        if self.fullrank:
            return self.dim + self._diag
        return np.arange(self.dim, 2 * self.dim)

    def lower(self, theta: np.ndarray) -> np.ndarray:
        """L (D, D) of a full-rank θ."""
        L = np.zeros((self.dim, self.dim))
        vech = np.asarray(theta[self.dim:], dtype=float)
        L[self._rows, self._cols] = vech
        if self.scale == "log":
            d = np.arange(self.dim)
            L[d, d] = np.exp(L[d, d])
        return L

    def from_family(self, params: np.ndarray) -> np.ndarray:
        """θ from the family's parameters."""
        params = np.asarray(params, dtype=float).copy()
        if self.native:
            return params
        d = self.dim
        if not self.fullrank:
            if self.scale == "direct":
                params[d:] = np.exp(params[d:])
            return params
        diag = d + self._diag
        stored_log = self.family.diagonal == "log"
        if self.scale == "log" and not stored_log:
            params[diag] = np.log(np.abs(params[diag]))
        elif self.scale == "direct" and stored_log:
            params[diag] = np.exp(params[diag])
        return params

    def to_family(self, theta: np.ndarray) -> np.ndarray:
        """The family's parameters for θ (same q)."""
        theta = np.asarray(theta, dtype=float).copy()
        if self.native:
            return theta
        d = self.dim
        if not self.fullrank:
            if self.scale == "direct":
                with np.errstate(divide="ignore"):
                    theta[d:] = np.log(np.abs(theta[d:]))
            return theta
        L = self.lower(theta)
        if self.scale == "direct":   # make the diagonal positive: flip the columns (LLᵀ kept)
            L = L * np.where(np.diag(L) < 0, -1.0, 1.0)[None, :]
        vech = L[self._rows, self._cols]
        if self.family.diagonal == "log":
            with np.errstate(divide="ignore"):
                vech[self._diag] = np.log(vech[self._diag])
        return np.concatenate([theta[:d], vech])

    # ------------------------------------------------------------------ the per-draw gradient
    def sample(self, theta: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """z = T(ε; θ) for each row of ``eps`` (n, D)."""
        theta = np.asarray(theta, dtype=float)
        if self.native:
            return self.family.sample_np(theta, eps)
        m = theta[: self.dim]
        if self.fullrank:
            return m + eps @ self.lower(theta).T
        s = theta[self.dim:]
        return m + (np.exp(s) if self.scale == "log" else s) * eps

    def per_draw(self, theta: np.ndarray, eps: np.ndarray, gamma: np.ndarray) -> np.ndarray:
        """g_θ(ε_n) (n, K) of docs/mlmcvi.md#per-draw-gradient from γ_n = ∇ log p(T(ε_n; θ))
        (n, D)."""
        theta = np.asarray(theta, dtype=float)
        d = self.dim
        if self.native:
            return -self.family.pullback_rows(theta, eps, gamma)
        if not self.fullrank:
            s = theta[d:]
            if self.scale == "log":
                scale = -1.0 - np.exp(s) * eps * gamma
            else:
                scale = -1.0 / s - eps * gamma
            return np.concatenate([-gamma, scale], axis=1)
        tri = -gamma[:, self._rows] * eps[:, self._cols]
        diag_vals = theta[d + self._diag]
        gi, ei = gamma, eps   # diagonal entries: rows == cols, in order 0..D−1
        if self.scale == "log":
            tri[:, self._diag] = -1.0 - np.exp(diag_vals) * gi * ei
        else:
            tri[:, self._diag] = -1.0 / diag_vals - gi * ei
        return np.concatenate([-gamma, tri], axis=1)

    def free_energy_gradient_of_entropy(self, theta: np.ndarray) -> np.ndarray:
        """−∇_θ H(q): the ε-free part of every per-draw gradient (zero on the location)."""
        if self.native:
            return -self.family.entropy_grad_np(theta)
        out = np.zeros(self.n_params)
        idx = self.scale_index()
        if self.scale == "log":
            out[idx] = -1.0
        else:
            out[idx] = -1.0 / np.asarray(theta, dtype=float)[idx]
        return out
