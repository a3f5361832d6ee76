"""``stanvi bench qsgp``: the QSGP figures of issue 14 (docs/gp.md#measured).

* ``steps``: median wall time per QSGP step (mean-field, Gaussian, n~ = 100, m~ = 1000,
  n_bar = 100) for n in {10⁴, 10⁵, 10⁶} and m in {10⁴, 10⁵, 10⁶, 10⁷}, after 20 warm-up steps,
  over 200 timed steps (20 compiled chunks of 10, ``block_until_ready``), against the ``svi``
  baseline (n~ = 100, one reparameterised draw, all m features per row: O(n~ m d)).
* ``accuracy``: RMSE / MNLP (regression, Gaussian and Laplace noise) and error rate / MNLP
  (classification) on simulated sets sized like the paper's (n = 40,000 like kin40k, 60,000
  like MNIST), QSGP-0 and QSGP-10 against the svi baseline at the same number of steps and an
  exact posterior on fewer features.
* ``small``: the small accuracy check (docs/gp.md#small-check), against a design prototype's
  figures.
* ``walltime``: QSGP-0 against svi at step counts that take about the same time (m = 10⁴, 10⁵).
* ``convergence``: issue T3-8's table: QSGP's and svi's predictive mean against the exact
  posterior's on a regression with n = 4000, m = 400 (docs/gp.md#convergence).
* ``rvm``: relevance vectors of QSRVM on sinc against full-batch EM / MacKay references.
* ``cv``: variance of the ELBO estimate and of its gradient with the data-Gram control variate
  for n_bar in {0, 50, 100, 300, 500} (the paper's kin40k study: m = 10⁴ RFF, μ from the
  prior, m~ = n~ = 500, 1000 evaluations each).

Data (docs/gp.md#simulated-data): x ~ U[−1, 1]^4; f a GP sample drawn through a 10⁴-feature
RFF with another seed (SE kernel, ℓ = 0.5, s_f = 1); y = f + N(0, 0.1²), or Laplace(b = 0.1)
noise, or y ~ Bernoulli(σ(3f)).
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.gp import estimators as E
from stanvi.gp import qsgp, svi
from stanvi.gp.basis import RandomFourierFeatures
from stanvi.gp.families import Chevron, MeanField
from stanvi.gp.kernels import SquaredExponential
from stanvi.gp.model import rff_classification, rff_regression, rvm_regression

D = 4


def simulate(n: int, kind: str = "gaussian", seed: int = 0, truth_seed: int = 12345,
             truth_m: int = 10_000, d: int = D):
    """(X, y, f) of docs/gp.md#simulated-data; kind 'gaussian', 'laplace' or 'classification'
    (``truth_m`` features for the true f: 10⁴ by default; the timing grid uses fewer, its
    data content does not matter)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, (n, d))
    truth = RandomFourierFeatures(m=truth_m, kernel=SquaredExponential(lengthscale=0.5),
                                  seed=truth_seed)
    arrays = truth.arrays(X)
    theta = truth.theta0(d)
    w = np.random.default_rng(truth_seed).standard_normal(truth_m)
    feats = jax.jit(lambda Xb: truth.features(arrays, Xb, jnp.arange(truth_m), theta) @ w)
    f = np.concatenate([np.asarray(feats(jnp.asarray(X[i:i + 2000])))
                        for i in range(0, n, 2000)])
    if kind == "gaussian":
        y = f + 0.1 * rng.standard_normal(n)
    elif kind == "laplace":
        y = f + rng.laplace(scale=0.1, size=n)
    else:
        y = np.where(rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-3.0 * f)), 1.0, -1.0)
    return X, y, f


# ------------------------------------------------------------------ step time

def _time_chunks(fn, state, args, n_chunks: int, warm: int = 2):
    for _ in range(warm):
        state, out = fn(state, *args)
        jax.block_until_ready(out)
    times = []
    for _ in range(n_chunks):
        t = time.perf_counter()
        state, out = fn(state, *args)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def qsgp_step_ms(n: int, m: int, *, nt=100, mt=1000, nbar=100, X=None, y=None,
                 dtype: str = "float64") -> float:
    model = rff_regression(X[:n], y[:n], m=m, lengthscale=0.5, noise=0.01)
    opts = qsgp.Options(batch_size=nt, basis_batch_size=mt, cv_rank=nbar, num_steps=10**5,
                        dtype=dtype)
    sz = qsgp.sizes_for(model, MeanField(), opts)
    state, data = qsgp.init_state(model, sz, opts, jax.random.PRNGKey(0))
    run = qsgp.make_chunk_runner(qsgp.make_step(model, sz, opts, None), 10)
    sec = _time_chunks(run, state, (data, jax.random.PRNGKey(1)), 20)
    assert run._cache_size() == 1, "qsgp chunk compiled more than once"
    return 1e3 * sec / 10


