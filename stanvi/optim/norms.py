"""The Euclidean norm of a vector, as ``np.linalg.norm`` computes it (``sqrt(x·x)`` for a real
1-D array with the default ``ord``, so the results are bit-identical) without its argument
handling, which costs more than the product on the few-element vectors of the trust-region
solvers' inner loops (docs/algorithms.md#gltr)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["norm"]


def norm(x: np.ndarray) -> float:
    """‖x‖₂ of a real 1-D float array (``np.linalg.norm(x)``, bit for bit)."""
    return math.sqrt(float(x.dot(x)))
