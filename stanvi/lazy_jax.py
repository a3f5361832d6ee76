"""JAX loaded when stanvi first uses it, not when stanvi is imported (docs/architecture.md#lazy-jax).

``import jax`` costs 0.6–1 s of a new process, most of what a new process that fits eight
schools spends (issue T3-1), and a Stan model fitted by TrustVI never calls JAX: its loop,
draws and algebra run on the host in NumPy (docs/algorithms.md#host-path).  So the modules that
``import stanvi`` loads take JAX from here::

    from stanvi.lazy_jax import jax, jnp, lax

These are stand-ins for the modules ``jax``, ``jax.numpy`` and ``jax.lax``: the first attribute
read (``jnp.sum``, ``jax.jit``) imports the real module, and the value is kept on the stand-in,
so later reads cost what a module's attribute costs.  A submodule not imported by its parent
(``jax.scipy``) is imported when it is read.  A decorator that must not load JAX when its
module is imported is :func:`jit`.  JAX's settings (float64, the compilation cache) are applied
when JAX is first imported, by whoever imports it (:func:`stanvi.jax_config.install`).

``tests/test_lazy_jax.py`` checks that ``import stanvi`` and a host-path fit of a Stan model
leave ``jax`` out of ``sys.modules``.
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Callable
from typing import Any


class LazyModule(types.ModuleType):
    """A stand-in for the module ``name``, imported on the first attribute read."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        module = importlib.import_module(self.__name__)
        try:
            value = getattr(module, attr)
        except AttributeError:
            try:
                value = importlib.import_module(f"{self.__name__}.{attr}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}"
                                     ) from None
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<stanvi.lazy_jax stand-in for {self.__name__!r}>"


jax = LazyModule("jax")
jnp = LazyModule("jax.numpy")
lax = LazyModule("jax.lax")


def jit(fun: Callable | None = None, /, **options: Any) -> Callable:
    """``jax.jit(fun, **options)``, built at the first call instead of at the definition:
    ``@jit`` and ``@jit(static_argnums=(1,))`` decorate a module-level function without
    importing JAX.  The compiled function is reached as ``wrapper.jitted``."""
    if fun is None:
        return functools.partial(jit, **options)

    @functools.wraps(fun)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        jitted = wrapper.__dict__.get("jitted")
        if jitted is None:
            jitted = wrapper.jitted = jax.jit(fun, **options)
        return jitted(*args, **kwargs)

    return wrapper
