"""``stanvi bench qsgp --models crossover``: QSGP against ``svi`` at equal wall time at
m = 10⁶ and 10⁷ RFF bases (issue T3-8 item 2; docs/gp.md#crossover).

Each (m, method) run gets the same wall budget of training steps (compilation and the accuracy
checkpoints are not counted). At checkpoints (1/16, 1/8, 1/4, 1/2 and all of the budget) the
run's predictive mean at held-out inputs is scored against the noise-free f (RMSE): the exact
posterior is out of reach at these m. QSGP runs with the step-time grid's sizes (n~ = 100, m~ = 1000,
n̄ = 100) and AdaGrad 0.1, svi with 100 rows per step and Adam 0.01; θ fixed in both. Each method's
rate decays by its default factor 0.1 over the steps the budget allows (planned from the measured
step time; ``schedule="constant"`` keeps the rates constant, as the first GPU run did).

Resumable: each finished run is written to ``output`` at once and skipped when the command is run
again with the same budget, so the CPU runs (hours) can span sessions.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.bench.qsgp_bench import simulate
from stanvi.gp import qsgp, svi
from stanvi.gp.families import MeanField, VParams
from stanvi.gp.model import rff_regression
from stanvi.gp.predict import latent_moments

CHECKPOINTS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0)
"""Fractions of the wall budget at which the predictive mean is scored."""


def _runner(method: str, model, opts):
    """(state, one(state, length) -> state, mean weights μ(state)) of a run from its start."""
    key = jax.random.PRNGKey(0)
    if method == "qsgp":
        sz = qsgp.sizes_for(model, MeanField(), opts)
        state, data = qsgp.init_state(model, sz, opts, jax.random.fold_in(key, 10**6))
        step = qsgp.make_step(model, sz, opts, qsgp.logdet_constant(model))
        chunks: dict = {}

        def one(st, length):
            if length not in chunks:
                chunks[length] = qsgp.make_chunk_runner(step, length)
            st, elbos = chunks[length](st, data, key)
            return st, elbos

        return state, one, lambda st: st.mu
    carry, args, _ = svi.prepare(model)
    chunks = {}

    def one(c, length):
        if length not in chunks:
            chunks[length] = svi.make_chunk(model, opts, length)
        return chunks[length](c, *args, key)

    return carry, one, lambda c: c[0][0]


def _rmse_of(model, mu, Xte, fte) -> float:
    m = model.m
    mean, _ = latent_moments(model, VParams(jnp.asarray(mu, jnp.float64), jnp.zeros(m),
                                            jnp.zeros((m, 0))), model.theta, Xte,
                             col_chunk=min(m, 2**15), row_chunk=1024)
    return float(np.sqrt(np.mean((mean - fte) ** 2)))


def timed_run(method: str, model, budget: float, Xte, fte, schedule: str = "planned") -> dict:
    """Train for ``budget`` seconds of steps; the RMSE of the predictive mean at each checkpoint.

    Single steps of a provisional run time the step (the median of five, after one that
    compiles); the run is then built for budget / step time
    steps (its rate schedule planned for them) and started again. Each chunk length compiles on
    its first call, outside the clock; chunks of about budget/64 seconds are run, the last ones
    shortened to the time left."""
    state, one, _ = _runner(method, model, _options(method, 10**6, schedule))
    c0 = time.perf_counter()
    times = []
    for _ in range(6):                  # the first call compiles; the median of the other five
        t = time.perf_counter()
        state, out = one(state, 1)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t)
    step_s = plan_step_s = max(float(np.median(times[1:])), 1e-6)
    planned = max(1, int(budget / plan_step_s))
    state, one, mean_of = _runner(method, model, _options(method, planned, schedule))
    length = int(min(1000, max(1, round(budget / 64 / step_s))))
    for n in {1, length}:               # compile both chunk lengths outside the clock
        state, out = one(state, n)
        jax.block_until_ready(out)
    compile_s = time.perf_counter() - c0
    steps, spent, rows = 1 + (length if length > 1 else 0), 0.0, []
    for frac in CHECKPOINTS:
        while spent < frac * budget:
            n = length if spent + length * step_s <= frac * budget or length == 1 else 1
            t = time.perf_counter()
            state, out = one(state, n)
            jax.block_until_ready(out)
            dt = time.perf_counter() - t
            spent += dt
            steps += n
            if n == length:
                step_s = dt / n
        if not bool(jnp.all(jnp.isfinite(mean_of(state)))):
            rows.append({"seconds": spent, "steps": steps, "rmse_f": math.nan})
            break
        rows.append({"seconds": spent, "steps": steps,
                     "rmse_f": _rmse_of(model, mean_of(state), Xte, fte)})
        print(f"    {method:<5} {spent:8.1f} s  {steps:>9} steps  rmse_f {rows[-1]['rmse_f']:.4f}",
              flush=True)
    return {"method": method, "budget_s": budget, "schedule": schedule, "planned_steps": planned,
            "plan_step_ms": 1e3 * plan_step_s, "compile_s": compile_s, "step_ms": 1e3 * step_s, "checkpoints": rows}


SVI_BATCH = 100
"""svi's rows per step at these m (the step-time grid's n~): its step forms the n~ × m feature
matrix, 8 GB in float64 at m = 10⁷ with 100 rows."""


def _options(method: str, steps: int, schedule: str):
    """The run's options: ``schedule`` "planned" decays each method's rate by its default
    factor (0.1) over ``steps`` (the budget over the measured step time), "constant" keeps it."""
    decay = {"planned": 0.1, "constant": 1.0}[schedule]
    if method == "qsgp":
        return qsgp.Options(batch_size=100, basis_batch_size=1000, cv_rank=100, lr=0.1,
                            lr_decay=decay, learn_hyperparameters=False, num_steps=steps)
    return svi.Options(batch_size=SVI_BATCH, lr_decay=decay, num_steps=steps)


def bench_crossover(sizes=(10**6, 10**7), budget: float = 600.0, n_train: int = 100_000,
                    n_test: int = 1000, output: str | os.PathLike | None = None,
                    methods=("svi", "qsgp"), schedule: str = "planned") -> dict:
    """The equal-wall-time comparison (module docstring); ``output`` keeps finished runs."""
    path = Path(output) if output else None
    done = json.loads(path.read_text()) if path and path.is_file() else {}
    X, y, f = simulate(n_train + n_test, "gaussian", seed=3)
    Xte, fte = X[n_train:], f[n_train:]
    print(f"crossover: n = {n_train:,}, d = 4, budget {budget:.0f} s of steps per run, backend "
          f"{jax.default_backend()}; RMSE of the predictive mean vs f at {n_test} test inputs "
          f"(sd of f {np.std(fte):.3f})", flush=True)
    for m in sizes:
        model = rff_regression(X[:n_train], y[:n_train], m=m, lengthscale=0.5, noise=0.01)
        for method in methods:
            key = f"{jax.default_backend()},{m},{method},{budget:g},{schedule}"
            if key in done:
                print(f"  m = {m:.0e} {method}: done before", flush=True)
                continue
            print(f"  m = {m:.0e} {method}", flush=True)
            try:
                done[key] = timed_run(method, model, budget, Xte, fte, schedule)
            except (MemoryError, RuntimeError, ValueError) as err:   # XLA's out-of-memory
                done[key] = {"method": method, "error": f"{type(err).__name__}: {err}"[:500]}
                print(f"    {done[key]['error']}", flush=True)
            if path:
                path.write_text(json.dumps(done, indent=1))
    print(crossover_table(done))
    return done


def crossover_table(done: dict) -> str:
    """A Markdown table: per backend and m, each method's RMSE at each checkpoint."""
    lines = ["| backend | m | method | rate | budget (s) | step (ms) | steps in budget | RMSE vs f "
             "at 1/16, 1/8, 1/4, 1/2, all of the budget |", "|---|---|---|---|---|---|---|---|"]
    for key, run in done.items():
        backend, m, method, budget, *rest = key.split(",")
        schedule = rest[0] if rest else "constant"   # the first GPU run's keys had no schedule
        head = f"| {backend} | {int(m):.0e} | {method} | {schedule} | {budget} |"
        if "error" in run:
            lines.append(f"{head} – | – | {run['error'][:80]} |")
            continue
        rows = run["checkpoints"]
        lines.append(f"{head} {run['step_ms']:.1f} | "
                     f"{rows[-1]['steps']:,} | "
                     + ", ".join(f"{r['rmse_f']:.3f}" for r in rows) + " |")
    return "\n".join(lines)


if __name__ == "__main__":      # the device machine runs it without the CLI's dependencies
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=600.0)
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--n-train", type=int, default=100_000)
    ap.add_argument("--methods", default="svi,qsgp")
    ap.add_argument("--schedule", choices=("planned", "constant"), default="planned")
    ap.add_argument("--output", default=None)
    a = ap.parse_args()
    bench_crossover(tuple(int(float(s)) for s in a.sizes.split(",")), a.budget, a.n_train,
                    output=a.output, methods=tuple(a.methods.split(",")), schedule=a.schedule)
