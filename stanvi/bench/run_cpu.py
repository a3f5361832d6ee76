"""``stanvi bench run-cpu``: the CPU time of TrustVI's run per fit on small ``stan_models``
models, the figure behind the full-rank wall-time ratio of issue T3-1 on models that Pathfinder
fits in a millisecond (docs/benchmarks.md#run-cpu).

Per model and family: one warm-up fit, then ``seeds`` fits; printed is the median over seeds
of ``fit.info["run_cpu_seconds"]`` (the calling thread's CPU inside the method: the Python
driver's cost, which is what separates TrustVI from Pathfinder on these models; the model's
worker threads are not counted) and of the wall time.  Thread CPU is disturbed less than wall
time by other load, so two checkouts can be compared by running the command from each, in
turn, on the same machine.

With ``dense_limits`` (``--dense-limits 0,48``) the same process compares settings of
:data:`stanvi.methods.trustvi_fixed.DENSE_SOLVE_MAX_PARAMS` (the largest P whose Stein matrix's
subproblems are solved exactly from its eigendecomposition; 0: GLTR always), interleaved over
``rounds`` rounds of all seeds so that a change of load hits every setting alike, and prints
each one's medians and model evaluations (docs/benchmarks.md#dense-model-solve).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

DEFAULT_MODELS = ("bernoulli", "far_posterior", "linear_regression", "loglog_heights", "tp_gq",
                  "student_t", "raw_regression_interaction")


def _model_files(models_dir: Path, name: str) -> tuple[Path, dict | None]:
    """The program and data of the model named ``name`` (a ``.stan`` file's stem, as
    :func:`stanvi.evaluation.models.discover_models` names them)."""
    from stanvi.evaluation.models import discover_models  # noqa: PLC0415

    found = [(stan, data) for stem, stan, data in discover_models(models_dir) if stem == name]
    if not found:
        raise SystemExit(f"stanvi bench run-cpu: no model {name!r} (no {name}.stan) in "
                         f"{models_dir}")
    stan, data = found[0]
    return stan, (json.loads(data.read_text()) if data else None)


def run(models_dir: Path, models: tuple[str, ...] = DEFAULT_MODELS,
        families: tuple[str, ...] = ("fullrank", "meanfield"), seeds: int = 7,
        dense_limits: tuple[int, ...] | None = None, rounds: int = 3) -> dict:
    """Print and return {model: {family: (median CPU ms, median wall ms)}}; with
    ``dense_limits``, {model: {family: {limit: (CPU ms, wall ms, evaluations)}}}."""
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    if dense_limits:
        return _compare_dense_limits(models_dir, models, families, seeds, dense_limits, rounds)
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


def _compare_dense_limits(models_dir: Path, models: tuple[str, ...], families: tuple[str, ...],
                          seeds: int, limits: tuple[int, ...], rounds: int) -> dict:
    """The module docstring's comparison of ``DENSE_SOLVE_MAX_PARAMS`` settings."""
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.methods import trustvi_fixed  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    kept = trustvi_fixed.DENSE_SOLVE_MAX_PARAMS
    out: dict = {}
    print(f"{'model':28s} {'family':10s} {'P':>4s} " + " ".join(
        f"{f'[{limit}] CPU ms':>13s} {'wall ms':>8s} {'evals':>7s}" for limit in limits))
    try:
        for name in models:
            stan, data = _model_files(models_dir, name)
            target = StanTarget(compile_model(stan, progress=False), data, progress=False)
            for family in families:
                fit(target, method="trustvi", family=family, seed=10_000, progress=False,
                    draws=10)
                runs: dict[int, list] = {limit: [] for limit in limits}
                for _ in range(rounds):
                    for limit in limits:
                        trustvi_fixed.DENSE_SOLVE_MAX_PARAMS = limit
                        runs[limit] += [fit(target, method="trustvi", family=family, seed=s,
                                            progress=False, draws=10) for s in range(seeds)]
                row = {limit: (1000 * statistics.median(r.info["run_cpu_seconds"] for r in rs),
                               1000 * statistics.median(r.wall_time for r in rs),
                               statistics.median(sum(r.info["model_evaluations"].values())
                                                 for r in rs))
                       for limit, rs in runs.items()}
                out.setdefault(name, {})[family] = row
                n_params = len(runs[limits[0]][0].params)
                print(f"{name:28s} {family:10s} {n_params:4d} " + " ".join(
                    f"{cpu:13.2f} {wall:8.2f} {evals:7.0f}" for cpu, wall, evals in row.values()),
                    flush=True)
    finally:
        trustvi_fixed.DENSE_SOLVE_MAX_PARAMS = kept
    return out
