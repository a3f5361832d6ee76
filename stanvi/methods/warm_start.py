"""A Laplace warm start for variational methods: the mode of log p found by L-BFGS, and q's
scales from the Hessian there (stanvi's addition, docs/methods.md, "Why `default` changed").

Stan's initialization, uniform(−2, 2) on the unconstrained scale, is far from posteriors in raw
units (a regression on heights in cm: the initial ELBO is −3e9; a mean near 1,500: a hundred
nats short for every method tried).  Pathfinder (Zhang, Carpenter, Gelman & Vehtari 2022, JMLR
23(306), §2) starts from the L-BFGS path of log p for the same reason.  Here:

1. L-BFGS (scipy's L-BFGS-B, no bounds) maximizes log p from the initial point, at most
   ``max_iters`` iterations; one batched gradient call per evaluation.
2. The Hessian H at the end point, from D Hessian-vector products in one batched call.
3. q₀ = N(z*, diag(1/Λ_ii)) for mean-field (the mean-field optimum if p were Gaussian with
   precision Λ = −H; Bishop 2006, §10.1.2), N(z*, Λ⁻¹) for full rank.
4. A safeguard, since a mode need not exist or be representative (a funnel's density is
   unbounded at its neck): the ELBO of q₀ and of the method's own initial q are estimated on the
   same ``n_compare`` draws, and the warm start is kept only if it is higher.

Every evaluation is charged to the method's ledger (gradients, HVPs, log densities).
"""

from __future__ import annotations

import numpy as np
import jax

from stanvi.estimators.elbo import standard_normal
from stanvi.methods.base import OracleLedger


def _mean_elbo(est, params: np.ndarray, eps: np.ndarray) -> float:
    """The ELBO estimate on ``eps``; −inf if more than 10% of the draws fail (the failing ones
    are dropped otherwise, as Stan's calc_ELBO drops them)."""
    values = est.values(params, eps)
    finite = np.isfinite(values)
    if finite.mean() < 0.9:
        return -np.inf
    return float(values[finite].mean())


def laplace_start(target, family, est, mu0: np.ndarray, default_params: np.ndarray, *,
                  key: jax.Array, ledger: OracleLedger, log_scale0: float,
                  max_iters: int = 1000, n_compare: int = 64) -> tuple[np.ndarray, dict]:
    """The initial variational parameters: the Laplace start when its ELBO estimate beats
    ``default_params``' on common draws, else ``default_params`` (module docstring).  Returns
    the parameters and a record (``warm_start``: 'laplace' or 'default', with the reason)."""
    dim = family.dim

    def neg_log_p(z: np.ndarray) -> tuple[float, np.ndarray]:
        res = target.log_density_gradient(z[None, :])
        ledger.gradient(1)
        if not bool(res.ok[0]):
            return np.inf, np.zeros(dim)
        return -float(res.log_density[0]), -np.asarray(res.gradient[0], dtype=float)

    import scipy.optimize  # noqa: PLC0415 (~0.4 s: imported by the first fit that needs it)

    info: dict = {}
    try:
        opt = scipy.optimize.minimize(neg_log_p, np.asarray(mu0, dtype=float), jac=True,
                                      method="L-BFGS-B",
                                      options={"maxiter": max_iters, "maxfun": 2 * max_iters})
    except (ValueError, FloatingPointError) as exc:  # scipy rejects non-finite starting values
        return default_params, {"warm_start": "default", "warm_start_reason": str(exc)}
    info["laplace_iterations"] = int(opt.nit)
    z_star = np.asarray(opt.x, dtype=float)
    if not (np.all(np.isfinite(z_star)) and np.isfinite(opt.fun)):
        return default_params, {**info, "warm_start": "default",
                                "warm_start_reason": "L-BFGS ended at a non-finite point"}
    res = target.log_density_hvp(np.tile(z_star, (dim, 1)), np.eye(dim))
    ledger.hvp(1, dim)
    if res.hvp is None or not np.all(res.ok) or not np.all(np.isfinite(res.hvp)):
        return default_params, {**info, "warm_start": "default",
                                "warm_start_reason": "the Hessian at the mode is not finite"}
    precision = -0.5 * (res.hvp + res.hvp.T)
    laplace = family.params_from_precision(z_star, precision, log_scale0)
    eps = standard_normal(key, n_compare, dim)
    elbo_laplace = _mean_elbo(est, laplace, eps)
    elbo_default = _mean_elbo(est, default_params, eps)
    ledger.elbo_estimate(2 * n_compare)
    info.update(laplace_elbo=elbo_laplace, default_elbo=elbo_default)
    if elbo_laplace > elbo_default:
        return laplace, {**info, "warm_start": "laplace"}
    return default_params, {**info, "warm_start": "default",
                            "warm_start_reason": "the Laplace start's ELBO estimate was lower"}
