"""The QSGP training loop (docs/gp.md#training): sparse AdaGrad on (μ, C, RVM log s), Adam on θ
after a freeze, the data-Gram control variate kept up to date incrementally (Prop 3), all inside
one jit-compiled ``lax.scan`` over ``chunk`` steps with the state donated, so every m-sized array
is updated in place and a step costs the same for any n and m (docs/gp.md#step-cost,
docs/gp.md#jax-rules).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import jax.scipy.linalg
import numpy as np

from stanvi.errors import VIError
from stanvi.gp.estimators import Sizes, Slices, draw_indices, gather, make_batch, objective
from stanvi.gp.families import VParams, dense_columns, make_gp_family
from stanvi.gp.likelihoods import Gaussian
from stanvi.gp.optim import adagrad_sparse, adam


@dataclass(frozen=True)
class Options:
    """QSGP options; defaults in docs/gp.md#options.

    * ``batch_size`` n~ = min(n, 500); ``basis_batch_size`` m~ = min(m, 10⁴);
      ``diag_batch_size`` m~_r (None: m~) — Table 2 settings.
    * ``cv_rank`` n_bar = 500 support rows for the data-Gram control variate (Gaussian
      likelihood only; 0 turns it off).
    * ``full_basis_pass``: when ``basis_batch_size`` >= m, i~ = j~ = every basis once and
      r~ = every diagonal column (no basis subsampling, no control variate needed) instead of
      m iid draws (docs/gp.md#convergence); False restores the draws.
    * ``num_steps`` T = 10⁵; ``lr`` AdaGrad 0.1 with exponential decay to ``lr_decay``·lr at T
      (γ = 0.1^{1/T}); ``adagrad_init`` = 0.1 (the accumulator's start, TF's default).
    * ``nystrom_rank``: support inputs V (random inducing inputs) of the Nyström control
      variate for the dense prior-precision term of the inducing-point family (App. F.2 (i),
      docs/gp.md#control-variates; the paper's Table 3 used 200); 0 (default) turns it off.
    * ``learn_hyperparameters`` (empirical Bayes) with Adam at ``hyper_lr`` = 1e-5, frozen for
      the first ``freeze_steps`` (None: 10 % of T).
    * ``chunk``: steps per compiled call (one row of the ELBO trace: the mean of the chunk's
      stochastic ELBO estimates); ``exact_elbo_every``: also log the exact ELBO every that many
      chunks (small problems only; 0 = never).
    * ``dtype``: ``"float64"`` (default: the statistical tests' precision) or ``"float32"``,
      the precision of the training state and data inside the loop (on a GPU float32 is the
      fast path; docs/gp.md#options).  The fitted parameters are returned as float64 arrays
      either way; predictions are made in float64.
    """

    batch_size: int = 500
    basis_batch_size: int = 10_000
    diag_batch_size: int | None = None
    cv_rank: int = 500
    num_steps: int = 100_000
    lr: float = 0.1
    lr_decay: float = 0.1
    adagrad_init: float = 0.1
    learn_hyperparameters: bool = True
    hyper_lr: float = 1e-5
    freeze_steps: int | None = None
    chunk: int = 100
    exact_elbo_every: int = 0
    nystrom_rank: int = 0
    dtype: str = "float64"
    full_basis_pass: bool = True


PROFILES: dict[str, dict] = {"default": {}}
"""Named option sets, read by :func:`stanvi.methods.make_options` (which checks names and
types): one, the defaults of :class:`Options` (docs/gp.md#options)."""
DEFAULT_PROFILE = "default"


class State(NamedTuple):
    mu: jax.Array
    ld: jax.Array
    L: jax.Array
    logs: jax.Array
    G_mu: jax.Array
    G_ld: jax.Array
    G_L: jax.Array
    G_logs: jax.Array
    theta: dict
    m1: dict
    m2: dict
    a_mu: jax.Array
    A: jax.Array
    t: jax.Array
    a_nys: jax.Array
    A_nys: jax.Array


class Data(NamedTuple):
    X: jax.Array
    y: jax.Array
    Xp: jax.Array      # control-variate support rows
    arrays: dict
    theta0: dict
    V: jax.Array       # Nyström support inputs (nys, d)
    R: jax.Array       # lower Cholesky factor of K(V, V) (nys, nys)


def check_model(model) -> None:
    """Refuse what QSGP cannot fit (docs/gp.md#likelihoods, docs/gp.md#stan-models)."""
    if not getattr(model.likelihood, "is_log_concave", False):
        raise VIError(f"qsgp needs a log-concave likelihood: {model.likelihood.name} is not, so "
                      "the stochastic lower bound of QSGP does not hold for it")
    if not hasattr(model.likelihood, "expected_log_site"):
        raise VIError(f"likelihood {model.likelihood.name} has no expected log site function")


DTYPES = {"float32": jnp.float32, "float64": jnp.float64}


def cast_floats(tree, dtype):
    """Every floating-point leaf of ``tree`` as ``dtype`` (integer leaves unchanged)."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating) else x,
        tree)


def sizes_for(model, family, opts: Options) -> Sizes:
    n, m = model.n, model.m
    k = family.num_dense(m)
    mt = min(m, int(opts.basis_batch_size))
    nt = min(n, int(opts.batch_size))
    mr = 0 if k >= m else int(opts.diag_batch_size or mt)
    # m~ >= m: every basis once per factor, no basis noise, and the data-Gram CV is exactly 0
    full = bool(opts.full_basis_pass) and int(opts.basis_batch_size) >= m
    if full:
        mr = m - k
    nbar = int(opts.cv_rank) if isinstance(model.likelihood, Gaussian) and not full else 0
    nbar = min(nbar, n)
    for name, value in (("batch_size", nt), ("basis_batch_size", mt)):
        if value < 1:
            raise ValueError(f"qsgp option {name} must be >= 1, got {value}")
    if opts.dtype not in DTYPES:
        raise ValueError(f"qsgp option dtype must be one of {sorted(DTYPES)}, got {opts.dtype!r}")
    nys = int(opts.nystrom_rank)
    if nys and model.basis.is_diagonal:
        raise ValueError("qsgp option nystrom_rank needs a dense prior precision (the "
                         f"inducing-point basis); {model.basis.name} has a diagonal S")
    if nys < 0:
        raise ValueError(f"qsgp option nystrom_rank must be >= 0, got {nys}")
    return Sizes(n=n, m=m, k=k, nt=nt, mt=mt, mr=mr, nbar=nbar,
                 nys=0 if full else min(nys, m), full=full)


def hyper_mask(model, learn: bool) -> dict:
    """1.0 for the hyperparameters QSGP learns (basis.learnable, Gaussian.learn_noise)."""
    out = {}
    for key in model.theta:
        on = learn
        if key in ("log_ell", "log_sf2"):
            on = on and model.basis.learnable
        if key == "log_noise":
            on = on and getattr(model.likelihood, "learn_noise", True)
        out[key] = jnp.asarray(1.0 if on else 0.0)
    return out


def init_state(model, sz: Sizes, opts: Options, key: jax.Array) -> tuple[State, Data]:
    """μ = 0; off-diagonals 0; c_rr from Prop 1 (docs/gp.md#training); p = n_bar random rows;
    a = Φ0[p] μ = 0, A = Φ0[p, :k] diag(c_rr[:k])."""
    m, k = sz.m, sz.k
    theta = {kk: jnp.asarray(v, dtype=jnp.float64) for kk, v in model.theta.items()}
    noise = model.likelihood.init_noise_var(theta)
    c0 = jnp.asarray(model.basis.init_diag_sd(model.n, noise, theta, model.arrays, model.X))
    logs = (jnp.full((m,), math.log(model.basis.s0)) if model.basis.per_basis_precision
            else jnp.zeros((0,)))
    g0 = float(opts.adagrad_init)
    rng = np.random.default_rng(np.asarray(jax.random.randint(key, (), 0, 2**31 - 1)).item())
    p = rng.choice(model.n, size=sz.nbar, replace=False) if sz.nbar else np.zeros(0, int)
    X = jnp.asarray(model.X)
    Xp = X[jnp.asarray(p)] if sz.nbar else jnp.zeros((0, model.d))
    A = jnp.zeros((sz.nbar, k))
    if sz.nbar and k:
        A = model.features(Xp, jnp.arange(k), theta) * c0[:k][None, :]
    V, R = jnp.zeros((0, model.d)), jnp.zeros((0, 0))
    A_nys = jnp.zeros((sz.nys, k))
    if sz.nys:   # Nyström support: n_bar random inducing inputs, K(V, V) = R Rᵀ (once)
        q = jnp.asarray(np.sort(rng.choice(m, size=sz.nys, replace=False)))
        V = model.arrays["Z"][q]
        R = jnp.linalg.cholesky(model.basis.prior_precision(model.arrays, q, q, theta))
        if k:
            A_nys = jax.scipy.linalg.solve_triangular(
                R, model.features(V, jnp.arange(k), theta), lower=True) * c0[:k][None, :]
    state = State(mu=jnp.zeros(m), ld=jnp.log(c0), L=jnp.zeros((m, k)), logs=logs,
                  G_mu=jnp.full((m,), g0), G_ld=jnp.full((m,), g0), G_L=jnp.full((m, k), g0),
                  G_logs=jnp.full(logs.shape, g0), theta=theta,
                  m1=jax.tree.map(jnp.zeros_like, theta), m2=jax.tree.map(jnp.zeros_like, theta),
                  a_mu=jnp.zeros(sz.nbar), A=A, t=jnp.asarray(0, jnp.int32),
                  a_nys=jnp.zeros(sz.nys), A_nys=A_nys)
    # strong (non-weak) dtypes: the state a chunk returns has the types it was given
    dtype = DTYPES[opts.dtype]
    state = cast_floats(jax.tree.map(lambda x: jnp.asarray(np.asarray(x)), state), dtype)
    data = Data(X=X, y=jnp.asarray(model.y), Xp=Xp, arrays=model.arrays,
                theta0={kk: jnp.array(v, copy=True) for kk, v in theta.items()}, V=V, R=R)
    return state, cast_floats(data, dtype)


def make_step(model, sz: Sizes, opts: Options, logdet_S_const: float | None):
    """One QSGP step (docs/gp.md#training) as a pure function
    (state, data, key) -> (state, elbo^)."""
    T = int(opts.num_steps)
    gamma = float(opts.lr_decay) ** (1.0 / max(T, 1))
    freeze = int(opts.freeze_steps if opts.freeze_steps is not None else T // 10)
    mask = hyper_mask(model, bool(opts.learn_hyperparameters))
    learn_any = any(float(v) for v in mask.values())
    k = sz.k
    rvm = model.basis.per_basis_precision

    def loss_fn(sl, theta, batch, arrays):
        return objective(model, sz, sl, theta, batch, arrays, logdet_S_const)

    if learn_any:
        grad_fn = jax.value_and_grad(loss_fn, argnums=(0, 1))
    else:   # no backward pass through the features when θ is fixed
        vg = jax.value_and_grad(loss_fn, argnums=0)

        def grad_fn(sl, theta, batch, arrays):
            loss, g = vg(sl, theta, batch, arrays)
            return loss, (g, None)

    def step(state: State, data: Data, key: jax.Array):
        t = state.t + 1
        l, i, j, r = draw_indices(jax.random.fold_in(key, t), sz)
        batch = make_batch(sz, data.X, data.y, data.Xp, l, i, j, r, model.basis, data.arrays,
                           data.theta0, state.a_mu, state.A,
                           (data.V, data.R, state.a_nys, state.A_nys) if sz.nys else None)
        W = batch.W
        sl = Slices(mu=gather(state.mu, W), ld=gather(state.ld, W),
                    L=state.L.at[W].get(mode="fill", fill_value=0.0),
                    logs=gather(state.logs, W) if rvm else state.logs)
        loss, (g_sl, g_th) = grad_fn(sl, state.theta, batch, data.arrays)
        lr = (opts.lr * gamma ** t.astype(jnp.float64)).astype(state.mu.dtype)
        mu, G_mu, mu_W = adagrad_sparse(state.mu, state.G_mu, W, sl.mu, g_sl.mu, lr)
        ld, G_ld, ld_W = adagrad_sparse(state.ld, state.G_ld, W, sl.ld, g_sl.ld, lr)
        L, G_L, L_W = state.L, state.G_L, sl.L
        if k:
            L, G_L, L_W = adagrad_sparse(state.L, state.G_L, W, sl.L, g_sl.L, lr)
        logs, G_logs = state.logs, state.G_logs
        if rvm:
            logs, G_logs, _ = adagrad_sparse(state.logs, state.G_logs, W, sl.logs, g_sl.logs, lr)
        # Prop 3: a <- a + P[:, U](u_U_new − u_U_old) after the step, for u = μ and the
        # dense columns of C, P = Φ0[p] (data-Gram CV) and P = Ψ (Nyström CV)
        d_mu = mu_W - sl.mu
        d_C = (dense_columns(W, L_W, ld_W[batch.pk], k)
               - dense_columns(W, sl.L, sl.ld[batch.pk], k)) if k else None
        a_mu, A = state.a_mu, state.A
        if sz.nbar:
            a_mu, A = _prop3(batch.Phi0, a_mu, A, d_mu, d_C)
        a_nys, A_nys = state.a_nys, state.A_nys
        if sz.nys:
            a_nys, A_nys = _prop3(batch.Psi, a_nys, A_nys, d_mu, d_C)
        theta, m1, m2 = state.theta, state.m1, state.m2
        if learn_any:
            lr_th = opts.hyper_lr * gamma ** t.astype(jnp.float64)
            th_new, m1_new, m2_new = adam(theta, g_th, m1, m2, t - freeze, lr_th, mask)
            on = t > freeze
            pick = lambda new, old: jax.tree.map(lambda a, b: jnp.where(on, a, b), new, old)  # noqa: E731
            theta, m1, m2 = pick(th_new, theta), pick(m1_new, m1), pick(m2_new, m2)
        new = State(mu, ld, L, logs, G_mu, G_ld, G_L, G_logs, theta, m1, m2, a_mu, A, t,
                    a_nys, A_nys)
        # the carry keeps the state's dtype (float32 runs: a float64 constant must not promote it)
        new = jax.tree.map(lambda a, old: a.astype(old.dtype), new, state)
        return new, -loss

    return step


def _prop3(P, a, A, d_mu, d_C):
    """The incremental update of a = P μ and A = P C[:, :k] by the step's change (Prop 3)."""
    return a + P @ d_mu, (A if d_C is None else A + P @ d_C)


def make_chunk_runner(step, length: int):
    """``length`` steps in one compiled call, the state donated (updated in place)."""

    @partial(jax.jit, donate_argnums=(0,))
    def run_chunk(state, data, key):
        return jax.lax.scan(lambda s, _: step(s, data, key), state, None, length=length)

    return run_chunk


def logdet_constant(model) -> float | None:
    if model.basis.is_diagonal:
        return None
    return model.basis.logdet_precision_exact(model.arrays, model.theta)


def run(model, family, *, seed: int = 0, options: Options, progress: bool = False):
    """Fit ``model`` with QSGP; returns a :class:`stanvi.gp.result.GPFit`."""
    from stanvi.gp.result import GPFit  # noqa: PLC0415

    check_model(model)
    family = make_gp_family(family)
    sz = sizes_for(model, family, options)
    T = int(options.num_steps)
    if T < 1:
        raise ValueError(f"qsgp option num_steps must be >= 1, got {T}")
    chunk = max(1, min(int(options.chunk), T))
    key = jax.random.PRNGKey(seed)
    t0 = time.perf_counter()
    state, data = init_state(model, sz, options, jax.random.fold_in(key, 10**6))
    logdet_S = logdet_constant(model)
    step = make_step(model, sz, options, logdet_S)
    runner = make_chunk_runner(step, chunk)
    tail = T % chunk
    runner_tail = make_chunk_runner(step, tail) if tail else None
    trace: list[dict] = [{"iteration": 0, "elbo": float("nan"), "wall_time": 0.0}]
    compile_time = 0.0
    done = 0
    n_chunks = 0
    status, message = "max_iters", f"ran num_steps={T} steps"
    compiled = {}
    while done < T:
        length = chunk if T - done >= chunk else tail
        if length not in compiled:
            c0 = time.perf_counter()
            fn = runner if length == chunk else runner_tail
            compiled[length] = fn.lower(state, data, key).compile()
            compile_time += time.perf_counter() - c0
        state, elbos = compiled[length](state, data, key)
        elbos = np.asarray(elbos)
        done += length
        n_chunks += 1
        if not np.all(np.isfinite(elbos)):
            status = "failed"
            message = f"the ELBO estimate became non-finite at step ~{done} (lower lr?)"
            trace.append({"iteration": done, "elbo": float("nan"),
                          "wall_time": time.perf_counter() - t0})
            break
        row = {"iteration": done, "elbo": float(np.mean(elbos)),
               "lr": float(options.lr * (options.lr_decay ** (done / T))),
               "wall_time": time.perf_counter() - t0}
        if options.exact_elbo_every and n_chunks % int(options.exact_elbo_every) == 0:
            row["exact_elbo"] = model.exact_elbo(
                _vparams(state), cast_floats(state.theta, jnp.float64),
                state.logs.astype(jnp.float64) if state.logs.size else None)
        trace.append(row)
    wall = time.perf_counter() - t0
    info = {"sizes": sz.__dict__, "logdet_S": logdet_S, "steps": done}
    if sz.nbar and sz.m * sz.nbar <= 5 * 10**7:
        info["cv_drift"] = cv_drift(model, state, data, sz)
    if sz.nys and sz.m * sz.nys <= 5 * 10**7:
        info["nystrom_drift"] = nystrom_drift(model, state, data, sz)
    if status == "failed":
        raise VIError(f"qsgp: {message}")
    return GPFit(model=model, method="qsgp", family=family, params=_vparams(state, numpy=True),
                 theta={kk: np.asarray(v, dtype=np.float64) for kk, v in state.theta.items()},
                 log_s=np.asarray(state.logs, dtype=np.float64) if state.logs.size else None, options=options,
                 seed=seed, trace=trace, status=status, message=message, wall_time=wall,
                 compile_time=compile_time, info=info)


def cv_drift(model, state: State, data: Data, sz: Sizes) -> float:
    """‖a − Φ0[p] μ‖ / ‖Φ0[p] μ‖: how far the incrementally kept control-variate vector has
    drifted from its definition (Prop 3; ~1e-12 in float64).  O(n_bar m), once per fit."""
    P0 = np.asarray(model.features(data.Xp, jnp.arange(sz.m), data.theta0))
    return _relative_gap(state.a_mu, P0 @ np.asarray(state.mu))


def nystrom_drift(model, state: State, data: Data, sz: Sizes) -> float:
    """‖ν − Ψ μ‖ / ‖Ψ μ‖ for the Nyström control variate's ν (Ψ = R⁻¹ K(V, Z); App. F.2 (i)
    with the Prop 3 bookkeeping).  O(n_bar m), once per fit."""
    K = np.asarray(model.features(data.V, jnp.arange(sz.m), data.theta0))
    return _relative_gap(state.a_nys, np.linalg.solve(np.asarray(data.R), K) @ np.asarray(state.mu))


def _relative_gap(kept, ref: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(kept) - ref) / max(np.linalg.norm(ref), 1e-300))


def _vparams(state: State, numpy: bool = False) -> VParams:
    if numpy:
        return VParams(*(np.asarray(a, dtype=np.float64) for a in (state.mu, state.ld, state.L)))
    return VParams(*(a.astype(jnp.float64) for a in (state.mu, state.ld, state.L)))
