"""One BLAS thread while a method fits a small problem (docs/algorithms.md#blas-threads).

NumPy and SciPy each load their own OpenBLAS, each with a pool of one worker thread per core;
after a product large enough to split, the workers spin for a while waiting for the next one.
A host-path TrustVI fit issues thousands of small products between batched model calls, so its
Python thread shared the project's two cores with up to two pools of spinning BLAS workers and
Stan's TBB workers: CPU time twice the wall time, and the first fit on each posteriordb model
100–200 ms instead of 15–30 (issue T3-1).  With one BLAS thread the median posteriordb fit
took 0.044 s instead of 0.052 s, hierarchical_radon full-rank (D = 101) 2.1 s instead of
3.9 s; at D = 1,000 full-rank two threads were faster (2.6 s against 3.7 s).  So while a method
runs on a problem of at most ``SMALL_DIM`` unconstrained parameters, every OpenBLAS in the
process is limited to one thread (threadpoolctl), and restored after; above it nothing changes.
``STANVI_BLAS_THREADS=keep`` turns the limit off.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import ContextManager

#: Largest D at which a method's run limits BLAS to one thread
SMALL_DIM = 512

#: (the modules whose BLAS libraries it saw, the controller); rebuilt when one more is loaded
_CONTROLLER: list = [None, None]
_BLAS_MODULES = ("numpy", "scipy.linalg", "scipy.sparse.linalg", "sklearn")


def _controller():
    """A threadpoolctl controller of the BLAS libraries loaded now (None without threadpoolctl);
    building one scans the process's libraries (~1 ms), so it is kept until another module that
    brings its own BLAS is imported."""
    loaded = tuple(name in sys.modules for name in _BLAS_MODULES)
    if _CONTROLLER[0] != loaded:
        try:
            from threadpoolctl import ThreadpoolController  # noqa: PLC0415
        except ImportError:
            return None
        _CONTROLLER[:] = [loaded, ThreadpoolController()]
    return _CONTROLLER[1]


def blas_limited(dim: int) -> ContextManager:
    """A context in which BLAS runs on one thread when ``dim`` ≤ :data:`SMALL_DIM` (module
    docstring); otherwise, without threadpoolctl or with ``STANVI_BLAS_THREADS=keep``, a
    context that changes nothing."""
    if dim > SMALL_DIM or os.environ.get("STANVI_BLAS_THREADS") == "keep":
        return contextlib.nullcontext()
    controller = _controller()
    if controller is None:
        return contextlib.nullcontext()
    return controller.limit(limits=1, user_api="blas")
