"""Stan ADVI's SGD steps as compiled chunks (Kucukelbir et al. 2017, JMLR 18(14),
Algorithm 1; Stan's ``advi::stochastic_gradient_ascent``; docs/algorithms.md#advi), for
:mod:`stanvi.methods.advi`.

One compiled call does up to ``_CHUNK`` steps: Stan's gradient
(:func:`stanvi.estimators.stan_advi.stan_calc_grad`, drop-and-redraw inside JAX) and
Stan's step size (:func:`stanvi.optim.step_size.stan_step`), and returns every iterate, so the
Python side only does bookkeeping.  One compile per (estimator, grad_samples); the compiled
chunk is cached weakly per estimator.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.stan_advi import GRAD_NAN, GRAD_OK, GRAD_RETRIES, stan_calc_grad
from stanvi.families import FullRank
from stanvi.methods.base import purpose_key
from stanvi.optim.step_size import stan_step

_CHUNK = 100                     # gradient steps per compiled call (static buffer length)
_HISTORY_BYTES = 128 * 2**20     # ... at most this much iterate history per call (issue 17)


def _chunk_for(family) -> int:
    """Steps per compiled call: ``_CHUNK``, fewer when the (steps, P) iterate history would
    exceed ``_HISTORY_BYTES`` (full rank, D = 2,000: 8 steps, not 100 × 16 MB).  Chunk
    boundaries do not change results (tests/test_advi.py)."""
    return max(1, min(_CHUNK, _HISTORY_BYTES // (8 * family.n_params)))


class ChunkResult(NamedTuple):
    params: np.ndarray       # (P,) after the last completed step
    s: np.ndarray            # (P,) step-size history after the last completed step
    history: np.ndarray      # (n_done, P) iterate after each completed step
    grad_failed: np.ndarray  # (n_done,) int: GRAD_OK, or why the step's gradient failed (a zero
    #                          gradient was used): GRAD_DROP_LIMIT or GRAD_NAN
    drops: np.ndarray        # (n_done,) dropped gradient draws per step
    n_done: int
    fatal: bool              # a gradient failed with absorb=False; step n_done + 1 not taken
    fatal_kind: int = GRAD_OK    # why it failed (GRAD_DROP_LIMIT or GRAD_NAN)
    fatal_drops: int = 0         # draws the failed gradient dropped
    evaluated: int = 0           # gradient draws evaluated by the chunk (redraws, the failed one)


def _build_kernel(family, log_density, n: int, chunk: int):
    n_params = family.n_params
    gradient = stan_calc_grad(family, log_density, n)

    def advance(params, s, k0, n_steps, t0, eta, key, absorb):
        def cond(c):
            return (c[0] < n_steps) & ~c[7]

        def body(c):
            i, params, s, hist, gfail, drops, evaluated, _ = c
            g, kind, dropped, n_eval = gradient(params, purpose_key(key, t0 + i + 1, "gradient"))
            failed = kind != GRAD_OK
            fatal = failed & ~absorb
            new_params, new_s, _ = stan_step(params, s, jnp.where(failed, 0.0, g), k0 + i + 1, eta)
            params = jnp.where(fatal, params, new_params)
            s = jnp.where(fatal, s, new_s)
            hist = jnp.where(fatal, hist, hist.at[i].set(params))
            return (jnp.where(fatal, i, i + 1), params, s, hist,
                    gfail.at[i].set(kind), drops.at[i].set(dropped),
                    evaluated.at[i].set(n_eval), fatal)

        init = (jnp.zeros((), jnp.int32), params, s, jnp.zeros((chunk, n_params)),
                jnp.zeros(chunk, jnp.int32), jnp.zeros(chunk, jnp.int32),
                jnp.zeros(chunk, jnp.int32), jnp.zeros((), bool))
        i, params, s, hist, gfail, drops, evaluated, fatal = lax.while_loop(cond, body, init)
        return params, s, hist, gfail, drops, evaluated, i, fatal

    return jax.jit(advance)


_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kernel(estimator: ElboEstimator, grad_samples: int):
    """The compiled chunk for (estimator, grad_samples), cached weakly on the estimator."""
    per_estimator = _KERNELS.setdefault(estimator, {})
    size = _chunk_for(estimator.family)
    if (grad_samples, size) not in per_estimator:
        per_estimator[grad_samples, size] = _build_kernel(
            estimator.family, estimator.log_density, grad_samples, size)
    return per_estimator[grad_samples, size]


def advance(estimator: ElboEstimator, params, s, *, k0: int, n_steps: int, t0: int, eta: float,
            key: jax.Array, absorb: bool, grad_samples: int) -> ChunkResult:
    """Run gradient steps k = k0+1 … k0+n_steps (global iterations t0+1 …) of Stan's SGD (docs/algorithms.md#advi-step-size) with
    ``grad_samples`` draws per gradient (at most ``_CHUNK`` steps per call).

    ``absorb=True`` (adaptation): a failed gradient is a zero gradient.  ``absorb=False`` (SGD):
    stop at the first failed gradient (``fatal``) with the iterate before it.
    """
    if not 1 <= n_steps <= _chunk_for(estimator.family):
        raise ValueError(f"n_steps must be in [1, {_chunk_for(estimator.family)}], got {n_steps}")
    out = _kernel(estimator, grad_samples)(
        jnp.asarray(params, dtype=jnp.float64), jnp.asarray(s, dtype=jnp.float64),
        np.int32(k0), np.int32(n_steps), np.int32(t0), np.float64(eta), key, np.bool_(absorb))
    p, s, hist, gfail, drops, evaluated, n_done, fatal = jax.device_get(out)
    n_done, fatal = int(n_done), bool(fatal)
    gfail, drops, evaluated = np.asarray(gfail), np.asarray(drops), np.asarray(evaluated)
    return ChunkResult(np.asarray(p), np.asarray(s), np.asarray(hist)[:n_done], gfail[:n_done],
                       drops[:n_done], n_done, fatal,
                       int(gfail[n_done]) if fatal else GRAD_OK,
                       int(drops[n_done]) if fatal else 0,
                       int(evaluated[:n_done + int(fatal)].sum()))


# --------------------------------------------------------------------------------- run


def gradient_failure_message(family, kind: int, grad_samples: int) -> str:
    """Stan's message for a failed ``calc_grad`` ([S] ``normal_meanfield::calc_grad`` /
    ``normal_fullrank::calc_grad``; ``set_omega`` / ``set_L_chol`` for a NaN gradient)."""
    name = "normal_fullrank" if isinstance(family, FullRank) else "normal_meanfield"
    if kind == GRAD_NAN:
        where = ("stan::variational::set_mu / set_L_chol" if name == "normal_fullrank" else
                 "stan::variational::normal_meanfield::set_mu / set_omega")
        return (f"{where}: the averaged ELBO gradient is nan, but must not be nan! (an "
                f"overflowing gradient: no draw was dropped, the result is NaN)")
    return (f"stan::variational::{name}::calc_grad: The number of dropped evaluations has "
            f"reached its maximum amount ({GRAD_RETRIES * grad_samples}). Your model may "
            f"be either severely ill-conditioned or misspecified.")
