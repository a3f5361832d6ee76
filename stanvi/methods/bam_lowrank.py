"""pBaM: batch, match and patch — BaM on the diagonal-plus-low-rank family (Modi, Cai & Saul,
"Batch, match, and patch: low-rank approximations for score-based variational inference",
AISTATS 2025, arXiv:2410.22292; docs/methods.md#pbam).

q = N(μ, Ψ + ΛΛᵀ) with Ψ = diag(ψ) (D) and Λ (D × k), stored by the ``lowrank`` family as
ψ = e^{2ω} and Λ = B.  Each iteration is BaM's (:mod:`stanvi.methods.bam`: the batch z_b, g_b
and the closed-form "match" step) followed by a "patch" that brings the matched covariance back
into the family; nothing of size D × D is formed (O(D (k + B)²) time and O(D (k + B)) memory).

*Match, in low rank.*  With X = (z − z̄)ᵀ/√B and G = (g − ḡ)ᵀ/√B (D × B) and w = λ/(1 + λ), BaM's
U and V are U = Q Qᵀ and V = Ψ + R Rᵀ with

    Q = [√λ G, √w ḡ]                      (D × (B + 1)),
    R = [Λ, √λ X, √w (μ − z̄)]              (D × (k + B + 1)).

The root Σ' = 2V(I + (I + 4UV)^{1/2})⁻¹ of Σ U Σ + Σ = V is then (push-through identity, as the
authors' code ``gsmvi/pbam.py`` computes it)

    Σ' = V − (VQ) M⁻² (VQ)ᵀ,   M = ½ I + (¼ I + Qᵀ V Q)^{1/2}   ((B + 1) × (B + 1)),

(for one dimension: v − v²q²/M² = 2v/(1 + √(1 + 4q²v))), and μ' = (μ + λ(Σ' ḡ + z̄))/(1 + λ), as
BaM's.  Σ' = Ψ + R Rᵀ − P Pᵀ with P = VQ M⁻¹ is kept in that factored form.

*Patch.*  (Ψ', Λ') minimize KL(N(0, Σ') ‖ N(0, Ψ' + Λ'Λ'ᵀ)) — maximum-likelihood factor
analysis with "sample covariance" Σ' — by ``patch_steps`` EM iterations from the current
(Ψ, Λ) (Rubin & Thayer 1982; the paper's §3): with β = (I + ΛᵀΨ⁻¹Λ)⁻¹ΛᵀΨ⁻¹ (k × D),

    Λ ← Σ'βᵀ (I − βΛ + βΣ'βᵀ)⁻¹,   ψ ← max(diag(Σ') − rowsum(Λ ⊙ Σ'βᵀ), ψ_min).

Each EM iteration does not increase the KL; where Σ' is in the family (Σ' = Ψ* + Λ*Λ*ᵀ) and
the iteration starts there, it stays.  The authors' code runs 10 EM iterations per BaM step by
default (``niter_em=10``), as does stanvi (``patch_steps``); ψ_min = 1e-6 is theirs too
(``jitter``).  The family stores Λ lower trapezoidal: Λ' = L O (L lower trapezoidal, O
orthogonal, from the QR factorization of Λ'ᵀ) gives the same covariance, and L is stored.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from stanvi.families.lowrank_host import lower_trapezoidal

#: EM iterations of the patch per BaM step (the authors' ``niter_em`` default).
PATCH_STEPS = 10
#: The floor of ψ after a patch (the authors' ``jitter``).
PSI_FLOOR = 1e-6


class LowRankCov(NamedTuple):
    """Σ = diag(ψ) + Λ Λᵀ: ψ (D,), Λ (D, k)."""

    psi: np.ndarray
    lam: np.ndarray


class Matched(NamedTuple):
    """BaM's matched covariance Σ' = diag(ψ) + R Rᵀ − P Pᵀ in factored form."""

    psi: np.ndarray
    R: np.ndarray
    P: np.ndarray

    def times(self, A: np.ndarray) -> np.ndarray:
        """Σ' A for A (D,) or (D, m)."""
        psi = self.psi if A.ndim == 1 else self.psi[:, None]
        return psi * A + self.R @ (self.R.T @ A) - self.P @ (self.P.T @ A)

    def diagonal(self) -> np.ndarray:
        return self.psi + np.sum(self.R * self.R, axis=1) - np.sum(self.P * self.P, axis=1)

    def dense(self) -> np.ndarray:
        """The D × D matrix (tests and small D only)."""
        return np.diag(self.psi) + self.R @ self.R.T - self.P @ self.P.T


