"""JAX settings stanvi relies on: float64 everywhere (DESIGN.md) and the persistent compilation
cache, so a second fit of the same model does not compile its step functions again.

The cache lives under the stanvi cache root (``$STANVI_CACHE_DIR`` …/jax); set
``STANVI_JAX_CACHE=0`` to turn it off.  (JAX does not persist executables that contain host
callbacks, so for Stan targets it mainly saves the pure-JAX parts.)
"""

from __future__ import annotations

import os

import jax


def configure() -> None:
    jax.config.update("jax_enable_x64", True)
    if os.environ.get("STANVI_JAX_CACHE", "1") == "0":
        return
    from stanvi.stan.cache import cache_root  # noqa: PLC0415

    try:
        jax.config.update("jax_compilation_cache_dir", str(cache_root() / "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.05)
    except (AttributeError, OSError, ValueError):  # an older JAX or an unwritable cache
        pass
