"""The JAX bridge: a batched Target as a JAX-differentiable log density (DESIGN.md, data flow).

``log_density = jax_log_density(target)`` gives a function of one unconstrained point z (D,) that
``jax.jit``, ``jax.vmap``, ``jax.grad`` and ``jax.jvp(jax.grad(...))`` all work on:

* values come from ``jax.pure_callback`` with ``vmap_method="broadcast_all"``, so ``vmap`` over
  draws turns into ONE batched C++ call on a (B, D) array;
* first order: a ``custom_jvp`` whose rule calls the target's batched gradient (which also returns
  the value), so ``jax.grad`` costs one gradient call per draw;
* second order: the gradient is itself a ``custom_jvp`` function whose rule calls the target's
  Hessian-vector product (exact nested autodiff where the library has it), so
  ``jax.jvp(jax.grad(f), (z,), (v,))`` costs one HVP call per draw.  The rule takes its primal
  outputs (value, gradient) from a separate callback on z alone, so that batching only the
  tangent (``jax.hessian``, ``jacfwd``) keeps the primal unbatched; that callback reuses the
  value and gradient the HVP call just computed at the same points instead of evaluating again.

Failed rows come back as ``-inf`` values and NaN derivatives, as in the Target protocol.
Everything is float64 (the bridge turns on ``jax_enable_x64``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.targets.base import Target

jax.config.update("jax_enable_x64", True)


def _flatten(z: np.ndarray, dim: int) -> tuple[np.ndarray, tuple[int, ...]]:
    arr = np.asarray(z, dtype=np.float64)
    batch_shape = arr.shape[:-1]
    return np.ascontiguousarray(arr.reshape(-1, dim)), batch_shape


def jax_log_density(target: Target) -> Callable[[jax.Array], jax.Array]:
    """``target``'s log density as a JAX function of one point (D,), batched under ``vmap``."""
    dim = target.dim

    def value_cb(z):
        flat, batch = _flatten(z, dim)
        return target.log_density(flat).log_density.reshape(batch)

    last_hvp = threading.local()  # (points' bytes, log density, gradient) of the last HVP call

    def value_grad_cb(z):
        flat, batch = _flatten(z, dim)
        hit = getattr(last_hvp, "value", None)
        if hit is not None and hit[0] == flat.tobytes():
            lp, g = hit[1], hit[2]
        else:
            r = target.log_density_gradient(flat)
            lp, g = r.log_density, r.gradient
        return lp.reshape(batch), g.reshape(*batch, dim)

    def hvp_cb(z, v):
        zf, batch = _flatten(z, dim)
        vf, _ = _flatten(np.broadcast_to(v, np.shape(z)), dim)
        r = target.log_density_hvp(zf, vf)
        last_hvp.value = (zf.tobytes(), r.log_density, r.gradient)
        return r.hvp.reshape(*batch, dim)

    def shapes(z, *extra):
        scalar = jax.ShapeDtypeStruct(z.shape[:-1], jnp.float64)
        vector = jax.ShapeDtypeStruct(z.shape, jnp.float64)
        return (scalar, *([vector] * len(extra)))

    @jax.custom_jvp
    def value_and_gradient(z):
        return jax.pure_callback(value_grad_cb, shapes(z, 1), z, vmap_method="broadcast_all")

    @value_and_gradient.defjvp
    def _value_and_gradient_jvp(primals, tangents):
        (z,), (v,) = primals, tangents
        hv = jax.pure_callback(hvp_cb, shapes(z, 1)[1], z, v, vmap_method="broadcast_all")
        lp, g = jax.pure_callback(value_grad_cb, shapes(z, 1), z, vmap_method="broadcast_all")
        return (lp, g), (jnp.sum(g * v, axis=-1), hv)

    @jax.custom_jvp
    def log_density(z):
        return jax.pure_callback(value_cb, shapes(z)[0], z, vmap_method="broadcast_all")

    @log_density.defjvp
    def _log_density_jvp(primals, tangents):
        (z,), (v,) = primals, tangents
        lp, g = value_and_gradient(z)
        return lp, jnp.sum(g * v, axis=-1)

    log_density.__doc__ = f"log density of {target!r} at one unconstrained point (D={dim},)"
    return log_density
