"""Conjugate gradients for a Newton system B p = c given only the operator v ↦ Bv (Hessian-free
Newton, Martens 2010; docs/algorithms.md#hfsgvi), truncated at a relative residual, an
iteration limit, or negative curvature (Nocedal & Wright 2006, Algorithm 7.1).  The trust-region
variant of the same iteration is :func:`stanvi.optim.steihaug.solve_steihaug`."""

from __future__ import annotations

import numpy as np


def truncated_cg(hvp, c: np.ndarray, *, tol: float, maxiter: int) -> tuple[np.ndarray, int, str]:
    """Solve B p = c by CG from p = 0 (Nocedal & Wright Alg. 7.1).  Returns (p, HVPs used,
    status): 'converged', 'max_iter', 'negative_curvature' (p so far, or c at the first
    iteration) or 'non_finite'."""
    p = np.zeros_like(c)
    r = c.copy()
    d = r.copy()
    rr = float(r @ r)
    c_norm = np.sqrt(rr)
    if c_norm == 0.0:
        return p, 0, "converged"
    for i in range(maxiter):
        bd = hvp(d)
        if not np.all(np.isfinite(bd)):
            return p, i + 1, "non_finite"
        curvature = float(d @ bd)
        if curvature <= 0.0:
            return (c.copy() if i == 0 else p), i + 1, "negative_curvature"
        alpha = rr / curvature
        p = p + alpha * d
        r = r - alpha * bd
        rr_new = float(r @ r)
        if np.sqrt(rr_new) <= tol * c_norm:
            return p, i + 1, "converged"
        d = r + (rr_new / rr) * d
        rr = rr_new
    return p, maxiter, "max_iter"
