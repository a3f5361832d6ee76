"""The low-rank family's Laplace start by reverse KL (docs/algorithms.md#lowrank-start).

Given the precision H at the mode, the Laplace approximation is p̂ = N(m, H⁻¹); the member of
the family q = N(m, Σ), Σ = diag(e^{2ω}) + BBᵀ, that maximizes the ELBO against p̂ minimizes

    f(ω, B) = KL(q ‖ p̂) + const = ½ tr(HΣ) − ½ log det Σ,

with ∂f/∂Σ = ½(H − Σ⁻¹), so ∂f/∂B = (H − Σ⁻¹)B and ∂f/∂ω_i = (H − Σ⁻¹)_ii e^{2ω_i}.  For a
near-Gaussian posterior this is close to the family's ELBO optimum, where probabilistic PCA of
H⁻¹ (:meth:`LowRank.params_from_covariance`) keeps the marginal variances of H⁻¹ (too wide for
a q that must fit p in reverse KL, as the mean-field start's 1/√H_ii is narrower than √(H⁻¹)_ii).
It is minimized by L-BFGS from the PPCA fit, with no model evaluation: O(D²k) per function
evaluation through H B and Woodbury's identity.
"""

from __future__ import annotations

import numpy as np

from stanvi.families.lowrank_host import trapezoid_mask

#: L-BFGS iterations of the reverse-KL fit (no model evaluation, but O(D²k) each, and SciPy's
#: L-BFGS-B adds ~0.1 µs per variable per iteration: at D = 500, k = 10, 500 iterations took
#: 11 s on the loaded 2-core machine, 200 took 4 s and ended within 0.004 nats of them).  The
#: trust-region run after it is chaotic in the start (the ELBO is not concave in (ω, B)): on
#: posteriordb 500 made the nes regressions cheaper (nes1996 655 evaluations against 975) and
#: kidiq_with_mom_work's dearer (interaction_c2 9,345 against 1,010); the median evaluations
#: were 1,435 with 200 and 1,778 with 500 (docs/benchmarks.md#lowrank-deficit)
MAX_ITERS = 200


def _objective(x: np.ndarray, H: np.ndarray, diagH: np.ndarray, D: int, k: int,
               mask: np.ndarray) -> tuple[float, np.ndarray]:
    omega, B = x[:D], x[D:].reshape(D, k) * mask
    d2 = np.exp(2.0 * omega)
    W = B / d2[:, None]                                  # Ψ⁻¹B
    C = np.eye(k) + B.T @ W
    try:
        chol = np.linalg.cholesky(C)
    except np.linalg.LinAlgError:
        return np.inf, np.zeros_like(x)
    HB = H @ B
    trace = float(diagH @ d2 + np.sum(B * HB))
    logdet = float(np.sum(2.0 * omega) + 2.0 * np.sum(np.log(np.diagonal(chol))))
    f = 0.5 * (trace - logdet)
    T = np.linalg.solve(chol, W.T)                       # L⁻¹ WᵀΨ… (k × D)
    # Σ⁻¹ = Ψ⁻¹ − W C⁻¹ Wᵀ: its diagonal and Σ⁻¹B
    inv_diag = 1.0 / d2 - np.sum(T * T, axis=0)
    inv_B = W - T.T @ (T @ B)
    g_omega = (diagH - inv_diag) * d2
    g_B = ((HB - inv_B) * mask).ravel()
    return f, np.concatenate([g_omega, g_B])


def gaussian_deficit(family, params: np.ndarray, precision: np.ndarray) -> float | None:
    """KL(q ‖ N(μ, H⁻¹)) for the family member λ = ``params`` centred at μ (the Laplace start,
    whose mean is the mode): f(ω, B) − ½(D + log det H) with f of the module docstring, the
    ELBO that q gives up against the Laplace Gaussian on a posterior equal to it (what a fit
    from q can climb without the posterior being non-Gaussian; docs/algorithms.md#second-start).
    None where H is not positive definite."""
    D, k = family.dim, family.rank
    H = 0.5 * (np.asarray(precision, dtype=float) + np.asarray(precision, dtype=float).T)
    try:
        log_det_h = 2.0 * float(np.sum(np.log(np.diagonal(np.linalg.cholesky(H)))))
    except np.linalg.LinAlgError:
        return None
    f, _ = _objective(np.asarray(params, dtype=float)[D:], H, np.diagonal(H).copy(), D, k,
                      trapezoid_mask(D, k))
    deficit = f - 0.5 * (D + log_det_h)
    return float(max(deficit, 0.0)) if np.isfinite(deficit) else None


def reverse_kl_params(family, mu: np.ndarray, precision: np.ndarray,
                      start: np.ndarray) -> np.ndarray:
    """λ of the family member nearest N(μ, H⁻¹) in KL(q ‖ ·) (module docstring), by L-BFGS from
    ``start`` (λ with the same μ); ``start`` itself when the fit does not improve on it."""
    from scipy.optimize import minimize  # noqa: PLC0415 (0.6 s: not on `import stanvi`)

    D, k = family.dim, family.rank
    mask = trapezoid_mask(D, k)
    H = 0.5 * (precision + precision.T)
    diagH = np.diagonal(H).copy()
    x0 = np.asarray(start, dtype=float)[D:]
    f0, _ = _objective(x0, H, diagH, D, k, mask)
    res = minimize(_objective, x0, args=(H, diagH, D, k, mask), jac=True, method="L-BFGS-B",
                   options={"maxiter": MAX_ITERS, "ftol": 1e-14, "gtol": 1e-9})
    if not (np.isfinite(res.fun) and res.fun < f0 and np.all(np.isfinite(res.x))):
        return np.asarray(start, dtype=float)
    return family.pack(mu, res.x[:D], res.x[D:].reshape(D, k) * mask)
