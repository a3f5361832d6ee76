"""Monte Carlo ELBO estimators for a Gaussian family over a target's JAX log density
(docs/algorithms.md#elbo, #meanfield, #fullrank, #random-keys, #failed-draws).

With fixed base draws ε_1..ε_n the estimate L̂(λ) = mean_j ℓ(λ; ε_j), with
ℓ(λ; ε) = log p(g(λ, ε)) + H(q_λ), is a smooth deterministic function of λ; everything here is
its exact value, gradient or Hessian-vector product, by JAX autodiff through the target (for a
Stan target, the JAX bridge turns each ``vmap`` over draws into ONE batched C++ call: gradients
for first order, model HVPs in direction u = ∂z/∂λ·v for second order, so an ELBO HVP costs one
model HVP per draw).

A draw whose log density fails (``reject()``, domain error, non-finite) has ℓ = −inf and NaN
gradient; callers drop and redraw such draws (see :func:`gradient_with_redraws`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stanvi.errors import VIError
from stanvi.families.fullrank_rows import FullRankRows
from stanvi.estimators.keys import HostKey, fold_in, host_normal
from stanvi.lazy_jax import jax, jnp
from stanvi.lazy_jax import jit as lazy_jit


class GradientFailure(VIError):
    """Too many draws of a stochastic gradient failed (the model threw or was non-finite);
    ``evaluated``: the draws evaluated before giving up (for the caller's accounting)."""

    def __init__(self, message: str, evaluated: int = 0) -> None:
        super().__init__(message)
        self.evaluated = int(evaluated)


def elbo_term(family, log_density: Callable[[jax.Array], jax.Array]) -> Callable:
    """ℓ(λ; ε) = log p(g(λ, ε)) + H(q_λ) for one base draw ε (D,): the reparameterized ELBO
    integrand (Kingma & Welling 2014; Kucukelbir et al. 2017), whose mean over draws is
    the ELBO estimate and whose gradient is the per-draw ELBO gradient.  The one definition every
    estimator differentiates."""

    def ell(params, eps_row):
        z = family.sample(params, eps_row[None, :])[0]
        return log_density(z) + family.entropy(params)

    return ell


def bucket(n: int) -> int:
    """The batch size a draw count ``n`` is evaluated at when bucketed: the smallest power of two
    ≥ n, so a few programs (1, 2, 4, …, compiled once and kept in JAX's persistent cache,
    :mod:`stanvi.jax_config`) serve every draw count (docs/architecture.md#conventions)."""
    n = int(n)
    if n < 1:
        raise ValueError(f"a batch needs at least one draw, got {n}")
    return 1 << (n - 1).bit_length()


class CompiledByShape:
    """``jax.jit(fn)`` compiled ahead of time once per argument-shape signature, timing each
    compilation, so a fit can report JAX compile time apart from run time
    (docs/architecture.md#conventions)."""

    def __init__(self, fn: Callable) -> None:
        self._jitted = jax.jit(fn)
        self._compiled: dict[tuple, Callable] = {}
        self.seconds = 0.0

    @property
    def signatures(self) -> list[tuple]:
        """The argument shapes compiled so far."""
        return list(self._compiled)

    def __call__(self, *args):
        args = tuple(np.asarray(a, dtype=np.float64) for a in args)
        signature = tuple(a.shape for a in args)
        compiled = self._compiled.get(signature)
        if compiled is None:
            start = time.perf_counter()
            compiled = self._jitted.lower(*args).compile()
            self.seconds += time.perf_counter() - start
            self._compiled[signature] = compiled
        return compiled(*args)


class PaddedRows:
    """A row-wise :class:`CompiledByShape` function evaluated at a bucketed batch size.

    Argument ``rows_arg`` holds the base draws (n, D); they are padded with zero rows to
    :func:`bucket` (n) and every output, one row per draw, is cut back to its first n rows.
    The padding rows (ε = 0, i.e. z = the mean of q) are evaluated too; the target's
    :class:`~stanvi.targets.base.OracleCounter` is corrected so that it counts the n real draws
    only (its ``seconds`` include the padding).

    Exactness: each output row depends only on its own draw, and for the models tested (eight
    schools, D = 10; a Gaussian, D = 10) padded rows are bit-for-bit those of the unpadded call
    (``tests/bench/test_coldstart.py``).  For a very small D, XLA vectorizes elementwise work across
    the flattened rows, so a row can differ in its last bits with the batch size, between two
    unpadded sizes just as between padded and unpadded ones (reject_region, D = 2: a few ulp)."""

    def __init__(self, compiled: CompiledByShape, rows_arg: int, counter=None) -> None:
        self.compiled = compiled
        self.rows_arg = rows_arg
        self.counter = counter

    def __call__(self, *args, bucketed: bool = True):
        eps = np.asarray(args[self.rows_arg], dtype=np.float64)
        n = eps.shape[0]
        if not bucketed or n == 0 or bucket(n) == n:
            return self.compiled(*args)
        size = bucket(n)
        padded = np.zeros((size, *eps.shape[1:]), dtype=np.float64)
        padded[:n] = eps
        args = (*args[:self.rows_arg], padded, *args[self.rows_arg + 1:])
        before = self.counter.snapshot() if self.counter is not None else None
        out = self.compiled(*args)
        out = tuple(np.asarray(o)[:n] for o in out) if isinstance(out, tuple) else np.asarray(out)[:n]
        if before is not None:
            self._uncount(before, n, size)
        return out

    def _uncount(self, before: dict[str, int], n: int, size: int) -> None:
        """Take the padding rows back out of the counter: a kind that grew by m·size draws (m
        model calls over the padded batch) is charged m·n."""
        after = self.counter.snapshot()
        for kind, count in after.items():
            grew = count - before[kind]
            if grew > 0 and grew % size == 0:
                setattr(self.counter, kind, count - grew // size * (size - n))


class ElboEstimator:
    """Jit-compiled ELBO pieces for one (family, log density) pair.

    All methods take the flat variational parameters ``params`` (P,) and base draws ``eps``
    (n, D) and return numpy arrays.
    """

    def __init__(self, family, log_density: Callable[[jax.Array], jax.Array], *,
                 counter=None, bucketing: bool = True) -> None:
        """``counter``: the target's :class:`~stanvi.targets.base.OracleCounter`, corrected for
        padding rows; ``bucketing``: False evaluates every call at its own size.

        Which calls are bucketed: the output draws (:meth:`log_p_and_q`, any ``draws=`` a user
        asks for) by default, and any row-wise call made with ``bucketed=True`` (``Fit.elbo``'s
        chunks).  The calls a method makes in its loop run at the method's own sizes (``bucketed``
        False): TrustVI's sample sizes are powers of two already and ADVI's are fixed options,
        so neither compiles per iteration, and their numbers stay exactly as they were."""
        self.family = family
        self.log_density = log_density
        ell = elbo_term(family, log_density)

        def mean_ell(params, eps):
            return jnp.mean(jax.vmap(ell, in_axes=(None, 0))(params, eps))

        def pair_differences(new, old, eps):
            z = jnp.concatenate([family.sample(new, eps), family.sample(old, eps)])
            lp = jax.vmap(log_density)(z)
            n = eps.shape[0]
            return lp[:n] - lp[n:] + family.entropy(new) - family.entropy(old)

        def log_p_and_q(params, eps):
            z = family.sample(params, eps)
            return z, jax.vmap(log_density)(z), family.log_q(params, z)

        def values_and_model_grads(params, eps):
            z = family.sample(params, eps)
            lp, g = jax.vmap(jax.value_and_grad(log_density))(z)
            return lp + family.entropy(params), g

        self._values = CompiledByShape(jax.vmap(ell, in_axes=(None, 0)))
        self._values_and_grads = CompiledByShape(jax.vmap(jax.value_and_grad(ell), in_axes=(None, 0)))
        self._hvp = CompiledByShape(
            lambda p, eps, v: jax.jvp(lambda q: jax.grad(mean_ell)(q, eps), (p,), (v,))[1])
        self._pair_differences = CompiledByShape(pair_differences)
        self._log_p_and_q = CompiledByShape(log_p_and_q)
        self._values_and_model_grads = CompiledByShape(values_and_model_grads)
        self._entropy_grad = CompiledByShape(jax.grad(family.entropy))
        self._compiled = (self._values, self._values_and_grads, self._hvp, self._pair_differences,
                          self._log_p_and_q, self._values_and_model_grads, self._entropy_grad)
        # the row-wise functions can run at bucketed batch sizes (see __init__'s docstring); the
        # HVP averages over its draws, so it always runs at the caller's size
        self._rows = {name: PaddedRows(compiled, rows_arg, counter) for name, compiled, rows_arg in (
            ("values", self._values, 1), ("values_and_grads", self._values_and_grads, 1),
            ("pair_differences", self._pair_differences, 2), ("log_p_and_q", self._log_p_and_q, 1),
            ("values_and_model_grads", self._values_and_model_grads, 1))}
        self.bucketing = bool(bucketing)

    def _row_call(self, name: str, args: tuple, bucketed: bool):
        return self._rows[name](*args, bucketed=bucketed and self.bucketing)

    @property
    def compile_seconds(self) -> float:
        """Total JAX compilation time spent so far by this estimator."""
        return sum(c.seconds for c in self._compiled)

    def values(self, params, eps, *, bucketed: bool = False) -> np.ndarray:
        """ℓ(λ; ε_j) for each draw (n,); ``bucketed``: evaluated at :func:`bucket` (n) draws."""
        return np.asarray(self._row_call("values", (params, eps), bucketed))

    def values_and_grads(self, params, eps, *, bucketed: bool = False
                         ) -> tuple[np.ndarray, np.ndarray]:
        """ℓ(λ; ε_j) (n,) and the per-draw gradients G_j = ∇_λ ℓ(λ; ε_j) (n, P), entropy
        gradient included (mean-field: ∂/∂μ = g, ∂/∂ω = g ⊙ σ ⊙ ε + 1;
        docs/algorithms.md#meanfield)."""
        v, g = self._row_call("values_and_grads", (params, eps), bucketed)
        return np.asarray(v), np.asarray(g)

    def values_and_model_grads(self, params, eps, *, bucketed: bool = False
                               ) -> tuple[np.ndarray, np.ndarray]:
        """ℓ(λ; ε_j) (n,) and the gradients of log p at the draws, ∇log p(z_j) (n, D): the
        per-draw ELBO gradients in factored form (see :class:`FullRankRows`), O(nD) memory
        instead of the O(nP) of :meth:`values_and_grads`."""
        v, g = self._row_call("values_and_model_grads", (params, eps), bucketed)
        return np.asarray(v), np.asarray(g)

    def entropy_gradient(self, params) -> np.ndarray:
        """∇_λ H(q_λ) (P,): the part of every per-draw gradient that does not depend on ε."""
        return np.asarray(self._entropy_grad(params))

    def hvp(self, params, eps, direction) -> np.ndarray:
        """∇²L̂(λ) v for the fixed draws ``eps`` (docs/algorithms.md#meanfield, #fullrank)."""
        return np.asarray(self._hvp(params, eps, direction))

    def pair_differences(self, new, old, eps, *, bucketed: bool = False) -> np.ndarray:
        """Matched-pair ELBO changes ℓ(λ'; ε_i) − ℓ(λ; ε_i) (TrustVI paper Eq. 8;
        docs/algorithms.md#trustvi-assessment), one batched call of
        2n log densities; the entropy difference is exact."""
        return np.asarray(self._row_call("pair_differences", (new, old, eps), bucketed))

    def log_p_and_q(self, params, eps, *, bucketed: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draws z = g(λ, ε), log p(z) and log q(z) (for output draws and importance ratios),
        evaluated at :func:`bucket` (n) draws unless ``bucketed`` is False."""
        z, lp, lq = self._row_call("log_p_and_q", (params, eps), bucketed)
        return np.asarray(z), np.asarray(lp), np.asarray(lq)


def per_draw_gradients(est: ElboEstimator, params, eps) -> tuple[np.ndarray, np.ndarray | FullRankRows]:
    """ℓ(λ; ε_j) (n,) and the per-draw gradients: an (n, P) array, or for the full-rank family
    (when the estimator offers :meth:`ElboEstimator.values_and_model_grads`) the factored
    :class:`FullRankRows`."""
    factored = _factored_rows(est)
    if factored is not None:
        values, g = est.values_and_model_grads(params, eps)
        return values, factored(params, g, eps, est.entropy_gradient(params))
    return est.values_and_grads(params, eps)


def _factored_rows(est):
    """The family's ``factored_rows`` (per-draw gradients without the (n, P) matrix: the
    full-rank family's :class:`FullRankRows`) where the family has one and the estimator gives
    the model gradients and the entropy gradient apart; else None."""
    factored = getattr(est.family, "factored_rows", None)
    if (factored is not None and hasattr(est, "values_and_model_grads")
            and hasattr(est, "entropy_gradient")):
        return factored
    return None


class GradientEstimate(NamedTuple):
    gradient: np.ndarray        # (P,) mean of the valid per-draw gradients
    per_draw: np.ndarray | FullRankRows  # (n, P) valid per-draw gradients (factored: full rank)
    values: np.ndarray          # (n,) ℓ at the valid draws
    n_dropped: int              # draws that failed and were replaced
    n_evaluated: int = 0        # draws evaluated in all (whole batches, redraws included)


@lazy_jit(static_argnums=(1, 2))
def _standard_normal(key: jax.Array, n: int, dim: int) -> jax.Array:
    return jax.random.normal(key, (n, dim), dtype=jnp.float64)


# (base, most entries drawn): row counts round up to a power of 16 while the block stays small,
# then to a power of 4, then not at all (see normal_rows).
_NORMAL_ROW_BUCKETS = ((16, 1 << 15), (4, 1 << 20))


def normal_rows(n: int, dim: int) -> int:
    """How many rows :func:`standard_normal` draws to return n: n rounded up to a power of 16
    while that block has at most 2¹⁵ entries, else to a power of 4 while at most 2²⁰, else n.
    Each distinct shape is one more program to trace, lower and load in every new process
    (≈ 25 ms each, issue 8 part 3), and a fit asks for up to a dozen sample sizes; drawing up to
    16× (small blocks) or 4× (blocks up to 8 MB) more normals than needed costs less than that."""
    n, dim = int(n), int(dim)
    for base, most in _NORMAL_ROW_BUCKETS:
        rows = 1
        while rows < n:
            rows *= base
        if rows * dim <= most:
            return rows
    return n


def standard_normal(key: jax.Array, n: int, dim: int) -> np.ndarray:
    """(n, dim) standard normal base draws from ``key``: the first n rows of a
    ``(normal_rows(n, dim), dim)`` draw, which are ``jax.random.normal(key, (n, dim))`` bit for
    bit because JAX's threefry is partitionable (each entry's bits depend on its index, not on
    the shape; :mod:`stanvi.jax_config` pins ``jax_threefry_partitionable``; tested).  A host-path
    key (:class:`~stanvi.estimators.keys.HostKey`) draws from NumPy instead."""
    n, dim = int(n), int(dim)
    if isinstance(key, HostKey):
        return host_normal(key, n, dim)
    return np.asarray(_standard_normal(key, normal_rows(n, dim), dim))[:n]


def collect_valid(evaluate: Callable, key: jax.Array, n: int, dim: int, max_drops: int,
                  what: str) -> tuple[list[np.ndarray], int, int]:
    """Draw batches of n base draws until n valid ones are collected: Stan's drop-and-redraw rule
    (``calc_grad``, ``calc_ELBO``; docs/algorithms.md#advi), the one home of that rule in Python
    (its JAX form, for compiled loops, is :func:`stanvi.estimators.stan_advi.stan_calc_grad`).  ``evaluate(eps)`` returns (ok mask, *per-draw arrays); returns, for each array of
    evaluate plus eps itself, the valid rows concatenated, then the drop count and the number of
    draws evaluated.  Batches keep the static size n, so nothing recompiles.  Raises
    GradientFailure when ``max_drops`` draws have failed."""
    kept: list[list[np.ndarray]] = []
    have = dropped = attempt = 0
    while have < n:
        eps = standard_normal(fold_in(key, attempt), n, dim)
        attempt += 1
        ok, *arrays = evaluate(eps)
        need = n - have
        good = np.flatnonzero(ok)
        # draws are consumed in order: failures after the last needed valid draw are not drops
        consumed = int(good[need - 1]) + 1 if len(good) >= need else n
        dropped += consumed - min(len(good), need)
        if dropped >= max_drops:
            raise GradientFailure(f"{dropped} draws of {what} failed (the model threw or returned "
                                  f"a non-finite value); limit {max_drops}", attempt * n)
        take = good[:need]
        kept.append([eps[take], *(a[take] for a in arrays)])
        have += len(take)
    columns = [np.concatenate(col) for col in zip(*kept)]
    return columns, dropped, attempt * n


def mean_of_valid(values: np.ndarray, min_valid: int) -> float:
    """An ELBO estimate on fixed draws: the mean of the finite per-draw values ℓ(λ; ε_j), the
    failing draws dropped as Stan's calc_ELBO drops them, or −inf when fewer than ``min_valid``
    of them are finite (no redraws: the draws are fixed, e.g. common random numbers for comparing
    two q's).  Used by the Laplace warm start's comparison and by the benchmarks' evaluation."""
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values)
    if int(finite.sum()) < min_valid:
        return -np.inf
    return float(values[finite].mean())


def valid_draws(est: ElboEstimator, params, key: jax.Array, n: int,
                max_drops: int) -> tuple[np.ndarray, int]:
    """n base draws ε at which ℓ(λ; ε) is finite, replacing failed ones as
    :func:`gradient_with_redraws` does (a Hessian sample must be usable at every draw, since one
    failed draw makes every Hessian-vector product of the sample non-finite).  Returns the draws
    and the number of log densities evaluated.  Raises GradientFailure at ``max_drops``."""
    (eps,), _, evaluated = collect_valid(
        lambda e: (np.isfinite(est.values(params, e)),), key, n, est.family.base_dim, max_drops,
        "a Hessian sample")
    return eps, evaluated


def gradient_with_redraws(est: ElboEstimator, params, key: jax.Array, n: int,
                          max_drops: int) -> GradientEstimate:
    """A stochastic ELBO gradient from n valid draws.

    A draw whose value or gradient is non-finite is dropped and replaced by a fresh one, as
    Stan's ``calc_grad`` does (docs/algorithms.md#failed-draws); when ``max_drops`` draws have
    failed, raises :class:`GradientFailure` with the count.
    """
    factored = _factored_rows(est)
    if factored is not None:
        # e.g. full rank: keep (g_i, ε_i) per draw, never the (n, P) matrix (FullRankRows)
        const = est.entropy_gradient(params)

        def evaluate(eps):
            vals, g = est.values_and_model_grads(params, eps)
            rows = factored(params, g, eps, const)
            return np.isfinite(vals) & rows.finite_rows(), g, vals

        (eps, g, values), dropped, evaluated = collect_valid(
            evaluate, key, n, est.family.base_dim, max_drops, "the stochastic gradient")
        rows = factored(params, g, eps, const)
        return GradientEstimate(rows.mean(axis=0), rows, values, dropped, evaluated)

    def evaluate(eps):
        vals, grads = est.values_and_grads(params, eps)
        return np.isfinite(vals) & np.isfinite(grads).all(axis=1), grads, vals

    (_, per_draw, values), dropped, evaluated = collect_valid(
        evaluate, key, n, est.family.base_dim, max_drops, "the stochastic gradient")
    return GradientEstimate(per_draw.mean(axis=0), per_draw, values, dropped, evaluated)
