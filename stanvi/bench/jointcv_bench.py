"""``stanvi bench jointcv``: the joint control variate's figures on simulated logistic
regressions of the paper's Sonar (208×60) and Australian (690×14) sizes, and optionally one with
N = 100,000 (issue 11; docs/jointcv.md#metrics, docs/jointcv.md#simulated-data).

For each problem:

1. **Variance decomposition along one joint run** (docs/jointcv.md#metrics, the paper's Table 1
   columns): at checkpoints of a joint-SAGA run (SGD, b = 5, lr 5e-4; b = 100 and Adam for the
   large problem) the total naive variance V_{n,ε}, the subsampling part V_n (batches of b, ε
   integrated out), the MC part V_ε (full data, one ε), and the variances of the naive, cv and
   joint estimators (the latter with the run's own table).  Variances are traces of
   covariances, of the μ-block ("mu") and of all parameters ("all"), estimated from ``reps``
   draws.
2. **Full-data ELBO vs iterations and vs wall time** (run time: the ELBO evaluations excluded)
   for naive, cv, joint (SAGA and SVRG) and, on the small problems, inc; through
   ``stanvi.fit(method="jointcv")``.
3. **Stan block target vs JAX per-datum target**: the same joint run on the same data through
   ``stan_models/jointcv_logistic`` split into blocks of one row, seconds per iteration each.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

import numpy as np

from stanvi.estimators.joint_cv import JointSAGA
from stanvi.estimators.subsampled import Naive, noise, row_gradients
from stanvi.estimators.taylor_cv import TaylorCV
from stanvi.families.gaussian import MeanField
from stanvi.fit import fit as stanvi_fit
from stanvi.methods.jointcv import Epoch, OptimizerState, next_batch, optimizer_step
from stanvi.targets.subsampled import logistic_regression_target

PROBLEMS = {"sonar": (208, 60), "australian": (690, 14), "large": (100_000, 20)}
# The Stan model with N >= 10,000 rows (stan_models/jointcv_logistic, N = 10,000, K = 5):
# jointcv against full-batch TrustVI and ADVI, in wall time to within 1 nat of the stored optimum.
STAN_PROBLEM = "stan10k"


def simulate(n: int, d: int, seed: int = 0, c: float = 6.0) -> tuple[np.ndarray, np.ndarray]:
    """The recipe of docs/jointcv.md#simulated-data: standardized X ~ N(0, I) (ddof 0),
    z* ~ N(0, c/d I), y ~ Bern(sigmoid(X z*))."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X = (X - X.mean(0)) / X.std(0)
    z = rng.normal(0.0, math.sqrt(c / d), d)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-X @ z))).astype(float)
    return X, y


def _saved(est) -> dict:
    return {k: v.copy() for k, v in vars(est).items() if isinstance(v, np.ndarray)}


def _restore(est, saved: dict) -> None:
    for k, v in saved.items():
        setattr(est, k, v.copy())


def estimator_variance(est, params: np.ndarray, b: int, reps: int, rng) -> dict[str, float]:
    """Trace of the covariance of ``est``'s estimate at ``params`` over (batch, ε), the
    estimator's state restored after each draw (i.i.d. batches without replacement)."""
    saved = _saved(est)
    draws = np.empty((reps, len(params)))
    for r in range(reps):
        draws[r] = est.gradient(params, rng.choice(est.n, b, replace=False),
                                rng.standard_normal(est.d))
        _restore(est, saved)
    var = draws.var(axis=0, ddof=1)
    return {"mu": float(var[: est.d].sum()), "all": float(var.sum())}


