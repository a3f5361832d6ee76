"""Data-subsampled targets: a log joint that is a finite sum over data (or blocks of data) with a
shared global parameter, the structure doubly-stochastic VI needs
(docs/jointcv.md#model; Wang, Geffner & Domke 2024, Eq. 3).

``log p(x, z) = log p0(z) + Σ_{n=1}^N ℓ_n(z)``.  A subsampled target exposes the paper's
per-term *scaled negative log joint*, with the sign fixed as in docs/jointcv.md#sign-fix,

    k_n(z) = −N·ℓ_n(z) − log p0(z),   so that   (1/N) Σ_n k_n(z) = −log p(x, z),

through its gradients and Hessian-vector products for a set of term indices (at one shared point
or at one point per index), and its full-data gradient ``(1/N) Σ_n ∇k_n(z) = −∇log p(x, z)``.
A "term" is a datum here (:class:`JaxPerDatumTarget`) and a block of rows for Stan models
(:class:`stanvi.targets.stan_blocks.StanBlockTarget`, docs/jointcv.md#block-scheme: blocks play
the data's role and their number M plays N's).

Every call is counted (:class:`SubsampledCounter`) per term gradient and per term HVP; a
full-data gradient counts once as a full pass.  The targets are also ordinary full-data
:class:`~stanvi.targets.base.Target`s (``full``), which the ELBO evaluations and the output
draws use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.targets.jax_target import JaxTarget


@dataclass
class SubsampledCounter:
    """Calls to a subsampled target, by kind: per-term gradients (``term_gradient``), per-term
    HVPs (``term_hvp``, which also return the term's gradient: counted once, as an HVP), and
    full-data gradients (``full_gradient``, each a pass over all terms)."""

    term_gradient: int = 0
    term_hvp: int = 0
    full_gradient: int = 0

    def snapshot(self) -> dict[str, int]:
        return {"term_gradient": self.term_gradient, "term_hvp": self.term_hvp,
                "full_gradient": self.full_gradient}


@runtime_checkable
class SubsampledTarget(Protocol):
    """What the doubly-stochastic estimators (:mod:`stanvi.estimators.subsampled`) ask of a
    model.  Arrays are NumPy float64; ``idx`` is an int array of distinct term indices (b,)."""

    terms: SubsampledCounter
    full: Any

    @property
    def dim(self) -> int:
        """Number of unconstrained parameters d."""

    @property
    def n_terms(self) -> int:
        """N (data) or M (blocks)."""

    def term_gradients(self, idx: np.ndarray, z: np.ndarray) -> np.ndarray:
        """∇k_n(z) for n in ``idx`` (b, d); ``z`` is one shared point (d,) or one per index
        (b, d)."""

    def term_hvps(self, idx: np.ndarray, z: np.ndarray, v: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(∇k_n(z_i), ∇²k_n(z_i) v_i) for n = idx[i]; ``z`` (d,) shared or (b, d), ``v``
        (b, d)."""

    def full_gradient(self, z: np.ndarray) -> np.ndarray:
        """(1/N) Σ_n ∇k_n(z) = −∇ log p(x, z) (d,), one full-data call."""


def _take(data: Any, idx: jax.Array) -> Any:
    return jax.tree_util.tree_map(lambda a: a[idx], data)


class JaxPerDatumTarget(JaxTarget):
    """A JAX model given per datum: ``log_lik(z, datum)`` (one datum's log likelihood, a scalar)
    and ``log_prior(z)``; ``data`` is a pytree of arrays whose leading dimension N indexes the
    data (issue 11, "JAX per-datum targets").  The full-data log density
    ``log_prior(z) + Σ_n log_lik(z, x_n)`` (vmapped) makes it a :class:`JaxTarget` as well, so
    ``stanvi.fit(JaxPerDatumTarget(...), method=...)`` works for every method; with
    ``method="jointcv"`` the per-datum terms are used.

    Per-term gradients are ``vmap(grad(k_n))`` over the selected data, HVPs are
    forward-over-reverse (``jvp`` of ``grad``), each set one jitted call; the data stay on the
    device and are indexed inside the compiled program.
    """

    def __init__(self, log_lik: Callable[[jax.Array, Any], jax.Array],
                 log_prior: Callable[[jax.Array], jax.Array], data: Any, dim: int, *,
                 names: list[str] | None = None, name: str = "jax_per_datum") -> None:
        leaves = jax.tree_util.tree_leaves(data)
        if not leaves:
            raise ValueError("data must hold at least one array (leading dimension N)")
        sizes = {int(np.shape(a)[0]) for a in leaves}
        if len(sizes) != 1:
            raise ValueError(f"every data array needs the same leading dimension N; got {sorted(sizes)}")
        self._n = sizes.pop()
        if self._n < 1:
            raise ValueError("a per-datum target needs N >= 1 data")
        data = jax.tree_util.tree_map(jnp.asarray, data)
        self.data = data
        self.log_lik = log_lik
        self.log_prior = log_prior
        n = self._n

        def full_log_density(z):
            return log_prior(z) + jnp.sum(jax.vmap(log_lik, (None, 0))(z, data))

        super().__init__(full_log_density, dim, names=names, name=name)
        self.terms = SubsampledCounter()
        self.full = self

        def k(z, datum):
            return -n * log_lik(z, datum) - log_prior(z)

        grad_k = jax.grad(k)

        def grads(z, idx, d):
            sel = _take(d, idx)
            if z.ndim == 1:
                return jax.vmap(grad_k, (None, 0))(z, sel)
            return jax.vmap(grad_k)(z, sel)

        def hvps(z, v, idx, d):
            sel = _take(d, idx)

            def one(zi, vi, xi):
                return jax.jvp(lambda zz: grad_k(zz, xi), (zi,), (vi,))

            if z.ndim == 1:
                return jax.vmap(one, (None, 0, 0))(z, v, sel)
            return jax.vmap(one)(z, v, sel)

        self._grads = jax.jit(grads)
        self._hvps = jax.jit(hvps)
        self._full_grad = jax.jit(lambda z: -jax.grad(full_log_density)(z))

    @property
    def n_terms(self) -> int:
        return self._n

    def __repr__(self) -> str:
        return f"JaxPerDatumTarget({self.name!r}, dim={self.dim}, N={self._n})"

    def term_gradients(self, idx: np.ndarray, z: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        self.terms.term_gradient += len(idx)
        return np.asarray(self._grads(jnp.asarray(z, dtype=jnp.float64), idx, self.data))

    def term_hvps(self, idx: np.ndarray, z: np.ndarray, v: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        idx = np.asarray(idx, dtype=np.int64)
        self.terms.term_hvp += len(idx)
        g, hv = self._hvps(jnp.asarray(z, dtype=jnp.float64), jnp.asarray(v, dtype=jnp.float64),
                           idx, self.data)
        return np.asarray(g), np.asarray(hv)

    def full_gradient(self, z: np.ndarray) -> np.ndarray:
        self.terms.full_gradient += 1
        return np.asarray(self._full_grad(jnp.asarray(z, dtype=jnp.float64)))


def logistic_regression_target(X: np.ndarray, y: np.ndarray, *, prior_sd: float = 1.0,
                               name: str = "logistic_regression") -> JaxPerDatumTarget:
    """Bayesian logistic regression ``y_n ~ Bernoulli(sigmoid(x_nᵀz))``, ``z ~ N(0, prior_sd²I)``,
    no intercept: the Sonar/Australian model of the joint-CV paper
    (docs/jointcv.md#simulated-data), per datum."""
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    log_norm = -0.5 * X.shape[1] * np.log(2 * np.pi * prior_sd ** 2)

    def log_lik(z, datum):
        x, yy = datum
        a = jnp.dot(x, z)
        return yy * a - jnp.logaddexp(0.0, a)

    def log_prior(z):
        return log_norm - 0.5 * jnp.sum(z * z) / prior_sd ** 2

    return JaxPerDatumTarget(log_lik, log_prior, (X, y), X.shape[1],
                             names=[f"beta.{i + 1}" for i in range(X.shape[1])], name=name)
