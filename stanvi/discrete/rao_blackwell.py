"""Rao-Blackwellized gradient estimators for one categorical variable (Liu, Regier, Tripuraneni,
Jordan & McAuliffe 2019, "Rao-Blackwellized Stochastic Gradients for Discrete Distributions",
ICML; docs/discrete.md#rb-estimator and #choosing-k).

Setting: ``q_η(z)`` over categories ``0..K−1`` given by normalised ``log_probs`` (shape
``(..., K)``; leading axes are independent rows), and an integrand ``f`` that maps an int array of
indices ``(..., M)`` to values ``(..., M)``, differentiable in the parameters; the goal is
``∇ Σ_z q(z) f(z)``.  Every function returns a **surrogate** scalar: ``jax.grad`` of it is the
estimate (the caller decides whether it maximises or minimises).

The estimator (paper Eq. 6; docs/discrete.md#rb-estimator): sum the ``k`` most probable
categories ``C_k`` exactly and cover the remainder ``C̄_k`` (mass ``ε_k``) with draws
``v ~ q(·| C̄_k)``::

    ĝ = Σ_{z∈C_k} ∇[q(z) f(z)]  +  ∇ε_k · f̄_v
        +  (ε_k / n) Σ_i [∇f(v_i) + (f(v_i) − b_i) ∇log q(v_i | C̄_k)]

with ``f̄_v`` the mean of the n remainder values.  This is the shared-baseline form
(docs/discrete.md#shared-baseline): the summed part is exact, only the remainder is noisy, and
any baseline ``b_i`` independent of ``v_i`` keeps it unbiased
(``∇log q(v|C̄) = ∇log q(v) − ∇log ε_k`` has mean zero under ``q|C̄``).  With a scalar
baseline shared by all terms it is algebraically the paper's ``Σ_{C_k} q g + ε_k g(v)`` with
REINFORCE ``g(z) = (f(z) − b)∇log q(z) + ∇f(z)``; with ``b = 0`` it is that with plain
REINFORCE.  The authors' own REINFORCE+ (a fresh baseline draw per term, unconditional score)
is ``reinforce("independent_sample")``, kept for comparison (docs/discrete.md#toy-problem, the
table's last row).

How k is chosen (docs/discrete.md#choosing-k):

* ``k`` (static): ``C_k`` and one remainder draw (k + 1 evaluations); ``k = 0`` is the base
  estimator itself (bit for bit); ``k ≥ K`` the exact sum.
* ``budget=M`` with ``rule="prop2"``: ``k̂ = argmin_{j<M} ε_j/(M−j)`` (paper Prop. 2, over
  ``j < M``, not the paper's ``j ≤ M``: docs/discrete.md#budget-rule), then ``M − k̂`` iid
  remainder draws, each with weight ``ε_k̂/(M−k̂)``; ``rule="mass"``:
  ``k̂ = min{j : ε_j ≤ mass_tol} ∧ (M−1)``; ``rule="fixed"`` with ``k``: ``k`` summed and
  ``M − k`` draws.  Shapes stay static (``k̂`` is traced), so it runs under ``jit``.
  ``M ≥ K`` is the exact sum.

Weights ``q(z)`` and ``ε`` enter as stop-gradient constants; the gradient through q comes only
from ``log q`` of the evaluated indices and from ``ε`` (computed by logsumexp, never as
``1 − Σ p_top``: cancellation).  Everything works under ``jit``, ``vmap`` and ``grad``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

from stanvi.lazy_jax import jax, jnp, lax

Array = "jax.Array"  # annotations only (they are not evaluated)


def sg(x):  # noqa: ANN001, ANN201  (jax.lax.stop_gradient, read at the call: lazy JAX)
    return lax.stop_gradient(x)


BaselineKind = Literal["shared_sample", "independent_sample", "ema", "loo"]


# --------------------------------------------------------------------------------- columns
class Columns(NamedTuple):
    """The evaluated indices of one estimate (``M`` columns per row) and how each is weighted.

    ``idx`` (..., M) int; ``weight`` (..., M) the stop-gradient weight (``q(z)`` for a summed
    column, ``ε/n`` for a remainder column, 0 for an unused one); ``remainder`` (..., M) bool;
    ``mask`` (..., K) bool membership of ``C_k`` (None: ``k = 0`` with ``ε ≡ 1`` exactly);
    ``eps`` (...,) the remainder mass (stop-gradient); ``n_rem`` (...,) remainder columns."""

    idx: Array
    weight: Array
    remainder: Array
    mask: Array | None
    eps: Array
    n_rem: Array


def _rows(x: Array) -> tuple[Array, tuple[int, ...]]:
    """(x reshaped to (R, K), the leading shape)."""
    lead = x.shape[:-1]
    return x.reshape((math.prod(lead), x.shape[-1])), lead


def _log_mass(log_probs: Array, mask: Array) -> Array:
    """log Σ_{z∉mask} q(z) by logsumexp, differentiable, and safe where every entry is masked
    or −inf (the value is then −inf and the gradient 0, not NaN)."""
    masked = jnp.where(mask, -jnp.inf, log_probs)
    empty = jnp.all(jnp.isneginf(sg(masked)), axis=-1, keepdims=True)
    safe = jnp.where(empty, 0.0, masked)
    out = jax.nn.logsumexp(safe, axis=-1)
    return jnp.where(empty[..., 0], -jnp.inf, out)


def _top_mask(top: Array, K: int) -> Array:
    """(..., K) membership of the indices ``top`` (..., k)."""
    return jnp.any(jax.nn.one_hot(top, K, dtype=bool), axis=-2)


def fixed_columns(key: Array, lp: Array, k: int, n: int = 1) -> Columns:
    """``C_k`` by ``lax.top_k`` on ``lp`` (stop-gradient, normalised; ties broken by lax.top_k,
    which depends on q only) and ``n`` iid draws from ``q|C̄_k``; static k (clamped to K)."""
    K = lp.shape[-1]
    k = min(int(k), K)
    p = jnp.exp(lp)
    if k == K:   # exact: every category summed (static branch)
        idx = jnp.broadcast_to(jnp.arange(K), lp.shape)
        return Columns(idx, p, jnp.zeros(lp.shape, bool), jnp.ones(lp.shape, bool),
                       jnp.zeros(lp.shape[:-1]), jnp.zeros(lp.shape[:-1], jnp.int32))
    if k == 0:   # the base estimator: ε ≡ 1, v ~ q (no top_k: docs/discrete.md#choosing-k)
        v = jax.random.categorical(key, lp[..., None, :], axis=-1,
                                   shape=(*lp.shape[:-1], n))
        ones = jnp.ones(lp.shape[:-1])
        return Columns(v, jnp.full(v.shape, 1.0 / n), jnp.ones(v.shape, bool), None, ones,
                       jnp.full(lp.shape[:-1], n, jnp.int32))
    top = lax.top_k(lp, k)[1]
    mask = _top_mask(top, K)
    rem = jnp.where(mask, -jnp.inf, lp)
    eps = jnp.exp(_log_mass(lp, mask))
    v = jax.random.categorical(key, rem[..., None, :], axis=-1, shape=(*lp.shape[:-1], n))
    v = jnp.where(eps[..., None] > 0, v, top[..., :1])   # all-masked row: valid index, weight 0
    idx = jnp.concatenate([top, v], axis=-1)
    weight = jnp.concatenate([jnp.take_along_axis(p, top, -1),
                              jnp.broadcast_to((eps / n)[..., None], v.shape)], axis=-1)
    remainder = jnp.concatenate([jnp.zeros(top.shape, bool), jnp.ones(v.shape, bool)], axis=-1)
    return Columns(idx, weight, remainder, mask, eps, jnp.full(lp.shape[:-1], n, jnp.int32))


def remainder_masses(lp: Array, budget: int) -> tuple[Array, Array, Array]:
    """(top indices (..., M), their probabilities (..., M), ε_j for j = 0..M (..., M+1)):
    ``ε_M`` by logsumexp over the categories outside the top M, then
    ``ε_j = ε_M + Σ_{i=j}^{M−1} p_top[i]`` (docs/discrete.md#budget-rule; no cancellation)."""
    K = lp.shape[-1]
    top_lp, top = lax.top_k(lp, budget)
    p_top = jnp.exp(top_lp)
    eps_m = jnp.exp(_log_mass(lp, _top_mask(top, K)))
    tail = jnp.cumsum(p_top[..., ::-1], axis=-1)[..., ::-1]
    return top, p_top, jnp.concatenate([tail + eps_m[..., None], eps_m[..., None]], axis=-1)


def choose_k(eps: Array, budget: int, rule: str, mass_tol: float = 0.05,
             k: int | None = None) -> Array:
    """k̂ (...,) from the remainder masses ε_0..ε_M: 'prop2' ``argmin_{j<M} ε_j/(M−j)`` (paper
    Prop. 2; ties to the smaller j), 'mass' ``min{j : ε_j ≤ mass_tol} ∧ (M−1)``,
    'fixed' ``k``."""
    M = budget
    if rule == "prop2":
        return jnp.argmin(eps[..., :M] / (M - jnp.arange(M)), axis=-1).astype(jnp.int32)
    if rule == "mass":
        below = eps[..., :M] <= mass_tol
        first = jnp.where(jnp.any(below, -1), jnp.argmax(below, -1), M - 1)
        return first.astype(jnp.int32)
    if rule == "fixed":
        return jnp.full(eps.shape[:-1], min(int(k), M - 1), jnp.int32)
    raise ValueError(f"rule must be 'fixed', 'prop2' or 'mass', got {rule!r}")


def budget_columns(key: Array, lp: Array, budget: int, rule: str = "prop2",
                   mass_tol: float = 0.05, k: int | None = None) -> Columns:
    """``budget = M < K`` columns per row: the first k̂ (:func:`choose_k`) are the top
    categories with weight ``q(z)``, the other ``M − k̂`` are iid draws from ``q|C̄_k̂`` with
    weight ``ε_k̂/(M − k̂)`` (docs/discrete.md#budget-rule); k̂ is traced, shapes static."""
    M = int(budget)
    top, p_top, eps_all = remainder_masses(lp, M)
    khat = choose_k(eps_all, M, rule, mass_tol, k)
    rank = jnp.full(lp.shape, M, jnp.int32)
    rank = jnp.put_along_axis(rank, top, jnp.broadcast_to(jnp.arange(M, dtype=jnp.int32),
                                                          top.shape), axis=-1, inplace=False)
    mask = rank < khat[..., None]
    eps = jnp.take_along_axis(eps_all, khat[..., None], -1)[..., 0]
    draws = jax.random.categorical(key, jnp.where(mask, -jnp.inf, lp)[..., None, :], axis=-1,
                                   shape=(*lp.shape[:-1], M))
    col = jnp.arange(M)
    summed = col < khat[..., None]
    n_rem = M - khat
    draws = jnp.where(eps[..., None] > 0, draws, top[..., :1])
    idx = jnp.where(summed, top, draws)
    weight = jnp.where(summed, p_top, (eps / n_rem)[..., None])
    return Columns(idx, weight, ~summed, mask, eps, n_rem)


# --------------------------------------------------------------------------------- base estimators
@dataclass(frozen=True)
class Reinforce:
    """REINFORCE (score function) with an optional baseline, as the base estimator ``g`` of the
    Rao-Blackwellization (docs/discrete.md#base-estimators).

    ``baseline``:

    * None: ``g(z) = f(z)∇log q(z) + ∇f(z)``.
    * ``"shared_sample"`` (REINFORCE+, shared): ``b = sg f(z')`` with one ``z' ~ q`` per row,
      shared by all terms (one extra evaluation); the recommended variant.
    * ``"independent_sample"`` (the authors' code): a fresh ``z'_c ~ q`` per term, applied with
      the unconditional score to every term (M extra evaluations); unbiased, but not exact at
      ``k ≥ K−1`` and Prop. 1's ``ε_k`` factor can fail (docs/discrete.md#variance-bounds).
    * ``"ema"``: a value given by the caller (``baseline_value``, e.g. a running mean of past
      values, :func:`ema_update`); no extra evaluation.
    * ``"loo"``: for remainder draw i the mean of the other remainder draws' values (leave one
      out, Kool, van Hoof & Welling 2019) when there are ≥ 2; with one draw the weighted mean of
      the summed values ``Σ_{C_k} q f/(1 − ε)`` (docs/discrete.md#mixture-estimator); with
      neither, 0.  All are independent of the draw they are applied to, so unbiased.
    * a callable ``b(log_probs)`` → (...,) (NVIL-style learned baseline; the caller trains it).
    """

    baseline: None | BaselineKind | Callable = None

    def __post_init__(self) -> None:
        if not (self.baseline is None or callable(self.baseline)
                or self.baseline in ("shared_sample", "independent_sample", "ema", "loo")):
            raise ValueError(f"unknown baseline {self.baseline!r}; choose None, 'shared_sample', "
                             f"'independent_sample', 'ema', 'loo' or a callable")

    def n_extra(self, n_columns: int) -> int:
        """Extra evaluations per row (baseline draws)."""
        return {"shared_sample": 1, "independent_sample": n_columns}.get(
            self.baseline if isinstance(self.baseline, str) else "", 0)

    def extra_indices(self, key: Array, lp: Array, n_columns: int) -> Array:
        """The baseline draws z' ~ q (..., n_extra)."""
        e = self.n_extra(n_columns)
        return jax.random.categorical(key, lp[..., None, :], axis=-1, shape=(*lp.shape[:-1], e))

    def surrogate(self, log_probs: Array, cols: Columns, fv: Array, f_extra: Array,
                  baseline_value: Array | None = None) -> Array:
        """The per-row surrogate (...,) whose gradient is the RB estimate (module docstring)."""
        lq = jnp.take_along_axis(log_probs, cols.idx, -1)
        if self.baseline == "independent_sample":
            # the authors' form: every term g(z_c) = (f(z_c) − f(z'_c)) ∇log q(z_c) + ∇f(z_c)
            return jnp.sum(cols.weight * (sg(fv - f_extra) * lq + fv), axis=-1)
        b = self._baseline(log_probs, cols, fv, f_extra, baseline_value)
        w = jnp.exp(lq)
        summed = jnp.where(cols.remainder, 0.0, sg(fv) * w + cols.weight * fv)
        if cols.mask is None:   # k = 0: ε ≡ 1 exactly, ∇ε = 0
            rem = cols.weight * (sg(fv - b) * lq + fv)
        else:
            log_eps = _log_mass(log_probs, cols.mask)
            ok = cols.eps > 0
            log_eps_safe = jnp.where(ok, log_eps, 0.0)[..., None]
            eps_diff = jnp.where(ok, jnp.exp(log_eps_safe[..., 0]), 0.0)[..., None]
            n = jnp.maximum(cols.n_rem, 1)[..., None]
            score = jnp.where(ok[..., None], lq - log_eps_safe, 0.0)
            rem = sg(fv) * eps_diff / n + cols.weight * (sg(fv - b) * score + fv)
        return jnp.sum(summed + jnp.where(cols.remainder, rem, 0.0), axis=-1)

    def _baseline(self, log_probs, cols: Columns, fv, f_extra, baseline_value) -> Array:
        """b per column (..., M), stop-gradient."""
        kind = self.baseline
        if kind is None:
            return jnp.zeros_like(fv)
        if kind == "shared_sample":
            return jnp.broadcast_to(sg(f_extra[..., :1]), fv.shape)
        if kind == "ema":
            if baseline_value is None:
                raise ValueError("reinforce('ema') needs baseline_value (the running mean)")
            return jnp.broadcast_to(sg(jnp.asarray(baseline_value))[..., None], fv.shape)
        if kind == "loo":
            f = sg(fv)
            rem = cols.remainder
            n = cols.n_rem[..., None].astype(f.dtype)
            total = jnp.sum(jnp.where(rem, f, 0.0), -1, keepdims=True)
            loo = (total - f) / jnp.maximum(n - 1.0, 1.0)
            summed_w = jnp.sum(jnp.where(rem, 0.0, cols.weight), -1, keepdims=True)
            summed_mean = (jnp.sum(jnp.where(rem, 0.0, cols.weight * f), -1, keepdims=True)
                           / jnp.where(summed_w > 0, summed_w, 1.0))
            return jnp.where(n >= 2, loo, jnp.where(summed_w > 0, summed_mean, 0.0))
        return jnp.broadcast_to(sg(kind(sg(log_probs)))[..., None], fv.shape)   # callable


def reinforce(baseline: None | BaselineKind | Callable = None) -> Reinforce:
    """The REINFORCE base estimator with ``baseline`` (see :class:`Reinforce`)."""
    return Reinforce(baseline)


def ema_update(b: Array, value: Array, decay: float = 0.9) -> Array:
    """A running-mean baseline: ``decay·b + (1 − decay)·value`` (for ``reinforce('ema')``)."""
    return decay * b + (1.0 - decay) * sg(value)


# --------------------------------------------------------------------------------- estimators
class RBResult(NamedTuple):
    """``surrogate``: a scalar whose gradient is the estimate (summed over rows); ``value``: the
    unbiased estimate of ``Σ_z q f`` (summed over rows, stop-gradient); ``remainder_mass`` ε
    (...,); ``indices`` (..., M) and ``weights`` (..., M) of the evaluated columns."""

    surrogate: Array
    value: Array
    remainder_mass: Array
    indices: Array
    weights: Array


def _evaluate(key: Array, log_probs: Array, f: Callable, cols: Columns, base: Reinforce,
              baseline_value) -> RBResult:
    """Evaluate f once on the columns and the baseline draws together, and form the result."""
    lp = sg(log_probs)
    M = cols.idx.shape[-1]
    extra = base.extra_indices(key, lp, M)
    e = extra.shape[-1]
    values = f(jnp.concatenate([cols.idx, extra], axis=-1)) if e else f(cols.idx)
    fv, f_extra = values[..., :M], values[..., M:]
    surrogate = base.surrogate(log_probs, cols, fv, f_extra, baseline_value)
    value = jnp.sum(cols.weight * sg(fv))
    return RBResult(jnp.sum(surrogate), value, cols.eps, cols.idx, cols.weight)


def rao_blackwell(key: Array, log_probs: Array, f: Callable[[Array], Array], *,
                  k: int | None = None, budget: int | None = None,
                  rule: Literal["fixed", "prop2", "mass"] = "fixed", mass_tol: float = 0.05,
                  base: Reinforce | None = None, baseline_value: Array | None = None
                  ) -> RBResult:
    """The Rao-Blackwellized estimate of ``∇ Σ_z q(z) f(z)`` (docs/discrete.md#rb-estimator).

    Give ``k`` (static; one remainder draw, k + 1 evaluations) or ``budget`` (M evaluations
    per row, k̂ by ``rule``; with ``rule='fixed'`` also ``k``).  ``base`` defaults to
    ``reinforce('shared_sample')`` (docs/discrete.md#base-estimators).  ``log_probs`` must be
    normalised (``jax.nn.log_softmax``).  ``f`` is called once, on all evaluated indices
    (..., M + extra).
    """
    base = reinforce("shared_sample") if base is None else base
    log_probs = jnp.asarray(log_probs)
    if log_probs.ndim < 1 or log_probs.shape[-1] < 1:
        raise ValueError(f"log_probs must have shape (..., K) with K ≥ 1, got {log_probs.shape}")
    K = log_probs.shape[-1]
    key_v, key_b = jax.random.split(key)
    lp = sg(log_probs)
    if budget is None:
        if k is None or int(k) < 0:
            raise ValueError(f"give k ≥ 0 or budget ≥ 1, got k={k!r}, budget={budget!r}")
        cols = fixed_columns(key_v, lp, int(k))
    else:
        budget = int(budget)
        if budget < 1:
            raise ValueError(f"budget must be ≥ 1, got {budget}")
        if rule == "fixed" and (k is None or not 0 <= int(k) < budget):
            raise ValueError(f"rule='fixed' with a budget needs 0 ≤ k < budget, got k={k!r}")
        if budget >= K:
            cols = fixed_columns(key_v, lp, K)
        else:
            cols = budget_columns(key_v, lp, budget, rule, mass_tol, k)
    return _evaluate(key_b, log_probs, f, cols, base, baseline_value)


def score_function(key: Array, log_probs: Array, f: Callable[[Array], Array], *,
                   base: Reinforce | None = None, n: int = 1,
                   baseline_value: Array | None = None) -> RBResult:
    """The base estimator alone: the mean of n draws ``z ~ q`` of ``g`` (k = 0; no
    Rao-Blackwellization).  With the same key, ``rao_blackwell(k=0)`` equals it bit for bit."""
    base = reinforce() if base is None else base
    key_v, key_b = jax.random.split(key)
    lp = sg(jnp.asarray(log_probs))
    v = jax.random.categorical(key_v, lp[..., None, :], axis=-1, shape=(*lp.shape[:-1], n))
    ones = jnp.ones(lp.shape[:-1])
    cols = Columns(v, jnp.full(v.shape, 1.0 / n), jnp.ones(v.shape, bool), None, ones,
                   jnp.full(lp.shape[:-1], n, jnp.int32))
    return _evaluate(key_b, jnp.asarray(log_probs), f, cols, base, baseline_value)


def rb_terms(log_probs: Array, top_idx: Array, v: Array, f: Callable[[Array], Array],
             base: Reinforce | None = None, key: Array | None = None,
             baseline_value: Array | None = None) -> RBResult:
    """The estimate for a given summed set ``top_idx`` (..., k) and given remainder draws ``v``
    (..., n) (or (...,) for one): the deterministic core of :func:`rao_blackwell`, so tests can
    enumerate the expectation over v exactly (docs/discrete.md#rb-checks).  ``key`` drives the
    base's baseline draws; ``v`` must lie in the complement of ``top_idx`` (where ε > 0)."""
    base = reinforce() if base is None else base
    log_probs = jnp.asarray(log_probs)
    cols = columns_for(sg(log_probs), top_idx, v)
    key = jax.random.PRNGKey(0) if key is None else key
    return _evaluate(key, log_probs, f, cols, base, baseline_value)


def columns_for(lp: Array, top_idx: Array, v: Array) -> Columns:
    """The :class:`Columns` of a given summed set ``top_idx`` (..., k) and given remainder draws
    ``v`` (..., n) (or (...,)); ``lp`` normalised and stop-gradient."""
    K = lp.shape[-1]
    top_idx = jnp.asarray(top_idx, jnp.int32)
    v = jnp.asarray(v, jnp.int32)
    if v.ndim == lp.ndim - 1:
        v = v[..., None]
    n = v.shape[-1]
    p = jnp.exp(lp)
    if top_idx.shape[-1] == 0:
        return Columns(v, jnp.full(v.shape, 1.0 / n), jnp.ones(v.shape, bool), None,
                       jnp.ones(lp.shape[:-1]), jnp.full(lp.shape[:-1], n, jnp.int32))
    mask = _top_mask(top_idx, K)
    eps = jnp.exp(_log_mass(lp, mask))
    return Columns(jnp.concatenate([top_idx, v], -1),
                   jnp.concatenate([jnp.take_along_axis(p, top_idx, -1),
                                    jnp.broadcast_to((eps / n)[..., None], v.shape)], -1),
                   jnp.concatenate([jnp.zeros(top_idx.shape, bool), jnp.ones(v.shape, bool)],
                                   -1),
                   mask, eps, jnp.full(lp.shape[:-1], n, jnp.int32))


def exact_surrogate(log_probs: Array, f: Callable[[Array], Array]) -> Array:
    """``Σ_z q(z) f(z)`` over all categories: its gradient is the exact ∇L (K evaluations)."""
    log_probs = jnp.asarray(log_probs)
    idx = jnp.broadcast_to(jnp.arange(log_probs.shape[-1]), log_probs.shape)
    return jnp.sum(jnp.exp(log_probs) * f(idx))
