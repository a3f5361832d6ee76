"""The result of a fit's PSIS diagnostics (:class:`Diagnostics`): k̂, the verdict and the
reading of q's means, the importance weights, and how they are printed; computed by
:mod:`stanvi.diagnostics.report` (docs/diagnostics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stanvi.diagnostics.verdict import (MAX_FAILED_FRACTION, MEAN_SHIFT_LIMIT, MEANS_TEXT,
                                        NEWTON_STEP_LIMIT, VERDICT_TEXT, newton_figures,
                                        shift_figures)


@dataclass
class Diagnostics:
    """Diagnostics of one fit.

    Attributes:
        khat: Pareto k̂ of the importance ratios p/q (−inf when they are constant), computed on
            the S diagnostic draws; ``khat_se``: its standard error (1 + k̂)/√M.
        threshold: τ(S) = min(1 − 1/log10 S, 0.7).
        verdict: 'good' | 'use with care' | 'unreliable' (:mod:`stanvi.diagnostics.report`).
        ess: effective sample size of the PSIS-smoothed importance weights of the diagnostic
            draws; ``ess_raw``: of their raw weights.
        n_draws: S (diagnostic draws); ``n_failed``: of them, draws whose log density was not
            finite (outside the support, or the model threw); ``failed_fraction`` = n_failed/S;
            ``failure_message``: the model's most frequent message at those draws.
        n_output_draws: the fit's output draws, which ``log_weights`` refers to.
        elbo, elbo_se: the ELBO estimated from the diagnostic draws (mean of log p − log q) and
            its Monte Carlo standard error.
        log_weights: normalized PSIS log weights of the *output* draws (n_output_draws,), for
            reweighting and resampling them; ``log_ratios``: the raw log p − log q of the
            diagnostic draws (S,).
        status, message: how the method stopped.
        warnings: what a user should know before using the fit.
        resampled: when asked for, the PSIS-resampled draws (constrained, by variable name);
            ``resampled_indices`` says which output draws they are.
        borderline: k̂'s band was still open at the most draws (:mod:`stanvi.diagnostics.verdict`).
        mean_shift: the largest PSIS shift of q's mean over the unconstrained coordinates, in
            sds of q (NaN without the draws); ``mean_shift_at``: its coordinate; ``shifts``
            and ``sd_ratios``: per coordinate, the shift and the PSIS-weighted sd over q's.
        means: the reading of q's means alone, 'hold' | 'plausible' | 'doubtful'
            (:func:`stanvi.diagnostics.verdict.means_reading`; docs/diagnostics.md#means);
            ``newton_steps`` and ``newton_steps_se``: per coordinate, the Newton step of q's
            means in sds of q and its Monte Carlo standard error, which it is read from;
            ``newton_curvature``: the ELBO's curvature along that step in units of q's and its
            standard error (:func:`stanvi.diagnostics.verdict.newton_curvature`), where the
            draws' ε were kept; ``means_bound``: the bound the reading was decided on
            (:func:`stanvi.diagnostics.verdict.curved_upper`).
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
    khat_se: float = math.nan
    failed_fraction: float = 0.0
    failure_message: str = ""
    n_output_draws: int = 0
    status: str = ""
    message: str = ""
    method: str = ""
    warnings: list[str] = field(default_factory=list)
    resampled: dict[str, np.ndarray] | None = field(default=None, repr=False)
    resampled_indices: np.ndarray | None = field(default=None, repr=False)
    borderline: bool = False
    mean_shift: float = math.nan
    mean_shift_at: int = -1
    shifts: np.ndarray | None = field(default=None, repr=False)
    sd_ratios: np.ndarray | None = field(default=None, repr=False)
    means: str = "doubtful"
    newton_steps: np.ndarray | None = field(default=None, repr=False)
    newton_steps_se: np.ndarray | None = field(default=None, repr=False)
    newton_curvature: tuple[float, float] | None = None
    means_bound: float = math.nan

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
        if self.khat == -math.inf:
            return "-inf (constant ratios)"
        se = f" +/- {self.khat_se:.2f}" if np.isfinite(self.khat_se) else ""
        return f"{self.khat:.2f}{se}" + (" (borderline)" if self.borderline else "")

    def _newton_text(self) -> str:
        figures = newton_figures(self.newton_steps, self.newton_steps_se,
                                 curvature=self.newton_curvature)
        if not figures:
            return "nan"
        text = (f"{figures['newton_step_median']:.3g} sd of q (Newton's, median over coordinates; "
                f"largest {figures['newton_step_max']:.3g}), at most "
                f"{figures['newton_step_upper']:.3g} by its error")
        if "newton_curvature" in figures and figures["newton_step_upper_curved"] != \
                figures["newton_step_upper"]:
            text += (f"; along it the ELBO's curvature is {figures['newton_curvature']:.3g} "
                     f"times q's: at most {figures['newton_step_upper_curved']:.3g}")
        return text

    def _failed_text(self) -> str:
        msg = f' (model: "{self.failure_message}")' if self.failure_message else ""
        return (f"log p is -inf or the model throws at {100.0 * self.failed_fraction:.1f}% of "
                f"q's draws{msg}")

    def one_line(self) -> str:
        """A one-line verdict, as printed after a fit."""
        stop = self.status + (" (not converged)" if self.status in ("budget", "max_iters") else "")
        line = (f"{self.method or 'fit'} {stop}: Pareto k-hat {self._khat_text()} "
                f"(threshold {self.threshold:.2f}, {self.n_draws} draws) -> {self.verdict}"
                f"{'' if self.means == 'hold' else f' (means {self.means})'}; "
                f"importance ESS {self.ess:.0f}/{self.n_draws}")
        if self.mean_shift > MEAN_SHIFT_LIMIT:
            line += f"; PSIS moves q's mean by {self.mean_shift:.2f} of its sd"
        if self.n_failed:
            line += "; " + self._failed_text()
        return line

    def verdict_figures(self) -> dict[str, Any]:
        """What the verdict was decided from (a batch record keeps them: docs/diagnostics.md#checked)."""
        return {"n_draws": self.n_draws, "threshold": self.threshold,
                "borderline": self.borderline, "mean_shift": self.mean_shift,
                "failed_fraction": self.failed_fraction, "means": self.means,
                "means_bound": self.means_bound,
                **shift_figures(self.shifts, self.sd_ratios),
                **newton_figures(self.newton_steps, self.newton_steps_se, self.sd_ratios,
                                 self.newton_curvature)}

    def to_dict(self) -> dict[str, Any]:
        return {"khat": self.khat, "threshold": self.threshold, "verdict": self.verdict,
                "khat_se": self.khat_se, "ess": self.ess, "ess_raw": self.ess_raw,
                "n_draws": self.n_draws, "n_output_draws": self.n_output_draws,
                "n_failed": self.n_failed, "failed_fraction": self.failed_fraction,
                "failure_message": self.failure_message, "elbo": self.elbo, "elbo_se": self.elbo_se,
                "status": self.status, "message": self.message, "method": self.method,
                "borderline": self.borderline, "mean_shift": self.mean_shift,
                "mean_shift_at": self.mean_shift_at, "means": self.means,
                "warnings": list(self.warnings)}

    def __str__(self) -> str:
        lines = [
            f"Pareto k-hat:     {self._khat_text()}   (threshold {self.threshold:.2f} for "
            f"S = {self.n_draws} draws)",
            f"verdict:          {self.verdict}   ({VERDICT_TEXT[self.verdict]})",
            f"means:            {self.means}   ({MEANS_TEXT[self.means]})",
            f"failed draws:     {self.n_failed} of {self.n_draws} "
            f"({100.0 * self.failed_fraction:.2f}%; above {100 * MAX_FAILED_FRACTION:.0f}%: "
            f"unreliable)" + (f': "{self.failure_message}"' if self.failure_message else ""),
            f"importance ESS:   {self.ess:.0f} of {self.n_draws} "
            f"({100.0 * self.ess / max(self.n_draws, 1):.0f}%; raw weights {self.ess_raw:.0f})",
            f"mean shift:       {self.mean_shift:.3g} sd of q (PSIS-weighted mean against "
            f"q's; above {MEAN_SHIFT_LIMIT}: unreliable)",
            f"means' step:      {self._newton_text()} (above {NEWTON_STEP_LIMIT}: means "
            f"doubtful)",
            f"ELBO (draws):     {self.elbo:.6g} +/- {self.elbo_se:.2g}",
            f"stopped:          {self.status}" + (f": {self.message}" if self.message else ""),
        ]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)
