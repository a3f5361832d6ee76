"""The ``cv`` estimator: the MC-only Taylor control variate of Miller et al. (2017), per datum at
the *current* w (docs/jointcv.md#cv; Wang, Geffner & Domke 2024, Eq. 9).

On the μ-block the closed-form expectation ``∇k_n(μ)`` cancels, leaving

    g_μ = (1/b) Σ_{n∈B} [∇k_n(T_w(ε)) − ∇²k_n(μ)(T_w(ε) − μ)],

one term gradient and one term HVP (at the shared point μ, direction σ⊙ε or Lε) per term; the
other blocks are naive.  Its variance has the subsampling floor V_n[∇f(w; n)] (Eq. 10).
"""

from __future__ import annotations

import numpy as np

from stanvi.estimators.subsampled import SubsampledEstimator, batch_gradient, noise


class TaylorCV(SubsampledEstimator):
    """``cv`` (docs/jointcv.md#cv)."""

    name = "cv"

    def gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        params = np.asarray(params, dtype=float)
        gz, eps_rows, _ = self.base_gradients(params, idx, eps)
        g = batch_gradient(self.family, params, eps_rows, gz)
        directions = noise(self.family, params, eps_rows)
        _, h = self.target.term_hvps(idx, params[: self.d], directions)
        g[: self.d] = (gz - h).mean(axis=0)
        return g
