"""Can this approximation be trusted?  Pareto-smoothed importance sampling (PSIS) diagnostics of a
variational fit (Yao, Vehtari, Simpson & Gelman 2018, "Yes, but did it work?: evaluating
variational inference"; Vehtari, Simpson, Gelman, Yao & Gabry 2024, "Pareto smoothed importance
sampling").

The output draws z_s ~ q come with log p(z_s) and log q(z_s); the importance ratios
r_s = p(z_s)/q(z_s) have a right tail that a generalized Pareto distribution fits, and its shape
k̂ says how far q is from p where it matters:

* threshold τ(S) = min(1 − 1/log10(S), 0.7) for S draws (Vehtari et al. 2024; the value
  arviz-stats uses).  Above it, importance sampling with S draws is unreliable.
* verdict (Yao et al. 2018, §2.3, with their fixed 0.7 replaced by τ(S)):

  ====================  ==============================  =======================================
  ``good``              k̂ ≤ min(0.5, τ)                q is close to p: means, sds, quantiles
                                                        of q can be used as they are.
  ``use with care``     min(0.5, τ) < k̂ ≤ τ            q is not perfect but useful; PSIS-
                                                        reweighted estimates are reliable.
  ``unreliable``        k̂ > τ (or no finite ratio)     q misses mass p has (tails, funnels,
                                                        multimodality); do not trust its draws.
  ====================  ==============================  =======================================

  k̂ > 1 additionally means the ratios have no finite mean: even PSIS fails.

The smoothing uses arviz-stats' PSIS (``array_stats.psislw``), not a reimplementation.  The
effective sample size of the (smoothed, normalized) importance weights is 1/Σ w_s².
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

VERDICTS = ("good", "use with care", "unreliable")
GOOD_K = 0.5  # Yao et al. 2018: below 0.5 the approximation is close to the posterior
MIN_DRAWS = 25  # PSIS fits the largest S/5 ratios (for S ≤ 225) and needs at least 5 of them


def khat_threshold(n_draws: int) -> float:
    """The sample-size-dependent k̂ threshold min(1 − 1/log10(S), 0.7)."""
    if n_draws <= 10:
        return 0.0
    return min(1.0 - 1.0 / math.log10(n_draws), 0.7)


def verdict(khat: float, n_draws: int) -> str:
    """'good', 'use with care' or 'unreliable' for k̂ with S draws (bands: module docstring)."""
    tau = khat_threshold(n_draws)
    if np.isnan(khat) or khat == math.inf:
        return "unreliable"
    if khat <= min(GOOD_K, tau):
        return "good"
    if khat <= tau:
        return "use with care"
    return "unreliable"


def psis(log_ratios: np.ndarray) -> tuple[np.ndarray, float]:
    """Pareto-smoothed, normalized log importance weights and k̂ for log ratios log p − log q.

    Non-finite ratios (a draw where the model failed: log p = −inf or NaN) get weight zero.
    Constant ratios (q equal to p up to normalization) give uniform weights and k̂ = −inf;
    fewer than 25 finite ratios give raw weights and k̂ = NaN (no tail to fit).
    """
    from arviz_stats.base import array_stats  # noqa: PLC0415

    r = np.asarray(log_ratios, dtype=float).ravel()
    r = np.where(np.isnan(r), -np.inf, r)
    finite = np.isfinite(r)
    if np.any(r == np.inf):  # p/q infinite somewhere: the weights are meaningless
        lw = np.where(r == np.inf, 0.0, -np.inf)
        return lw - np.log(np.count_nonzero(r == np.inf)), math.inf
    if not finite.any():  # every draw failed: no weights at all
        return np.full(r.shape, -np.inf), math.inf
    if np.count_nonzero(finite) < MIN_DRAWS:  # too few for a tail fit (≥ 5 tail draws)
        lw = np.where(finite, r, -np.inf)
        return lw - np.logaddexp.reduce(lw[finite]), math.nan
    spread = np.ptp(r[finite])
    if spread <= 1e-12 * max(1.0, np.max(np.abs(r[finite]))) and finite.all():
        return np.full(r.shape, -np.log(r.size)), -math.inf
    # arviz-stats' psislw takes log-likelihood values and smooths the ratios exp(−value)
    # (its LOO convention), so pass −log_ratio.  Failed draws sit at the bottom of the ratios.
    shifted = np.where(finite, r, np.min(r[finite]) - 1e3)
    try:
        lw, k = array_stats.psislw(-shifted)
    except ValueError:  # the tail is flat: every tail ratio equal
        lw = shifted - np.logaddexp.reduce(shifted)
        k = -math.inf
    lw = np.where(finite, np.asarray(lw, dtype=float), -np.inf)
    lw = lw - np.logaddexp.reduce(lw[finite])
    return lw, float(k)


def importance_ess(log_weights: np.ndarray) -> float:
    """Effective sample size 1/Σ w² of normalized log weights."""
    lw = np.asarray(log_weights, dtype=float)
    lw = lw[np.isfinite(lw)]
    if lw.size == 0:
        return 0.0
    lw = lw - np.logaddexp.reduce(lw)
    return float(1.0 / np.sum(np.exp(2.0 * lw)))


def resample_indices(log_weights: np.ndarray, n: int | None = None, seed: int = 0) -> np.ndarray:
    """Stratified resampling (with replacement) of draws by their normalized weights: each of the
    n strata [i/n, (i+1)/n) contributes one uniform, which keeps the resample close to the
    weights (lower variance than multinomial resampling)."""
    lw = np.asarray(log_weights, dtype=float)
    w = np.exp(lw - np.logaddexp.reduce(lw[np.isfinite(lw)]))
    w = np.where(np.isfinite(w), w, 0.0)
    w = w / w.sum()
    n = lw.size if n is None else int(n)
    rng = np.random.default_rng(seed)
    u = (np.arange(n) + rng.uniform(size=n)) / n
    idx = np.searchsorted(np.cumsum(w), u, side="right")
    return np.minimum(idx, lw.size - 1)


@dataclass
class Diagnostics:
    """Diagnostics of one fit.

    Attributes:
        khat: Pareto k̂ of the importance ratios p/q (−inf when they are constant).
        threshold: τ(S) = min(1 − 1/log10 S, 0.7).
        verdict: 'good' | 'use with care' | 'unreliable' (see the module docstring).
        ess: effective sample size of the PSIS-smoothed importance weights; ``ess_raw``: of the
            raw weights.
        n_draws: S; ``n_failed``: draws whose log density was not finite.
        elbo, elbo_se: the ELBO estimated from the output draws (mean of log p − log q) and its
            Monte Carlo standard error.
        log_weights: normalized PSIS log weights (S,), for reweighting expectations;
            ``log_ratios``: the raw log p − log q (S,).
        status, message: how the method stopped.
        warnings: what a user should know before using the fit.
        resampled: when asked for, the PSIS-resampled draws (constrained, by variable name);
            ``resampled_indices`` says which output draws they are.
    """

    khat: float
    threshold: float
    verdict: str
    ess: float
    ess_raw: float
    n_draws: int
    n_failed: int
    elbo: float
    elbo_se: float
    log_weights: np.ndarray = field(repr=False)
    log_ratios: np.ndarray | None = field(default=None, repr=False)
    status: str = ""
    message: str = ""
    method: str = ""
    warnings: list[str] = field(default_factory=list)
    resampled: dict[str, np.ndarray] | None = field(default=None, repr=False)
    resampled_indices: np.ndarray | None = field(default=None, repr=False)

    @property
    def reliable(self) -> bool:
        """True unless the verdict is 'unreliable'."""
        return self.verdict != "unreliable"

    def weighted_mean(self, values: np.ndarray) -> np.ndarray:
        """PSIS-reweighted mean of per-draw values (S, ...) (Yao et al. 2018, §3)."""
        v = np.asarray(values, dtype=float)
        w = np.exp(self.log_weights)
        w = np.where(np.isfinite(w), w, 0.0)
        ok = np.isfinite(v).reshape(v.shape[0], -1).all(axis=1) & (w > 0)
        w = np.where(ok, w, 0.0)
        v = np.where(ok.reshape((-1,) + (1,) * (v.ndim - 1)), v, 0.0)
        return np.tensordot(w / w.sum(), v, axes=(0, 0))

    def _khat_text(self) -> str:
        return "-inf (constant ratios)" if self.khat == -math.inf else f"{self.khat:.2f}"

    def one_line(self) -> str:
        """A one-line verdict, as printed after a fit."""
        stop = self.status + (" (not converged)" if self.status in ("budget", "max_iters") else "")
        return (f"{self.method or 'fit'} {stop}: Pareto k-hat {self._khat_text()} "
                f"(threshold {self.threshold:.2f}) -> {self.verdict}; importance ESS "
                f"{self.ess:.0f}/{self.n_draws}")

    def to_dict(self) -> dict[str, Any]:
        return {"khat": self.khat, "threshold": self.threshold, "verdict": self.verdict,
                "ess": self.ess, "ess_raw": self.ess_raw, "n_draws": self.n_draws,
                "n_failed": self.n_failed, "elbo": self.elbo, "elbo_se": self.elbo_se,
                "status": self.status, "message": self.message, "method": self.method,
                "warnings": list(self.warnings)}

    def __str__(self) -> str:
        lines = [
            f"Pareto k-hat:     {self._khat_text()}   (threshold {self.threshold:.2f} for "
            f"S = {self.n_draws} draws)",
            f"verdict:          {self.verdict}   ({_VERDICT_TEXT[self.verdict]})",
            f"importance ESS:   {self.ess:.0f} of {self.n_draws} "
            f"({100.0 * self.ess / max(self.n_draws, 1):.0f}%; raw weights {self.ess_raw:.0f})",
            f"ELBO (draws):     {self.elbo:.6g} +/- {self.elbo_se:.2g}",
            f"stopped:          {self.status}" + (f": {self.message}" if self.message else ""),
        ]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


_VERDICT_TEXT = {
    "good": "k-hat <= 0.5: q is close to the posterior",
    "use with care": "q is usable, PSIS-reweighted estimates are reliable",
    "unreliable": "k-hat above the threshold: q misses posterior mass; do not trust it",
}


def compute(log_p: np.ndarray, log_q: np.ndarray, *, status: str = "", message: str = "",
            method: str = "") -> Diagnostics:
    """Diagnostics from log p and log q at draws from q."""
    log_p = np.asarray(log_p, dtype=float)
    log_q = np.asarray(log_q, dtype=float)
    r = log_p - log_q
    n = int(r.size)
    failed = ~np.isfinite(r)
    lw, k = psis(r)
    ess = importance_ess(lw)
    raw = np.where(np.isfinite(r), r, -np.inf)
    ess_raw = importance_ess(raw) if np.isfinite(raw).any() else 0.0
    fin = r[~failed]
    if failed.any():
        elbo, elbo_se = -math.inf, math.nan
    else:
        elbo = float(fin.mean())
        with np.errstate(over="ignore", invalid="ignore"):  # a diverged fit: report inf, no warning
            elbo_se = float(fin.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    tau = khat_threshold(n)
    v = verdict(k, n)
    warns: list[str] = []
    if status == "budget":
        warns.append("the method stopped because the oracle budget ran out, not because it "
                     "converged: the approximation may be far from the optimum")
    elif status == "max_iters":
        warns.append("the method stopped at its iteration limit, not because it converged: "
                     "the approximation may be far from the optimum")
    elif status == "failed":
        warns.append(f"the method failed ({message}); these draws come from its last good iterate")
    if failed.any():
        warns.append(f"{int(failed.sum())} of {n} draws have a non-finite log density (outside "
                     "the support, or the model threw there)")
    if np.isnan(k):
        warns.append(f"k-hat could not be estimated from {n - int(failed.sum())} usable draws "
                     "(PSIS needs more; use draws=1000 or more)")
    elif k > 1 and not failed.all():
        warns.append("k-hat > 1: the importance ratios have no finite mean; even PSIS-reweighted "
                     "estimates are not usable")
    elif v == "unreliable" and n < 1000 and k <= 0.7:
        warns.append(f"with only {n} draws the threshold is {tau:.2f}; more output draws "
                     "(draws=...) give a sharper diagnostic")
    return Diagnostics(khat=float(k), threshold=tau, verdict=v, ess=ess, ess_raw=ess_raw,
                       n_draws=n, n_failed=int(failed.sum()), elbo=elbo, elbo_se=elbo_se,
                       log_weights=lw, log_ratios=r, status=status, message=message, method=method,
                       warnings=warns)


def diagnose(fit, *, resample: bool = False, n_resample: int | None = None,
             seed: int | None = None) -> Diagnostics:
    """Diagnostics of a :class:`stanvi.Fit`; with ``resample=True`` also the PSIS-resampled
    draws (``Diagnostics.resampled``, constrained, by variable name)."""
    d = compute(fit.log_p, fit.log_q, status=fit.status, message=fit.message, method=fit.method)
    if resample and not np.isfinite(d.log_weights).any():
        d.warnings.append("no draw has a finite weight: nothing to resample")
    elif resample:
        idx = resample_indices(d.log_weights, n_resample,
                               seed=(fit.seed if seed is None else seed) + 7919)
        d.resampled_indices = idx
        d.resampled = {k: np.asarray(v)[idx] for k, v in fit.draws.items()}
        if d.verdict == "unreliable":
            d.warnings.append("resampled draws inherit the unreliability: with k-hat above the "
                              "threshold a few draws carry most of the weight")
    return d
