"""The draws from q on which a fit's Pareto k̂ is computed: how many (S_diag,
:func:`diagnostic_draw_count`), and their log p and log q from one batched log-density call
(:func:`diagnostic_log_densities`), with the Gaussian families' affine map z = m + A ε taken in
NumPy.  Why k̂ needs its own, larger set of draws, and the verdict drawn from it:
:mod:`stanvi.diagnostics` (docs/algorithms.md#pareto-k).
"""

from __future__ import annotations

import math

import numpy as np

DIAG_MIN_DRAWS = 4000    # diagnostic draws: S_diag = max(draws, min(MAX, max(MIN, WORK // D)))
DIAG_MAX_DRAWS = 32000
DIAG_WORK = 64000


def diagnostic_draw_count(dim: int, n_output: int = 0) -> int:
    """S_diag = max(n_output, min(32000, max(4000, 64000 // D))): the number of draws from q on
    which k̂ is computed (:mod:`stanvi.diagnostics`: the GPD tail fit uses 3√S of them)."""
    by_dim = DIAG_WORK // max(int(dim), 1)
    return max(int(n_output), min(DIAG_MAX_DRAWS, max(DIAG_MIN_DRAWS, by_dim)))


def _cholesky(family, params) -> np.ndarray:
    """``family.cholesky(params)``: in NumPy where L's entries are λ's as they are (the 'stan'
    diagonal), else as one jitted program per (family, shape); not the dozen eager JAX
    operations that calling it on an array runs, each its own program to trace, lower and load
    in a new process (~0.2–0.3 s of a first full-rank fit, issue 8 part 3).  The same values:
    copies, gathers and selects are exact, and XLA's exp is the same fused or not."""
    if getattr(family, "diagonal", None) == "stan":  # L is λ's entries as they are: NumPy
        return family.lower_factor(params)
    import jax  # noqa: PLC0415

    try:
        hash(family)
    except TypeError:  # not a frozen family: call it as it is
        return np.asarray(family.cholesky(params), dtype=float)
    global _CHOLESKY_JIT  # noqa: PLW0603
    if _CHOLESKY_JIT is None:
        _CHOLESKY_JIT = jax.jit(lambda fam, p: fam.cholesky(p), static_argnums=0)
    return np.asarray(_CHOLESKY_JIT(family, params), dtype=float)


_CHOLESKY_JIT = None


def _affine_map(family, params):
    """(m, A, log|det A|) when the family's draws are z = m + A ε (the Gaussian families:
    mean-field A = diag(exp ω), returned as the vector exp ω; full-rank A = L); None otherwise.
    Mean-field splits the parameters in NumPy (no JAX operation to compile)."""
    if hasattr(family, "split") and getattr(family, "name", "") == "meanfield":
        mu, omega = (np.asarray(x, dtype=float)
                     for x in family.split(np.asarray(params, dtype=float)))
        return mu, np.exp(omega), float(np.sum(omega))  # A = diag(exp ω), kept as a vector
    if hasattr(family, "cholesky") and getattr(family, "name", "") == "fullrank":
        lower = _cholesky(family, params)
        mu = np.asarray(params, dtype=float)[: family.dim]
        return mu, lower, float(np.sum(np.log(np.abs(np.diag(lower)))))
    return None


def diagnostic_log_densities(fit, n_draws: int | None = None, seed: int | None = None):
    """log p, log q and the model's messages at S_diag fresh draws from the fit's q, drawn with
    a seed derived from ``fit.seed``: one batched log-density call (no gradients), plus log q.
    Returns None when the fit has no target to evaluate."""
    target, family = getattr(fit, "target", None), getattr(fit, "family", None)
    if target is None or family is None or not hasattr(target, "log_density"):
        return None
    import jax.numpy as jnp  # noqa: PLC0415

    dim = int(family.dim)
    n = diagnostic_draw_count(dim, len(fit.log_p)) if n_draws is None else int(n_draws)
    rng = np.random.default_rng([int(fit.seed if seed is None else seed), 0x5D1A6])
    eps = rng.standard_normal((n, dim))
    affine = _affine_map(family, np.asarray(fit.params, dtype=float))
    if affine is not None:
        # z = m + A ε with a fixed (m, A): log q(z) = log φ(ε) − log|det A| exactly, computed in
        # NumPy; no JAX function of a new (S, D) shape to compile on the first fit.
        m, a, log_det = affine
        z = m + (eps * a if a.ndim == 1 else eps @ a.T)
        log_q = -0.5 * np.einsum("ij,ij->i", eps, eps) - log_det - 0.5 * dim * math.log(2 * math.pi)
    else:
        params = jnp.asarray(fit.params)
        z = np.asarray(family.sample(params, jnp.asarray(eps)), dtype=float)
        log_q = np.asarray(family.log_q(params, jnp.asarray(z)), dtype=float)
    res = target.log_density(np.asarray(z, dtype=float))
    log_p = np.asarray(res.log_density, dtype=float)
    if res.ok is not None:
        log_p = np.where(np.asarray(res.ok, dtype=bool), log_p, -np.inf)
    return log_p, log_q, dict(res.messages or {})
