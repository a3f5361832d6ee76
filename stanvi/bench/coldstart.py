"""``stanvi bench coldstart``: what a user pays for the first fit in a new process (issue 8, part 3).

For each configuration (method × family; default TrustVI and ADVI × mean-field and full-rank) on
one already-compiled model (default: eight schools, non-centred), the benchmark starts fresh
Python processes (:mod:`subprocess`), each of which does exactly what a user's script does::

    import stanvi
    stanvi.fit(model, data=data, method=..., family=..., progress=False)

The first process per configuration is a warm-up, not counted: it compiles the Stan model if it
was not compiled yet and fills JAX's persistent compilation cache (:mod:`stanvi.jax_config`).
Then ``reps`` processes are timed and the median of each figure is printed:

* ``import``: ``import stanvi`` (NumPy, the Stan layer; JAX is imported when a fit first uses it,
  which a Stan model fitted on the host path never does: :mod:`stanvi.lazy_jax`);
* ``fit``: the ``stanvi.fit`` call, split into ``setup`` (loading the compiled model and data,
  building the target), ``wall`` (the method, JAX compilation included: ``Fit.wall_time``), of which
  ``compile`` (``Fit.compile_time``: tracing, lowering and compiling or loading from the
  persistent cache the estimator's programs), and ``output`` (the rest: output draws in
  constrained space; with ``progress=False`` the Pareto k-hat verdict is computed when first asked
  for, docs/diagnostics.md#on-demand, so not here); ``verdict`` (``run_child(..., verdict=True)``
  only: ``fit.diagnostics()`` called inside the timed process, after the fit, and timed apart);
* ``e2e``: the whole process as the parent sees it, interpreter start-up and exit included;
* ``cpu``: the CPU time (user + system, all threads) of the whole process, from the parent's
  ``resource.getrusage(RUSAGE_CHILDREN)`` before and after it (the child also reports
  ``cpu_import`` and ``cpu_fit``, its own ``time.process_time()`` over those two steps).  On a
  machine shared with other jobs wall times grow with the load, CPU times much less, so the CPU
  column is the one to compare across measurements;
* ``load``: the 1-minute load average when the process started (printed, not a median).

With ``jax_cache=False`` the processes run with ``STANVI_JAX_CACHE=0`` (every program compiled
in every process), which shows what the persistent cache saves.  The load average of the machine
is printed before and after, since timings on a loaded machine are not comparable.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stanvi.evaluation.models import MODELS_DIR

DEFAULT_MODELS_DIR = MODELS_DIR
DEFAULT_MODEL = DEFAULT_MODELS_DIR / "eight_schools" / "eight_schools_noncentered.stan"
DEFAULT_DATA = DEFAULT_MODELS_DIR / "eight_schools" / "eight_schools.data.json"
DEFAULT_CONFIGS: tuple[tuple[str, str], ...] = (
    ("trustvi", "meanfield"), ("trustvi", "fullrank"), ("advi", "meanfield"), ("advi", "fullrank"))
FIGURES = ("import", "setup", "wall", "compile", "output", "fit", "e2e", "cpu")

# The child process: times `import stanvi` and `stanvi.fit`, prints one JSON line.
_CHILD = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
import stanvi
t1, c1 = time.perf_counter(), time.process_time()
model, data, method, family, verdict = sys.argv[1:6]
data = data or None
if method.startswith("pathfinder"):
    from stanvi.reference import pathfinder
    ref = pathfinder(model, data, seed=0, num_paths=1 if method == "pathfinder" else 4)
    t2, c2 = time.perf_counter(), time.process_time()
    figures = {"setup": 0.0, "wall": ref.wall_time, "compile": 0.0,
               "output": (t2 - t1) - ref.wall_time, "status": "converged", "iterations": 0}
else:
    fit = stanvi.fit(model, data=data, method=method, family=family, progress=False)
    t2, c2 = time.perf_counter(), time.process_time()
    figures = {"setup": fit.setup_time, "wall": fit.wall_time, "compile": fit.compile_time,
               "output": (t2 - t1) - fit.setup_time - fit.wall_time, "status": fit.status,
               "iterations": len(fit.trace) - 1}
    if verdict == "verdict":
        fit.diagnostics()
        figures["verdict"] = time.perf_counter() - t2
print("STANVI_COLDSTART " + json.dumps({
    "import": t1 - t0, "fit": t2 - t1, "cpu_import": c1 - c0, "cpu_fit": c2 - c1, **figures,
    # read after the clock: asking JAX for its cache directory imports JAX, which a host-path
    # fit never does (stanvi.lazy_jax)
    "jax_loaded": "jax" in sys.modules,
    "jax_cache": stanvi.jax_config.persistent_cache_dir() if "jax" in sys.modules else None}))
"""

@dataclass
class ColdStartResult:
    """Timings (seconds) of the timed processes of one configuration."""

    method: str
    family: str
    runs: list[dict] = field(default_factory=list)

    def median(self, figure: str) -> float:
        return statistics.median(r[figure] for r in self.runs)

    def as_dict(self) -> dict:
        return {"method": self.method, "family": self.family, "runs": self.runs,
                "median": {f: self.median(f) for f in FIGURES} if self.runs else {}}


