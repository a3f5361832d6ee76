"""``hvp_method="auto"`` for a Stan target: exact (nested-autodiff) or finite-difference
Hessian-vector products, timed once per (compiled library, data) and stored next to the library
in ``hvp_choice.json``, so every later load, in any process and under any load, makes the same
choice (see :class:`~stanvi.targets.stan_target.StanTarget`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HvpTimer = Callable[[np.ndarray, np.ndarray], tuple[bool, float, float]]


def stored_hvp_choice(library_path: Path, data_json: str | None, dim: int,
                      timed: HvpTimer) -> str:
    """The choice stored for this (library, data) in ``<library dir>/hvp_choice.json``, or, the
    first time, the timed choice (``timed(z, v)``, :func:`timed_hvp_choice` on 16 fixed points),
    written there under a file lock (a concurrent first writer wins, and everyone adopts its
    choice).  An unwritable directory keeps the choice for this process only."""
    import hashlib  # noqa: PLC0415

    from filelock import FileLock, Timeout  # noqa: PLC0415

    key = hashlib.sha256((data_json or "").encode()).hexdigest()[:20]
    path = library_path.parent / "hvp_choice.json"

    def stored() -> str | None:
        try:
            return json.loads(path.read_text()).get(key, {}).get("method")
        except (OSError, ValueError, AttributeError):
            return None

    choice = stored()
    if choice in ("exact", "finite_difference"):
        return choice
    rng = np.random.default_rng(0)
    z = rng.uniform(-2.0, 2.0, size=(16, dim))
    v = rng.normal(size=(16, dim))
    fd, exact_s, fd_s = timed(z, v)
    choice = "finite_difference" if fd else "exact"
    try:
        with FileLock(str(path) + ".lock", timeout=30):
            existing = stored()
            if existing in ("exact", "finite_difference"):
                return existing
            try:
                table = json.loads(path.read_text())
            except (OSError, ValueError):
                table = {}
            table[key] = {"method": choice, "exact_seconds": exact_s, "fd_seconds": fd_s}
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(table, indent=1))
            os.replace(tmp, path)
    except (OSError, Timeout):
        pass
    return choice


def timed_hvp_choice(hvp: Callable[..., object], z: np.ndarray,
                     v: np.ndarray) -> tuple[bool, float, float]:
    """Time both HVP methods on the rows of z (best of 3 calls of
    ``hvp(z, v, finite_difference=...)``): (finite differences?, exact seconds,
    finite-difference seconds); finite differences when the exact sweep costs more than twice
    as much."""
    zs, vs = z[:16], v[:16]

    def best(fd: bool) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            hvp(zs, vs, finite_difference=fd)
            times.append(time.perf_counter() - t0)
        return min(times)

    exact_s, fd_s = best(False), best(True)
    return exact_s > 2.0 * fd_s, exact_s, fd_s
