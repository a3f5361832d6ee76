"""Variational families q(w) = N(μ, C Cᵀ) for the GP weights (docs/gp.md#families).

C is lower triangular with a positive diagonal, stored as ``ld = log c_rr`` (m,) plus the strict
lower triangle of its first k columns, ``L`` (m, k); only entries ``L[i, r]`` with ``i > r`` are
used (the others are masked).  Column r of C is ``L[:, r]·1[i > r] + c_rr e_r`` for r < k and
``c_rr e_r`` for r >= k.

* :class:`MeanField`: k = 0 (C diagonal), the default (docs/gp.md#options).
* :class:`Chevron` (k): "QSGP-k", columns 1..k dense lower-triangular, the rest diagonal.  The
  first k basis functions get full posterior correlation with all others (docs/gp.md#families).
* :class:`FullCholesky`: k = m, O(m²) parameters; small m only (tests, reference).  QSGP
  evaluates all of its columns every step (the Thm 2 inner estimator per column, summed exactly
  over r), which is unbiased; the paper's r~-subsampled Thm 2 is not used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class VParams(NamedTuple):
    """Variational parameters: mean μ (m,), log-diagonal ld (m,), dense columns L (m, k)."""

    mu: jax.Array
    ld: jax.Array
    L: jax.Array


@dataclass(frozen=True)
class MeanField:
    name: str = "meanfield"

    def num_dense(self, m: int) -> int:
        return 0


@dataclass(frozen=True)
class Chevron:
    """Chevron(k) ("QSGP-k", docs/gp.md#families): k dense lower-triangular columns, the rest
    diagonal."""

    k: int = 100

    def __post_init__(self) -> None:
        if int(self.k) < 0:
            raise ValueError(f"Chevron(k) needs k >= 0, got {self.k}")

    @property
    def name(self) -> str:
        return f"chevron({int(self.k)})"

    def num_dense(self, m: int) -> int:
        return min(int(self.k), int(m))


@dataclass(frozen=True)
class FullCholesky:
    name: str = "full"

    def num_dense(self, m: int) -> int:
        return int(m)


Family = MeanField | Chevron | FullCholesky


def make_gp_family(family) -> Family:
    """A family object from itself or a name: 'meanfield', 'full'/'fullrank', 'chevron:K'."""
    if isinstance(family, (MeanField, Chevron, FullCholesky)):
        return family
    if isinstance(family, str):
        text = family.strip().lower()
        if text in ("meanfield", "mean-field", "mf"):
            return MeanField()
        if text in ("full", "fullrank", "full-rank", "fullcholesky"):
            return FullCholesky()
        if text.startswith("chevron"):
            rest = text[len("chevron"):].strip(":()= ")
            try:
                return Chevron(int(rest) if rest else 100)
            except ValueError:
                pass
    raise ValueError(f"unknown GP family {family!r}; use gp.MeanField(), gp.Chevron(k), "
                     f"gp.FullCholesky() or 'meanfield' / 'chevron:K' / 'full'")


def dense_columns(rows: jax.Array, L_rows: jax.Array, ld_diag: jax.Array, k: int) -> jax.Array:
    """Rows ``rows`` of C's first k columns: ``L_rows·1[row > r] + c_rr·1[row == r]``.

    Args:
        rows: (b,) basis indices; L_rows: (b, k) = L[rows]; ld_diag: (k,) = ld[:k].
    """
    r = jnp.arange(k)
    lower = (rows[:, None] > r[None, :]).astype(L_rows.dtype)
    on_diag = (rows[:, None] == r[None, :]).astype(L_rows.dtype)
    return L_rows * lower + on_diag * jnp.exp(ld_diag)[None, :]


def dense_matrix(params: VParams) -> np.ndarray:
    """C as a dense (m, m) array (small m only)."""
    mu, ld, L = (np.asarray(x) for x in params)
    m, k = L.shape
    C = np.diag(np.exp(ld))
    if k:
        C[:, :k] = np.asarray(dense_columns(jnp.arange(m), jnp.asarray(L), jnp.asarray(ld[:k]), k))
    return C


def sample_weights(params: VParams, key: jax.Array, num: int) -> jax.Array:
    """``num`` draws of w = μ + C ε (O(m k) each)."""
    mu, ld, L = params
    m, k = L.shape
    eps = jax.random.normal(key, (num, m))
    w = mu[None, :] + jnp.exp(ld)[None, :] * eps
    if k:
        lower = (jnp.arange(m)[:, None] > jnp.arange(k)[None, :]).astype(L.dtype)
        w = w + eps[:, :k] @ (L * lower).T
    return w
