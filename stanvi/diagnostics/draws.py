"""The draws from q on which a fit's Pareto k̂ is computed: how many (S_diag,
:func:`diagnostic_draw_count`), and their log p and log q from one batched log-density call
(:func:`diagnostic_log_densities`), with the Gaussian families' draws and log q taken in NumPy
(:mod:`stanvi.families.host_math`).  Why k̂ needs its own, larger set of draws, and the verdict drawn from it:
:mod:`stanvi.diagnostics.report` (docs/algorithms.md#pareto-k).
"""

from __future__ import annotations

import numpy as np

DIAG_MIN_DRAWS = 4000    # diagnostic draws: S_diag = max(draws, min(MAX, max(MIN, WORK // D)))
DIAG_MAX_DRAWS = 32000
DIAG_WORK = 64000
#: The diagnostic draws are made and evaluated in blocks of at most this many numbers (rows × D).
CHUNK_ENTRIES = 1 << 24


def diagnostic_draw_count(dim: int, n_output: int = 0) -> int:
    """S_diag = max(n_output, min(32000, max(4000, 64000 // D))): the number of draws from q on
    which k̂ is computed (:mod:`stanvi.diagnostics.report`: the GPD tail fit uses 3√S of them)."""
    by_dim = DIAG_WORK // max(int(dim), 1)
    return max(int(n_output), min(DIAG_MAX_DRAWS, max(DIAG_MIN_DRAWS, by_dim)))


def diagnostic_log_densities(fit, n_draws: int | None = None, seed: int | None = None):
    """log p, log q and the model's messages at S_diag fresh draws from the fit's q, drawn with
    a seed derived from ``fit.seed``: one batched log-density call (no gradients), plus log q.
    Returns None when the fit has no target to evaluate."""
    target, family = getattr(fit, "target", None), getattr(fit, "family", None)
    if target is None or family is None or not hasattr(target, "log_density"):
        return None
    dim = int(family.dim)
    n = diagnostic_draw_count(dim, len(fit.log_p)) if n_draws is None else int(n_draws)
    rng = np.random.default_rng([int(fit.seed if seed is None else seed), 0x5D1A6])
    width = int(family.base_dim)
    params = np.asarray(fit.params, dtype=float)
    # in blocks of rows (the same draws: NumPy's generator fills row after row), so that memory
    # stays O(CHUNK_ENTRIES) at large D (S_diag = 4,000 draws of D = 50,000 are 1.6 GB an array)
    rows = max(1, CHUNK_ENTRIES // max(width, 1))
    log_p_parts, log_q_parts, messages = [], [], {}
    for start in range(0, n, rows):
        eps = rng.standard_normal((min(rows, n - start), width))
        lp, lq, msgs = _block(target, family, params, eps)
        log_p_parts.append(lp)
        log_q_parts.append(lq)
        messages.update({start + int(i): m for i, m in msgs.items()})
    log_p, log_q = np.concatenate(log_p_parts), np.concatenate(log_q_parts)
    return log_p, log_q, messages


def _block(target, family, params: np.ndarray, eps: np.ndarray):
    """log p, log q and the model's messages (by row) at the draws of one block ``eps``."""
    if hasattr(family, "log_q_eps_np"):
        # the Gaussian families' host math (stanvi.families.host_math): z = m + A ε and
        # log q(z) in NumPy, no JAX program to compile on a first fit
        z = family.sample_np(params, eps)
        log_q = family.log_q_eps_np(params, eps)
    else:
        import jax.numpy as jnp  # noqa: PLC0415

        z = np.asarray(family.sample(jnp.asarray(params), jnp.asarray(eps)), dtype=float)
        log_q = np.asarray(family.log_q(jnp.asarray(params), jnp.asarray(z)), dtype=float)
    res = target.log_density(np.asarray(z, dtype=float))
    log_p = np.asarray(res.log_density, dtype=float)
    if res.ok is not None:
        log_p = np.where(np.asarray(res.ok, dtype=bool), log_p, -np.inf)
    return log_p, log_q, dict(res.messages or {})
