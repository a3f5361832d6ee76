"""``stanvi bench target``: the cost of the Stan target layer (issue P1-1, "Tests and benchmark").

For each model it prints:

* compile times: cold (a fresh cache: precompiled header and glue included), warm (the model
  recompiled with the toolchain cached) and a cache hit;
* the C++ cost per draw of a gradient and of an HVP, from a serial (1-thread) batched call of 256
  draws divided by 256, and of a one-draw call;
* the batched 256-draw call per draw, with all threads;
* the bridgestan Python loop per draw (``StanModel.log_density_gradient`` called per draw);
* the JAX bridge, through XLA FFI custom calls and through ``pure_callback``: ``jit(vmap(grad))``
  per draw (all threads); on a 1-thread target (steadier under load), its cost per batched call
  over the direct batched call (``target.log_density_gradient``, itself ~5 µs of Python and
  ctypes: the FFI bridge can be cheaper), and the whole jitted call for one draw, whose excess
  over one C++ gradient is the bridge's per-call overhead (JAX dispatch included).

Then, for ``reject_region`` (a model that throws on part of its domain): the cost of a throwing
draw in a fresh process and after ``compiles`` XLA compilations whose executables stay alive,
for the model library as stanvi links it (private C++ runtime and unwinder) and linked with the
shared runtime (``compile_model(static_runtime=False)``); see ``toolchain.STATIC_RUNTIME_FLAGS``.

Targets: batched per draw <= 1.3x the single-draw C++ cost and >= 5x faster than the Python loop
on eight schools; JAX bridge overhead <= 150 µs per batched call (P1-1) and <= 40 µs through FFI
(issue 8); <= 50 µs per throwing draw after 300 XLA compilations (issue 8); warm compile <= 15 s.
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


def best_time(fn, repeats: int, inner: int = 1) -> float:
    """Best-of-``repeats`` wall time of ``inner`` calls of fn, per call (seconds)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def _best_times(fns, repeats: int, inner: int = 1) -> list[float]:
    """Like :func:`best_time` for several functions, timed in turn within each repeat, so that
    a change of machine load during the measurement affects all of them alike."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            best[i] = min(best[i], (time.perf_counter() - t0) / inner)
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

    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    res: dict[str, float] = _compile_times(stan_file, cold)
    target = StanTarget(stan_file, data_file, progress=False)
    serial = StanTarget(stan_file, data_file, threads=1, progress=False)
    rng = np.random.default_rng(seed)
    z = rng.normal(scale=0.5, size=(batch, target.dim))
    v = rng.normal(size=(batch, target.dim))
    res["dim"] = target.dim
    res["batch"] = batch
    res["threads"] = target.threads
    res["cpp_gradient_per_draw"] = best_time(lambda: serial.log_density_gradient(z), repeats) / batch
    res["cpp_hvp_per_draw"] = best_time(lambda: serial.log_density_hvp(z, v), repeats) / batch
    one = z[:1].copy()
    res["one_draw_call"] = best_time(lambda: serial.log_density_gradient(one), repeats, inner=200)
    res["batched_gradient_per_draw"] = best_time(lambda: target.log_density_gradient(z),
                                                 repeats) / batch
    res["batched_hvp_per_draw"] = best_time(lambda: target.log_density_hvp(z, v), repeats) / batch
    bs = target._bs  # the bridgestan client on the same library

    def python_loop():
        for row in z:
            bs.log_density_gradient(row, propto=False, jacobian=True)

    res["python_loop_per_draw"] = best_time(python_loop, max(3, repeats // 2)) / batch
    # The bridge's cost per call is measured on the 1-thread target: with all threads the batched
    # call's own time varies by more than the overhead under load.
    zj, one_j = jnp.asarray(z), jnp.asarray(one)
    from stanvi.targets.jax_ffi import ffi_available  # noqa: PLC0415

    backends = ("ffi", "callback") if ffi_available() else ("callback",)
    grads = {b: jax.jit(jax.vmap(jax.grad(serial.jax_log_density_with(b)))) for b in backends}
    for b in backends:
        grad_all = jax.jit(jax.vmap(jax.grad(target.jax_log_density_with(b))))
        res[f"jax_{b}_per_draw"] = best_time(lambda: grad_all(zj).block_until_ready(),
                                             repeats, inner=20) / batch
    many = _best_times([lambda: serial.log_density_gradient(z)]
                       + [lambda g=g: g(zj).block_until_ready() for g in grads.values()],
                       repeats, inner=20)
    single = _best_times([lambda: serial.log_density_gradient(one)]
                         + [lambda g=g: g(one_j).block_until_ready() for g in grads.values()],
                         repeats, inner=200)
    res["direct_call"], res["direct_one_draw_call"] = many[0], single[0]
    for i, b in enumerate(backends, start=1):
        res[f"jax_{b}_overhead_per_call"] = many[i] - many[0]
        res[f"jax_{b}_one_draw_call"] = single[i]
    res["hvp_exact"] = float(target.hvp_exact)
    return res


def _jit_many(count: int) -> list:
    """``count`` distinct jitted programs, compiled and kept alive (their executables' unwind
    tables stay registered with libgcc, as in a long fitting process)."""
    import jax  # noqa: PLC0415
    import jax.numpy as jnp  # noqa: PLC0415

    kept = []
    for k in range(count):
        def program(x, k=k):
            y = jax.lax.fori_loop(0, 3 + k % 5, lambda i, c: c * jnp.tanh(c + i * k) + jnp.sum(c), x)
            return jax.grad(lambda a: jnp.sum(jnp.sin(a) ** k))(y) @ jnp.outer(y, x)

        fn = jax.jit(program)
        fn(jnp.ones(4)).block_until_ready()
        kept.append(fn)
    return kept


def bench_exceptions(stan_file: Path, data_file: Path, *, compiles: int = 300, rows: int = 256,
                     repeats: int = 5) -> dict[str, float]:
    """µs per throwing draw (a gradient call of ``rows`` identical throwing rows, 1 thread) for
    the library linked with a private runtime (as stanvi builds it) and with the shared one:
    fresh, and after ``compiles`` live XLA compilations, both for a library loaded before them
    and for one loaded after them (a copy under another name).  The second case is the slow one
    with the shared unwinder: libgcc 12 keeps registered frames in a list sorted by address and
    walks it down to the first object below the pc; a library mapped after the JIT code lies
    below most of it.  Each throw's message is checked."""
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    code = Path(stan_file).read_text()
    early, late = {}, {}
    for label, static in (("private_runtime", True), ("shared_runtime", False)):
        early[label] = StanTarget(compile_model(stan_file, progress=False, static_runtime=static),
                                  data_file, threads=1, progress=False)
        late[label] = compile_model(code, name="reject_region_loaded_late", progress=False,
                                    static_runtime=static)
    z = np.tile([[3.0, 0.0]], (rows, 1))  # x > 2: reject()

    def per_draw(target) -> float:
        res = target.log_density_gradient(z)
        if res.ok.any() or "must be at most 2" not in res.messages.get(rows - 1, ""):
            raise RuntimeError(f"reject_region did not throw as expected: {res.messages}")
        return best_time(lambda: target.log_density_gradient(z), repeats) / rows

    out: dict[str, float] = {"compiles": float(compiles)}
    for label, target in early.items():
        out[f"{label}_fresh"] = per_draw(target)
    t0 = time.perf_counter()
    kept = _jit_many(compiles)
    out["compile_seconds"] = time.perf_counter() - t0
    for label, target in early.items():
        out[f"{label}_after_loaded_before"] = per_draw(target)
        out[f"{label}_after"] = per_draw(StanTarget(late[label], data_file, threads=1,
                                                    progress=False))
    del kept
    return out


