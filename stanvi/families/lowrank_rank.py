"""The low-rank family's rank, chosen from the Laplace Gaussian (docs/algorithms.md#lowrank-rank).

A column of B that the posterior's correlations do not need is (nearly) unidentified: the ELBO
is flat along it, some coordinate's variance moves into B with d_i → 0, and the trust region
crawls towards that boundary optimum for tens of thousands of evaluations
(docs/benchmarks.md#lowrank-boundary).  So the rank is the smallest k after which one more
column would not pay: on the Laplace Gaussian p̂ = N(m, H⁻¹), whose KL from the family's
nearest member (the reverse-KL fit of :mod:`stanvi.families.lowrank_start`) is the ELBO the
family gives up against p̂, greedily

    k = 1, 2, …:  stop at k when deficit(k) − deficit(k + 1) < ``min_gain`` (or k = max_rank),

with no model evaluation.  Rank k + 1 is fitted from rank k's (ω, B) with one more column, along
the eigenvector of the most negative eigenvalue of H − Σₖ⁻¹ (the direction along which adding
t² uuᵀ to Σₖ lowers ½ tr(HΣ) − ½ log det Σ, with t² = 1/uᵀHu − 1/uᵀΣₖ⁻¹u, the minimizer
along u), and, when that gains too little, also from the PPCA fit at rank k + 1 (the family's
own start), since the (ω, B) landscape is not convex and either can stall.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stanvi.families.lowrank import LowRank
from stanvi.families.lowrank_host import lower_trapezoidal
from stanvi.families.lowrank_start import gaussian_deficit, reverse_kl_params

#: A column that gains less than this many nats against the Laplace Gaussian is not added (the
#: fixed-sample certification's own tolerance is of this order; docs/algorithms.md#lowrank-rank).
MIN_GAIN = 0.05
#: The rank is chosen up to this dimension; above it the default rule min(10, ⌊D/2⌋) holds
#: (each candidate rank costs a reverse-KL fit, O(D²k) per L-BFGS iteration, and an eigh, O(D³)).
AUTO_RANK_MAX_DIM = 100


@dataclass(frozen=True)
class RankChoice:
    """The chosen ``rank`` and the deficits (nats) of ranks 1 … rank + 1 that decided it (the
    last is the column not added, absent when ``rank`` is the cap)."""

    rank: int
    deficits: tuple[float, ...]


def _inverse_covariance(omega: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Σ⁻¹ = Ψ⁻¹ − W C⁻¹ Wᵀ for Σ = diag(e^{2ω}) + BBᵀ (Woodbury), D × D, with C⁻¹Wᵀ by a
    solve: where a d_i collapses (posteriordb's mesquite, d = 5e-6 beside 33), the family's
    :meth:`~stanvi.families.lowrank_host.LowRankHostMath.precision_rows`, which multiplies by
    an explicit C⁻¹, is off by orders of magnitude (‖ΣΣ⁻¹ − I‖ ~ 1e3), this to rounding."""
    d2 = np.exp(2.0 * omega)
    W = B / d2[:, None]
    C = np.eye(B.shape[1]) + B.T @ W
    return np.diag(1.0 / d2) - W @ np.linalg.solve(C, W.T)


def _one_more_column(narrow: LowRank, wider: LowRank, mu: np.ndarray, H: np.ndarray,
                     params: np.ndarray) -> np.ndarray:
    """λ of ``wider`` (rank k + 1) from ``narrow``'s λ (rank k) with the column of the module
    docstring."""
    D = mu.size
    omega, B = params[D:2 * D], params[2 * D:].reshape(D, narrow.rank)
    inv = _inverse_covariance(omega, B)
    _, vecs = np.linalg.eigh(H - inv)
    u = vecs[:, 0]
    uhu, uiu = float(u @ H @ u), float(u @ inv @ u)
    t2 = max(1.0 / uhu - 1.0 / uiu, 1e-4 / uhu)
    start = wider.pack(mu, omega, lower_trapezoidal(np.column_stack([B, np.sqrt(t2) * u])))
    return reverse_kl_params(wider, mu, H, start)


def choose_rank(mu: np.ndarray, precision: np.ndarray, max_rank: int,
                min_gain: float = MIN_GAIN) -> RankChoice | None:
    """The rank of the module docstring for the Laplace Gaussian N(``mu``, ``precision``⁻¹),
    at most ``max_rank``; None where the precision is not positive definite (no Laplace
    Gaussian: the caller keeps its default)."""
    H = 0.5 * (np.asarray(precision, dtype=float) + np.asarray(precision, dtype=float).T)
    mu = np.asarray(mu, dtype=float)
    narrow = LowRank(mu.size, 1)
    params = narrow.laplace_starts(mu, H, 0.0)[0]
    first = gaussian_deficit(narrow, params, H)     # None: H is not positive definite
    if first is None:
        return None
    deficits = [first]
    while narrow.rank < max_rank:
        wider = LowRank(mu.size, narrow.rank + 1)
        candidate = _one_more_column(narrow, wider, mu, H, params)
        deficit = gaussian_deficit(wider, candidate, H)
        if deficit is None or deficits[-1] - deficit < min_gain:
            own = wider.laplace_starts(mu, H, 0.0)[0]
            own_deficit = gaussian_deficit(wider, own, H)
            if own_deficit is not None and (deficit is None or own_deficit < deficit):
                candidate, deficit = own, own_deficit
        if deficit is None:
            break
        deficits.append(deficit)
        if deficits[-2] - deficit < min_gain:
            break
        narrow, params = wider, candidate
    return RankChoice(narrow.rank, tuple(float(d) for d in deficits))
