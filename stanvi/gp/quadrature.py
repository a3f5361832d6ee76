"""One-dimensional Gaussian expectations E_{z~N(0,1)}[h(a + s z)] for the site functions
(docs/gp.md#site-functions, and docs/gp.md#prediction for predictive probabilities).

* Gauss–Hermite with ``nodes`` nodes: E[h] = π^{-1/2} Σ_k w_k h(a + s √2 t_k).  Accurate for
  small s (GH-32: 1e-14 at s <= 1, GH-101: 3e-10 at s = 3, docs/gp.md#site-functions).
* For s > 2 the *split rule* (docs/gp.md#site-functions): h = (part with a Gaussian closed
  form) + (a bounded remainder that decays like e^{-|u|}), the remainder integrated in u over
  [−36, 0] and [0, 36] with 64-node Gauss–Legendre each (error <= 2e-12 for s >= 1).
"""

from __future__ import annotations

import math
from functools import lru_cache, partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import ndtr

_U_MAX = 36.0
SPLIT_ABOVE = 2.0  # s above which the split rule replaces Gauss–Hermite (docs/gp.md#site-functions)


@lru_cache(maxsize=None)
def hermite(nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Probabilists' form: (x_k, v_k) with E[h(z)] ≈ Σ v_k h(x_k), z ~ N(0, 1)."""
    t, w = np.polynomial.hermite.hermgauss(int(nodes))
    return math.sqrt(2.0) * t, w / math.sqrt(math.pi)


@lru_cache(maxsize=None)
def legendre_halves(nodes: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Nodes and weights covering [−36, 0] ∪ [0, 36] (Gauss–Legendre on each half)."""
    x, w = np.polynomial.legendre.leggauss(int(nodes))
    half = 0.5 * _U_MAX
    u = np.concatenate([half * (x - 1.0), half * (x + 1.0)])
    return u, np.concatenate([half * w, half * w])


def gh_expect(h, a: jax.Array, s: jax.Array, nodes: int) -> jax.Array:
    """E[h(a + s z)] by Gauss–Hermite (elementwise over a, s)."""
    x, v = hermite(nodes)
    u = a[..., None] + s[..., None] * jnp.asarray(x)
    return jnp.sum(h(u) * jnp.asarray(v), axis=-1)


def _normal_pdf(u, a, s):
    z = (u - a[..., None]) / s[..., None]
    return jnp.exp(-0.5 * z * z) / (s[..., None] * math.sqrt(2.0 * math.pi))


@partial(jax.jit, static_argnames=("nodes",))
def expected_log_sigmoid(a: jax.Array, s: jax.Array, nodes: int = 32) -> jax.Array:
    """E[log σ(a + s z)], z ~ N(0, 1): Gauss–Hermite for s <= 2, else the split
    log σ(u) = min(u, 0) − log1p(e^{−|u|}) with E[min(u, 0)] = a Φ(−a/s) − s φ(a/s) in closed form
    and the bounded remainder by Gauss–Legendre (docs/gp.md#site-functions)."""
    s = jnp.maximum(s, 1e-12)
    gh = gh_expect(jax.nn.log_sigmoid, a, jnp.minimum(s, SPLIT_ABOVE), nodes)
    sl = jnp.maximum(s, SPLIT_ABOVE)
    closed = a * ndtr(-a / sl) - sl * jnp.exp(-0.5 * (a / sl) ** 2) / math.sqrt(2.0 * math.pi)
    u, w = legendre_halves()
    u = jnp.asarray(u)
    rem = -jnp.sum(jnp.asarray(w) * jnp.log1p(jnp.exp(-jnp.abs(u))) * _normal_pdf(u, a, sl),
                   axis=-1)
    return jnp.where(s > SPLIT_ABOVE, closed + rem, gh)


@partial(jax.jit, static_argnames=("nodes",))
def expected_sigmoid(a: jax.Array, s: jax.Array, nodes: int = 32) -> jax.Array:
    """E[σ(a + s z)] (the logistic predictive p(y = 1), docs/gp.md#prediction), with the same
    hybrid rule: σ(u) = 1[u > 0] + (σ(u) − 1[u > 0]), E[1[u > 0]] = Φ(a/s)."""
    s = jnp.maximum(s, 1e-12)
    gh = gh_expect(jax.nn.sigmoid, a, jnp.minimum(s, SPLIT_ABOVE), nodes)
    sl = jnp.maximum(s, SPLIT_ABOVE)
    u, w = legendre_halves()
    u = jnp.asarray(u)
    r = jax.nn.sigmoid(u) - (u > 0)
    rem = jnp.sum(jnp.asarray(w) * r * _normal_pdf(u, a, sl), axis=-1)
    return jnp.where(s > SPLIT_ABOVE, ndtr(a / sl) + rem, gh)
