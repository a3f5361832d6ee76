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

import numpy as np

from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.stan_advi import GRAD_NAN, GRAD_OK, GRAD_RETRIES, stan_calc_grad
from stanvi.lazy_jax import jax, jnp, lax
from stanvi.methods.base import purpose_key
from stanvi.optim.step_size import stan_step

_CHUNK = 100                     # gradient steps per compiled call (static buffer length)
_HISTORY_BYTES = 128 * 2**20     # ... at most this much iterate history per call (issue 17)


def chunk_for(family) -> int:
    """Steps per compiled call: ``_CHUNK``, fewer when the (steps, P) iterate history would
    exceed ``_HISTORY_BYTES`` (full rank, D = 2,000: 8 steps, not 100 × 16 MB).  Chunk
    boundaries do not change results (tests/methods/test_advi.py)."""
    return max(1, min(_CHUNK, _HISTORY_BYTES // (8 * family.n_params)))


def steps_within_budget(context, scaled: float, per_step: float, n: int) -> int:
    """How many of the next n gradient steps run before the budget (``context``, a
    :class:`~stanvi.methods.base.RunContext`) is spent, the step that spends it included, from
    the ledger's ``scaled`` and ``per_step`` oracle units a step, mirroring the ledger's float
    accumulation (so a chunk ends at the step where ADVI's budget check stops the run)."""
    if context.max_oracle_calls is None:
        return n
    for i in range(1, n + 1):
        scaled += per_step
        if context.over_budget(scaled):
            return i
    return n


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


class _Carry(NamedTuple):
    """The compiled loop's state: ``i`` steps done, the iterate and step-size history after them,
    the per-step records (iterate after each step, why its gradient failed, dropped and evaluated
    gradient draws) and whether a gradient failed with absorb=False (the loop then stops)."""

    i: jax.Array
    params: jax.Array
    s: jax.Array
    history: jax.Array
    grad_failed: jax.Array
    drops: jax.Array
    evaluated: jax.Array
    fatal: jax.Array


def _build_kernel(family, log_density, n: int, chunk: int):
    n_params = family.n_params
    gradient = stan_calc_grad(family, log_density, n)

    def advance(params, s, k0, n_steps, t0, eta, key, absorb) -> _Carry:
        def cond(c: _Carry):
            return (c.i < n_steps) & ~c.fatal

        def body(c: _Carry) -> _Carry:
            g, kind, dropped, n_eval = gradient(c.params,
                                                purpose_key(key, t0 + c.i + 1, "gradient"))
            failed = kind != GRAD_OK
            fatal = failed & ~absorb
            new_params, new_s, _ = stan_step(c.params, c.s, jnp.where(failed, 0.0, g),
                                             k0 + c.i + 1, eta)
            params = jnp.where(fatal, c.params, new_params)
            return _Carry(i=jnp.where(fatal, c.i, c.i + 1), params=params,
                          s=jnp.where(fatal, c.s, new_s),
                          history=jnp.where(fatal, c.history, c.history.at[c.i].set(params)),
                          grad_failed=c.grad_failed.at[c.i].set(kind),
                          drops=c.drops.at[c.i].set(dropped),
                          evaluated=c.evaluated.at[c.i].set(n_eval), fatal=fatal)

        return lax.while_loop(cond, body, _Carry(
            i=jnp.zeros((), jnp.int32), params=params, s=s, history=jnp.zeros((chunk, n_params)),
            grad_failed=jnp.zeros(chunk, jnp.int32), drops=jnp.zeros(chunk, jnp.int32),
            evaluated=jnp.zeros(chunk, jnp.int32), fatal=jnp.zeros((), bool)))

    return jax.jit(advance)


_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kernel(estimator: ElboEstimator, grad_samples: int):
    """The compiled chunk for (estimator, grad_samples), cached weakly on the estimator."""
    per_estimator = _KERNELS.setdefault(estimator, {})
    size = chunk_for(estimator.family)
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
    if not 1 <= n_steps <= chunk_for(estimator.family):
        raise ValueError(f"n_steps must be in [1, {chunk_for(estimator.family)}], got {n_steps}")
    out = _kernel(estimator, grad_samples)(
        jnp.asarray(params, dtype=jnp.float64), jnp.asarray(s, dtype=jnp.float64),
        np.int32(k0), np.int32(n_steps), np.int32(t0), np.float64(eta), key, np.bool_(absorb))
    c = jax.device_get(out)
    n_done, fatal = int(c.i), bool(c.fatal)
    gfail, drops = np.asarray(c.grad_failed), np.asarray(c.drops)
    evaluated = np.asarray(c.evaluated)
    return ChunkResult(np.asarray(c.params), np.asarray(c.s), np.asarray(c.history)[:n_done],
                       gfail[:n_done], drops[:n_done], n_done, fatal,
                       int(gfail[n_done]) if fatal else GRAD_OK,
                       int(drops[n_done]) if fatal else 0,
                       int(evaluated[:n_done + int(fatal)].sum()))


def gradient_failure_message(family, kind: int, grad_samples: int) -> str:
    """Stan's message for a failed ``calc_grad`` ([S] ``normal_meanfield::calc_grad`` /
    ``normal_fullrank::calc_grad``; ``set_omega`` / ``set_L_chol`` for a NaN gradient)."""
    name = getattr(family, "stan_name", "normal_meanfield")
    if kind == GRAD_NAN:
        where = ("stan::variational::set_mu / set_L_chol" if name == "normal_fullrank" else
                 "stan::variational::normal_meanfield::set_mu / set_omega")
        return (f"{where}: the averaged ELBO gradient is nan, but must not be nan! (an "
                f"overflowing gradient: no draw was dropped, the result is NaN)")
    return (f"stan::variational::{name}::calc_grad: The number of dropped evaluations has "
            f"reached its maximum amount ({GRAD_RETRIES * grad_samples}). Your model may "
            f"be either severely ill-conditioned or misspecified.")
