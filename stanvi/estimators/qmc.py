"""Base draws ε for reparameterized gradients, selectable by name: plain Monte Carlo or
randomized quasi-Monte Carlo (docs/mlmcvi.md#baselines; Buchholz, Wenzel & Mandt, *Quasi-Monte
Carlo Variational Inference*, ICML 2018).

* ``"mc"``: i.i.d. N(0, I_D) rows.
* ``"rqmc"``: ε_n = Φ⁻¹(u_n) elementwise, u_1…u_N the first N points of a scrambled Sobol'
  sequence (``scipy.stats.qmc.Sobol(d=D, scramble=True)``), re-scrambled at every call so the
  estimate stays unbiased; u is clipped to [1e−12, 1 − 1e−12] before Φ⁻¹
  (docs/mlmcvi.md#baselines).  N need not be a power of two (the paper uses 100 and 50); scipy
  then warns that the balance properties are lost, which we silence here and document: the
  estimate is still unbiased, its variance no longer enjoys the full O(N⁻²) rate.
"""

from __future__ import annotations

import warnings

import numpy as np

NOISE_KINDS = ("mc", "rqmc")
_U_CLIP = 1e-12


def base_draws(kind: str, rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """(n, dim) base draws of ``kind`` ('mc' or 'rqmc'), randomized by ``rng``."""
    if kind == "mc":
        return rng.standard_normal((n, dim))
    if kind == "rqmc":
        return rqmc_normal(rng, n, dim)
    raise ValueError(f"unknown base-draw kind {kind!r}; choose one of {list(NOISE_KINDS)}")


def rqmc_normal(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """Φ⁻¹ of the first n points of a freshly scrambled Sobol' sequence in [0, 1)^dim
    (docs/mlmcvi.md#baselines).  Each row is marginally N(0, I) exactly, so means over rows are
    unbiased."""
    # SciPy is imported here, not at module import: `import stanvi` and fits that do not
    # use RQMC import no SciPy (tests/bench/test_coldstart.py)
    from scipy.special import ndtri  # noqa: PLC0415
    from scipy.stats import qmc  # noqa: PLC0415

    sobol = qmc.Sobol(d=dim, scramble=True, seed=rng)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*balance properties.*")
        u = sobol.random(n)
    return ndtri(np.clip(u, _U_CLIP, 1.0 - _U_CLIP))
