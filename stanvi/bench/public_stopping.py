"""``stanvi bench public-stopping``: does a ``converged`` TrustVI fit mean converged on public
posteriors that nobody here wrote (issue 8, part 1)?  ``stanvi bench stopping`` asks it of the
project's own stan_models; this asks it of posteriordb.

For each posterior of a posteriordb checkout (``--posteriordb``: the repository root or its
``posterior_database`` directory; :data:`DEFAULT_POSTERIORS` unless ``--posteriors`` names
others):

1. compile its model with stanvi and load its data (``data/data/<name>.json.zip``).  A model
   stanc rejects (posteriordb has some in pre-2.33 syntax) is recorded as skipped with stanc's
   message;
2. compute its mean-field optimum independently of every stanvi method, by the procedure of
   ``stan_models/compute_optima.py`` (:func:`stanvi.evaluation.optima.optimum_record`: L-BFGS-B on a
   fixed 4,096-draw sample-average ELBO from four starts, ELBO re-estimated on 100,000 fresh
   draws), cached as ``<optima dir>/<posterior>.optimum.json`` (default
   ``<stanvi cache root>/optima``) and recomputed when the model code or data change
   (``source_sha256``);
3. fit it with TrustVI's ``default`` profile (mean-field) over ``seeds`` seeds and measure each
   run as ``stanvi bench stopping`` does (:func:`stanvi.bench.stopping_bench.measure_run`):
   status, final ELBO on 10,000 common fresh draws, gap = optimum − final ELBO, draw-level
   evaluations and run time until the trace stays within 1 nat of the optimum.

Printed: a row per posterior (medians over seeds) and the overall lines: ``converged`` runs
within 1 nat / all ``converged`` runs, every run that reports ``converged`` while more than 1 nat
short (posterior, seed, gap, message), and the skipped posteriors with their reasons.  The JSON
output (rewritten after every posterior) holds each posterior's record and every run.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from stanvi.batch.posteriordb import database_root, posterior_files  # noqa: F401
from stanvi.batch.posteriordb import read_zipped_json as read_data
from stanvi.evaluation.optima import optimum_record
from stanvi.bench.stopping_bench import StopRun, run_model

DEFAULT_CONFIGS = ("trustvi:default",)

# The fixed list (selection rule in docs/benchmarks.md): posteriordb posteriors with an
# unconstrained dimension between 2 and 100, favouring regressions on raw (uncentred)
# predictors and with interactions, hierarchical models (eight schools, radon), and posteriors
# known to be ill-conditioned; one posterior per model where several share it.  Cheap ones first.
DEFAULT_POSTERIORS = (
    "earnings-earn_height",                          # D 3: earnings in dollars on raw height
    "kilpisjarvi_mod-kilpisjarvi",                   # D 3: temperature on raw years (~2000)
    "garch-garch11",                                 # D 4: volatility model, constrained
    "earnings-logearn_interaction",                  # D 5: raw height x male interaction
    "kidiq-kidscore_interaction",                    # D 5: raw mom_iq x mom_hs interaction
    "sblrc-blr",                                     # D 6: linear regression, correlated design
    "arK-arK",                                       # D 7: AR(5) time series
    "mesquite-mesquite",                             # D 8: raw-unit regression, 6 predictors
    "nes1972-nes",                                   # D 10: election survey regression
    "eight_schools-eight_schools_centered",          # D 10: funnel
    "eight_schools-eight_schools_noncentered",       # D 10
    "gp_pois_regr-gp_pois_regr",                     # D 13: latent GP, Poisson
    "diamonds-diamonds",                             # D 26: 24 strongly correlated predictors
    "mcycle_gp-accel_gp",                            # D 66: approximate GP, heteroscedastic
    "radon_mn-radon_partially_pooled_centered",      # D 88: hierarchical, centred
    "radon_mn-radon_hierarchical_intercept_noncentered",  # D 90: hierarchical, non-centred
)


@dataclass
class PosteriorRecord:
    """What happened to one posterior (``status``: "ok", "skipped" or "failed")."""

    name: str
    model: str
    data: str
    status: str
    reason: str = ""
    dim: int | None = None
    optimum_elbo: float | None = None
    optimum_elbo_se: float | None = None
    starts_agree: bool | None = None
    start_spread: float | None = None
    optimum_seconds: float | None = None
    optimum_cached: bool = False
    optimum_path: str | None = None


def default_optima_dir() -> Path:
    """``<stanvi cache root>/optima`` (the root honours ``$STANVI_CACHE_DIR``)."""
    from stanvi.stan.cache import cache_root  # noqa: PLC0415

    return cache_root() / "optima"


def source_digest(code: str, data: dict) -> str:
    """SHA-256 of the model code and the canonical JSON of its data: the cache key."""
    h = hashlib.sha256(code.encode())
    h.update(b"\0")
    h.update(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()


def cached_optimum(name: str, target, digest: str, optima_dir: Path) -> tuple[dict, bool, Path]:
    """The optimum record of a posterior: read from ``<optima_dir>/<name>.optimum.json`` when its
    ``source_sha256`` matches, else computed (:func:`~stanvi.evaluation.optima.optimum_record`) and
    written there.  Returns (record, whether it came from the cache, path)."""
    path = Path(optima_dir).expanduser() / f"{name}.optimum.json"
    if path.exists():
        try:
            record = json.loads(path.read_text())
        except ValueError:
            record = {}
        if record.get("source_sha256") == digest and record.get("dim") == target.dim:
            return record, True, path
    t0 = time.perf_counter()
    record = optimum_record(name, target)
    record["posterior"] = name
    record["source_sha256"] = digest
    record["seconds"] = time.perf_counter() - t0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    tmp.replace(path)
    return record, False, path


def _first_line(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:limit]}"


def run_posterior(root: Path, name: str, *, configs=DEFAULT_CONFIGS, seeds: int = 5,
                  optima_dir: Path) -> tuple[PosteriorRecord, list[StopRun]]:
    """Compile, compute (or read) the optimum, fit and measure one posterior."""
    from stanvi.errors import StanCompileError, StanDataError  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    info, stan, zipped = posterior_files(root, name)
    rec = PosteriorRecord(name=name, model=info["model_name"], data=info["data_name"],
                          status="ok")
    try:
        data = read_data(zipped)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        rec.status, rec.reason = "skipped", f"data: {_first_line(exc)}"
        return rec, []
    try:
        target = StanTarget(str(stan), data=data, progress=False)
    except (StanCompileError, StanDataError) as exc:
        rec.status, rec.reason = "skipped", _first_line(exc)
        return rec, []
    rec.dim = target.dim
    digest = source_digest(stan.read_text(), data)
    optimum, rec.optimum_cached, path = cached_optimum(name, target, digest, optima_dir)
    rec.optimum_path = str(path)
    rec.optimum_seconds = optimum.get("seconds")
    rec.starts_agree = optimum.get("starts_agree")
    rec.start_spread = optimum.get("start_spread")
    if optimum.get("elbo") is None:
        rec.status, rec.reason = "skipped", f"no finite optimum: {optimum.get('reason')}"
        return rec, []
    rec.optimum_elbo, rec.optimum_elbo_se = optimum["elbo"], optimum.get("elbo_se")
    print(f"  {name}: D = {target.dim}, optimum ELBO {rec.optimum_elbo:.3f} ± "
          f"{rec.optimum_elbo_se:.3f} (starts agree: {rec.starts_agree}; "
          f"{'cached' if rec.optimum_cached else f'{rec.optimum_seconds:.0f} s'})", flush=True)
    runs = run_model(name, stan, None, optimum, configs=configs, seeds=seeds, target=target)
    return rec, runs


def run(posteriordb: Path, *, posteriors: list[str] | None = None, configs=DEFAULT_CONFIGS,
        seeds: int = 5, output: Path | None = None,
        optima_dir: Path | None = None) -> tuple[list[PosteriorRecord], list[StopRun]]:
    """Run the benchmark over ``posteriors`` (default :data:`DEFAULT_POSTERIORS`) and print the
    table (module docstring)."""
    root = database_root(posteriordb)
    optima_dir = Path(optima_dir).expanduser() if optima_dir else default_optima_dir()
    records: list[PosteriorRecord] = []
    runs: list[StopRun] = []
    for name in posteriors or DEFAULT_POSTERIORS:
        t0 = time.perf_counter()
        try:
            rec, new_runs = run_posterior(root, name, configs=configs, seeds=seeds,
                                          optima_dir=optima_dir)
        except FileNotFoundError as exc:
            rec, new_runs = PosteriorRecord(name=name, model="", data="", status="skipped",
                                            reason=_first_line(exc)), []
        except Exception as exc:  # noqa: BLE001 - a benchmark records failures and goes on
            rec, new_runs = PosteriorRecord(name=name, model="", data="", status="failed",
                                            reason=_first_line(exc)), []
        if rec.status != "ok":
            print(f"  {name}: {rec.status}: {rec.reason}", flush=True)
        else:
            print(f"  {name}: {time.perf_counter() - t0:.0f} s in all", flush=True)
        records.append(rec)
        runs += new_runs
        if output is not None:
            write_json(output, root, optima_dir, configs, seeds, records, runs)
    print_table(records, runs)
    return records, runs


def write_json(output: Path, root: Path, optima_dir: Path, configs, seeds: int,
               records: list[PosteriorRecord], runs: list[StopRun]) -> None:
    out = {"posteriordb": str(root), "optima_dir": str(optima_dir), "configs": list(configs),
           "seeds": seeds, "posteriors": [asdict(r) for r in records],
           "runs": [asdict(r) for r in runs]}
    Path(output).write_text(json.dumps(out, indent=1, default=str) + "\n")


def false_converged(runs: list[StopRun], tol: float = 1.0) -> list[StopRun]:
    """Runs that report ``converged`` while more than ``tol`` nats short of the optimum."""
    return [r for r in runs if r.status == "converged" and not r.gap <= tol]


def _med(values) -> float:
    values = [v for v in values]
    return float(np.median(values)) if values else math.nan


def print_table(records: list[PosteriorRecord], runs: list[StopRun]) -> None:
    """Per (posterior, configuration) medians over seeds, then the overall lines."""
    print(f"\n{'posterior':50s} {'D':>3s} {'ELBO*':>10s} {'conv':>5s} {'gap':>7s} "
          f"{'max gap':>8s} {'false':>5s} {'draws→1nat':>10s} {'s→1nat':>7s} {'draws':>8s} "
          f"{'run s':>6s}")
    by_name = {r.name: r for r in records}
    configs = list(dict.fromkeys(r.config for r in runs))
    for config in configs:
        if len(configs) > 1:
            print(f"[{config}]")
        for name, rec in by_name.items():
            rs = [r for r in runs if r.model == name and r.config == config]
            if not rs:
                continue
            print(f"{name:50s} {rec.dim:3d} {rec.optimum_elbo:10.2f} "
                  f"{sum(r.status == 'converged' for r in rs):2d}/{len(rs):<2d} "
                  f"{_med(r.gap for r in rs):7.3f} {max(r.gap for r in rs):8.3f} "
                  f"{len(false_converged(rs)):5d} "
                  f"{_med(r.to_one_nat_draws for r in rs):10.0f} "
                  f"{_med(r.to_one_nat_seconds for r in rs):7.2f} "
                  f"{_med(r.draw_evals for r in rs):8.0f} {_med(r.run_time for r in rs):6.2f}")
    for config in configs:
        cruns = [r for r in runs if r.config == config]
        conv = [r for r in cruns if r.status == "converged"]
        ok = [r for r in conv if r.gap <= 1.0]
        print(f"\n[{config}] converged runs within 1 nat of the optimum: {len(ok)}/{len(conv)}; "
              f"runs reporting converged: {len(conv)}/{len(cruns)}; runs within 1 nat at the "
              f"end: {sum(r.gap <= 1.0 for r in cruns)}/{len(cruns)}")
        for r in false_converged(cruns):
            print(f"  FALSE converged: {r.model} seed {r.seed}: gap {r.gap:.3f} nats "
                  f"({r.message})")
        for r in cruns:
            if r.status != "converged":
                print(f"  not converged: {r.model} seed {r.seed}: {r.status}, gap {r.gap:.3f} "
                      f"({r.message})")
    for rec in records:
        if rec.status != "ok":
            print(f"{rec.status}: {rec.name}: {rec.reason}")
        elif rec.starts_agree is False:
            spread = ("a start ended where the ELBO is -inf" if not rec.start_spread < 1e299
                      else f"the starts end {rec.start_spread:.3f} nats apart")
            print(f"note: {rec.name}: {spread} (fixed draws; checked on fresh ones): the best "
                  "start is kept")
