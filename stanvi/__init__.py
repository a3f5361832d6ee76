"""stanvi: fast variational inference for Stan models (see README.md and docs/)."""

from __future__ import annotations

import os
from pathlib import Path

from stanvi.errors import (ModelEvaluationError, StanCompileError, StanDataError, StanviError,
                           ToolchainError, VIError)
from stanvi.stan.compiler import CompiledModel, compile_model
from stanvi.stan.data import DataLike
from stanvi.targets import JaxTarget, StanTarget

from stanvi.jax_config import configure as _configure_jax

_configure_jax()

from stanvi.fit import Fit, fit  # noqa: E402

__version__ = "0.1.0"


def compile(path: str | os.PathLike, *, progress: bool = True, force: bool = False) -> Path:  # noqa: A001
    """Compile a `.stan` file (cached by content) and return the model library's path."""
    return compile_model(path, progress=progress, force=force).library


def load(model: str | os.PathLike | CompiledModel, data: DataLike = None, *, seed: int = 0,
         threads: int | None = None, progress: bool = True, hvp_method: str = "auto") -> StanTarget:
    """A :class:`StanTarget` for a `.stan` file (compiled if needed) or a compiled library
    (``hvp_method``: see :class:`StanTarget`)."""
    return StanTarget(model, data, seed=seed, threads=threads, progress=progress,
                      hvp_method=hvp_method)


__all__ = ["CompiledModel", "Fit", "fit", "JaxTarget", "ModelEvaluationError", "StanCompileError",
           "StanDataError", "StanTarget", "StanviError", "ToolchainError", "VIError", "compile",
           "load", "__version__"]
