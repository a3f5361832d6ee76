"""``stanvi bench lowrank``: exactness, peak memory and time per iteration of the
diagonal-plus-low-rank family (issue T3-6; docs/algorithms.md#lowrank,
docs/benchmarks.md#lowrank-bench).

The target is a Gaussian N(m, Σ) with Σ = diag(a²) + CCᵀ, C of shape D × r, as a JAX log
density whose precision is applied by Woodbury (O(D r) per evaluation, no D × D matrix), so the
cost measured is the family's and the method's, not the model's.  The family of rank k ≥ r
contains the target, so a correct fit has q = p.

1. **Exactness** (D = 2,000, rank 5): TrustVI's fixed-sample iterations on N = 2,048 > D + k + 1
   moment-matched draws, where the sample-average ELBO of a Gaussian is the ELBO exactly
   (docs/algorithms.md#trustvi-fixed), and the Stein model of the Hessian is exact.  Reported: the largest error of q's mean relative to max|m|, the
   relative error of q's marginal sds, and ‖Σ_q − Σ‖_F/‖Σ‖_F computed exactly from the factors
   in O(D k²) (:func:`frobenius_error`; no D × D matrix).
2. **Scaling** (D = 5,000, 20,000, 50,000, rank 10): the ``default`` profile on its first
   fixed sample only (64 draws, ``fixed_n_max=64``: the fit ends at its first certification;
   P = D(k + 2) is far above 64 draws, so it is not certified, and the errors are the 64-draw
   sample-average optimum's), the second-start checks off, 100 output draws; each D in a fresh
   process whose peak resident memory (``ru_maxrss``) is the fit's.  Printed: the time per
   fixed-sample iteration (the method's wall time, L-BFGS warm start and JAX compilation
   included, over its iterations) and, separately, one Stein-model product and one 64-draw
   gradient pullback, which should grow as D·k.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import Sequence

import numpy as np

EXACT_DIM, EXACT_RANK = 2000, 5
SCALING_DIMS: tuple[int, ...] = (5000, 20000, 50000)
SCALING_RANK = 10


def diag_plus_low_rank_target(dim: int, rank: int, seed: int = 0):
    """(JaxTarget of N(m, diag(a²) + CCᵀ), m, a, C): a = e^{U(−1, 1)}, C and m standard normal
    (C scaled by 1/√r so that the low-rank part is of the diagonal's order)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    from stanvi.targets.jax_target import JaxTarget  # noqa: PLC0415

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(seed)
    a = np.exp(rng.uniform(-1.0, 1.0, dim))
    C = rng.standard_normal((dim, rank)) / np.sqrt(rank)
    m = rng.standard_normal(dim)
    inv_a2 = 1.0 / (a * a)
    core = np.linalg.inv(np.eye(rank) + C.T @ (C * inv_a2[:, None]))   # Woodbury's k × k
    aj, Cj, mj, corej = (jnp.asarray(x) for x in (inv_a2, C, m, core))

    def log_p(z):
        r = z - mj
        y = r * aj
        t = Cj.T @ y
        return -0.5 * (r @ y - t @ (corej @ t))

    return JaxTarget(log_p, dim), m, a, C


def frobenius_error(d: np.ndarray, B: np.ndarray, a: np.ndarray, C: np.ndarray) -> float:
    """‖Σ_q − Σ‖_F / ‖Σ‖_F for Σ_q = diag(d²) + BBᵀ, Σ = diag(a²) + CCᵀ, exactly in O(D k²):
    with E = diag(d² − a²), F = [B, C], G = [B, −C], Σ_q − Σ = E + FGᵀ and
    ‖E + FGᵀ‖²_F = ‖E‖² + 2 Σ_i E_ii (FGᵀ)_ii + tr(FᵀF GᵀG)."""
    def sq(e: np.ndarray, F: np.ndarray, G: np.ndarray) -> float:
        return float(e @ e + 2.0 * np.sum(e * np.sum(F * G, axis=1))
                     + np.sum((F.T @ F) * (G.T @ G)))

    diff = sq(d * d - a * a, np.hstack([B, C]), np.hstack([B, -C]))
    ref = sq(a * a, C, C)
    return float(np.sqrt(max(diff, 0.0) / ref))


def accuracy(family, params: np.ndarray, m: np.ndarray, a: np.ndarray, C: np.ndarray) -> dict:
    """q's errors against the target (the module docstring's three figures)."""
    _, d, B = family.parts_np(params)
    sd_p = np.sqrt(a * a + np.sum(C * C, axis=1))
    return {"mean_err": float(np.max(np.abs(family.mean(params) - m)) / np.max(np.abs(m))),
            "sd_err": float(np.max(np.abs(family.marginal_sd(params) / sd_p - 1.0))),
            "cov_frobenius_err": frobenius_error(d, B, a, C)}


def exactness(dim: int = EXACT_DIM, rank: int = EXACT_RANK, seed: int = 0) -> dict:
    """Part 1 of the module docstring."""
    from stanvi.fit import fit  # noqa: PLC0415

    target, m, a, C = diag_plus_low_rank_target(dim, rank, seed)
    start = time.perf_counter()
    result = fit(target, method="trustvi", family="lowrank", family_options={"rank": rank},
                 seed=seed, progress=False, draws=100, fixed_n0=2048, second_paths=0,
                 second_start_iters=0, certify_rms=1e-5)
    return {"dim": dim, "rank": rank, "status": result.status,
            "seconds": time.perf_counter() - start, "iterations": len(result.trace) - 1,
            **accuracy(result.family, result.params, m, a, C)}


def micro_timings(family, params: np.ndarray, target, n: int = 64, reps: int = 5) -> dict:
    """Seconds of one Stein-model product and one n-draw gradient pullback (model gradient
    excluded) at ``params``, the best of ``reps``."""
    eps = np.random.default_rng(1).standard_normal((n, family.base_dim))
    z = family.sample_np(params, eps)
    g = np.asarray(target.log_density_gradient(z).gradient, dtype=float)
    op = family.stein_hvp_operator(params, eps, g)
    v = np.random.default_rng(2).standard_normal(family.n_params)
    out = {}
    for name, call in (("stein_product_s", lambda: op(v)),
                       ("pullback_s", lambda: family.pullback_mean(params, eps, g))):
        best = np.inf
        for _ in range(reps):
            t0 = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t0)
        out[name] = best
    return out


