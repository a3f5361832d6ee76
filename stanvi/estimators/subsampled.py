"""Doubly-stochastic gradient estimators of −ELBO for subsampled targets: the shared pieces, the
``naive`` estimator, and the registry that picks an estimator by name
(docs/jointcv.md#model to docs/jointcv.md#baselines; Wang, Geffner & Domke 2024).

Notation (docs/jointcv.md#model): the family q_w has parameters w (for the mean-field Gaussian
w = (μ, ω), σ = exp(ω); for the full-rank Gaussian w = (μ, L)), the reparameterization is
``z = T_w(ε) = μ + (T_w(ε) − μ)`` with ε ~ N(0, I), and the per-sample objective is
``f(w; n, ε) = k_n(T_w(ε)) − H(w)`` whose expectation over a uniform term n and ε is −ELBO(w).
Every estimator returns an unbiased estimate of ∇_w(−ELBO) (a minimizer's gradient) on a
minibatch ``idx`` of distinct term indices and base draws ``eps``: one row (d,) shared by the
batch (docs/jointcv.md#minibatches, the official code's default) or one row per term (b, d)
(``per_datum_eps``).

The control variates act on the μ-block only; every other block (ω, or L) is always the naive
estimator (docs/jointcv.md#surrogate: its closed-form expectation would need the Hessian
diagonal).

Estimators keep host-side state (NumPy tables) and call the target through
:class:`~stanvi.targets.subsampled.SubsampledTarget`, which counts every term gradient and HVP.
The order inside :meth:`SubsampledEstimator.gradient` is that of docs/jointcv.md#table: the
estimate uses the *old* table, then the table is updated with the *pre-step* parameters; the caller
then steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np



# ------------------------------------------------------------------------- family pieces
# The reparameterization is the family's (its NumPy pieces, stanvi.families.host_math); these
# turn its ELBO-gradient pullbacks (for g = ∇log p) into the −ELBO gradients of the terms
# k_n (g = −∇k_n), docs/jointcv.md#noise-sources.
def _host(family):
    if not hasattr(family, "pullback_rows_at"):
        raise TypeError(f"doubly-stochastic estimators support Gaussian families, not {family!r}")
    return family


def noise(family, params: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """T_w(ε) − μ for each row of ``eps`` (b, d): σ ⊙ ε (mean-field) or L ε (full-rank)."""
    return _host(family).noise_np(np.asarray(params, dtype=float), np.atleast_2d(eps))


def row_gradients(family, params_rows: np.ndarray, eps_rows: np.ndarray,
                  gz: np.ndarray) -> np.ndarray:
    """∇_w f(w_i; n_i, ε_i) per row (b, P), given gz_i = ∇k_{n_i}(T_{w_i}(ε_i)) (paper Eq. 4,
    docs/jointcv.md#noise-sources: ``∇_μ f = ∇k_n(z)``, ``∇_ω f = ∇k_n(z) ⊙ σ ⊙ ε − 1``; in
    general the pullback through z = T_w(ε) minus the entropy's gradient)."""
    return -_host(family).pullback_rows_at(params_rows, eps_rows, -gz)


def batch_gradient(family, params: np.ndarray, eps_rows: np.ndarray, gz: np.ndarray) -> np.ndarray:
    """The minibatch mean of :func:`row_gradients` at one w (the naive estimate,
    docs/jointcv.md#minibatches)."""
    return -_host(family).pullback_mean(np.asarray(params, dtype=float), eps_rows, -gz)


def _eps_rows(eps: np.ndarray, b: int) -> tuple[np.ndarray, bool]:
    """(ε per row (b, d), shared?) from a shared draw (d,) or per-term draws (b, d)."""
    eps = np.asarray(eps, dtype=float)
    if eps.ndim == 1:
        return np.broadcast_to(eps, (b, eps.shape[0])), True
    if eps.shape[0] != b:
        raise ValueError(f"per-term draws must have one row per term: {eps.shape} for b={b}")
    return eps, False


# ------------------------------------------------------------------------- estimators
class SubsampledEstimator:
    """Base class and the ``naive`` estimator (docs/jointcv.md#naive, paper Eq. 4): the minibatch
    mean of ∇f(w; n, ε) = ∇k_n(T_w(ε)) pulled back through the reparameterization, minus ∇H(w).
    Cost: one term gradient per term (at the shared point when ε is shared).

    Subclasses with a table (``uses_table``) are filled during the naive warm-up by
    :meth:`warmup_gradient` and :meth:`finish_warmup`, or at once by :meth:`start`."""

    name = "naive"
    uses_table = False

    def __init__(self, target, family, **_: Any) -> None:
        self.target = target
        self.family = family
        self.d = family.dim
        self.n = target.n_terms

    # table life cycle (no-ops here)
    def start(self, params: np.ndarray) -> None:
        """Before the first main iteration, when there was no warm-up."""

    def warmup_gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """A naive estimate during the warm-up epochs (docs/jointcv.md#table), recording table
        entries."""
        return SubsampledEstimator.gradient(self, params, idx, eps)

    def finish_warmup(self) -> None:
        """After the warm-up epochs."""

    def end_epoch(self) -> None:
        """After each epoch of the main loop (floating-point resynchronization,
        docs/jointcv.md#table)."""

    def base_gradients(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, bool]:
        """(gz (b, d), ε rows (b, d), shared?) with gz_n = ∇k_n(T_w(ε_n))."""
        params = np.asarray(params, dtype=float)
        eps_rows, shared = _eps_rows(eps, len(idx))
        if shared:
            z = params[: self.d] + noise(self.family, params, eps_rows[:1])[0]
        else:
            z = params[: self.d] + noise(self.family, params, eps_rows)
        return self.target.term_gradients(idx, z), eps_rows, shared

    def gradient(self, params: np.ndarray, idx: np.ndarray, eps: np.ndarray) -> np.ndarray:
        """The estimate of ∇_w(−ELBO) (P,) on terms ``idx`` and draws ``eps``."""
        gz, eps_rows, _ = self.base_gradients(params, idx, eps)
        return batch_gradient(self.family, params, eps_rows, gz)


Naive = SubsampledEstimator
