"""JAX settings stanvi relies on: float64 everywhere (docs/architecture.md#conventions) and JAX's persistent compilation
cache, so a new process (a script, a notebook kernel, a CLI call) that fits a model fitted before
loads its compiled step functions from disk instead of compiling them again.

The cache is on by default, in ``<stanvi cache root>/jax`` (``$STANVI_CACHE_DIR/jax``, default
``~/.cache/stanvi/jax``).  Turn it off with ``STANVI_JAX_CACHE=0`` in the environment (read
when JAX is first imported in a process that imported stanvi) or :func:`set_persistent_cache`
``(False)`` in the process; a cache directory the user already gave JAX
(``JAX_COMPILATION_CACHE_DIR`` or ``jax.config.update("jax_compilation_cache_dir", ...)``
before stanvi configures JAX) is kept.

What makes it effective (issue 8, part 3):

* every program is persisted, however quickly it compiled (``min_compile_time_secs = 0``; JAX's
  default of 1 s would skip all of a small model's step functions, which compile in 10–300 ms
  each but add up to seconds);
* JAX never persists a program containing a host callback (``jax.pure_callback``), so a Stan
  target is called through XLA FFI custom calls whose only attribute is the target's index in the
  handler's registry (:mod:`stanvi.targets.jax_ffi`), the same in every process; an address
  there would make every process's programs different and every lookup miss;
* batch shapes come from a small fixed set, so the same few programs serve every iteration, fit
  and process: TrustVI's sample sizes are powers of two, ADVI's are fixed options, and the output
  draws (any ``draws=``) and ``Fit.elbo``'s chunks are padded to powers of two
  (:func:`stanvi.estimators.elbo.bucket`).

JAX itself is imported when first used (:mod:`stanvi.lazy_jax`), not when stanvi is: importing
stanvi calls :func:`install`, which applies these settings at once if JAX is already imported, and
otherwise as soon as anyone imports it (stanvi, or the user's own ``import jax`` after
``import stanvi``), before any array is built (docs/architecture.md#lazy-jax).

The cache grows without bound (JAX's size limit rescans the whole directory on every write);
deleting the directory is always safe.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_VAR = "STANVI_JAX_CACHE"
MIN_COMPILE_TIME_SECS = 0.0

_state: dict[str, object] = {"ours": None}  # the directory stanvi set, None when it set none


def _env_enabled() -> bool:
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def default_cache_dir() -> Path:
    """``<stanvi cache root>/jax`` (the root honours ``$STANVI_CACHE_DIR``)."""
    from stanvi.stan.cache import cache_root  # noqa: PLC0415

    return cache_root() / "jax"


def set_persistent_cache(enabled: bool = True, directory: str | os.PathLike | None = None) -> None:
    """Turn JAX's persistent compilation cache on (in ``directory``, default
    :func:`default_cache_dir`) or off, for programs compiled from now on in this process."""
    import jax  # noqa: PLC0415
    from jax._src import compilation_cache  # noqa: PLC0415

    if not enabled:
        jax.config.update("jax_enable_compilation_cache", False)
        _state["ours"] = None
        compilation_cache.reset_cache()
        return
    path = Path(directory) if directory is not None else default_cache_dir()
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_SECS)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _state["ours"] = str(path)
    compilation_cache.reset_cache()  # the next compilation opens the cache at the new path


def persistent_cache_dir() -> str | None:
    """The directory JAX's persistent compilation cache uses now, or None when it is off."""
    import jax  # noqa: PLC0415

    if not jax.config.jax_enable_compilation_cache:
        return None
    return jax.config.jax_compilation_cache_dir


def configure() -> None:
    """float64, partitionable threefry, and the persistent compilation cache unless
    ``$STANVI_JAX_CACHE`` turns it off (run when JAX is first imported: :func:`install`)."""
    import jax  # noqa: PLC0415

    jax.config.update("jax_enable_x64", True)
    # each random entry's bits depend on its index alone, so a block's first rows are the smaller
    # draw (stanvi.estimators.elbo.standard_normal relies on it; JAX's default since 0.5)
    jax.config.update("jax_threefry_partitionable", True)
    if not _env_enabled():
        set_persistent_cache(False)
        return
    user_dir = jax.config.jax_compilation_cache_dir
    if user_dir and user_dir != _state["ours"]:
        # the user chose a directory: keep it, but persist small programs too
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_SECS)
        return
    try:
        from stanvi.stan.cache import writable  # noqa: PLC0415

        if not writable(default_cache_dir()):
            raise PermissionError("read-only cache")   # a read-only site cache: no JAX cache
        set_persistent_cache(True)
    except OSError:  # an unwritable cache root: fits still work, they just compile
        set_persistent_cache(False)


class _ConfigureOnImport:
    """The finder :func:`install` puts first on ``sys.meta_path`` (a meta path finder and loader,
    duck-typed: ``importlib.abc`` would cost a new process 20–30 ms): it finds ``jax`` with the
    other finders, lets its loader execute the package, then runs :func:`configure` and takes
    itself off the path (once per process)."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201
        if fullname != "jax":
            return None
        for finder in sys.meta_path:
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        else:
            return None
        if spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):  # noqa: ANN001, ANN201
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        uninstall()
        configure()


_HOOK = _ConfigureOnImport()


def install() -> None:
    """Apply :func:`configure` now if JAX is imported, else when it first is (run when
    ``stanvi`` is imported)."""
    if "jax" in sys.modules:
        configure()
    elif _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def uninstall() -> None:
    """Take the import hook of :func:`install` off ``sys.meta_path`` (no-op when it is off)."""
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)
