"""First-order updates on the host, optax-shaped: a state tuple and a pure update function that
returns the update to add and the next state (docs/jointcv.md#defaults,
docs/mlmcvi.md#extensions).  Adam (Kingma & Ba 2015, Algorithm 1: b1 = 0.9, b2 = 0.999,
eps = 1e-8, bias-corrected, optax's defaults) and heavy-ball momentum (Polyak 1964), for the
methods whose loop is NumPy (jointcv, MLMCVI): one home instead of a copy in each.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8


class AdamState(NamedTuple):
    """Adam's moments (None before the first update) and its step count."""

    m: np.ndarray | None = None
    v: np.ndarray | None = None
    t: int = 0


def adam_update(g: np.ndarray, state: AdamState, lr: float) -> tuple[np.ndarray, AdamState]:
    """(the update to add to the parameters, the next state) for gradient ``g`` of the
    objective to minimize at step size ``lr``."""
    b1, b2, eps = ADAM_B1, ADAM_B2, ADAM_EPS
    t = state.t + 1
    m = (1 - b1) * g if state.m is None else b1 * state.m + (1 - b1) * g
    v = (1 - b2) * g * g if state.v is None else b2 * state.v + (1 - b2) * g * g
    m_hat = m / (1 - b1 ** t)
    v_hat = v / (1 - b2 ** t)
    return -(lr * m_hat / (np.sqrt(v_hat) + eps)), AdamState(m, v, t)


def heavy_ball(g: np.ndarray, velocity: np.ndarray | None, momentum: float) -> np.ndarray:
    """The heavy-ball direction m ← momentum·m + g (m = g at the first step)."""
    return g if velocity is None else momentum * velocity + g
