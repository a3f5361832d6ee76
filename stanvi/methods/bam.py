"""BaM: batch and match (Cai, Modi, Pillaud-Vivien, Margossian, Gower, Blei & Saul, "Batch and
match: black-box variational inference with a score-based divergence", ICML 2024,
arXiv:2402.14758; docs/methods.md#bam).

BaM fits a full-rank Gaussian q = N(μ, Σ) by minimizing the score-based divergence
D(q; p) = E_q‖∇log q − ∇log p‖²_{Cov(q)} with a stochastic proximal-point method: each step
minimizes the batch estimate of D(q; p) plus 2/λ_t · KL(q_t ‖ q), and this subproblem has a closed
form for Gaussian q (the paper's Algorithm 1, its "batch" and "match" steps):

    batch:  z_b ~ q_t, g_b = ∇log p(z_b) (b = 1..B);  z̄, ḡ their means;
            C = (1/B) Σ_b (z_b − z̄)(z_b − z̄)ᵀ,   Γ = (1/B) Σ_b (g_b − ḡ)(g_b − ḡ)ᵀ
    match:  U = λ_t Γ + λ_t/(1 + λ_t) ḡḡᵀ
            V = Σ_t + λ_t C + λ_t/(1 + λ_t) (μ_t − z̄)(μ_t − z̄)ᵀ
            Σ_{t+1} = 2V (I + (I + 4UV)^{1/2})⁻¹
            μ_{t+1} = 1/(1 + λ_t) μ_t + λ_t/(1 + λ_t) (Σ_{t+1} ḡ + z̄)

Σ_{t+1} is the positive-definite root of the quadratic matrix equation Σ U Σ + Σ = V.  stanvi
computes it without the non-symmetric square root: with V = R Rᵀ (Cholesky) and
M = Rᵀ U R = Q diag(m) Qᵀ (symmetric, eigen-decomposed), (I + 4UV)^{1/2} = R⁻ᵀ (I + 4M)^{1/2} Rᵀ,
so Σ_{t+1} = R Q diag(2/(1 + √(1 + 4m))) Qᵀ Rᵀ — symmetric positive definite by construction.

The learning rate: λ_t = BD/(t + 1) for t = 0, 1, … (``schedule="decay"``, the paper's
experiments), or a constant (``schedule="constant"``); ``lr`` replaces BD.  A Gaussian target is a
fixed point of the update for every batch (Σ* U Σ* + Σ* = V and μ = μ* solve it when p = N(μ*, Σ*),
since then g_b = −Σ*⁻¹(z_b − μ*)), and the paper proves exponential convergence to it in the
limit of large batches.  The stopping rule and the handling of failed draws are
:mod:`stanvi.methods.score_vi`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stanvi.lazy_jax import jax
from stanvi.methods.base import MethodResult, RunContext
# the method-module contract (PROFILES … HOST_PATH, stanvi.methods) is the same for both score
# methods: score_vi's, re-exported (BaM alone also fits the low-rank family)
from stanvi.methods.bam_lowrank import PATCH_STEPS, LowRankCov, pbam_update
from stanvi.methods.score_vi import (DEFAULT_PROFILE, ESTIMATOR, HOST_PATH,  # noqa: F401
                                     PROFILES, ScoreOptions, batch_size, check_options,
                                     run_score_method)

#: full rank, and the diagonal-plus-low-rank family by pBaM (:mod:`stanvi.methods.bam_lowrank`)
FAMILIES_SUPPORTED = ("fullrank", "lowrank")


@dataclass(frozen=True)
class Options(ScoreOptions):
    """BaM options: those both score methods have
    (:class:`~stanvi.methods.score_vi.ScoreOptions`) and its own (docs/methods.md#bam;
    [P] the BaM paper, [R] the authors' code github.com/modichirag/GSM-VI ``gsmvi/bam.py``)."""

    schedule: str = "decay"           # λ_t = lr/(t+1) ('decay') [P] | lr ('constant') [P]
    lr: float | None = None           # None: lr = B·D, so λ_t = BD/(t+1) [P]
    patch_steps: int = PATCH_STEPS    # family='lowrank': EM iterations of pBaM's patch [R]

    def __post_init__(self) -> None:
        check_options("bam", self, {"schedule": ("decay", "constant"), "init": ("zero", "random"),
                                    "warm_start": ("none", "laplace")})
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"bam option lr must be positive, got {self.lr}")
        if self.patch_steps < 1:
            raise ValueError(f"bam option patch_steps must be at least 1, got {self.patch_steps}")


def learning_rate(o: Options, t: int, B: int, dim: int) -> float:
    """λ_t for iteration t = 0, 1, …: ``lr``/(t + 1) or ``lr``, with lr = B·D by default."""
    lr = float(B * dim) if o.lr is None else float(o.lr)
    return lr / (t + 1) if o.schedule == "decay" else lr


def bam_update(mu: np.ndarray, cov: np.ndarray, z: np.ndarray, g: np.ndarray,
               lam: float) -> tuple[np.ndarray, np.ndarray]:
    """One BaM step (module docstring; the paper's Algorithm 1) from the batch z (B, D) with
    scores g (B, D) and learning rate λ: returns (μ_{t+1}, Σ_{t+1})."""
    zbar, gbar = z.mean(axis=0), g.mean(axis=0)
    dz, dg = z - zbar, g - gbar
    n = z.shape[0]
    C = dz.T @ dz / n
    Gamma = dg.T @ dg / n
    w = lam / (1.0 + lam)
    r = mu - zbar
    U = lam * Gamma + w * np.outer(gbar, gbar)
    V = cov + lam * C + w * np.outer(r, r)
    V = 0.5 * (V + V.T)
    R = np.linalg.cholesky(V)
    M = R.T @ (0.5 * (U + U.T)) @ R
    m, Q = np.linalg.eigh(0.5 * (M + M.T))
    m = np.maximum(m, 0.0)          # M is positive semidefinite; clip rounding below zero
    F = R @ (Q * np.sqrt(2.0 / (1.0 + np.sqrt(1.0 + 4.0 * m))))
    cov_new = F @ F.T
    mu_new = (mu + lam * (cov_new @ gbar + zbar)) / (1.0 + lam)
    return mu_new, cov_new


def run(target, family, *, key: jax.Array, options: Options, context: RunContext) -> MethodResult:
    """Batch and match (module docstring) on the full-rank family, or batch, match and patch
    (:mod:`stanvi.methods.bam_lowrank`) on the low-rank one."""
    o = options
    B = batch_size(o.batch_size)

    def update(mu, cov, z, g, k):
        lam = learning_rate(o, k - 1, B, family.dim)
        try:
            if isinstance(cov, LowRankCov):
                mu_new, cov_new = pbam_update(mu, cov, z, g, lam, o.patch_steps)
            else:
                mu_new, cov_new = bam_update(mu, cov, z, g, lam)
        except np.linalg.LinAlgError:       # not positive definite: rejected by the loop
            mu_new, cov_new = mu, None
        return mu_new, cov_new, {"lr": lam}

    return run_score_method("bam", update, target, family, key=key, options=o,
                            context=context)