def decomposition(target, family, params: np.ndarray, b: int, reps: int, rng
                  ) -> dict[str, dict[str, float]]:
    """V_n (subsampling: variance over batches of the ε-averaged batch gradient, exact over
    batches given per-datum means from ``reps`` ε draws) and V_ε (MC: variance over ε of the
    full-data gradient ∇f(w; ε)), docs/jointcv.md#noise-sources."""
    n, d = target.n_terms, family.dim
    everyone = np.arange(n)
    rows = np.broadcast_to(params, (n, len(params)))
    per_datum_sum = np.zeros((n, len(params)))
    full = np.empty((reps, len(params)))
    for r in range(reps):
        eps = rng.standard_normal(d)
        z = params[:d] + noise(family, params, eps[None, :])[0]
        g = row_gradients(family, rows, np.broadcast_to(eps, (n, d)),
                          target.term_gradients(everyone, z))
        per_datum_sum += g
        full[r] = g.mean(axis=0)
    per_datum = per_datum_sum / reps
    # variance of a mean of b draws without replacement from a finite population of n
    pop = per_datum.var(axis=0, ddof=0) * n / max(n - 1, 1) / b * (n - b) / n
    mc = full.var(axis=0, ddof=1)
    return {"V_n": {"mu": float(pop[:d].sum()), "all": float(pop.sum())},
            "V_eps": {"mu": float(mc[:d].sum()), "all": float(mc.sum())}}


def variance_along_run(target, family, *, b: int, lr: float, optimizer: str, iters: int,
                       checkpoints: list[int], reps: int, seed: int = 0) -> list[dict[str, Any]]:
    """A joint-SAGA run (one naive warm-up epoch, as the method), with the variance figures at
    each checkpoint."""
    rng = np.random.default_rng(seed)
    n, d = target.n_terms, family.dim
    params = np.concatenate([rng.standard_normal(d), rng.standard_normal(d)])  # paper init
    joint = JointSAGA(target, family)
    naive, cv = Naive(target, family), TaylorCV(target, family)
    schedule, opt = Epoch(), OptimizerState()
    warmup = math.ceil(n / b)
    out = []
    mrng = np.random.default_rng(seed + 1)
    for k in range(1, iters + 1):
        idx, end, schedule = next_batch(n, b, rng, schedule)
        eps = rng.standard_normal(d)
        if k <= warmup:
            g = joint.warmup_gradient(params, idx, eps)
            if k == warmup:
                joint.finish_warmup()
        else:
            g = joint.gradient(params, idx, eps)
            if end:
                joint.end_epoch()
        params, opt = optimizer_step(optimizer, lr, 0.0, params, g, opt)
        if k in checkpoints:
            row = {"iteration": k, **decomposition(target, family, params, b, reps, mrng)}
            row["naive"] = estimator_variance(naive, params, b, reps, mrng)
            row["cv"] = estimator_variance(cv, params, b, reps, mrng)
            row["joint"] = estimator_variance(joint, params, b, reps, mrng) if k > warmup else None
            out.append(row)
    return out


def elbo_curves(target, *, b: int, lr: float, optimizer: str, iters: int, estimators: list[str],
                elbo_every: int, elbo_draws: int, seed: int = 0) -> dict[str, dict[str, list]]:
    """Full-data ELBO against iterations and run time (wall time minus ELBO evaluations)."""
    curves = {}
    for label in estimators:
        est, variant = (label.split("-") + ["saga"])[:2]
        fit = stanvi_fit(target, method="jointcv", estimator=est, variant=variant, batch_size=b,
                         learning_rate=lr, optimizer=optimizer, max_iters=iters,
                         elbo_every=elbo_every, elbo_draws=elbo_draws, progress=False, seed=seed)
        t = fit.trace
        elbo = t.column("elbo")
        keep = np.flatnonzero(np.isfinite(elbo))
        # eval_time is recorded on ELBO rows only: carry it forward
        ev = np.maximum.accumulate(np.nan_to_num(t.column("eval_time")))
        run_time = t.column("wall_time") - ev
        curves[label] = {"iteration": t.column("iteration")[keep].astype(int).tolist(),
                         "elbo": elbo[keep].tolist(), "run_time": run_time[keep].tolist(),
                         "status": fit.status}
    return curves


