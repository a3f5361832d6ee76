"""``stanvi bench target``: the cost of the Stan target layer (issue P1-1, "Tests and benchmark").

For each model it prints:

* compile times: cold (a fresh cache: precompiled header and glue included), warm (the model
  recompiled with the toolchain cached) and a cache hit;
* the C++ cost per draw of a gradient and of an HVP, from a serial (1-thread) batched call of 256
  draws divided by 256, and of a one-draw call;
* the batched 256-draw call per draw, with all threads;
* the bridgestan Python loop per draw (``StanModel.log_density_gradient`` called per draw);
* the JAX bridge: ``jit(vmap(grad))`` per draw, and its overhead per batched call over the direct
  batched call.

Targets (issue P1-1): batched per draw <= 1.3x the single-draw C++ cost and >= 5x faster than the
Python loop on eight schools; JAX bridge overhead <= 150 µs per batched call; warm compile <= 15 s.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np

MODELS = {
    "eight_schools": ("eight_schools/eight_schools_noncentered.stan",
                      "eight_schools/eight_schools.data.json"),
    "hierarchical_radon": ("hierarchical_radon/hierarchical_radon.stan",
                           "hierarchical_radon/hierarchical_radon.data.json"),
}


def _best_time(fn, repeats: int, inner: int = 1) -> float:
    """Best-of-``repeats`` wall time of ``inner`` calls of fn, per call (seconds)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _compile_times(stan_file: Path, cold: bool) -> dict[str, float]:
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    out = {}
    if cold:
        saved = os.environ.get("STANVI_CACHE_DIR")
        with tempfile.TemporaryDirectory(prefix="stanvi-cold-") as tmp:
            os.environ["STANVI_CACHE_DIR"] = tmp
            try:
                t0 = time.perf_counter()
                compile_model(stan_file, progress=False)
                out["cold_compile_s"] = time.perf_counter() - t0
            finally:
                if saved is None:
                    os.environ.pop("STANVI_CACHE_DIR", None)
                else:
                    os.environ["STANVI_CACHE_DIR"] = saved
    compile_model(stan_file, progress=False)  # make sure the toolchain is warm
    t0 = time.perf_counter()
    compile_model(stan_file, progress=False, force=True)
    out["warm_compile_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    compile_model(stan_file, progress=False)
    out["cache_hit_s"] = time.perf_counter() - t0
    return out


def bench_model(stan_file: Path, data_file: Path, *, batch: int = 256, cold: bool = True,
                repeats: int = 7, seed: int = 0) -> dict[str, float]:
    """All figures for one model, as a dict (seconds per draw unless named otherwise)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    import stanvi  # noqa: PLC0415

    res: dict[str, float] = _compile_times(stan_file, cold)
    target = stanvi.load(stan_file, data_file, progress=False)
    serial = stanvi.load(stan_file, data_file, threads=1, progress=False)
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=0.5, size=(batch, target.dim))
    v = rng.normal(size=(batch, target.dim))
    res["dim"] = target.dim
    res["threads"] = target.threads
    res["cpp_gradient_per_draw"] = _best_time(lambda: serial.log_density_gradient(z), repeats) / batch
    res["cpp_hvp_per_draw"] = _best_time(lambda: serial.log_density_hvp(z, v), repeats) / batch
    one = z[:1].copy()
    res["one_draw_call"] = _best_time(lambda: serial.log_density_gradient(one), repeats, inner=200)
    res["batched_gradient_per_draw"] = _best_time(lambda: target.log_density_gradient(z),
                                                  repeats) / batch
    res["batched_hvp_per_draw"] = _best_time(lambda: target.log_density_hvp(z, v), repeats) / batch
    bs = target._bs  # the bridgestan client on the same library

    def python_loop():
        for row in z:
            bs.log_density_gradient(row, propto=False, jacobian=True)

    res["python_loop_per_draw"] = _best_time(python_loop, max(3, repeats // 2)) / batch
    grad_all = jax.jit(jax.vmap(jax.grad(target.jax_log_density)))
    zj = jnp.asarray(z)
    direct = _best_time(lambda: target.log_density_gradient(z), repeats)
    bridged = _best_time(lambda: grad_all(zj).block_until_ready(), repeats)
    res["jax_bridge_per_draw"] = bridged / batch
    res["jax_bridge_overhead_per_call"] = bridged - direct
    res["hvp_exact"] = float(target.hvp_exact)
    return res


def format_report(name: str, r: dict[str, float]) -> str:
    us = 1e6
    lines = [f"== {name}: D = {int(r['dim'])}, {int(r['threads'])} threads, "
             f"HVP {'exact (nested autodiff)' if r['hvp_exact'] else 'finite differences'}"]
    if "cold_compile_s" in r:
        lines.append(f"  compile: cold {r['cold_compile_s']:.1f} s (fresh cache, incl. precompiled "
                     f"header and glue)")
    lines.append(f"  compile: warm {r['warm_compile_s']:.1f} s (target <= 15 s), "
                 f"cache hit {r['cache_hit_s'] * 1e3:.1f} ms")
    lines.append(f"  C++ gradient per draw (serial batch): {r['cpp_gradient_per_draw'] * us:8.2f} µs")
    lines.append(f"  C++ HVP per draw (serial batch):      {r['cpp_hvp_per_draw'] * us:8.2f} µs")
    lines.append(f"  one-draw batched call (gradient):     {r['one_draw_call'] * us:8.2f} µs")
    ratio_cpp = r["batched_gradient_per_draw"] / r["cpp_gradient_per_draw"]
    ratio_py = r["python_loop_per_draw"] / r["batched_gradient_per_draw"]
    lines.append(f"  batched 256-draw gradient per draw:   {r['batched_gradient_per_draw'] * us:8.2f} µs"
                 f"  = {ratio_cpp:.2f}x the serial C++ cost (target <= 1.3x)")
    lines.append(f"  batched 256-draw HVP per draw:        {r['batched_hvp_per_draw'] * us:8.2f} µs")
    lines.append(f"  bridgestan Python loop per draw:      {r['python_loop_per_draw'] * us:8.2f} µs"
                 f"  -> batched is {ratio_py:.1f}x faster (target >= 5x)")
    lines.append(f"  JAX bridge jit(vmap(grad)) per draw:  {r['jax_bridge_per_draw'] * us:8.2f} µs, "
                 f"overhead {r['jax_bridge_overhead_per_call'] * us:.0f} µs per batched call "
                 f"(target <= 150 µs)")
    return "\n".join(lines)


def run(models_dir: Path, *, cold: bool = True, batch: int = 256) -> dict[str, dict[str, float]]:
    """Benchmark the models of :data:`MODELS` found under ``models_dir`` and print the report."""
    results = {}
    for name, (stan_rel, data_rel) in MODELS.items():
        stan_file, data_file = models_dir / stan_rel, models_dir / data_rel
        if not stan_file.is_file():
            print(f"== {name}: skipped, {stan_file} not found")
            continue
        results[name] = bench_model(stan_file, data_file, batch=batch, cold=cold)
        print(format_report(name, results[name]), flush=True)
        cold = False  # a second cold compile measures the same thing
    return results
