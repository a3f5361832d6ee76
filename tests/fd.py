"""Finite differences with an error estimate, for checking derivatives the library computes.

Derivatives use the fourth-order central stencil
    D(h) = [f(x - 2h) - 8 f(x - h) + 8 f(x + h) - f(x + 2h)] / (12 h),
whose truncation error is c h^4 f^(5) and whose rounding error is at most
(1 + 8 + 8 + 1) / 12 * e / h = 1.5 e / h, where e bounds the absolute error of each value of f.
A log density or a gradient component is a sum of many rounded terms, so e is a modest multiple
of u * max|f| (u = machine epsilon) rather than u * max|f| itself; we take e = 64 u max|f|, which
makes the rounding allowance 96 u max|f| / h (~3e-11 max|f| at h ~ 7e-4).
Evaluating the stencil at h and 2h gives the truncation error of D(h) as (D(2h) - D(h)) / 15
(the error scales as h^4, so D(2h) has 16x it).  The tolerance of a comparison is therefore

    tol = 96 u max|f| / h  +  2 |D(2h) - D(h)| / 15,

twice the Richardson estimate plus the rounding bound.  Callers additionally assert that this
tolerance is small relative to the derivative itself, so a model that is too rough for finite
differences fails loudly instead of passing with a meaningless tolerance.

h = u^(1/5) * max(1, |x|) balances the two error terms for the fourth-order stencil.
"""

from __future__ import annotations

import numpy as np

EPS = np.finfo(float).eps
OFFSETS = np.array([-2.0, -1.0, 1.0, 2.0])
WEIGHTS = np.array([1.0, -8.0, 8.0, -1.0]) / 12.0


def step(x: np.ndarray) -> float:
    return EPS ** 0.2 * max(1.0, float(np.max(np.abs(x))))


def directional(fun, x: np.ndarray, directions: np.ndarray):
    """Derivatives of the batched function ``fun`` ((B, D) -> (B, *out)) at x along each row of
    ``directions`` (K, D).  Returns (estimate (K, *out), tolerance (K, *out))."""
    x = np.asarray(x, dtype=float)
    directions = np.atleast_2d(directions)
    h = step(x) / np.maximum(1.0, np.linalg.norm(directions, axis=1))   # (K,)
    k = directions.shape[0]
    # rows: for each direction, for each scale (h, 2h), the four stencil points
    scales = np.array([1.0, 2.0])
    t = h[:, None, None] * scales[None, :, None] * OFFSETS[None, None, :]    # (K, 2, 4)
    pts = x[None, None, None, :] + t[..., None] * directions[:, None, None, :]
    vals = np.asarray(fun(pts.reshape(-1, x.size)))
    out_shape = vals.shape[1:]
    vals = vals.reshape(k, 2, 4, *out_shape)
    w = WEIGHTS.reshape((1, 1, 4) + (1,) * len(out_shape))
    hs = (h[:, None] * scales[None, :]).reshape((k, 2) + (1,) * len(out_shape))
    d = (vals * w).sum(axis=2) / hs                                           # (K, 2, *out)
    d_h, d_2h = d[:, 0], d[:, 1]
    scale = np.max(np.abs(vals), axis=(1, 2))                                 # (K, *out)
    hk = h.reshape((k,) + (1,) * len(out_shape))
    tol = 96 * EPS * scale / hk + 2 * np.abs(d_2h - d_h) / 15
    return d_h, tol


def gradient(log_density, x: np.ndarray):
    """FD gradient of a batched scalar function at x, with per-coordinate tolerances."""
    est, tol = directional(log_density, x, np.eye(x.size))
    return est, tol


def hvp(gradient_fun, x: np.ndarray, v: np.ndarray):
    """FD of a batched gradient function along v: H(x) v, with per-coordinate tolerances."""
    est, tol = directional(gradient_fun, x, v[None, :])
    return est[0], tol[0]