def _sym_sqrt(A: np.ndarray) -> np.ndarray:
    """The symmetric square root of a symmetric positive semidefinite matrix (eigenvalues below
    zero from rounding are clipped)."""
    vals, vecs = np.linalg.eigh(0.5 * (A + A.T))
    return (vecs * np.sqrt(np.maximum(vals, 0.0))) @ vecs.T


def match(mu: np.ndarray, cov: LowRankCov, z: np.ndarray, g: np.ndarray,
          lam: float) -> tuple[np.ndarray, Matched]:
    """BaM's match step in low rank (module docstring): (μ', Σ' factored)."""
    n = z.shape[0]
    zbar, gbar = z.mean(axis=0), g.mean(axis=0)
    X = (z - zbar).T / math.sqrt(n)
    G = (g - gbar).T / math.sqrt(n)
    w = lam / (1.0 + lam)
    Q = np.concatenate([math.sqrt(lam) * G, math.sqrt(w) * gbar[:, None]], axis=1)
    R = np.concatenate([cov.lam, math.sqrt(lam) * X, math.sqrt(w) * (mu - zbar)[:, None]],
                       axis=1)
    VQ = cov.psi[:, None] * Q + R @ (R.T @ Q)
    eye = np.eye(Q.shape[1])
    M = 0.5 * eye + _sym_sqrt(0.25 * eye + Q.T @ VQ)
    P = np.linalg.solve(M, VQ.T).T          # VQ M⁻¹ (M symmetric): P Pᵀ = VQ M⁻² (VQ)ᵀ
    matched = Matched(cov.psi, R, P)
    mu_new = (mu + lam * (matched.times(gbar) + zbar)) / (1.0 + lam)
    return mu_new, matched


def patch(S: Matched, start: LowRankCov, steps: int = PATCH_STEPS,
          psi_floor: float = PSI_FLOOR) -> LowRankCov:
    """``steps`` EM iterations of factor analysis of Σ' = S from ``start`` (module docstring)."""
    psi, lam = start.psi, start.lam
    k = lam.shape[1]
    diag_S = S.diagonal()
    eye = np.eye(k)
    for _ in range(steps):
        Wt = lam.T / psi                                   # ΛᵀΨ⁻¹ (k × D)
        beta = np.linalg.solve(eye + Wt @ lam, Wt)         # (I + ΛᵀΨ⁻¹Λ)⁻¹ΛᵀΨ⁻¹
        SBt = S.times(beta.T)                              # Σ'βᵀ (D × k)
        inner = eye - beta @ lam + beta @ SBt
        lam = np.linalg.solve(0.5 * (inner + inner.T), SBt.T).T
        psi = np.maximum(diag_S - np.sum(lam * SBt, axis=1), psi_floor)
    return LowRankCov(psi, lam)


def pbam_update(mu: np.ndarray, cov: LowRankCov, z: np.ndarray, g: np.ndarray, lam: float,
                patch_steps: int = PATCH_STEPS) -> tuple[np.ndarray, LowRankCov]:
    """One pBaM iteration: match (BaM's closed form, in low rank), then patch."""
    mu_new, matched = match(mu, cov, z, g, lam)
    return mu_new, patch(matched, cov, patch_steps)


