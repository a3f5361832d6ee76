"""Prediction at test inputs (docs/gp.md#prediction): latent mean φ*ᵀμ and variance ‖Cᵀφ*‖²,
chunked over test points and basis columns (O(m k) per point); the predictive distribution of
y*; metrics.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.gp.basis import InducingPoints
from stanvi.gp.families import VParams, dense_columns
from stanvi.gp.likelihoods import BernoulliLogit, Gaussian


class Prediction(NamedTuple):
    """mean, var_f: latent f* moments; var_y: Gaussian observation variance var_f + σ²
    (None otherwise); prob: p(y* = +1) for classification (None otherwise)."""

    mean: np.ndarray
    var_f: np.ndarray
    var_y: np.ndarray | None = None
    prob: np.ndarray | None = None


@partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _block(basis, col_chunk: int, m: int, k: int, arrays: dict, th: dict, mu_p, ld_p, L_p, ld_k,
           Xb, c0):
    """One (test rows × basis columns) block of :func:`latent_moments`: the partial sums of
    φ*ᵀμ, of the diagonal columns' Σ (φ*_r c_rr)², of φ*ᵀC[:, :k] and of ‖φ*‖².  Module-level,
    so that every prediction with the same basis and shapes reuses one compiled program."""
    cols = c0 + jnp.arange(col_chunk)
    P = basis.features(arrays, Xb, cols, th) * (cols < m)[None, :]
    mu_c = jax.lax.dynamic_slice(mu_p, (c0,), (col_chunk,))
    ld_c = jax.lax.dynamic_slice(ld_p, (c0,), (col_chunk,))
    mean = P @ mu_c
    diag = jnp.sum((P * (jnp.exp(ld_c) * (cols >= k))[None, :]) ** 2, axis=1)
    PC = jnp.zeros((Xb.shape[0], k))
    if k:
        L_c = jax.lax.dynamic_slice(L_p, (c0, 0), (col_chunk, k))
        PC = P @ dense_columns(cols, L_c, ld_k, k)
    return mean, diag, PC, jnp.sum(P * P, axis=1)


def latent_moments(model, params: VParams, theta: dict, Xs: np.ndarray, *,
                   col_chunk: int = 8192, row_chunk: int = 2048,
                   with_norm: bool = False):
    """(mean, var_f[, Σ_i φ*_i²]) at test inputs Xs (n*, d)."""
    mu, ld, L = (jnp.asarray(x) for x in params)
    m, k = L.shape
    Xs = np.asarray(Xs, dtype=float).reshape(-1, model.d)
    col_chunk = min(col_chunk, m)
    n_col = -(-m // col_chunk)
    pad = n_col * col_chunk - m
    mu_p = jnp.concatenate([mu, jnp.zeros(pad)])
    ld_p = jnp.concatenate([ld, jnp.zeros(pad)])
    L_p = jnp.concatenate([L, jnp.zeros((pad, k))])
    ld_k = ld[:k]
    th = {kk: jnp.asarray(v) for kk, v in theta.items()}
    args = (model.basis, col_chunk, m, k)

    means, vars_, norms = [], [], []
    for r0 in range(0, Xs.shape[0], row_chunk):
        Xb = jnp.asarray(Xs[r0:r0 + row_chunk])
        mean = jnp.zeros(Xb.shape[0])
        diag = jnp.zeros(Xb.shape[0])
        PC = jnp.zeros((Xb.shape[0], k))
        nrm = jnp.zeros(Xb.shape[0])
        for c in range(n_col):
            a, b, pc, nn = _block(*args, model.arrays, th, mu_p, ld_p, L_p, ld_k, Xb,
                                  c * col_chunk)
            mean, diag, PC, nrm = mean + a, diag + b, PC + pc, nrm + nn
        means.append(np.asarray(mean))
        vars_.append(np.asarray(diag + jnp.sum(PC * PC, axis=1)))
        norms.append(np.asarray(nrm))
    out = (np.concatenate(means), np.concatenate(vars_))
    return out + (np.concatenate(norms),) if with_norm else out


def predict(model, params: VParams, theta: dict, Xs, *, augment: bool = False) -> Prediction:
    """Predictive moments at Xs (docs/gp.md#prediction).  ``augment``: Prop 4's augmented latent
    variance k*ᵀΣk* + σ² k**² / (k*ᵀk* + σ² k**) (inducing points at Z = X, Gaussian likelihood
    only)."""
    lik = model.likelihood
    mean, var_f, norm2 = latent_moments(model, params, theta, Xs, with_norm=True)
    if augment:
        if not (isinstance(model.basis, InducingPoints) and model.basis.Z is None
                and isinstance(lik, Gaussian)):
            raise ValueError("augment=True needs inducing points at the training inputs "
                             "(Z = X) and a Gaussian likelihood (Prop 4)")
        s2 = float(np.exp(np.asarray(theta["log_noise"])))
        kss = np.asarray(model.basis.kernel.diag(jnp.asarray(np.asarray(Xs).reshape(-1, model.d)),
                                                 {k: jnp.asarray(v) for k, v in theta.items()}))
        var_f = var_f + s2 * kss ** 2 / (norm2 + s2 * kss)
    if isinstance(lik, Gaussian):
        return Prediction(mean, var_f, var_y=var_f + float(np.exp(np.asarray(theta["log_noise"]))))
    if isinstance(lik, BernoulliLogit):
        return Prediction(mean, var_f, prob=np.asarray(lik.prob(jnp.asarray(mean),
                                                                jnp.asarray(var_f))))
    return Prediction(mean, var_f)


def metrics(model, pred: Prediction, theta: dict, y) -> dict[str, float]:
    """Regression: RMSE, MAE and MNLP = mean −log p(y*|x*); classification: error rate
    (sign of the latent mean, the posterior median) and MNLP (docs/gp.md#prediction)."""
    lik = model.likelihood
    y = lik.check_y(np.asarray(y).reshape(-1))
    if y.shape != pred.mean.shape:
        raise ValueError(f"y has {y.shape[0]} values for {pred.mean.shape[0]} predictions")
    th = {k: jnp.asarray(v) for k, v in theta.items()}
    lp = np.asarray(lik.log_predictive(jnp.asarray(y), jnp.asarray(pred.mean),
                                       jnp.asarray(pred.var_f), th))
    out = {"mnlp": float(-np.mean(lp))}
    if lik.task == "classification":
        out["error_rate"] = float(np.mean(np.where(pred.mean >= 0, 1.0, -1.0) != y))
    else:
        out["rmse"] = float(np.sqrt(np.mean((y - pred.mean) ** 2)))
        out["mae"] = float(np.mean(np.abs(y - pred.mean)))
    return out
