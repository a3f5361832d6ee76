"""``method="svi"``: the O(m)-per-step baseline (docs/gp.md#methods) — doubly-stochastic
reparameterised VI (Titsias & Lázaro-Gredilla 2014): a data minibatch of n~ rows plus one
reparameterised draw w = μ + σ ⊙ ε of a mean-field q, so a step costs O(n~ m d) (every basis
function at every sampled row), against QSGP's O(n~ m~ d).  Dense Adam on (μ, log σ); θ is
held fixed.  Diagonal prior precision only (RFF, RVM at its initial s): a dense S makes log p(w)
O(m²)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.errors import VIError
from stanvi.gp.families import MeanField, VParams
from stanvi.gp.optim import ADAM_B1, ADAM_B2, ADAM_EPS

_LOG_2PI = math.log(2.0 * math.pi)


@dataclass(frozen=True)
class Options:
    """``batch_size`` n~ (500, as QSGP's default); ``num_steps``; Adam ``lr`` 0.01 with
    exponential decay to ``lr_decay``·lr at the end (our choice for the baseline); ``chunk``
    steps per compiled call (one trace row)."""

    batch_size: int = 500
    num_steps: int = 10_000
    lr: float = 0.01
    lr_decay: float = 0.1
    chunk: int = 100


PROFILES: dict[str, dict] = {"default": {}}
"""Named option sets, read by :func:`stanvi.methods.make_options`: one, the defaults above."""
DEFAULT_PROFILE = "default"


def make_chunk(model, opts: Options, length: int):
    """A compiled function running ``length`` SVI steps (state donated)."""
    basis, lik = model.basis, model.likelihood
    n, m = model.n, model.m
    nt = min(n, int(opts.batch_size))
    T = int(opts.num_steps)
    gamma = float(opts.lr_decay) ** (1.0 / max(T, 1))

    def neg_elbo(params, theta, Xl, yl, feats, s, eps):
        mu, ld = params
        w = mu + jnp.exp(ld) * eps
        P = basis.features_at(feats, Xl, theta)
        f = P @ w
        loglik = (n / nt) * jnp.sum(lik.expected_log_site(yl, f, jnp.zeros_like(f), theta))
        logp = -0.5 * jnp.sum(s * w * w) + 0.5 * jnp.sum(jnp.log(s)) - 0.5 * m * _LOG_2PI
        ent = jnp.sum(ld) + 0.5 * m * (1.0 + _LOG_2PI)
        return -(loglik + logp + ent)

    def step(carry, X, y, theta, feats, s_diag, key):
        params, m1, m2, t = carry
        t = t + 1
        k1, k2 = jax.random.split(jax.random.fold_in(key, t))
        l = jax.random.randint(k1, (nt,), 0, n)
        eps = jax.random.normal(k2, (m,))
        loss, g = jax.value_and_grad(neg_elbo)(params, theta, X[l], y[l], feats, s_diag, eps)
        m1 = jax.tree.map(lambda a, b: ADAM_B1 * a + (1 - ADAM_B1) * b, m1, g)
        m2 = jax.tree.map(lambda a, b: ADAM_B2 * a + (1 - ADAM_B2) * b * b, m2, g)
        tf = t.astype(jnp.float64)
        lr = opts.lr * gamma ** tf
        params = jax.tree.map(lambda p, a, b: p - lr * (a / (1 - ADAM_B1 ** tf))
                              / (jnp.sqrt(b / (1 - ADAM_B2 ** tf)) + ADAM_EPS), params, m1, m2)
        return (params, m1, m2, t), -loss

    @partial(jax.jit, donate_argnums=(0,))
    def run_chunk(carry, X, y, theta, feats, s_diag, key):
        return jax.lax.scan(lambda c, _: step(c, X, y, theta, feats, s_diag, key), carry, None,
                            length=length)

    return run_chunk


def initial_carry(params):
    """(params, Adam moments, t) with strong (non-weak) dtypes, so that the carry returned by a
    chunk has the same types as the one given and the chunk compiles once."""
    carry = (params, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params),
             jnp.asarray(0, jnp.int32))
    return jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), carry)


def prepare(model) -> tuple[tuple, tuple, jax.Array | None]:
    """(carry, (X, y, θ, feature columns, prior precision diagonal), log s) of an svi run from
    its start: μ = 0, log σ from the basis's initial sd; the arguments every chunk takes."""
    basis = model.basis
    m = model.m
    theta = {k: jnp.asarray(v) for k, v in model.theta.items()}
    cols = jnp.arange(m)
    log_s = jnp.full((m,), math.log(basis.s0)) if basis.per_basis_precision else None
    s_diag = basis.precision_diag(model.arrays, cols, theta, log_s)
    feats = basis.columns(model.arrays, cols)   # stored once: O(m d) memory
    noise = model.likelihood.init_noise_var(theta)
    ld0 = jnp.log(basis.init_diag_sd(model.n, noise, theta, model.arrays, model.X))
    carry = initial_carry((jnp.zeros(m), ld0))
    return carry, (jnp.asarray(model.X), jnp.asarray(model.y), theta, feats, s_diag), log_s


def run(model, family=None, *, seed: int = 0, options: Options, progress=False):
    from stanvi.gp.result import GPFit  # noqa: PLC0415

    if family is not None and getattr(family, "name", family) not in ("meanfield",):
        raise ValueError("method 'svi' fits a mean-field q only")
    basis = model.basis
    if not basis.is_diagonal:
        raise VIError("method 'svi' needs a diagonal prior precision (RFF or RVM): with a dense S "
                      "log p(w) costs O(m²) per step")
    T = int(options.num_steps)
    chunk = max(1, min(int(options.chunk), T))
    m = model.m
    carry, (X, y, theta, feats, s_diag), log_s = prepare(model)
    key = jax.random.PRNGKey(seed)
    t0 = time.perf_counter()
    compiled, compile_time = {}, 0.0
    trace = [{"iteration": 0, "elbo": float("nan"), "wall_time": 0.0}]
    done = 0
    while done < T:
        length = min(chunk, T - done)
        if length not in compiled:
            c0 = time.perf_counter()
            compiled[length] = make_chunk(model, options, length).lower(
                carry, X, y, theta, feats, s_diag, key).compile()
            compile_time += time.perf_counter() - c0
        carry, elbos = compiled[length](carry, X, y, theta, feats, s_diag, key)
        elbos = np.asarray(elbos)
        done += length
        if not np.all(np.isfinite(elbos)):
            raise VIError(f"svi: the ELBO estimate became non-finite at step ~{done}")
        trace.append({"iteration": done, "elbo": float(np.mean(elbos)),
                      "wall_time": time.perf_counter() - t0})
    (mu, ld), *_ = carry
    params = VParams(np.asarray(mu), np.asarray(ld), np.zeros((m, 0)))
    return GPFit(model=model, method="svi", family=MeanField(), params=params,
                 theta={k: np.asarray(v) for k, v in theta.items()},
                 log_s=None if log_s is None else np.asarray(log_s), options=options, seed=seed,
                 trace=trace, status="max_iters", message=f"ran num_steps={T} steps",
                 wall_time=time.perf_counter() - t0, compile_time=compile_time,
                 info={"sizes": {"nt": min(model.n, options.batch_size), "mt": m}})
