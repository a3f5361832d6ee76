"""Random keys of the host path (docs/algorithms.md#random-keys, #host-path).

Every base draw of a fit comes from an explicit key derived from the fit's integer seed, one per
(iteration, purpose) (:func:`stanvi.methods.base.purpose_key`).  On the JAX path the key is a
JAX PRNG key and the draws are ``jax.random.normal``.  On the host path (a Stan model fitted by a
method whose loop is Python, :func:`stanvi.estimators.base.host_path`) the key is a
:class:`HostKey`, the seed and the path of integers folded into it, and the draws come from
NumPy's Philox generator seeded by ``SeedSequence(seed, spawn_key=path)`` — no JAX program to
compile for each draw shape (~25 ms each in a new process, a third of a host-path fit's time
before this; issue T3-1).  The same seed gives the same draws on the same path; the two paths
draw different (equally valid) numbers.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class HostKey(NamedTuple):
    """A host-path key: the fit's seed and the integers folded into it so far."""

    seed: int
    path: tuple[int, ...] = ()


def make_key(seed: int, *, host: bool):
    """The root key of a fit with integer ``seed``: a :class:`HostKey` on the host path, else
    ``jax.random.PRNGKey(seed)``."""
    if host:
        return HostKey(int(seed))
    import jax  # noqa: PLC0415

    return jax.random.PRNGKey(seed)


def fold_in(key, data: int):
    """``key`` with the integer ``data`` folded in (``jax.random.fold_in`` for a JAX key)."""
    if isinstance(key, HostKey):
        return HostKey(key.seed, key.path + (int(data),))
    import jax  # noqa: PLC0415

    return jax.random.fold_in(key, data)


def host_normal(key: HostKey, n: int, dim: int) -> np.ndarray:
    """(n, dim) standard normal draws from a :class:`HostKey` (row-major, so the first n rows of
    a larger draw from the same key are these)."""
    seq = np.random.SeedSequence(key.seed, spawn_key=key.path)
    return np.random.Generator(np.random.Philox(seq)).standard_normal((int(n), int(dim)))


def uniform(key, dim: int, low: float, high: float) -> np.ndarray:
    """(dim,) uniform(low, high) draws from ``key``: NumPy's Philox for a :class:`HostKey`,
    ``jax.random.uniform`` for a JAX key."""
    if isinstance(key, HostKey):
        seq = np.random.SeedSequence(key.seed, spawn_key=key.path)
        return np.random.Generator(np.random.Philox(seq)).uniform(low, high, int(dim))
    import jax  # noqa: PLC0415

    return np.asarray(jax.random.uniform(key, (int(dim),), minval=low, maxval=high),
                      dtype=float)
