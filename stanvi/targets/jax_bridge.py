"""The JAX bridge: a batched Target as a JAX-differentiable log density (docs/architecture.md#data-flow).

``log_density = jax_log_density(target)`` gives a function of one unconstrained point z (D,) that
``jax.jit``, ``jax.vmap``, ``jax.grad`` and ``jax.jvp(jax.grad(...))`` all work on:

* values come from ``jax.pure_callback`` with ``vmap_method="broadcast_all"``, so ``vmap`` over
  draws turns into ONE batched C++ call on a (B, D) array;
* first order: a ``custom_jvp`` whose rule calls the target's batched gradient (which also returns
  the value), so ``jax.grad`` costs one gradient call per draw;
* second order: the gradient is itself a ``custom_jvp`` function whose rule calls the target's
  Hessian-vector product (exact nested autodiff where the library has it), so
  ``jax.jvp(jax.grad(f), (z,), (v,))`` costs one HVP call per draw (the HVP call returns the
  value and gradient too).  That callback is a ``custom_vmap`` function: when only the tangent
  is batched (``jax.hessian``, ``jacfwd``), its rule evaluates the broadcast points and returns
  the value and gradient unbatched, as JAX requires of a primal output.

Failed rows come back as ``-inf`` values and NaN derivatives, as in the Target protocol.
Everything is float64 (``jax_enable_x64``, set by :mod:`stanvi.jax_config` when JAX is first
imported in a process that imported stanvi).

**Two ways into C++.**  For a :class:`~stanvi.targets.stan_target.StanTarget` the three calls
are XLA FFI custom calls (:mod:`stanvi.targets.jax_ffi`): XLA calls the model library's batched
entry points directly, with no Python on the way (~10 µs per call instead of ~340 µs); they
count draws and C++ time into ``target.counter`` and use ``target.threads`` and the target's HVP
method, exactly as the target's own methods do, so results are bit-identical.  Otherwise (any
other Target, ``backend="callback"``, ``$STANVI_JAX_BRIDGE=callback``, or when the FFI handlers
cannot be built) they are ``jax.pure_callback`` calls into the target's batched methods.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.custom_batching
import jax.numpy as jnp
import numpy as np

from stanvi.targets.base import Target


def _flatten(z: np.ndarray, dim: int) -> tuple[np.ndarray, tuple[int, ...]]:
    arr = np.asarray(z, dtype=np.float64)
    batch_shape = arr.shape[:-1]
    return np.ascontiguousarray(arr.reshape(-1, dim)), batch_shape


def _only_cpu_devices() -> bool:
    """True when JAX has no accelerator (every program is lowered for the CPU)."""
    return all(d.platform == "cpu" for d in jax.devices())


def jax_log_density(target: Target, backend: str | None = None
                    ) -> Callable[[jax.Array], jax.Array]:
    """``target``'s log density as a JAX function of one point (D,), batched under ``vmap``.

    ``backend``: ``"ffi"`` (XLA custom calls; StanTarget only, RuntimeError when unavailable),
    ``"callback"`` (``pure_callback``) or ``"auto"`` / None (``$STANVI_JAX_BRIDGE``, else FFI
    for a StanTarget when the handlers are available, else ``pure_callback``).
    """
    from stanvi.targets import jax_ffi  # noqa: PLC0415

    dim = target.dim
    state_address = getattr(target, "ffi_state_address", None)
    if state_address is None:
        if backend == "ffi":
            raise ValueError(f"the FFI bridge needs a StanTarget, not {type(target).__name__}")
        use_ffi = False
    else:
        use_ffi = jax_ffi.resolve_backend(backend) == "ffi"

    def value_cb(z):
        flat, batch = _flatten(z, dim)
        return target.log_density(flat).log_density.reshape(batch)

    def value_grad_cb(z):
        flat, batch = _flatten(z, dim)
        r = target.log_density_gradient(flat)
        return r.log_density.reshape(batch), r.gradient.reshape(*batch, dim)

    def hvp_cb(z, v):
        zf, batch = _flatten(z, dim)
        vf, _ = _flatten(np.broadcast_to(v, np.shape(z)), dim)
        r = target.log_density_hvp(zf, vf)
        return (r.log_density.reshape(batch), r.gradient.reshape(*batch, dim),
                r.hvp.reshape(*batch, dim))

    def shapes(z, *extra):
        scalar = jax.ShapeDtypeStruct(z.shape[:-1], jnp.float64)
        vector = jax.ShapeDtypeStruct(z.shape, jnp.float64)
        return (scalar, *([vector] * len(extra)))

    def cb_value(z):
        return jax.pure_callback(value_cb, shapes(z)[0], z, vmap_method="broadcast_all")

    def cb_value_grad(z):
        return jax.pure_callback(value_grad_cb, shapes(z, 1), z, vmap_method="broadcast_all")

    def cb_value_grad_hvp(z, v):
        return jax.pure_callback(hvp_cb, shapes(z, 1, 1), z, v)

    call_value, call_value_grad, call_value_grad_hvp = cb_value, cb_value_grad, cb_value_grad_hvp
    if use_ffi:
        ffi = jax_ffi.ffi_calls(state_address, owner=target)
        if _only_cpu_devices():
            call_value, call_value_grad, call_value_grad_hvp = ffi
        else:
            # The handlers are registered for the CPU only: a program lowered for an accelerator
            # takes the pure_callback branch (chosen when it is lowered, not at run time).
            def on_cpu(ffi_fn, cb_fn):
                return lambda *args: jax.lax.platform_dependent(*args, cpu=ffi_fn, default=cb_fn)

            call_value, call_value_grad, call_value_grad_hvp = (
                on_cpu(f, c) for f, c in zip(ffi, (cb_value, cb_value_grad, cb_value_grad_hvp)))

    @jax.custom_batching.custom_vmap
    def value_gradient_hvp(z, v):
        """(log p, gradient, H v) at points z (..., D); one batched HVP call."""
        return call_value_grad_hvp(z, v)

    @value_gradient_hvp.def_vmap
    def _value_gradient_hvp_vmap(axis_size, in_batched, z, v):
        z_batched, v_batched = in_batched
        if z_batched:
            v = v if v_batched else jnp.broadcast_to(v, z.shape)
            return value_gradient_hvp(z, v), (True, True, True)
        lp, g, hv = value_gradient_hvp(jnp.broadcast_to(z, (axis_size, *z.shape)), v)
        return (lp[0], g[0], hv), (False, False, True)

    @jax.custom_jvp
    def value_and_gradient(z):
        return call_value_grad(z)

    @value_and_gradient.defjvp
    def _value_and_gradient_jvp(primals, tangents):
        (z,), (v,) = primals, tangents
        lp, g, hv = value_gradient_hvp(z, v)
        return (lp, g), (jnp.sum(g * v, axis=-1), hv)

    @jax.custom_jvp
    def log_density(z):
        return call_value(z)

    @log_density.defjvp
    def _log_density_jvp(primals, tangents):
        (z,), (v,) = primals, tangents
        lp, g = value_and_gradient(z)
        return lp, jnp.sum(g * v, axis=-1)

    log_density.__doc__ = (f"log density of {target!r} at one unconstrained point (D={dim},), "
                           f"through {'XLA FFI' if use_ffi else 'pure_callback'}")
    log_density.backend = "ffi" if use_ffi else "callback"
    return log_density