def format_exceptions(r: dict[str, float]) -> str:
    us = 1e6
    n = int(r["compiles"])
    lines = [f"== C++ exceptions (reject_region, 1 thread): µs per throwing draw, fresh -> after "
             f"{n} live XLA compilations ({r['compile_seconds']:.0f} s), library loaded after "
             f"them [loaded before them]"]
    for label, what in (("private_runtime", "private runtime (stanvi's build)"),
                        ("shared_runtime", "shared libgcc_s/libstdc++ runtime")):
        lines.append(f"  {what:34s} {r[f'{label}_fresh'] * us:8.2f} µs -> "
                     f"{r[f'{label}_after'] * us:8.2f} µs "
                     f"[{r[f'{label}_after_loaded_before'] * us:.2f} µs]"
                     + ("  (target <= 50 µs)" if label == "private_runtime" else ""))
    return "\n".join(lines)


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
    lines.append(f"  direct batched call (1 thread): {r['direct_call'] * us:.1f} µs for "
                 f"{int(r['batch'])} draws, {r['direct_one_draw_call'] * us:.1f} µs for one "
                 f"(target.log_density_gradient)")
    for backend, what, target in (("ffi", "XLA FFI     ", "<= 40 µs"),
                                  ("callback", "pure_callback", "<= 150 µs")):
        if f"jax_{backend}_per_draw" not in r:
            lines.append(f"  JAX bridge ({what}): not available in this process")
            continue
        one = r[f"jax_{backend}_one_draw_call"]
        lines.append(f"  JAX bridge ({what}) jit(vmap(grad)): {r[f'jax_{backend}_per_draw'] * us:7.2f} µs"
                     f" per draw; 1 thread: {r[f'jax_{backend}_overhead_per_call'] * us:+7.1f} µs "
                     f"over the direct call, one-draw call {one * us:6.1f} µs = overhead "
                     f"{(one - r['cpp_gradient_per_draw']) * us:6.1f} µs + one gradient "
                     f"(target {target})")
    return "\n".join(lines)


def run(models_dir: Path, *, cold: bool = True, batch: int = 256,
        compiles: int = 300) -> dict[str, dict[str, float]]:
    """Benchmark the models of :data:`MODELS` found under ``models_dir`` and print the report;
    then the cost of C++ exceptions after ``compiles`` XLA compilations (0: skip)."""
    results = {}
    for name, (stan_rel, data_rel) in MODELS.items():
        stan_file, data_file = models_dir / stan_rel, models_dir / data_rel
        if not stan_file.is_file():
            print(f"== {name}: skipped, {stan_file} not found")
            continue
        results[name] = bench_model(stan_file, data_file, batch=batch, cold=cold)
        print(format_report(name, results[name]), flush=True)
        cold = False  # a second cold compile measures the same thing
    stan_file, data_file = (models_dir / "reject_region/reject_region.stan",
                            models_dir / "reject_region/reject_region.data.json")
    if compiles > 0 and stan_file.is_file():
        results["exceptions"] = bench_exceptions(stan_file, data_file, compiles=compiles)
        print(format_exceptions(results["exceptions"]), flush=True)
    return results
