"""The paper's toy problem (Liu et al. 2019, §5.1; docs/discrete.md#toy-problem) and exact
moments of the Rao-Blackwellized estimators on any small categorical, by enumeration.

The problem: three Bernoullis ``b_i ~ Bernoulli(σ(η))``, ``f(b) = Σ_i (b_i − p_i)²`` with
``p = (0.6, 0.51, 0.48)``, treated as one categorical over K = 8 (index ``4b₁ + 2b₂ + b₃``);
``L(η) = Σ_i [σ(1 − p_i)² + (1 − σ)p_i²] = Σp² − 0.18 σ(η)``, minimised over
the scalar η; ``∇L = −0.18 σ(1 − σ)``: −0.0031793 at η = −4, −0.045 at η = 0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.discrete.rao_blackwell import Reinforce, rb_terms, reinforce

TOY_P = (0.6, 0.51, 0.48)
TOY_K = 8
_BITS = np.array([[(z >> 2) & 1, (z >> 1) & 1, z & 1] for z in range(TOY_K)], dtype=float)


def toy_log_probs(eta: jax.Array) -> jax.Array:
    """log q_η(b) for the 8 configurations (index 4b₁ + 2b₂ + b₃), shape (8,)."""
    bits = jnp.asarray(_BITS)
    return jnp.sum(bits * jax.nn.log_sigmoid(eta) + (1 - bits) * jax.nn.log_sigmoid(-eta), -1)


def toy_f(idx: jax.Array) -> jax.Array:
    """f(b) = Σ_i (b_i − p_i)² for indices of any shape."""
    table = jnp.asarray(((_BITS - np.array(TOY_P)) ** 2).sum(-1))
    return table[idx]


def toy_loss(eta) -> jax.Array:
    """L(η) = Σ_b q_η(b) f(b) exactly."""
    return jnp.sum(jnp.exp(toy_log_probs(eta)) * toy_f(jnp.arange(TOY_K)))


def toy_grad(eta) -> jax.Array:
    """∇L(η) exactly (= −0.18 σ(η)(1 − σ(η)))."""
    return jax.grad(toy_loss)(jnp.asarray(eta, dtype=jnp.float64))


@functools.lru_cache(maxsize=256)
def _rb_grads(log_probs_fn: Callable, f: Callable, k: int, with_baseline: bool) -> Callable:
    """jit(vmap) of the RB gradient over remainder draws v (and baseline values b) for a summed
    set of size k: one compiled program per (problem, k)."""
    base = reinforce("ema") if with_baseline else reinforce()

    def one(eta, top, v, b):
        return jax.grad(lambda e: rb_terms(log_probs_fn(e), top, v[None], f, base,
                                           baseline_value=b if with_baseline else None
                                           ).surrogate)(eta)

    return jax.jit(jax.vmap(one, in_axes=(None, None, 0, 0)))


def exact_moments(log_probs_fn: Callable, f: Callable, eta, top_idx, base: Reinforce
                  ) -> tuple[float, float]:
    """(mean, variance) of the RB estimate of ``∇_η Σ q_η f`` for a scalar η, the summed set
    ``top_idx`` (k,) and one remainder draw, by exact enumeration over the remainder draw v and
    the base's baseline draws (docs/discrete.md#rb-checks).

    ``base``: ``reinforce()`` (deterministic), ``reinforce('shared_sample')`` (one z' shared by
    all terms: enumerated jointly with v), or ``reinforce('independent_sample')`` (z'_c per term:
    Var = E_v Var(ĝ|v) + Var_v E(ĝ|v), with ``Var(ĝ|v) = Σ_c (w_c ∂log q(z_c))² Var_q f``)."""
    eta = jnp.asarray(eta, dtype=jnp.float64)
    lp = np.asarray(log_probs_fn(eta))
    K = lp.shape[-1]
    q = np.exp(lp)
    top_idx = np.asarray(top_idx, dtype=np.int32)
    k = top_idx.size
    rest = np.setdiff1d(np.arange(K), top_idx) if k else np.arange(K)
    eps = q[rest].sum() if k else 1.0   # the remainder draw's weight
    v_probs = (q[rest] / eps if eps > 0 else np.zeros(len(rest))) if k else q
    if len(rest) == 0 or (k and not eps > 0):
        rest, v_probs = np.array([int(top_idx[0])]), np.array([1.0])
    fz = np.asarray(f(jnp.arange(K)))
    top = jnp.asarray(top_idx)
    if base.baseline is None:
        g = np.asarray(_rb_grads(log_probs_fn, f, k, False)(
            eta, top, jnp.asarray(rest, jnp.int32), jnp.zeros(len(rest))))
        mean = float(v_probs @ g)
        return mean, float(v_probs @ (g - mean) ** 2)
    if base.baseline == "shared_sample":
        vs, zs = np.meshgrid(rest, np.arange(K), indexing="ij")
        g = np.asarray(_rb_grads(log_probs_fn, f, k, True)(
            eta, top, jnp.asarray(vs.ravel(), jnp.int32), jnp.asarray(fz[zs.ravel()])))
        joint = (v_probs[:, None] * q[None, :]).ravel()
        mean = float(joint @ g)
        return mean, float(joint @ (g - mean) ** 2)
    if base.baseline == "independent_sample":
        # E(ĝ|v) is the unconditional-form estimator with every b_c = E b (it is linear in each)
        mean_b = float(q @ fz)
        var_b = float(q @ (fz - mean_b) ** 2)
        score = np.asarray(jax.jacobian(log_probs_fn)(eta))   # ∂log q(z)/∂η, (K,)
        idx = np.concatenate([np.broadcast_to(top_idx, (len(rest), k)), rest[:, None]], 1)
        w = np.concatenate([q[top_idx], [eps]])
        lq_grad = score[idx]                                   # (n_v, k+1)
        f_idx = fz[idx]
        cm = np.sum(w * (f_idx - mean_b) * lq_grad, 1)          # (f here does not depend on η)
        cv = np.sum((w * lq_grad) ** 2, 1) * var_b
        mean = float(v_probs @ cm)
        return mean, float(v_probs @ cv + v_probs @ (cm - mean) ** 2)
    raise ValueError(f"exact_moments enumerates the baselines None, 'shared_sample' and "
                     f"'independent_sample', not {base.baseline!r}")


def top_set(log_probs, k: int) -> np.ndarray:
    """The summed set C_k exactly as :func:`~stanvi.discrete.rao_blackwell.rao_blackwell`
    chooses it (``lax.top_k`` on the stop-gradient log-probabilities; ties as lax breaks them)."""
    lp = jnp.asarray(log_probs)
    if k == 0:
        return np.zeros(0, dtype=np.int32)
    return np.asarray(jax.lax.top_k(lp, min(k, lp.shape[-1]))[1])


def sgd_paths(key: jax.Array, *, estimator: str = "rb", k: int = 1,
              base: Reinforce | None = None, n_trials: int = 20, n_steps: int = 1000,
              lr: float = 1.0, eta0: float = -4.0) -> np.ndarray:
    """The toy problem's SGD runs (docs/discrete.md#toy-problem: lr 1.0, 1000 steps from η = −4,
    20 trials, as in the authors' code): the exact loss L(η_t) after each step, (n_trials,
    n_steps).  ``estimator``: 'exact' (the exact gradient), 'rb'
    (:func:`~stanvi.discrete.rao_blackwell.rao_blackwell` with ``k``; ``k = 0`` is the base
    estimator itself)."""
    from stanvi.discrete.rao_blackwell import rao_blackwell  # noqa: PLC0415

    base = reinforce() if base is None else base

    def grad(eta, key):
        if estimator == "exact":
            return jax.grad(toy_loss)(eta)
        return jax.grad(lambda e: rao_blackwell(key, toy_log_probs(e), toy_f, k=k,
                                                base=base).surrogate)(eta)

    def run(key):
        def step(eta, key):
            eta = eta - lr * grad(eta, key)
            return eta, toy_loss(eta)
        _, losses = jax.lax.scan(step, jnp.asarray(eta0, jnp.float64),
                                 jax.random.split(key, n_steps))
        return losses

    return np.asarray(jax.jit(jax.vmap(run))(jax.random.split(key, n_trials)))