def svi_step_ms(n: int, m: int, *, nt=100, steps=10, X=None, y=None) -> float:
    model = rff_regression(X[:n], y[:n], m=m, lengthscale=0.5, noise=0.01)
    opts = svi.Options(batch_size=nt, num_steps=10**5)
    theta = {k: jnp.asarray(v) for k, v in model.theta.items()}
    cols = jnp.arange(m)
    feats = model.basis.columns(model.arrays, cols)
    s_diag = model.basis.precision_diag(model.arrays, cols, theta)
    params = (jnp.zeros(m), jnp.full((m,), -3.0))
    carry = svi.initial_carry(params)
    run = svi.make_chunk(model, opts, steps)
    args = (jnp.asarray(model.X), jnp.asarray(model.y), theta, feats, s_diag, jax.random.PRNGKey(1))
    sec = _time_chunks(lambda c, *a: run(c, *a), carry, args, 3, warm=1)
    assert run._cache_size() == 1, "svi chunk compiled more than once"
    return 1e3 * sec / steps


def bench_steps(ns=(10**4, 10**5, 10**6), ms=(10**4, 10**5, 10**6, 10**7),
                svi_ms=(10**4, 10**5, 10**6), qsgp: bool = True, dtype: str = "float64") -> dict:
    """QSGP's grid in ``dtype`` (the svi baseline always in float64)."""
    X, y, _ = simulate(max(ns), "gaussian", seed=1, truth_m=500)
    out = {"qsgp": {}, "svi": {}, "dtype": dtype}
    for n in (ns if qsgp else ()):
        for m in ms:
            out["qsgp"][f"{n},{m}"] = qsgp_step_ms(n, m, X=X, y=y, dtype=dtype)
            print(f"  qsgp  n={n:>8} m={m:>9}: {out['qsgp'][f'{n},{m}']:8.2f} ms/step", flush=True)
    n_svi = 10**5 if 10**5 in ns else ns[0]
    for m in svi_ms:
        out["svi"][f"{n_svi},{m}"] = svi_step_ms(n_svi, m, X=X, y=y)
        print(f"  svi   n={n_svi:>8} m={m:>9}: {out['svi'][f'{n_svi},{m}']:8.2f} ms/step", flush=True)
    return out


# ------------------------------------------------------------------ accuracy

def _rmse(pred, truth) -> float:
    """Root mean squared difference (the test RMSE against the noise-free f)."""
    return float(np.sqrt(np.mean((np.asarray(pred) - np.asarray(truth)) ** 2)))


def _fit(model, method, family=None, **opts):
    from stanvi.gp.dispatch import fit_gp  # noqa: PLC0415

    t = time.perf_counter()
    res = fit_gp(model, method=method, family=family or "meanfield", **opts)
    return res, time.perf_counter() - t


