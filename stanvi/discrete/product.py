"""A product of independent categoricals ``q(z) = Π_m q_m(z_m)`` with a non-separable objective
and a large joint space (docs/discrete.md#product-categoricals): the joint top-k by merging, and
draws from the remainder by rejection.

* :func:`joint_top_k`: exact, because a configuration whose prefix is not among the top-k
  prefixes is beaten by k configurations that share its suffix
  (docs/discrete.md#product-categoricals).  O(D·k²).
* :func:`remainder_by_rejection`: ``z ~ Π q_m`` until ``z ∉ C_k`` (expected 1/ε_k tries), capped
  at ``max_tries``; a capped draw is reported (``ok`` False) so the caller can drop its term
  (bias at most ε_k·|g|) and count it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax


def joint_top_k(log_probs_list, k: int) -> tuple[jax.Array, jax.Array]:
    """The k most probable joint configurations of ``Π_m q_m`` (``log_probs_list``: D arrays of
    shapes (K_m,)) as (joint log-probabilities (k',), assignments (k', D) int), best first, with
    ``k' = min(k, Π K_m)``; ties broken by ``lax.top_k`` (lower flattened index first)."""
    if k < 1:
        raise ValueError(f"k must be ≥ 1, got {k}")
    scores = jnp.zeros((1,))
    assign = jnp.zeros((1, 0), jnp.int32)
    for lp in log_probs_list:
        lp = jnp.asarray(lp)
        vals, ids = lax.top_k(lp, min(k, lp.shape[-1]))
        cand = (scores[:, None] + vals[None, :]).reshape(-1)
        keep = min(k, cand.shape[0])
        best, pos = lax.top_k(cand, keep)
        prefix, choice = pos // vals.shape[0], pos % vals.shape[0]
        assign = jnp.concatenate([assign[prefix], ids[choice][:, None].astype(jnp.int32)], 1)
        scores = best
    return scores, assign


def remainder_by_rejection(key: jax.Array, log_probs_list, top_assign: jax.Array,
                           max_tries: int = 1000) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One draw from ``Π q_m`` restricted to the configurations not in ``top_assign`` (k, D),
    by rejection inside ``lax.while_loop``.  Returns (z (D,), tries, ok): ``ok`` False when
    ``max_tries`` draws all fell in ``C_k`` (then z is the last, rejected, draw)."""
    lps = [jnp.asarray(lp) for lp in log_probs_list]

    def draw(key):
        keys = jax.random.split(key, len(lps))
        return jnp.stack([jax.random.categorical(kk, lp) for kk, lp in zip(keys, lps)]
                         ).astype(jnp.int32)

    def inside(z):
        return jnp.any(jnp.all(top_assign == z[None, :], axis=1))

    def cond(c):
        _, z, tries = c
        return inside(z) & (tries < max_tries)

    def body(c):
        key, _, tries = c
        key, sub = jax.random.split(key)
        return key, draw(sub), tries + 1

    key, sub = jax.random.split(key)
    _, z, tries = lax.while_loop(cond, body, (key, draw(sub), jnp.ones((), jnp.int32)))
    return z, tries, ~inside(z)