def _woodbury_parts(cov: LowRankCov) -> tuple[np.ndarray, np.ndarray, float]:
    """(W = Ψ⁻¹Λ, the Cholesky factor of C = I + ΛᵀΨ⁻¹Λ, log det Σ)."""
    W = cov.lam / cov.psi[:, None]
    chol = np.linalg.cholesky(np.eye(cov.lam.shape[1]) + cov.lam.T @ W)
    logdet = float(np.sum(np.log(cov.psi)) + 2.0 * np.sum(np.log(np.diagonal(chol))))
    return W, chol, logdet


def lowrank_kl(mu1: np.ndarray, cov1: LowRankCov, mu0: np.ndarray, cov0: LowRankCov) -> float:
    """KL(N(μ₁, Σ₁) ‖ N(μ₀, Σ₀)) for Σ = diag(ψ) + ΛΛᵀ, by Woodbury and the determinant lemma
    in O(D k²) (the same formula as :func:`stanvi.methods.score_vi.gaussian_kl`); +inf when a
    covariance is not positive definite."""
    try:
        W0, chol0, logdet0 = _woodbury_parts(cov0)
        _, _, logdet1 = _woodbury_parts(cov1)
    except np.linalg.LinAlgError:
        return math.inf
    if not (np.all(cov0.psi > 0) and np.all(cov1.psi > 0)):
        return math.inf
    # Σ₀⁻¹ = Ψ₀⁻¹ − W₀ C₀⁻¹ W₀ᵀ
    T0 = np.linalg.solve(chol0, W0.T)                    # L₀⁻¹ W₀ᵀ (k × D)
    diag_inv = 1.0 / cov0.psi - np.sum(T0 * T0, axis=0)
    A = T0 @ cov1.lam                                    # L₀⁻¹ W₀ᵀ Λ₁
    trace = float(diag_inv @ cov1.psi + np.sum(cov1.lam ** 2 / cov0.psi[:, None]) - np.sum(A * A))
    d = mu1 - mu0
    td = T0 @ d
    quad = float(d @ (d / cov0.psi) - td @ td)
    kl = 0.5 * (trace - len(mu0) + quad + logdet0 - logdet1)
    return float(max(kl, 0.0)) if np.isfinite(kl) else math.inf


def valid(cov: LowRankCov) -> bool:
    """Finite, with ψ > 0 (then Σ is positive definite)."""
    return bool(np.all(np.isfinite(cov.psi)) and np.all(np.isfinite(cov.lam))
                and np.all(cov.psi > 0))


class LowRankMoments:
    """The score loop's view of the ``lowrank`` family (:mod:`stanvi.methods.score_vi`): q's
    covariance as :class:`LowRankCov`, base draws of width D + k."""

    def __init__(self, family) -> None:
        self.family = family

    def start(self, mu0: np.ndarray, log_scale0: float) -> tuple[np.ndarray, LowRankCov]:
        """(λ₀, Σ₀): e^{2·log_scale0} I plus the family's small B₀ (Λ = 0 is a fixed point of
        the patch, as B = 0 is a stationary point of the ELBO)."""
        params0 = self.family.initial_params(mu0, log_scale0)
        return params0, self.covariance(params0)

    def covariance(self, params: np.ndarray) -> LowRankCov:
        _, d, B = self.family.parts_np(params)
        return LowRankCov(d * d, B)

    def draw_map(self, params: np.ndarray, mu: np.ndarray, cov: LowRankCov):
        """(base-draw width, ε ↦ z)."""
        return self.family.base_dim, lambda eps: self.family.sample_np(params, eps)

    def checked(self, cov: LowRankCov) -> LowRankCov | None:
        return LowRankCov(cov.psi, lower_trapezoidal(cov.lam)) if valid(cov) else None

    kl = staticmethod(lowrank_kl)

    def params(self, mu: np.ndarray, cov: LowRankCov) -> np.ndarray:
        return self.family.pack(mu, 0.5 * np.log(cov.psi), cov.lam)
