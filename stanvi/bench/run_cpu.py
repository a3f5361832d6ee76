"""``stanvi bench run-cpu``: the CPU time of TrustVI's run per fit on small ``stan_models``
models, the figure behind the full-rank wall-time ratio of issue T3-1 on models that Pathfinder
fits in a millisecond (docs/benchmarks.md#run-cpu).

Per model and family: one warm-up fit, then ``seeds`` fits; printed is the median over seeds
of ``fit.info["run_cpu_seconds"]`` (the calling thread's CPU inside the method: the Python
driver's cost, which is what separates TrustVI from Pathfinder on these models; the model's
worker threads are not counted) and of the wall time.  Thread CPU is disturbed less than wall
time by other load, so two checkouts can be compared by running the command from each, in
turn, on the same machine.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

DEFAULT_MODELS = ("bernoulli", "far_posterior", "linear_regression", "loglog_heights", "tp_gq",
                  "student_t", "raw_regression_interaction")


def _model_files(models_dir: Path, name: str) -> tuple[Path, dict | None]:
    folder = models_dir / name
    stan = sorted(folder.glob("*.stan"))
    if not stan:
        raise SystemExit(f"stanvi bench run-cpu: no .stan file in {folder}")
    data = sorted(folder.glob("*.data.json"))
    return stan[0], (json.loads(data[0].read_text()) if data else None)


def run(models_dir: Path, models: tuple[str, ...] = DEFAULT_MODELS,
        families: tuple[str, ...] = ("fullrank", "meanfield"), seeds: int = 7) -> dict:
    """Print and return {model: {family: (median CPU ms, median wall ms)}}."""
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    out: dict = {}
    print(f"{'model':28s} {'family':10s} {'run CPU ms':>10s} {'wall ms':>8s}")
    for name in models:
        stan, data = _model_files(models_dir, name)
        compiled = compile_model(stan, progress=False)
        for family in families:
            fit(compiled, data, method="trustvi", family=family, seed=10_000, progress=False,
                draws=100)
            runs = [fit(compiled, data, method="trustvi", family=family, seed=s,
                        progress=False, draws=100) for s in range(seeds)]
            cpu = 1000 * statistics.median(r.info["run_cpu_seconds"] for r in runs)
            wall = 1000 * statistics.median(r.wall_time for r in runs)
            out.setdefault(name, {})[family] = (cpu, wall)
            print(f"{name:28s} {family:10s} {cpu:10.2f} {wall:8.2f}", flush=True)
    return out
