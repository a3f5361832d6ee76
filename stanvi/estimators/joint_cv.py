"""The ``joint`` estimator: the joint control variate of Wang, Geffner & Domke (2024, Eq. 5),
in its SAGA form (a table, paper Alg. 1) and its SVRG form (a snapshot, Θ(d) memory, paper
App. B Alg. 2) (docs/jointcv.md#joint-estimator, docs/jointcv.md#svrg).

For a stored mean m, a stored scale s and a draw ε the per-term control-variate vector is

    c_n(m, s; ε) = ∇k_n(m) + ∇²k_n(m)(s ⊙ ε),   E_ε c_n(m, s; ε) = ∇k_n(m)

(the gradient of the second-order Taylor surrogate of k_n around m, docs/jointcv.md#surrogate,
with the sign of docs/jointcv.md#sign-fix), and the μ-block estimate on a minibatch B is

    g_μ = (1/|B|) Σ_{n∈B} [∇k_n(T_w(ε)) − c_n(μⁿ, sⁿ; ε)] + G,   G = (1/N) Σ_m ∇k_m(μᵐ),

unbiased because E_{B,ε} of the mean of c_n over B is G for any batch with inclusion
probability |B|/N.  The other blocks are naive (docs/jointcv.md#surrogate).  ``hvp_scale``:
``"table"`` uses sⁿ = exp(ωⁿ) stored with μⁿ (the paper; mean-field only), ``"current"`` the
current σ (or L for the full-rank family, docs/jointcv.md#full-rank) — both unbiased.
"""

from __future__ import annotations

import numpy as np

from stanvi.estimators.subsampled import SubsampledEstimator, batch_gradient, noise


def _hvp_scale(family, hvp_scale: str | None) -> str:
    """``None`` → ``"table"`` for mean-field (paper), ``"current"`` otherwise
    (docs/jointcv.md#full-rank)."""
    if hvp_scale is None:
        return "table" if getattr(family, "vector_scale", False) else "current"
    if hvp_scale not in ("table", "current"):
        raise ValueError(f"hvp_scale must be 'table' or 'current', got {hvp_scale!r}")
    if hvp_scale == "table" and not getattr(family, "vector_scale", False):
        raise ValueError("hvp_scale='table' stores a scale per term, which only the mean-field "
                         "family has (a full-rank L per term would cost N·d² numbers, "
                         "docs/jointcv.md#full-rank); use hvp_scale='current'")
    return hvp_scale


class JointSAGA(SubsampledEstimator):
    """The joint CV with a SAGA table (docs/jointcv.md#joint-estimator, docs/jointcv.md#table).

    State, one row per term n: μⁿ (``mu_table``), ωⁿ (``omega_table``, only with
    ``hvp_scale="table"``), gⁿ = ∇k_n(μⁿ) (``grad_table``, when ``cache_grads``; otherwise the
    gradient that comes with the HVP at μⁿ is used: our targets' HVP calls return it), and the
    running mean G (float64).  Each main iteration: the estimate with the old table and old G,
    then G += (g_new − gⁿ)/N and the rows of B are set to the pre-step w (g_new = ∇k_n(μ), one
    term gradient per term at the shared point μ).  Cost per term: 2 gradients + 1 HVP.

    ``surrogate_sign`` is −1 only in tests: the paper's App. F sign typo
    (docs/jointcv.md#sign-fix), which stays unbiased but increases the variance.
    """

    name = "joint"
    uses_table = True
    surrogate_sign = 1.0

    def __init__(self, target, family, *, hvp_scale: str | None = None,
                 cache_grads: bool = True, **_) -> None:
        super().__init__(target, family)
        self.hvp_scale = _hvp_scale(family, hvp_scale)
        self.cache_grads = bool(cache_grads)
        n, d = self.n, self.d
        self.mu_table = np.zeros((n, d))
        self.omega_table = np.zeros((n, d)) if self.hvp_scale == "table" else None
        # with cache_grads=False the gradients are still needed once, to form G at the end of
        # the warm-up; they are dropped then (finish_warmup)
        self.grad_table: np.ndarray | None = np.zeros((n, d))
        self.G = np.zeros(d)
        self.visited = np.zeros(n, dtype=bool)

    # -------------------------------------------------------------- table maintenance
    def _record(self, params: np.ndarray, idx: np.ndarray, g_new: np.ndarray) -> None:
        self.mu_table[idx] = params[: self.d]
        if self.omega_table is not None:
            self.omega_table[idx] = params[self.d: 2 * self.d]
        if self.grad_table is not None:
            self.grad_table[idx] = g_new
        self.visited[idx] = True

    def start(self, params: np.ndarray, chunk: int = 4096) -> None:
        """All rows at w and G their exact mean: a full pass of term gradients at μ (the
        alternative initialization of docs/jointcv.md#g-init), used when ``warmup_epochs=0``."""
        params = np.asarray(params, dtype=float)
        total = np.zeros(self.d)
        for lo in range(0, self.n, chunk):
            idx = np.arange(lo, min(lo + chunk, self.n))
            g = self.target.term_gradients(idx, params[: self.d])
            self._record(params, idx, g)
            total += g.sum(axis=0)
        self.G = total / self.n
        self._drop_cache()

    def warmup_gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """Naive estimate; the rows of B get the pre-step w and gⁿ = ∇k_n(μ)
        (docs/jointcv.md#table)."""
        params = np.asarray(params, dtype=float)
        g = SubsampledEstimator.gradient(self, params, idx, eps)
        self._record(params, idx, self.target.term_gradients(idx, params[: self.d]))
        return g

    def finish_warmup(self) -> None:
        """G = (1/N) Σ_m gᵐ over the *stored* entries (docs/jointcv.md#g-init: not at the
        current w).  Rows the warm-up never visited (only possible with a partial epoch) raise."""
        if not self.visited.all():
            raise RuntimeError(f"{int((~self.visited).sum())} table rows were not filled by the "
                               "warm-up; run whole epochs")
        self.G = self.grad_table.mean(axis=0)
        self._drop_cache()

    def _drop_cache(self) -> None:
        if not self.cache_grads:
            self.grad_table = None

    def end_epoch(self) -> None:
        """Re-set G to the table mean (no model calls; removes floating-point drift,
        docs/jointcv.md#table)."""
        if self.grad_table is not None:
            self.G = self.grad_table.mean(axis=0)

    # -------------------------------------------------------------- the estimate
    def _directions(self, params: np.ndarray, idx: np.ndarray, eps_rows: np.ndarray) -> np.ndarray:
        if self.hvp_scale == "table":
            return np.exp(self.omega_table[idx]) * eps_rows
        return noise(self.family, params, eps_rows)

    def gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        params = np.asarray(params, dtype=float)
        idx = np.asarray(idx)
        gz, eps_rows, _ = self.base_gradients(params, idx, eps)
        g = batch_gradient(self.family, params, eps_rows, gz)
        g_at_table, h = self.target.term_hvps(idx, self.mu_table[idx],
                                              self._directions(params, idx, eps_rows))
        g_old = self.grad_table[idx] if self.grad_table is not None else g_at_table
        sign = self.surrogate_sign
        g[: self.d] = (gz - sign * (g_old + h)).mean(axis=0) + sign * self.G
        # table and G with the pre-step w (after the estimate: docs/jointcv.md#table)
        g_new = self.target.term_gradients(idx, params[: self.d])
        self.G = self.G + (g_new - g_old).sum(axis=0) / self.n
        self._record(params, idx, g_new)
        return g

    def table_mean(self) -> np.ndarray:
        """(1/N) Σ_m ∇k_m(μᵐ), recomputed from the model (tests: the G invariant of
        docs/jointcv.md#table)."""
        return self.target.term_gradients(np.arange(self.n), self.mu_table).mean(axis=0)


