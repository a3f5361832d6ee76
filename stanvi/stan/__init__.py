"""The Stan side: toolchain, compiler and cache, model libraries, data I/O."""

from stanvi.stan.compiler import CompiledModel, compile_model

__all__ = ["CompiledModel", "compile_model"]