def bench_accuracy(steps: int = 3000, m: int = 10_000, nt: int = 200, mt: int = 500) -> dict:
    """Scaled down from the paper (m = 10⁵, 10⁵ steps, n~ = 500, m~ = 10⁴) to fit 2 CPU cores:
    m = 10⁴, ``steps`` steps, n~ = 200, m~ = 500, hyperparameters fixed at the truth's ℓ."""
    out = {}
    qs = dict(batch_size=nt, basis_batch_size=mt, cv_rank=100, num_steps=steps,
              chunk=max(1, steps // 10), lr=0.1, learn_hyperparameters=False)
    for kind, n_train in (("gaussian", 36_000), ("laplace", 36_000), ("classification", 54_000)):
        n_test = n_train // 9
        X, y, f = simulate(n_train + n_test, kind, seed=2)
        Xtr, ytr, Xte, yte = X[:n_train], y[:n_train], X[n_train:], y[n_train:]
        if kind == "classification":
            make = lambda mm: rff_classification(Xtr, ytr, m=mm, lengthscale=0.5)  # noqa: E731
        else:
            make = lambda mm: rff_regression(Xtr, ytr, m=mm, lengthscale=0.5,  # noqa: E731
                                             noise=0.01 if kind == "gaussian" else 0.1,
                                             likelihood=kind)
        rows = {}
        model = make(m)
        for label, method, fam, extra in (
                ("qsgp-0", "qsgp", MeanField(), {}),
                ("qsgp-10", "qsgp", Chevron(10), {}),
                ("svi", "svi", None, {})):
            kw = dict(qs) if method == "qsgp" else dict(batch_size=nt, num_steps=steps,
                                                        chunk=max(1, steps // 10))
            if method == "qsgp" and kind != "gaussian":
                kw["cv_rank"] = 0
            res, sec = _fit(model, method, fam, **kw)
            met = res.metrics(Xte, yte)
            if kind != "classification":
                met["rmse_f"] = _rmse(res.predict(Xte).mean, f[n_train:])
            met["seconds"] = sec
            rows[label] = met
            print(f"  {kind:<14} {label:<8} " + "  ".join(f"{k}={v:.4g}" for k, v in met.items()),
                  flush=True)
        if kind == "gaussian":
            ref = make(1000)
            res, sec = _fit(ref, "exact")
            met = res.metrics(Xte, yte)
            met["rmse_f"] = _rmse(res.predict(Xte).mean, f[n_train:])
            met["seconds"] = sec
            rows["exact(m=1000)"] = met
            print(f"  {kind:<14} exact(m=1000) " + "  ".join(f"{k}={v:.4g}" for k, v in met.items()),
                  flush=True)
        out[kind] = {"n_train": n_train, "n_test": n_test, "m": m, "steps": steps, **rows}
    return out


def bench_small(steps: int = 20_000) -> dict:
    """The small accuracy check (docs/gp.md#small-check), to compare with a design
    prototype's figures: n = 5000, m = 500 RFF, d = 2, σ = 0.1, m~ = n~ = 100, ``steps``
    AdaGrad steps at a constant lr 0.1, hyperparameters fixed; with the control variate
    (n̄ = 500) and without.  Reports the test RMSE against f, and the relative error of the
    predictive mean against the exact posterior mean of the same model (the prototype: 0.026 /
    0.050 with the CV, 0.031 / 0.059 without; exact posterior RMSE 0.008 on its data)."""
    X, y, f = simulate(6000, "gaussian", seed=0, d=2)
    Xtr, ytr, Xte, fte = X[:5000], y[:5000], X[5000:], f[5000:]
    model = rff_regression(Xtr, ytr, m=500, lengthscale=0.5, noise=0.01)
    ex, sec = _fit(model, "exact")
    m_ex = np.asarray(ex.predict(Xte).mean)
    out = {"exact": {"rmse_f": _rmse(m_ex, fte), "seconds": sec}}
    print(f"  exact posterior        rmse_f={out['exact']['rmse_f']:.4f}", flush=True)
    for nbar in (500, 0):
        res, sec = _fit(model, "qsgp", batch_size=100, basis_batch_size=100, cv_rank=nbar,
                        num_steps=steps, chunk=1000, lr=0.1, lr_decay=1.0,
                        learn_hyperparameters=False)
        mean = np.asarray(res.predict(Xte).mean)
        row = {"rmse_f": _rmse(mean, fte),
               "rel_err_vs_exact": float(np.linalg.norm(mean - m_ex) / np.linalg.norm(m_ex)),
               "seconds": sec}
        out[f"qsgp nbar={nbar}"] = row
        print(f"  qsgp n_bar={nbar:<4} rmse_f={row['rmse_f']:.4f}  relative error vs exact "
              f"mean={row['rel_err_vs_exact']:.4f}  {sec:.0f} s", flush=True)
    return out


WALLTIME_RUNS = ((10_000, "svi", 3000), (10_000, "qsgp", 10_000),
                 (100_000, "svi", 600), (100_000, "qsgp", 4000), (100_000, "qsgp", 12_000))
"""(m, method, steps) of the equal-wall-time comparison: step counts chosen from the measured
step times so that each pair takes about the same time."""


def bench_walltime(runs=WALLTIME_RUNS, nt: int = 200, mt: int = 500) -> dict:
    """The regression set of :func:`bench_accuracy` (n_train = 36,000), QSGP-0 (constant lr
    0.1, n̄ = 100, θ fixed) against svi at step counts that take about equal time."""
    n_train = 36_000
    X, y, f = simulate(n_train + n_train // 9, "gaussian", seed=2)
    Xte, yte, fte = X[n_train:], y[n_train:], f[n_train:]
    out = {}
    for m, method, steps in runs:
        model = rff_regression(X[:n_train], y[:n_train], m=m, lengthscale=0.5, noise=0.01)
        if method == "qsgp":
            res, sec = _fit(model, "qsgp", MeanField(), batch_size=nt, basis_batch_size=mt,
                            cv_rank=100, num_steps=steps, chunk=max(1, steps // 10), lr=0.1,
                            lr_decay=1.0, learn_hyperparameters=False)
        else:
            res, sec = _fit(model, "svi", None, batch_size=nt, num_steps=steps,
                            chunk=max(1, steps // 10))
        met = res.metrics(Xte, yte)
        met["rmse_f"] = _rmse(res.predict(Xte).mean, fte)
        met["seconds"] = sec
        out[f"{m},{method},{steps}"] = met
        print(f"  m={m:<7} {method:<5} {steps:>6} steps  rmse_f={met['rmse_f']:.3f}  "
              f"mnlp={met['mnlp']:.3f}  {sec:.0f} s", flush=True)
    return out


def sinc_data(n: int = 500, seed: int = 0):
    """Tipping's sinc problem: x ~ U[−10, 10], y = sin(x)/x + N(0, 0.1²)."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-10.0, 10.0, (n, 1))
    return X, np.sinc(X[:, 0] / np.pi) + 0.1 * rng.standard_normal(n)


def bench_rvm(steps: int = 40_000, lengthscale: float = 2.0, em_iters=(100, 300, 1000)) -> dict:
    """Relevance vectors (s_i < 10⁴) of QSRVM on sinc (docs/gp.md#rvm-pruning; n = m = 500; the
    paper's 13), with the paper's settings (Chevron(10), m~ = 250, n~ = 100, n̄ = 250), beside
    two full-batch references on the exact Gaussian posterior: the EM update
    s_i <- 1/(μ_i² + Σ_ii) (the fixed point QSGP's gradient ascent in s seeks) and MacKay's
    s_i <- γ_i/μ_i², γ_i = 1 − s_i Σ_ii (Tipping 2001)."""
    from stanvi.gp.dispatch import fit_gp  # noqa: PLC0415

    X, y = sinc_data()
    noise = 0.01
    model = rvm_regression(X, y, lengthscale=lengthscale, noise=noise)
    res = fit_gp(model, method="qsgp", family=Chevron(10), batch_size=100,
                 basis_batch_size=250, cv_rank=250, num_steps=steps, chunk=max(1, steps // 10),
                 learn_hyperparameters=False)
    full = fit_gp(model, method="qsgp", family=Chevron(10), batch_size=100, cv_rank=250,
                  num_steps=steps, chunk=max(1, steps // 10), learn_hyperparameters=False)
    out = {}
    for label, r in (("qsgp", res), ("qsgp, full basis pass", full)):   # m~ = 250, m~ >= m
        out[label] = {"steps": steps, "relevance_vectors": int(len(r.relevance_vectors())),
                      "median_s": float(np.median(np.exp(r.log_s)))}
        print(f"  {label} ({steps} steps): {out[label]['relevance_vectors']} relevance vectors, "
              f"median s {out[label]['median_s']:.3g}", flush=True)
    x = X[:, 0]
    K = np.exp(-(x[:, None] - x[None, :]) ** 2 / (2 * lengthscale**2))
    KtK, Kty = K.T @ K / noise, K.T @ y / noise
    for rule in ("em", "mackay"):
        s = np.ones(len(x))
        counts = {}
        for it in range(1, max(em_iters) + 1):
            Sig = np.linalg.inv(np.diag(s) + KtK)
            mu = Sig @ Kty
            if rule == "em":
                s = 1.0 / (mu**2 + np.diag(Sig))
            else:
                s = np.minimum((1.0 - s * np.diag(Sig)) / np.maximum(mu**2, 1e-300), 1e12)
            if it in em_iters:
                counts[it] = int(np.sum(s < 1e4))
        out[rule] = counts
        print(f"  exact posterior, {rule} update: relevance vectors after "
              + ", ".join(f"{k} iterations: {v}" for k, v in counts.items()), flush=True)
    return out


# ------------------------------------------------------------------ control variate

def bench_cv(n: int = 40_000, m: int = 10_000, nt: int = 500, mt: int = 500,
             nbars=(0, 50, 100, 300, 500), evals: int = 1000, lengthscale: float = 0.5) -> dict:
    """Variance of the ELBO estimate and of its gradient for each n̄ (see the module
    docstring); ``lengthscale`` is the model's RFF lengthscale (the data's truth keeps ℓ = 0.5)."""
    X, y, _ = simulate(n, "gaussian", seed=3)
    model = rff_regression(X, y, m=m, lengthscale=lengthscale, noise=0.01)
    mu = jnp.asarray(np.random.default_rng(4).standard_normal(m))   # from the prior (s_f = 1)
    out = {}
    for nbar in nbars:
        opts = qsgp.Options(batch_size=nt, basis_batch_size=mt, cv_rank=nbar)
        sz = qsgp.sizes_for(model, MeanField(), opts)
        state, data = qsgp.init_state(model, sz, opts, jax.random.PRNGKey(5))
        P0 = model.basis.features(model.arrays, data.Xp, jnp.arange(m), data.theta0) if nbar \
            else jnp.zeros((0, m))
        a_mu = P0 @ mu if nbar else jnp.zeros(0)

        def one(key, sz=sz, data=data, a_mu=a_mu, state=state):
            l, i, j, r = E.draw_indices(key, sz)
            b = E.make_batch(sz, data.X, data.y, data.Xp, l, i, j, r, model.basis, data.arrays,
                             data.theta0, a_mu, state.A)

            def val(mu_w):
                sl = E.Slices(mu_w, E.gather(state.ld, b.W), state.L.at[b.W].get(
                    mode="fill", fill_value=0.0), state.logs)
                return -E.objective(model, sz, sl, model.theta, b, data.arrays, None)

            v, g = jax.value_and_grad(val)(E.gather(mu, b.W))
            return v, jnp.zeros(m).at[b.W].add(g, mode="drop")

        f = jax.jit(jax.vmap(one))
        vals, grads = [], []
        for c in range(evals // 50):
            v, g = f(jax.random.split(jax.random.PRNGKey(100 + c), 50))
            vals.append(np.asarray(v))
            grads.append(np.asarray(g))
        vals = np.concatenate(vals)
        grads = np.concatenate(grads)
        out[nbar] = {"value_var": float(vals.var()), "grad_var": float(grads.var(axis=0).sum()),
                     "value_mean": float(vals.mean())}
    base = out[nbars[0]]
    for nbar in nbars:
        out[nbar]["value_reduction"] = base["value_var"] / out[nbar]["value_var"]
        out[nbar]["grad_reduction"] = base["grad_var"] / out[nbar]["grad_var"]
        print(f"  n_bar={nbar:>4}: Var(ELBO^) / {out[nbar]['value_reduction']:6.2f}, "
              f"Var(grad) / {out[nbar]['grad_reduction']:6.2f}", flush=True)
    return out


def run(parts=("steps", "accuracy", "cv", "small"), *, steps: int = 3000, output=None,
        max_n: int = 10**6, max_m: int = 10**7, dtype: str = "float64") -> dict:
    """Run the chosen parts, print their figures, write JSON to ``output``."""
    print(f"stanvi bench qsgp (JAX backend: {jax.default_backend()}, "
          f"{jax.device_count()} device(s))", flush=True)
    out: dict = {"backend": jax.default_backend()}
    if "steps" in parts:
        print(f"step time (median ms per step; QSGP-0 in {dtype}: n~ = 100, m~ = 1000, "
              "n_bar = 100; svi in float64)")
        ns = tuple(n for n in (10**4, 10**5, 10**6) if n <= max_n)
        ms = tuple(m for m in (10**4, 10**5, 10**6, 10**7) if m <= max_m)
        out["steps"] = bench_steps(ns, ms, tuple(m for m in ms if m <= 10**6), dtype=dtype)
        q = list(out["steps"]["qsgp"].values())
        print(f"  qsgp max/min over the grid: {max(q) / min(q):.2f}")
    if "cv" in parts:
        print("control variate (kin40k-like: n = 40,000, m = 10⁴, m~ = n~ = 500, 1000 evaluations)")
        out["cv"] = bench_cv()
        for ell in (1.0, 2.0):   # smoother features: the low-rank Gram approximates ΦᵀΦ better
            print(f"  the same with the model's lengthscale {ell} (500 evaluations)")
            out[f"cv_lengthscale_{ell}"] = bench_cv(nbars=(0, 300), evals=500, lengthscale=ell)
    if "small" in parts:
        print("the small accuracy check (n = 5000, m = 500, d = 2, m~ = n~ = 100, "
              "2·10⁴ steps at lr 0.1)")
        out["small"] = bench_small()
    if "walltime" in parts:
        print("equal wall time (regression, n_train = 36,000; QSGP-0 vs svi)")
        out["walltime"] = bench_walltime()
    if "rvm" in parts:
        print("QSRVM on sinc (n = m = 500; the paper: 13 relevance vectors)")
        out["rvm"] = bench_rvm()
    if "accuracy" in parts:
        print(f"accuracy (simulated; m = 10⁴, {steps} steps, n~ = 200, m~ = 500)")
        out["accuracy"] = bench_accuracy(steps=steps)
    if output:
        with open(output, "w") as fh:
            json.dump(out, fh, indent=1)
    return out
