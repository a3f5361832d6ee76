"""The ``inc`` estimator: SAGA applied per ε (docs/jointcv.md#inc; Wang, Geffner & Domke 2024,
Eq. 13), an incremental-gradient baseline that removes subsampling noise only:

    g = (1/|B|) Σ_{n∈B} [∇f(w; n, ε) − ∇f(wⁿ; n, ε)] + (1/N) Σ_m ∇f(wᵐ; m, ε)

for every block of w, with a table of the full variational parameters wᵐ per term.  The last
average depends on the fresh ε, so every iteration makes a full pass over all N terms at their
stored parameters (N + b term gradients): for small data only.  The table is filled by the
naive warm-up (the rows of B get the pre-step w) or set to w₀ at the start; each iteration
sets the rows of B to the pre-step w after the estimate.  Shared ε only.
"""

from __future__ import annotations

import numpy as np

from stanvi.estimators.subsampled import SubsampledEstimator, row_gradients


class Incremental(SubsampledEstimator):
    """``inc`` (docs/jointcv.md#inc)."""

    name = "inc"
    uses_table = True

    def __init__(self, target, family, **_) -> None:
        super().__init__(target, family)
        self.w_table = np.zeros((self.n, family.n_params))
        self.visited = np.zeros(self.n, dtype=bool)

    def start(self, params: np.ndarray) -> None:
        self.w_table[:] = np.asarray(params, dtype=float)
        self.visited[:] = True

    def warmup_gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        g = SubsampledEstimator.gradient(self, params, idx, eps)
        self.w_table[idx] = params
        self.visited[idx] = True
        return g

    def finish_warmup(self) -> None:
        if not self.visited.all():
            raise RuntimeError(f"{int((~self.visited).sum())} table rows were not filled by the "
                               "warm-up; run whole epochs")

    def gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        params = np.asarray(params, dtype=float)
        eps = np.asarray(eps, dtype=float)
        if eps.ndim != 1:
            raise ValueError("the inc estimator needs one ε shared by all terms (its full pass "
                             "averages over every term at the same ε)")
        d, n = self.d, self.n
        everyone = np.arange(n)
        eps_all = np.broadcast_to(eps, (n, eps.shape[0]))
        z_all = self.w_table[:, :d] + noise_rows(self.family, self.w_table, eps_all)
        g_all = row_gradients(self.family, self.w_table, eps_all,
                              self.target.term_gradients(everyone, z_all))
        gz, eps_rows, _ = self.base_gradients(params, idx, eps)
        g_cur = row_gradients(self.family, np.broadcast_to(params, (len(idx), len(params))),
                              eps_rows, gz)
        g = (g_cur - g_all[idx]).mean(axis=0) + g_all.mean(axis=0)
        self.w_table[idx] = params
        return g


def noise_rows(family, params_rows: np.ndarray, eps_rows: np.ndarray) -> np.ndarray:
    """T_{w_i}(ε_i) − μ_i for per-row parameters (the family's ``noise_rows_np``)."""
    if not hasattr(family, "noise_rows_np"):
        raise TypeError(f"doubly-stochastic estimators support Gaussian families, not {family!r}")
    return family.noise_rows_np(params_rows, eps_rows)
