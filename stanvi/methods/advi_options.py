"""ADVI's options and profiles (docs/algorithms.md#advi-defaults, #advi-profiles): Stan's
defaults as ``stan``, what the TrustVI paper's code changed as ``paper``.  The markers are
:mod:`stanvi.methods.advi`'s: [S] Stan's source, [R] the TrustVI authors' code, [C] stanvi's
choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Options:
    """ADVI settings.  Defaults are Stan's ([S] ``services/experimental/advi/defaults.hpp``,
    CmdStan's ``variational`` method); the ``paper`` profile changes what [R] changed.

    Attributes:
        max_iterations: [S] ``iter`` = 10000, SGD iterations after adaptation.
        grad_samples: [S] 1 draw per gradient ([R]/paper: 256).
        elbo_samples: [S] 100 draws per ``calc_ELBO``.
        eta: [S] 1.0; the step-size scale, used only when ``adapt_engaged`` is False.
        adapt_engaged: [S] True: choose eta by the grid search of ``adapt_eta``.
        adapt_iter: [S] 50 SGD steps per trial eta.
        tol_rel_obj: [S] 0.01 ([R]/paper: 1e-4), relative ELBO tolerance.
        eval_elbo: [S] 100, iterations between ELBO checks.
        output_samples: [S] 1000 approximate-posterior draws (see :func:`output_draws`).
        init: initial mean when the caller gives none: 'random' = Stan's uniform(−2, 2) on the
            unconstrained scale ([S] ``services::util::initialize``, ``init_radius`` 2);
            'zero' = μ₀ = 0 ([R]'s TrustVI, used for all methods in the paper profile, docs/algorithms.md#advi-profiles).
        init_log_scale: [S] 0 (ω₀ = 0 / L₀ = I); [R] −1 (σ₀ = e⁻¹, set in [R]'s
            ``normal_meanfield(cont_params)``; applied to full-rank too as L₀ = e⁻¹ I [C]).
        elbo_before_loop: [S] False; [R] True: one ``calc_ELBO(q)`` before the SGD loop, so the
            first buffered relative change is a real change and a stop at iteration
            ``eval_elbo`` is possible (docs/algorithms.md#advi-profiles).
        output_check: [S] True: after the SGD loop, Stan's ``advi::run`` evaluates
            ``log_prob<false, true>`` at each of the ``output_samples`` output draws outside any
            try block, so one throwing draw ends the run with an error (see :func:`run`).
            False skips this (the draws' failures then only show in the fit's ``log_p__`` and
            diagnostics) [C].
        improper_check: stanvi's addition (issue P2-1c), default True: when the SGD phase ends
            ('converged' or 'max_iters'), or a gradient turns NaN, q is checked for an improper
            posterior (:func:`stanvi.methods.checks.divergence`: non-finite parameters or a
            runaway scale; :func:`stanvi.methods.checks.improper_direction`: the ELBO still rising
            as q is widened along its widest coordinates).  Stan's ADVI reports 'converged' on
            ``parameters { real x; } model { }`` (full-rank: the ELBO grows like log σ, so its
            relative change falls below ``tol_rel_obj``); here that run ends 'failed' with "the
            posterior may be improper" and Stan's status kept in ``info['sgd_status']``.  The
            widening probe runs only when the last three ELBO checks were increasing.
            False gives Stan's status.
    """

    max_iterations: int = 10000
    grad_samples: int = 1
    elbo_samples: int = 100
    eta: float = 1.0
    adapt_engaged: bool = True
    adapt_iter: int = 50
    tol_rel_obj: float = 0.01
    eval_elbo: int = 100
    output_samples: int = 1000
    init: str = "random"
    init_log_scale: float = 0.0
    elbo_before_loop: bool = False
    output_check: bool = True
    improper_check: bool = True

    def __post_init__(self) -> None:
        for name in ("max_iterations", "grad_samples", "elbo_samples", "adapt_iter", "eval_elbo",
                     "output_samples"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"advi option {name} must be a positive integer, got {value!r}")
        for name in ("eta", "tol_rel_obj"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"advi option {name} must be a positive number, got {value!r}")
        if self.init not in ("random", "zero"):
            raise ValueError(f"advi option init must be 'random' or 'zero', got {self.init!r}")
        if not math.isfinite(self.init_log_scale):
            raise ValueError(f"advi option init_log_scale must be finite, "
                             f"got {self.init_log_scale!r}")

    @property
    def cb_size(self) -> int:
        """Circular-buffer capacity ``int(max(0.1·max_iterations/eval_elbo, 2.0))`` [S]."""
        return int(max(0.1 * self.max_iterations / self.eval_elbo, 2.0))


PROFILES: dict[str, dict[str, Any]] = {
    # Stan's defaults (docs/algorithms.md#advi-defaults).
    "stan": {},
    # What [R] changed for the TrustVI paper's experiments (docs/algorithms.md#advi-profiles).
    "paper": {"grad_samples": 256, "tol_rel_obj": 1e-4, "init_log_scale": -1.0, "init": "zero",
              "elbo_before_loop": True},
}
DEFAULT_PROFILE = "stan"
