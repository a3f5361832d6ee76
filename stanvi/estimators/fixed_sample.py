"""Fixed samples of base draws for sample-average ELBO objectives: moment matching, and drawing
a sample at which the model is finite together with the objective's values and mean gradient
there (docs/algorithms.md#trustvi-fixed).

With fixed base draws ε₁..ε_N the ELBO estimate L̂_N(λ) = (1/N) Σ_j ℓ(λ; ε_j) is a deterministic
smooth function of λ (the sample-average approximation, Shapiro, Dentcheva & Ruszczyński 2009,
ch. 5), whose maximizer is within O_p(N^{-1/2}) of the ELBO's.  Moment matching (Boyle, Broadie &
Glasserman 1997, §4.2) makes the sample's mean exactly 0 and its covariance exactly I: the ELBO
of a Gaussian log p depends on ε only through those moments, so its fixed-draw objective is then
exact, and for a near-Gaussian posterior most of the fixed-draw error goes.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from stanvi.estimators.elbo import GradientFailure, standard_normal, valid_draws
from stanvi.estimators.keys import fold_in


def moment_matched(eps: np.ndarray) -> np.ndarray:
    """The draws shifted and whitened to sample mean exactly 0 and sample covariance exactly I
    (needs N > D + 1; with fewer draws each coordinate is centred and scaled to unit variance,
    which matches the means and the marginal variances)."""
    eps = np.asarray(eps, dtype=float)
    n, dim = eps.shape
    if n < 2:
        return eps
    centred = eps - eps.mean(axis=0)
    if n > dim + 1:
        try:
            chol = np.linalg.cholesky(centred.T @ centred / n)
            return np.linalg.solve(chol, centred.T).T
        except np.linalg.LinAlgError:
            pass
    sd = np.sqrt(np.mean(centred * centred, axis=0))
    return centred / np.where(sd > 0, sd, 1.0)


def values_and_gradients(est, params, eps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ℓ(λ; ε_j) per draw (n,), ∇log p at the draws (n, D), and the mean ELBO gradient over
    the draws (P,) (NaN when a draw failed), from one batched gradient call: the family pulls
    the model's gradients back (:meth:`pullback_mean`, :mod:`stanvi.families.host_math`)."""
    values, g = est.values_and_model_grads(params, eps)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = est.family.pullback_mean(params, np.asarray(eps, dtype=float), g)
    return values, g, mean


class FixedSample(NamedTuple):
    """A fixed sample and the objective there: draws (n, D), ℓ per draw at the parameters it
    was drawn at, ∇log p at the draws (n, D), the mean ELBO gradient there (P,), and whether
    the draws are moment matched."""

    eps: np.ndarray
    values: np.ndarray
    model_grads: np.ndarray
    gradient: np.ndarray
    matched: bool


def finite(values: np.ndarray, gradient: np.ndarray) -> bool:
    """Every value and every gradient entry finite."""
    return bool(np.all(np.isfinite(values)) and np.all(np.isfinite(gradient)))


def draw_fixed_sample(est, params, key, n: int, max_drops: int, ledger) -> FixedSample:
    """n moment-matched base draws at which the model is finite at ``params``, with ℓ and the
    mean gradient there: n gradient evaluations, which the objective needs anyway.  Where the
    model fails at some draw: Stan's drop-and-redraw rule (:func:`valid_draws`, at most
    ``max_drops`` failures, raising :class:`GradientFailure`), then moment matching, kept only if
    the model is finite at every matched draw (else the screened draws as they are).  Every
    evaluation is charged to ``ledger`` (an :class:`~stanvi.methods.base.OracleLedger`): the
    sample's gradients as gradients, the failed attempts as redrawn gradients, the screening's
    log densities as screening."""
    dim = est.family.base_dim
    eps = moment_matched(standard_normal(key, n, dim))
    values, g, grad = values_and_gradients(est, params, eps)
    if finite(values, grad):
        ledger.gradient(n)
        return FixedSample(eps, values, g, grad, True)
    ledger.redrawn(n)
    try:
        screened, evaluated = valid_draws(est, params, fold_in(key, 1), n, max_drops)
    except GradientFailure as exc:
        ledger.screening(exc.evaluated)
        raise
    ledger.screening(evaluated)
    for candidate, matched in ((moment_matched(screened), True), (screened, False)):
        values, g, grad = values_and_gradients(est, params, candidate)
        if finite(values, grad):
            ledger.gradient(n)
            return FixedSample(candidate, values, g, grad, matched)
        ledger.redrawn(n)
    raise GradientFailure("the model's gradient failed at draws where its log density was "
                          "finite (a fixed sample could not be drawn)", 0)