def run_child(model: Path, data: Path | None, method: str, family: str, *,
              jax_cache: bool = True, env: dict[str, str] | None = None,
              timeout: float = 600.0, verdict: bool = False) -> dict:
    """One fresh process fitting ``model``; returns its timings plus ``e2e`` (the process's wall
    time seen from here), ``cpu`` (its user + system CPU time, from this process's
    RUSAGE_CHILDREN, so run one child at a time) and ``load`` (the 1-minute load average at its
    start).  With ``verdict`` a stanvi fit's process also computes its k̂ verdict
    (``fit.diagnostics()``) before it exits: ``e2e`` includes it and ``verdict`` is its time.
    Raises RuntimeError with the child's stderr when it fails."""
    child_env = dict(os.environ if env is None else env)
    if not jax_cache:
        child_env["STANVI_JAX_CACHE"] = "0"
    cmd = [sys.executable, "-c", _CHILD, str(model), str(data or ""), method, family,
           "verdict" if verdict else ""]
    load = _load_1min()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=timeout)
    e2e = time.perf_counter() - start
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"the {method}/{family} process failed (exit {proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("STANVI_COLDSTART ")]
    if not lines:
        raise RuntimeError(f"the {method}/{family} process printed no timings:\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    out = json.loads(lines[-1].split(" ", 1)[1])
    out["e2e"] = e2e
    out["cpu"] = cpu
    out["load"] = load
    return out


def measure(model: Path = DEFAULT_MODEL, data: Path | None = DEFAULT_DATA, *,
            configs: Sequence[tuple[str, str]] = DEFAULT_CONFIGS, reps: int = 3,
            jax_cache: bool = True, warmup: bool = True,
            echo=None) -> list[ColdStartResult]:
    """For each configuration: one warm-up process (unless ``warmup`` is False), then ``reps``
    timed processes.  ``echo(str)`` reports each process as it finishes."""
    if reps < 1:
        raise ValueError(f"reps must be at least 1, got {reps}")
    results = []
    for method, family in configs:
        if warmup:
            first = run_child(model, data, method, family, jax_cache=jax_cache)
            if echo:
                echo(f"  {method}/{family} warm-up: e2e {first['e2e']:.2f} s")
        res = ColdStartResult(method, family)
        for i in range(reps):
            res.runs.append(run_child(model, data, method, family, jax_cache=jax_cache))
            if echo:
                r = res.runs[-1]
                echo(f"  {method}/{family} run {i + 1}: e2e {r['e2e']:.2f} s, cpu "
                     f"{r['cpu']:.2f} s (import {r['import']:.2f}, fit {r['fit']:.2f}; load "
                     f"{r['load']:.2f})")
        results.append(res)
    return results


def format_table(results: Sequence[ColdStartResult]) -> str:
    """The medians as a table, one row per configuration."""
    head = (f"{'method':<9} {'family':<10}" + "".join(f"{f:>9}" for f in FIGURES)
            + f"{'load':>12}   status")
    lines = [head, "-" * len(head)]
    for res in results:
        statuses = ",".join(sorted({r["status"] for r in res.runs}))
        loads = [r["load"] for r in res.runs if r.get("load") is not None]
        load = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"
        lines.append(f"{res.method:<9} {res.family:<10}"
                     + "".join(f"{res.median(f):>9.2f}" for f in FIGURES) + f"{load:>12}"
                     + f"   {statuses}")
    return "\n".join(lines)


def _load_1min() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _load_text() -> str:
    try:
        one, five, _ = os.getloadavg()
    except OSError:
        return "load average unavailable"
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def run(model: Path = DEFAULT_MODEL, data: Path | None = DEFAULT_DATA, *,
        configs: Sequence[tuple[str, str]] = DEFAULT_CONFIGS, reps: int = 3,
        jax_cache: bool = True, warmup: bool = True, output: Path | None = None) -> list[ColdStartResult]:
    """Measure, print the table of medians (seconds) and optionally write the runs as JSON."""
    print(f"cold start: {Path(model).name}, {reps} fresh processes per configuration after "
          f"{'one warm-up' if warmup else 'no warm-up'}; JAX persistent cache "
          f"{'on' if jax_cache else 'off (STANVI_JAX_CACHE=0)'}")
    load_before = _load_text()
    print(f"before: {load_before}")
    results = measure(model, data, configs=configs, reps=reps, jax_cache=jax_cache,
                      warmup=warmup, echo=lambda s: print(s, flush=True))
    load_after = _load_text()
    print(f"after:  {load_after}")
    print("medians in seconds (fit = setup + wall + output; compile is part of wall; e2e is the "
          "whole process, cpu its user + system CPU time; load: 1-minute load average at the "
          "start of the timed processes, min-max)")
    print(format_table(results))
    if output is not None:
        Path(output).write_text(json.dumps({
            "model": str(model), "data": str(data) if data else None, "reps": reps,
            "jax_cache": jax_cache, "load_before": load_before, "load_after": load_after,
            "python": sys.version.split()[0],
            "results": [r.as_dict() for r in results]}, indent=1))
        print(f"wrote {output}")
    return results