class JointSVRG(SubsampledEstimator):
    """The joint CV in SVRG form (docs/jointcv.md#svrg; paper App. B, Alg. 2 with its two slips
    fixed, docs/jointcv.md#svrg-slips): a snapshot w̃ = (μ̃, ω̃) and ḡ = (1/N) Σ_m ∇k_m(μ̃) (one
    full-data gradient) refreshed every ``svrg_period`` calls (default: one epoch, ⌈N/b⌉
    iterations, set by the caller); the μ-block estimate is

        g_μ = (1/|B|) Σ_{n∈B} [∇k_n(T_w(ε)) − ∇k_n(μ̃) − ∇²k_n(μ̃)(s̃ ⊙ ε)] + ḡ

    with s̃ = σ̃ (``hvp_scale="table"``) or the current scale (``"current"``).  All CV HVPs of an
    iteration share the point μ̃; the gradient ∇k_n(μ̃) comes with them.  The snapshot is taken
    at the first call (the official code: no warm-up, snapshot at iteration 0).
    """

    name = "joint-svrg"
    uses_table = False

    def __init__(self, target, family, *, hvp_scale: str | None = None,
                 svrg_period: int | None = None, **_) -> None:
        super().__init__(target, family)
        self.hvp_scale = _hvp_scale(family, hvp_scale)
        if svrg_period is not None and svrg_period < 1:
            raise ValueError(f"svrg_period must be >= 1, got {svrg_period}")
        self.period = svrg_period
        self.calls = 0
        self.refreshes: list[int] = []   # the call numbers at which the snapshot was taken
        self.snapshot: np.ndarray | None = None
        self.g_bar = np.zeros(self.d)

    def refresh(self, params: np.ndarray) -> None:
        """w̃ ← w, ḡ ← (1/N) Σ_m ∇k_m(μ̃) = −∇log p(x, μ̃) (one full-data call)."""
        self.snapshot = np.array(params, dtype=float, copy=True)
        self.g_bar = self.target.full_gradient(self.snapshot[: self.d])
        self.refreshes.append(self.calls)

    def gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        params = np.asarray(params, dtype=float)
        if self.snapshot is None or (self.period is not None and self.calls % self.period == 0):
            self.refresh(params)
        self.calls += 1
        gz, eps_rows, _ = self.base_gradients(params, idx, eps)
        g = batch_gradient(self.family, params, eps_rows, gz)
        source = self.snapshot if self.hvp_scale == "table" else params
        directions = noise(self.family, source, eps_rows)
        g_snap, h = self.target.term_hvps(idx, self.snapshot[: self.d], directions)
        g[: self.d] = (gz - g_snap - h).mean(axis=0) + self.g_bar
        return g