def stan_vs_jax(X: np.ndarray, y: np.ndarray, *, b: int, lr: float, iters: int,
                n_blocks: int | None = None) -> dict[str, float]:
    """The same joint run through the Stan block target and the JAX per-datum target."""
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    from stanvi.evaluation.models import MODELS_DIR as DEFAULT_MODELS_DIR  # noqa: PLC0415

    n, d = X.shape
    stan = StanTarget(DEFAULT_MODELS_DIR / "jointcv_logistic" / "jointcv_logistic.stan",
                      {"N": n, "K": d, "X": X, "y": y.astype(int)}, progress=False,
                      hvp_method="exact")
    out = {}
    for label, target in (("jax", logistic_regression_target(X, y)), ("stan", stan)):
        t0 = time.perf_counter()
        fit = stanvi_fit(target, method="jointcv", batch_size=b, learning_rate=lr,
                         max_iters=iters, elbo_every=iters, elbo_draws=200, progress=False,
                         n_blocks=n_blocks or n, seed=0)
        total = time.perf_counter() - t0
        ev = np.nanmax(fit.trace.column("eval_time"))
        out[label] = {"seconds_per_iteration": (fit.wall_time - ev) / iters,
                      "total_seconds": total, "final_elbo": float(fit.trace.column("elbo")[-1])}
    return out


def stan_full_batch(seeds: int = 3, print_fn=print) -> dict[str, Any]:
    """jointcv (Adam, lr 1e-2, 10 blocks per iteration of M = 100, 3000 iterations) against
    full-batch TrustVI (``default``) and ADVI (``stan``) on ``stan_models/jointcv_logistic``
    (issue 11: "a Stan model with N >= 10,000 rows where jointcv reaches within 1 nat of the
    full-batch optimum in less wall time than full-batch TrustVI and ADVI, or the honest
    statement of where it does not").  Per run: final ELBO (10,000 draws) minus the stored
    mean-field optimum (``jointcv_logistic.optimum.json``), and wall time (run + JAX compile);
    for jointcv also the first trace ELBO (1,000 draws) within 1 nat, if any, and when."""
    from stanvi.evaluation.models import MODELS_DIR as DEFAULT_MODELS_DIR  # noqa: PLC0415
    from stanvi.evaluation.optima import load_optimum  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    stan = DEFAULT_MODELS_DIR / "jointcv_logistic" / "jointcv_logistic.stan"
    target = StanTarget(stan, stan.with_suffix(".data.json"), progress=False)
    best = load_optimum(stan).elbo
    configs = {"trustvi": {"method": "trustvi"},
               "advi (stan)": {"method": "advi", "profile": "stan"},
               "jointcv": {"method": "jointcv", "optimizer": "adam", "batch_size": 10,
                           "n_blocks": 100, "max_iters": 3000}}
    print_fn(f"\n=== {STAN_PROBLEM}: stan_models/jointcv_logistic (N = 10,000, K = 5), optimum "
             f"ELBO {best:.2f}; {seeds} seeds ===")
    print_fn(f"{'method':>12} {'seed':>4} {'status':>10} {'gap (nats)':>10} {'wall s':>7} "
             f"{'first within 1 nat (iteration, s)':>34}")
    out: dict[str, Any] = {"optimum": best, "runs": {}}
    for label, cfg in configs.items():
        runs = []
        for seed in range(seeds):
            opts = dict(cfg)
            fit = stanvi_fit(target, seed=seed, progress=False, **opts)
            gap = best - fit.elbo(10_000)[0]
            within = next(((r["iteration"], r["wall_time"]) for r in fit.trace.rows
                           if label == "jointcv" and r.get("elbo") is not None
                           and best - r["elbo"] <= 1.0), None)
            wall = fit.run_time + fit.compile_time
            runs.append({"status": fit.status, "gap": gap, "wall": wall, "within_1": within})
            print_fn(f"{label:>12} {seed:4d} {fit.status:>10} {gap:10.2f} {wall:7.2f} "
                     f"{(f'{within[0]} at {within[1]:.1f} s' if within else '-'):>34}")
        out["runs"][label] = runs
    return out


def _fmt(x: float | None) -> str:
    return "      -" if x is None else f"{x:9.3g}"


