"""Jackknife signal-to-noise check of the stochastic gradient and the adaptive replication
factor (Regier, Jordan & McAuliffe 2017, §3.2; Efron & Stein 1981;
docs/algorithms.md#trustvi-gradient; follows the authors' code, which works with the squared
norm ‖∇L‖²).

With per-draw gradients ``G_i`` (n×p), ``S = Σ G_i`` and ``Q = Σ ‖G_i‖²``:

* ``θ̂ = (‖S‖² − Q)/(n(n−1)) = (1/(n(n−1))) Σ_{i≠j} G_iᵀG_j``, a U-statistic, unbiased for
  ``‖E G‖²``;
* ``θ̂_(i) = (‖S‖² − 2G_iᵀS + 2‖G_i‖² − Q)/((n−1)(n−2))`` (the same statistic without draw i);
* ``v_jk = ((n−1)/n) Σ_i (θ̂_(i) − mean θ̂_(·))²``, ``sd = √v_jk``.

Everything is O(np): one pass for ``GS`` and the row norms, no leave-one-out loop.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["JackknifeResult", "jackknife_snr", "update_replication"]


class JackknifeResult(NamedTuple):
    """``theta_hat``: U-statistic estimate of ``‖∇L‖²``; ``sd``: its jackknife standard
    deviation ``√v_jk`` (docs/algorithms.md#trustvi-gradient)."""

    theta_hat: float
    sd: float
    noise: float = float("nan")  # tr(Σ̂)/n = ‖Ḡ‖² − θ̂: the Monte Carlo part of ‖ḡ‖²


def jackknife_snr(G: np.ndarray) -> JackknifeResult:
    """θ̂ and the jackknife standard deviation from per-draw gradients ``G`` (n×p)
    (docs/algorithms.md#trustvi-gradient).

    Numerically we use the equivalent centred forms: ``θ̂ = ‖Ḡ‖² − tr(Σ̂)/n`` with the unbiased
    sample covariance ``Σ̂``, and ``θ̂_(i) − mean θ̂_(·) = (2/((n−1)(n−2)))·(−(G_i − Ḡ)ᵀS +
    (‖G_i‖² − mean‖G‖²))``, which avoid cancelling the large constant ``‖S‖² − Q``. Requires
    ``n ≥ 3``.

    ``G`` may also be a factored matrix with a ``jackknife_moments()`` method returning
    ``(Ḡ, ‖G_i − Ḡ‖², (G_i − Ḡ)ᵀḠ)`` (e.g. the full-rank family's
    :class:`~stanvi.estimators.elbo.FullRankRows`, which never forms the n × P matrix); the
    statistics below need nothing else.
    """
    if hasattr(G, "jackknife_moments"):
        n = G.shape[0]
        if n < 3:
            raise ValueError(f"the jackknife needs n >= 3 draws, got {n}")
        mean, sq_c, gc_mean = G.jackknife_moments()
        return _from_moments(n, mean, sq_c, gc_mean)
    G = np.asarray(G, dtype=float)
    if G.ndim != 2:
        raise ValueError(f"G must be a 2-d (n, p) array, got shape {G.shape}")
    n = G.shape[0]
    if n < 3:
        raise ValueError(f"the jackknife needs n >= 3 draws, got {n}")
    mean = G.mean(axis=0)
    Gc = G - mean
    sq_c = np.einsum("ij,ij->i", Gc, Gc)  # ‖G_i − Ḡ‖²
    gc_mean = Gc @ mean
    return _from_moments(n, mean, sq_c, gc_mean)


def _from_moments(n: int, mean: np.ndarray, sq_c: np.ndarray,
                  gc_mean: np.ndarray) -> JackknifeResult:
    """The jackknife from Ḡ, ‖G_i − Ḡ‖² and (G_i − Ḡ)ᵀḠ (see :func:`jackknife_snr`)."""
    theta_hat = float(mean @ mean - sq_c.sum() / (n * (n - 1)))
    # ‖G_i‖² − mean‖G‖² = ‖G_i−Ḡ‖² + 2(G_i−Ḡ)ᵀḠ − mean‖G_j−Ḡ‖²   (centred, no cancellation)
    sq_dev = sq_c + 2.0 * gc_mean - sq_c.mean()
    dev = (2.0 / ((n - 1) * (n - 2))) * (sq_dev - n * gc_mean)  # (G_i−Ḡ)ᵀS = n (G_i−Ḡ)ᵀḠ
    v_jk = (n - 1) / n * float(dev @ dev)
    return JackknifeResult(theta_hat, float(np.sqrt(v_jk)), float(sq_c.sum() / (n * (n - 1))))


def update_replication(r: int, theta_hat: float, sd: float, r_max: int = 32, *,
                       noise: float | None = None, norm_test: float | None = None) -> int:
    """Replication-factor rule (docs/algorithms.md#trustvi-gradient).

    If ``θ̂ − sd < 0`` and ``r < r_max``: ``r ← 2r`` (capped at ``r_max``); else if
    ``θ̂ − 3sd > 0`` and ``r > 1``: ``r ← r/2``; otherwise keep ``r``. Non-finite inputs keep
    ``r``.

    ``norm_test = ν`` adds the norm test of Byrd, Chin, Nocedal & Wu (2012, "Sample size
    selection in optimization methods for machine learning", Eq. 3.3) on top [C]: the
    gradient's Monte Carlo noise ``tr(Σ̂)/n`` (``noise``) must not exceed ``ν²θ̂``, else ``r``
    doubles; ``r`` halves only when, after halving, it would still pass (``2·noise ≤ ν²θ̂``).
    The jackknife alone only asks whether ``‖∇L‖`` differs from 0; a gradient can pass it while
    its direction is mostly noise, and then the model overstates every step's gain.
    """
    r = int(r)
    fails_norm, passes_half = False, True
    if norm_test is not None and noise is not None and np.isfinite(noise):
        fails_norm = noise > norm_test ** 2 * theta_hat
        passes_half = 2.0 * noise <= norm_test ** 2 * theta_hat
    if (theta_hat - sd < 0 or fails_norm) and r < r_max:
        return min(2 * r, int(r_max))
    if theta_hat - 3.0 * sd > 0 and r > 1 and passes_half:
        return max(r // 2, 1)
    return r
