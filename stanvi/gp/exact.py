"""``method="exact"``: the closed-form conjugate posterior of the weights for a Gaussian
likelihood and small m (docs/gp.md#methods, the test oracle):
Σ = (ΦᵀΦ/σ² + S)⁻¹, μ = Σ Φᵀy/σ²; the ELBO of q = N(μ, Σ) is the log evidence.
Cost O(n m² + m³) (Φ accumulated in row chunks, so n may be large)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from stanvi.errors import VIError
from stanvi.gp.families import FullCholesky, VParams
from stanvi.gp.likelihoods import Gaussian

MAX_M = 8000   # m beyond which an m × m Cholesky is not "small"


@dataclass(frozen=True)
class Options:
    """``row_chunk``: training rows per block when accumulating ΦᵀΦ."""

    row_chunk: int = 4096


def posterior(model, theta: dict | None = None, log_s=None, row_chunk: int = 4096):
    """(μ, lower Cholesky factor of Σ, log evidence)."""
    if not isinstance(model.likelihood, Gaussian):
        raise VIError(f"method 'exact' needs a Gaussian likelihood (conjugate); "
                      f"{model.likelihood.name} has no closed-form posterior: use method='qsgp'")
    if model.m > MAX_M:
        raise VIError(f"method 'exact' factorises an m × m matrix; m = {model.m} > {MAX_M}: "
                      "use method='qsgp'")
    theta = model.theta if theta is None else theta
    v = float(np.exp(np.asarray(theta["log_noise"])))
    G = np.zeros((model.m, model.m))
    b = np.zeros(model.m)
    for r0 in range(0, model.n, row_chunk):
        P = np.asarray(model.features(model.X[r0:r0 + row_chunk], theta=theta))
        G += P.T @ P
        b += P.T @ model.y[r0:r0 + row_chunk]
    S = np.asarray(model.precision_matrix(theta, log_s))
    A = G / v + S
    LA = np.linalg.cholesky(A)
    mu = np.linalg.solve(LA.T, np.linalg.solve(LA, b / v))
    # Σ = A⁻¹ = (LA⁻ᵀ)(LA⁻¹); a lower factor: C = chol(A⁻¹)
    inv_LA = np.linalg.solve(LA, np.eye(model.m))
    C = np.linalg.cholesky(inv_LA.T @ inv_LA)
    logdet_S = np.linalg.slogdet(S)[1]
    yy = float(model.y @ model.y)
    log_ev = 0.5 * (logdet_S - 2.0 * np.sum(np.log(np.diag(LA)))
                    - model.n * math.log(2 * math.pi * v) - yy / v + b @ mu / v)
    return mu, C, float(log_ev)


def run(model, family=None, *, seed: int = 0, options: Options | None = None, progress=False):
    from stanvi.gp.result import GPFit  # noqa: PLC0415

    options = options or Options()
    t0 = time.perf_counter()
    mu, C, log_ev = posterior(model, row_chunk=options.row_chunk)
    d = np.diag(C)
    L = np.tril(C, -1)
    params = VParams(mu, np.log(d), L)
    wall = time.perf_counter() - t0
    return GPFit(model=model, method="exact", family=FullCholesky(), params=params,
                 theta={k: np.asarray(v) for k, v in model.theta.items()}, log_s=None,
                 options=options, seed=seed,
                 trace=[{"iteration": 0, "elbo": log_ev, "wall_time": wall}],
                 status="converged", message="closed-form conjugate posterior",
                 wall_time=wall, info={"log_evidence": log_ev, "logdet_S": None})
