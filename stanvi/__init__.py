"""stanvi: fast variational inference for Stan models (see README.md and docs/)."""

from __future__ import annotations

import os
from pathlib import Path

# JAX settings (float64, the persistent compilation cache), applied when JAX is first imported,
# by stanvi (stanvi.lazy_jax) or by the user, or now if it already is.  The only place stanvi
# configures JAX.
from stanvi.jax_config import install as _install_jax_settings

_install_jax_settings()

from stanvi.errors import (DivergedError, MissingExtraError, ModelEvaluationError,
                           NotConvergedError, NotConvergedWarning, StanCompileError,
                           StanDataError, StanviError, StanviWarning, ToolchainError, VIError)
from stanvi.stan.compiler import CompiledModel, compile_model
from stanvi.stan.data import DataLike
from stanvi.targets import JaxTarget, StanTarget


def _freeze_gc() -> None:
    """At interpreter exit: move every object to the collector's permanent generation.

    Finalizing a process that imported JAX and SciPy and ran a fit spends ~0.3–0.7 s in the
    cyclic garbage collector's final passes over their object graphs (measured on eight
    schools, issue 8 part 3); frozen objects are skipped, and the memory goes back to the
    operating system when the process ends anyway.  Objects are still released by reference
    counting and ``atexit``/``weakref.finalize`` callbacks still run; only finalizers of objects
    in reference cycles at exit are skipped.  ``STANVI_FAST_EXIT=0`` turns this off."""
    import gc  # noqa: PLC0415

    gc.freeze()


if os.environ.get("STANVI_FAST_EXIT", "1") != "0":
    import atexit

    atexit.register(_freeze_gc)

from stanvi.fit import fit  # noqa: E402
from stanvi.fit_result import Fit  # noqa: E402

from stanvi.version import __version__  # noqa: E402


def compile(path: str | os.PathLike, *, progress: bool = True, force: bool = False) -> Path:  # noqa: A001
    """Compile a `.stan` file (cached by content) and return the model library's path."""
    return compile_model(path, progress=progress, force=force).library


def load_model(model: str | os.PathLike | CompiledModel, data: DataLike = None, *,
               seed: int = 0, threads: int | None = None, progress: bool = True,
               hvp_method: str = "auto") -> StanTarget:
    """A :class:`StanTarget` for a `.stan` file (compiled if needed) or a compiled library
    (``hvp_method``: see :class:`StanTarget`).  To read a saved *fit*, use :func:`read`."""
    return StanTarget(model, data, seed=seed, threads=threads, progress=progress,
                      hvp_method=hvp_method)


#: The former name of :func:`load_model` (kept: it loads a model, not results; see :func:`read`).
load = load_model

from stanvi.saved import SavedFit, read  # noqa: E402
from stanvi.evaluation.compare import Comparison, compare  # noqa: E402


__all__ = ["Comparison", "CompiledModel", "DivergedError", "Fit", "fit", "JaxTarget",
           "MissingExtraError", "compare",
           "ModelEvaluationError",
           "NotConvergedError", "NotConvergedWarning", "StanCompileError", "StanDataError",
           "SavedFit", "StanTarget", "StanviError", "StanviWarning", "ToolchainError", "VIError",
           "compile", "load", "load_model", "read", "__version__"]


#: Subpackages with a public API of their own (docs/api.md), listed by ``dir(stanvi)`` once
#: imported.
_PUBLIC_PACKAGES = ("diagnostics", "discrete", "evaluation", "families", "gp", "output",
                    "reference", "targets")


def __dir__() -> list[str]:
    """``dir(stanvi)`` (and tab completion) lists the public names only: those of
    :data:`__all__` and the public subpackages already imported (PEP 562); the helpers imported
    here (``os``, ``Path``, ``compile_model``, ...) stay out of sight."""
    return sorted({*__all__, *(name for name in _PUBLIC_PACKAGES if name in globals())})