def child(dim: int, rank: int, seed: int = 0) -> None:
    """One scaling fit in this process; prints one JSON line (``STANVI_LOWRANK {...}``)."""
    from stanvi.fit import fit  # noqa: PLC0415

    t0 = time.perf_counter()
    target, m, a, C = diag_plus_low_rank_target(dim, rank, seed)
    result = fit(target, method="trustvi", family="lowrank", family_options={"rank": rank},
                 seed=seed, progress=False, draws=100, second_paths=0, second_start_iters=0,
                 fixed_n_max=64)
    rows = [r for r in result.trace.rows if r.get("phase") in ("fixed", "certify")]
    row = {"dim": dim, "rank": rank, "status": result.status, "wall": result.wall_time,
           "iterations": len(rows), "per_iteration_s": result.wall_time / max(len(rows), 1),
           "process": time.perf_counter() - t0,
           **accuracy(result.family, result.params, m, a, C),
           **micro_timings(result.family, result.params, target)}
    row["peak_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print("STANVI_LOWRANK " + json.dumps(row), flush=True)


def run_scaling(dims: Sequence[int] = SCALING_DIMS, rank: int = SCALING_RANK,
                timeout: float = 1800.0) -> list[dict]:
    """Part 2: each D in a fresh process (:func:`child`)."""
    rows = []
    for dim in dims:
        code = f"from stanvi.bench.lowrank_bench import child; child({int(dim)}, {int(rank)})"
        try:
            proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code],
                                  capture_output=True, text=True, timeout=timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("STANVI_LOWRANK ")]
            rows.append(json.loads(lines[-1].split(" ", 1)[1]) if lines else
                        {"dim": dim, "rank": rank, "status": "error",
                         "message": (proc.stderr.strip().splitlines() or ["no output"])[-1]})
        except subprocess.TimeoutExpired:
            rows.append({"dim": dim, "rank": rank, "status": "killed", "message": "timeout"})
        print(_scaling_line(rows[-1]), flush=True)
    return rows


def _scaling_line(r: dict) -> str:
    if "wall" not in r:
        return f"{r['dim']:>7} {r['rank']:>4}  {r['status']}: {r.get('message', '')}"
    return (f"{r['dim']:>7} {r['rank']:>4} {r['status']:>10} {r['peak_gb']:>7.2f} "
            f"{r['wall']:>8.1f} {r['iterations']:>5} {r['per_iteration_s']:>8.3f} "
            f"{r['stein_product_s'] * 1e3:>9.1f} {r['pullback_s'] * 1e3:>9.2f} "
            f"{r['mean_err']:>9.1e} {r['sd_err']:>9.1e} {r['cov_frobenius_err']:>9.1e}")


def run(dims: Sequence[int] = SCALING_DIMS, *, exact: bool = True,
        output: str | None = None) -> dict:
    """Both parts, printed as tables; ``output``: also write them as JSON."""
    result: dict = {}
    if exact:
        print(f"exactness: TrustVI, lowrank rank {EXACT_RANK}, on N(m, diag(a²) + CCᵀ), "
              f"D = {EXACT_DIM}, C of rank {EXACT_RANK}")
        e = exactness()
        result["exactness"] = e
        print(f"  status {e['status']}, {e['iterations']} iterations, {e['seconds']:.1f} s; "
              f"max|μ − m|/max|m| = {e['mean_err']:.1e}, max|sd_q/sd − 1| = {e['sd_err']:.1e}, "
              f"‖Σ_q − Σ‖_F/‖Σ‖_F = {e['cov_frobenius_err']:.1e}")
    print(f"scaling: TrustVI default profile (second start off), rank {SCALING_RANK}, a fresh "
          f"process per D")
    print(f"{'D':>7} {'k':>4} {'status':>10} {'peak GB':>7} {'wall s':>8} {'iters':>5} "
          f"{'s/iter':>8} {'Stein ms':>9} {'pull ms':>9} {'mean err':>9} {'sd err':>9} "
          f"{'cov err':>9}")
    result["scaling"] = run_scaling(dims)
    if output:
        with open(output, "w") as fh:
            json.dump(result, fh, indent=1)
    return result
