"""Sparse AdaGrad for the m-sized variational parameters and Adam for θ (docs/gp.md#training,
docs/gp.md#control-variates).

AdaGrad (Duchi et al. 2011) updates only the gathered entries: G_W += g²,
x_W −= lr g / √(G_W + 1e-10), scattered back with ``mode="drop"`` so padded indices (= m) are
ignored.  Adam or momentum on μ or C would break the control variate's incremental bookkeeping
(Prop 3), so they are used only for the hyperparameters.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ADAGRAD_EPS = 1e-10   # inside the square root (docs/gp.md#training)
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8   # Kingma & Ba (2015) defaults


def adagrad_sparse(x: jax.Array, G: jax.Array, W: jax.Array, x_W: jax.Array, g: jax.Array,
                   lr: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Update rows W of x (and its accumulator G) with gradient g of the gathered x_W;
    returns (x, G, x_W_new)."""
    G_W = G.at[W].get(mode="fill", fill_value=1.0) + g * g
    x_new = x_W - lr * g / jnp.sqrt(G_W + ADAGRAD_EPS)
    return x.at[W].set(x_new, mode="drop"), G.at[W].set(G_W, mode="drop"), x_new


def adam(theta: dict, grad: dict, m1: dict, m2: dict, t: jax.Array, lr: jax.Array,
         mask: dict) -> tuple[dict, dict, dict]:
    """One Adam step on the hyperparameters whose ``mask`` is 1 (the others unchanged)."""
    tf = t.astype(jnp.float64)
    m1 = jax.tree.map(lambda a, g: ADAM_B1 * a + (1 - ADAM_B1) * g, m1, grad)
    m2 = jax.tree.map(lambda a, g: ADAM_B2 * a + (1 - ADAM_B2) * g * g, m2, grad)
    c1 = 1.0 - ADAM_B1 ** tf
    c2 = 1.0 - ADAM_B2 ** tf
    new = jax.tree.map(lambda x, a, b, k: x - k * lr * (a / c1) / (jnp.sqrt(b / c2) + ADAM_EPS),
                       theta, m1, m2, mask)
    return new, m1, m2