def run(problems: list[str], *, iters: int = 5000, reps: int = 400, seed: int = 0,
        output: str | None = None, print_fn=print) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in problems:
        if name == STAN_PROBLEM:
            results[name] = stan_full_batch(print_fn=print_fn)
            continue
        n, d = PROBLEMS[name]
        large = n > 10_000
        b, lr, optimizer = (100, 1e-2, "adam") if large else (5, 5e-4, "sgd")
        X, y = simulate(n, d, seed)
        target = logistic_regression_target(X, y, name=name)
        family = MeanField(d)
        its = min(iters, 2000) if large else iters
        print_fn(f"\n=== {name}: simulated logistic regression N={n}, d={d}; b={b}, "
                 f"{optimizer} lr={lr:g}, {its} iterations ===")
        checkpoints = sorted({max(math.ceil(n / b) + 1, its // 10), its // 2, its})
        t0 = time.perf_counter()
        var_rows = variance_along_run(target, family, b=b, lr=lr, optimizer=optimizer,
                                      iters=its, checkpoints=checkpoints,
                                      reps=max(50, reps // 4) if large else reps, seed=seed)
        print_fn(f"variance along one joint run (trace of covariance; mu-block / all; 'cv ceil' "
                 f"= V_total/V_n and 'inc ceil' = V_total/V_eps, the best reduction any MC-only "
                 f"or incremental-only estimator can reach, docs/jointcv.md#metrics), "
                 f"{time.perf_counter() - t0:.0f} s")
        print_fn(f"{'iter':>6} {'block':>5} {'V_total':>9} {'V_n':>9} {'V_eps':>9} "
                 f"{'cv ceil':>8} {'inc ceil':>8} {'cv':>9} {'joint':>9} {'naive/joint':>11}")
        for r in var_rows:
            for blk in ("mu", "all"):
                joint = r["joint"][blk] if r["joint"] else None
                total = r["naive"][blk]      # the naive estimator's variance is V_{n,eps}
                print_fn(f"{r['iteration']:6d} {blk:>5} {_fmt(total)} {_fmt(r['V_n'][blk])} "
                         f"{_fmt(r['V_eps'][blk])} {total / r['V_n'][blk]:8.2f} "
                         f"{total / r['V_eps'][blk]:8.1f} {_fmt(r['cv'][blk])} {_fmt(joint)} "
                         f"{(total / joint if joint else float('nan')):11.1f}")
        est_list = ["naive", "cv", "joint", "joint-svrg"] + ([] if large else ["inc"])
        curves = elbo_curves(target, b=b, lr=lr, optimizer=optimizer, iters=its,
                             estimators=est_list, elbo_every=max(its // 10, 1),
                             elbo_draws=200 if large else 1000, seed=seed)
        print_fn("full-data ELBO vs iteration (run time in s, ELBO evaluations excluded)")
        iters_row = curves["naive"]["iteration"]
        print_fn(f"{'iter':>6} " + " ".join(f"{k:>18}" for k in curves))
        for i, it in enumerate(iters_row):
            cells = []
            for k, c in curves.items():
                cells.append(f"{c['elbo'][i]:10.2f} ({c['run_time'][i]:5.1f})"
                             if i < len(c["elbo"]) else " " * 18)
            print_fn(f"{it:6d} " + " ".join(f"{c:>18}" for c in cells))
        results[name] = {"n": n, "d": d, "b": b, "lr": lr, "optimizer": optimizer,
                         "iterations": its, "variance": var_rows, "elbo": curves}
        if not large:
            sj = stan_vs_jax(X, y, b=b, lr=lr, iters=min(its, 1000))
            print_fn("Stan block target (one row per block) vs JAX per-datum target, joint: "
                     + ", ".join(f"{k} {v['seconds_per_iteration'] * 1e3:.2f} ms/iteration "
                                 f"(final ELBO {v['final_elbo']:.2f})" for k, v in sj.items()))
            results[name]["stan_vs_jax"] = sj
        if output:
            with open(output, "w") as fh:
                json.dump(results, fh, indent=1)
    return results
