"""The ``stanvi bench`` subcommand: its arguments (:func:`add_bench_parser`, called by
:func:`stanvi.cli.build_parser`) and its dispatch to the benchmark modules of
:mod:`stanvi.bench` (:func:`run_bench`).  Each benchmark is imported only when it is run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from stanvi.evaluation.models import MODELS_DIR as DEFAULT_MODELS_DIR


def add_bench_parser(sub) -> None:
    """Add ``bench`` to the ``stanvi`` command's subparsers ``sub``."""
    p = sub.add_parser("bench", help="run a benchmark and print its figures")
    p.add_argument("what", choices=["target", "methods", "stopping", "public-stopping",
                                    "coldstart", "fullrank", "lowrank", "jointcv", "peers", "mlmcvi",
                                    "rb", "qsgp", "local-optima", "advi-fidelity", "run-cpu",
                                    "verdict", "jax-native", "score-peers", "task-time",
                                    "protocol"],
                   help="target: cost of gradients/HVPs, batching, JAX bridge, compiles; "
                        "methods: TrustVI vs ADVI vs HFSGVI on stan_models (paper protocol); "
                        "stopping: does 'converged' mean converged (against stored optima); "
                        "public-stopping: the same on posteriordb posteriors; "
                        "coldstart: import + first fit in fresh processes; "
                        "fullrank: peak memory, time and accuracy of full-rank fits as D grows; "
                        "lowrank: exactness of the diagonal-plus-low-rank family at D = 2,000 "
                        "and its memory and time per iteration at D = 5k, 20k, 50k (--dims); with "
                        "--records DIR,...: its posteriordb targets from batch records (low-rank "
                        "against TrustVI full-rank, multi-path Pathfinder, mean-field); "
                        "jointcv: joint control variate vs naive/cv/inc on simulated logistic "
                        "regressions (variance decomposition, ELBO curves, Stan vs JAX); "
                        "peers: TrustVI vs Stan's own ADVI and Pathfinder (single, multi-path) "
                        "on stan_models, accuracy against Stan's NUTS; "
                        "mlmcvi: MLMC gradients vs plain MC and RQMC at equal cost on simulated "
                        "HLR/BLR and two stan_models (variance, SNR, ELBO vs cost and time); "
                        "rb: Rao-Blackwellized gradients: the toy problem's variance table and "
                        "SGD paths, the mixture family on stan_models/bimodal (--seeds runs); "
                        "qsgp: stanvi.gp step time over n and m vs the svi baseline, control-"
                        "variate variance reduction, accuracy on simulated sets (--models among "
                        "steps,cv,small,accuracy,walltime,rvm,convergence,crossover; --iters: training "
                        "steps, default 3000; crossover: QSGP vs svi at equal wall time at m = "
                        "10⁶ and 10⁷, --budget seconds per run, resumable through --output); "
                        "run-cpu: CPU of TrustVI's run per fit on small stan_models (--models, "
                        "--seeds; default 7 small models, 5 seeds; --dense-limits 0,48: the exact "
                        "small-matrix solve against GLTR, interleaved in one process); "
                        "local-optima: does TrustVI certify a local optimum that ADVI or "
                        "Pathfinder beats by a nat (hmm_drive_0, mvn_orange, stagnant); "
                        "advi-fidelity: stanvi's ADVI against Stan's C++ ADVI, failures and eta "
                        "over --seeds seeds on raw-unit regressions (--models); "
                        "verdict: how well the verdict separates fits whose means are off from "
                        "the rest, and whether it holds across seeds, over the batch records of "
                        "--records; "
                        "score-peers: BaM and GSM beside TrustVI full-rank and multi-path "
                        "Pathfinder over the batch records of --records; "
                        "task-time: where the task time of the batch runs of --records went, per "
                        "configuration (the fit, the ELBO, the verdict, the trace, timeouts); "
                        "protocol: the TrustVI paper's protocol over the batch records of "
                        "--records, seed by seed and over the models with every seed; "
                        "jax-native: JAX-native fits (a logistic regression in JAX) end to end on "
                        "JAX's default device, CPU or GPU")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="qsgp: the precision of QSGP's training loop in the step-time grid "
                        "(default float64)")
    p.add_argument("--models-dir", default=str(DEFAULT_MODELS_DIR), help="directory of the stan_models set")
    p.add_argument("--no-cold", action="store_true", help="skip the cold compile (fresh cache, ~1 min)")
    p.add_argument("--batch", type=int, default=256, help="draws per batched call (default 256)")
    p.add_argument("--compiles", type=int, default=300,
                   help="target: XLA compilations before timing C++ exceptions (0: skip; default 300)")
    p.add_argument("--models", default=None, help="methods: comma-separated model names (default: all)")
    p.add_argument("--seeds", type=int, default=5,
                   help="methods, peers, local-optima: runs per method and model (default 5)")
    p.add_argument("--configs", default=None,
                   help="methods: comma-separated method:profile list (default: trustvi:default,"
                        "trustvi:paper,advi:paper,advi:stan,hfsgvi:paper); coldstart: "
                        "method:family list (default: trustvi and advi x meanfield and fullrank)")
    p.add_argument("--output", default=None,
                   help="methods: write the figures as JSON here (rewritten after every model); "
                        "coldstart, fullrank: write the runs as JSON here")
    p.add_argument("--resume", action="store_true",
                   help="methods: skip the models already in --output")
    p.add_argument("--reps", type=int, default=3,
                   help="coldstart: timed processes per configuration, after one warm-up "
                        "(default 3; medians are printed)")
    p.add_argument("--model", default=None,
                   help="coldstart: the .stan file (default: eight schools, non-centred)")
    p.add_argument("--data", default=None, help="coldstart: its data (JSON)")
    p.add_argument("--no-jax-cache", action="store_true",
                   help="coldstart: run the processes with STANVI_JAX_CACHE=0")
    p.add_argument("--posteriordb", default=None,
                   help="public-stopping, peers: a posteriordb checkout (its root or its "
                        "posterior_database directory)")
    p.add_argument("--posteriors", default=None,
                   help="public-stopping, peers: comma-separated posterior names (default: the fixed "
                        "list in stanvi.bench.public_stopping)")
    p.add_argument("--example-models", default=None,
                   help="local-optima: a stan-dev/example-models checkout")
    p.add_argument("--optima-dir", default=None,
                   help="public-stopping: where the computed optima are cached as JSON "
                        "(default: <stanvi cache>/optima)")
    p.add_argument("--max-dim", type=int, default=None,
                   help="peers: leave out models with more unconstrained parameters")
    p.add_argument("--plot", default=None,
                   help="peers: write the accuracy-against-evaluations plot (PNG) here")
    p.add_argument("--new-process", action="store_true",
                   help="peers: also time a fresh process per method and model (seed 0)")
    p.add_argument("--options", default=None,
                   help="peers: TrustVI options, e.g. 'certify_rms=0.02,fixed_n0=32'")
    p.add_argument("--dims", default=None,
                   help="fullrank: comma-separated dimensions (default 500,1000,2000); "
                        "lowrank: the scaling dimensions (default 5000,20000,50000)")
    p.add_argument("--methods", default=None,
                   help="fullrank: comma-separated methods (default trustvi,advi); peers: among "
                        "trustvi,trustvi-fullrank,stan-advi,pathfinder,pathfinder-multi")
    p.add_argument("--max-memory", type=float, default=8.0,
                   help="fullrank: kill a fit whose resident memory exceeds this many GB "
                        "(default 8)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="fullrank: kill a fit after this many seconds (default 1800)")
    p.add_argument("--dense-limits", default=None,
                   help="run-cpu: comma-separated settings of TrustVI's DENSE_SOLVE_MAX_PARAMS to "
                        "compare in one process (0: GLTR always), e.g. 0,48")
    p.add_argument("--budget", type=float, default=None,
                   help="methods: oracle budget per run in the paper's scaled units "
                        "(max_oracle_calls; default none); qsgp crossover: seconds of training "
                        "steps per (m, method) run (default 600)")
    p.add_argument("--iters", type=int, default=5000,
                   help="jointcv: iterations per run (default 5000; at most 2000 for 'large'); "
                        "--models picks problems among sonar,australian,large "
                        "(default sonar,australian); mlmcvi: the last level T (5000 means the "
                        "default, 1000), --models among hlr,blr,logistic_regression,"
                        "hierarchical_radon (default all)")
    p.add_argument("--records", default=None,
                   help="verdict: comma-separated batch runs directories (stanvi batch --out) "
                        "whose fits have reference draws; score-peers, task-time, protocol: "
                        "the batch runs directories whose fit records they read")
    p.add_argument("--common-draws-since", type=float, default=None, metavar="UNIX_TIME",
                   help="verdict: leave out the records of seeds other than 0 finished before "
                        "this time (unix seconds), judged on their own seed's diagnostic draws "
                        "before the draws were common to every fit (docs/diagnostics.md"
                        "#common-draws; the T3-4 store: 1796573881)")
    p.set_defaults(func=run_bench)


def _options(text: str | None) -> dict:
    """``name=value,...`` as a dict of options (values parsed as Python literals, else strings)."""
    import ast  # noqa: PLC0415

    out: dict = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, _, value = part.partition("=")
        try:
            out[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[name.strip()] = value.strip()
    return out


def run_bench(args: argparse.Namespace) -> int:
    """``stanvi bench WHAT``: run the benchmark ``args.what`` with the options it reads."""
    if args.what == "target":
        from stanvi.bench import target_bench  # noqa: PLC0415

        target_bench.run(Path(args.models_dir), cold=not args.no_cold, batch=args.batch,
                         compiles=args.compiles)
        return 0
    if args.what == "methods":
        from stanvi.bench import methods_bench  # noqa: PLC0415

        configs = methods_bench.DEFAULT_CONFIGS
        if args.configs:
            configs = tuple(tuple(c.split(":", 1)) for c in args.configs.split(","))
        methods_bench.run(Path(args.models_dir), models=args.models.split(",") if args.models else None,
                          seeds=args.seeds, configs=configs, budget=args.budget,
                          output=Path(args.output) if args.output else None, resume=args.resume)
        return 0
    if args.what == "stopping":
        from stanvi.bench import stopping_bench  # noqa: PLC0415

        configs = stopping_bench.DEFAULT_CONFIGS
        if args.configs:  # ';' separates configurations whose options contain ','
            sep = ";" if ";" in args.configs else ","
            configs = tuple(c for c in args.configs.split(sep) if c)
        stopping_bench.run(Path(args.models_dir),
                           models=args.models.split(",") if args.models else None,
                           seeds=args.seeds, configs=configs,
                           output=Path(args.output) if args.output else None)
        return 0
    if args.what == "public-stopping":
        from stanvi.bench import public_stopping  # noqa: PLC0415

        if not args.posteriordb:
            raise SystemExit("stanvi bench public-stopping: --posteriordb PATH is required "
                             "(a posteriordb checkout)")
        configs = public_stopping.DEFAULT_CONFIGS
        if args.configs:
            sep = ";" if ";" in args.configs else ","
            configs = tuple(c for c in args.configs.split(sep) if c)
        public_stopping.run(Path(args.posteriordb),
                            posteriors=args.posteriors.split(",") if args.posteriors else None,
                            seeds=args.seeds, configs=configs,
                            output=Path(args.output) if args.output else None,
                            optima_dir=Path(args.optima_dir) if args.optima_dir else None)
        return 0
    if args.what == "verdict":
        from stanvi.batch.verdict_check import check_stores, report_text  # noqa: PLC0415

        if not args.records:
            raise SystemExit("stanvi bench verdict: --records DIR[,DIR...] is required (batch "
                             "runs directories with reference draws)")
        print(report_text(check_stores(args.records.split(","),
                                       common_draws_since=args.common_draws_since)))
        return 0
    if args.what == "run-cpu":
        from stanvi.bench import run_cpu  # noqa: PLC0415

        models = tuple(args.models.split(",")) if args.models else run_cpu.DEFAULT_MODELS
        limits = (tuple(int(x) for x in args.dense_limits.split(","))
                  if args.dense_limits else None)
        run_cpu.run(Path(args.models_dir), models, seeds=args.seeds, dense_limits=limits)
        return 0
    if args.what == "coldstart":
        from stanvi.bench import coldstart  # noqa: PLC0415

        configs = coldstart.DEFAULT_CONFIGS
        if args.configs:
            configs = tuple(tuple(c.split(":", 1)) for c in args.configs.split(","))
            if any(len(c) != 2 for c in configs):
                raise SystemExit("stanvi bench coldstart: --configs takes method:family,...")
        model = Path(args.model) if args.model else coldstart.DEFAULT_MODEL
        data = Path(args.data) if args.data else (coldstart.DEFAULT_DATA if not args.model else None)
        coldstart.run(model, data, configs=configs, reps=args.reps,
                      jax_cache=not args.no_jax_cache,
                      output=Path(args.output) if args.output else None)
        return 0
    if args.what == "fullrank":
        from stanvi.bench import fullrank_bench  # noqa: PLC0415

        dims = (tuple(int(d) for d in args.dims.split(",")) if args.dims
                else fullrank_bench.DEFAULT_DIMS)
        methods = (tuple(args.methods.split(",")) if args.methods
                   else fullrank_bench.DEFAULT_METHODS)
        fullrank_bench.run(dims, methods, max_memory_gb=args.max_memory,
                           timeout=args.timeout, output=Path(args.output) if args.output else None)
        return 0
    if args.what == "lowrank" and args.records:   # issue T3-6's posteriordb targets
        from stanvi.bench import lowrank_posteriordb as lp  # noqa: PLC0415

        print(lp.report_text(*lp.check_stores(args.records.split(","))))
        return 0
    if args.what == "lowrank":
        from stanvi.bench import lowrank_bench  # noqa: PLC0415

        dims = (tuple(int(d) for d in args.dims.split(",")) if args.dims
                else lowrank_bench.SCALING_DIMS)
        lowrank_bench.run(dims, output=args.output)
        return 0
    if args.what == "jointcv":
        from stanvi.bench import jointcv_bench  # noqa: PLC0415

        problems = args.models.split(",") if args.models else ["sonar", "australian"]
        known = {*jointcv_bench.PROBLEMS, jointcv_bench.STAN_PROBLEM}
        unknown = sorted(set(problems) - known)
        if unknown:
            raise SystemExit(f"stanvi bench jointcv: unknown problems {unknown}; choose from "
                             f"{sorted(known)}")
        jointcv_bench.run(problems, iters=args.iters, output=args.output)
        return 0
    if args.what == "peers":
        from stanvi.bench import peers  # noqa: PLC0415

        names = args.posteriors.split(",") if args.posteriors else None
        if args.posteriordb:
            cases = peers.posteriordb_cases(Path(args.posteriordb), names)
        else:
            cases = peers.stan_models_cases(Path(args.models_dir),
                                            args.models.split(",") if args.models else None)
        methods = tuple(args.methods.split(",")) if args.methods else peers.METHODS
        unknown = sorted(set(methods) - set(peers.METHODS))
        if unknown:
            raise SystemExit(f"stanvi bench peers: unknown methods {unknown}; choose from "
                             f"{list(peers.METHODS)}")
        peers.run(cases, seeds=args.seeds, methods=methods,
                  output=Path(args.output) if args.output else None,
                  plot=Path(args.plot) if args.plot else None, new_process=args.new_process,
                  max_dim=args.max_dim, resume=args.resume,
                  options=_options(args.options))
        return 0
    if args.what == "advi-fidelity":
        from stanvi.bench import advi_fidelity  # noqa: PLC0415

        advi_fidelity.run(args.models.split(",") if args.models else None, seeds=args.seeds,
                          output=Path(args.output) if args.output else None)
        return 0
    if args.what == "local-optima":
        from stanvi.bench import local_optima  # noqa: PLC0415

        local_optima.run(Path(args.posteriordb) if args.posteriordb else None,
                         Path(args.example_models) if args.example_models else None,
                         seeds=args.seeds,
                         output=Path(args.output) if args.output else None)
        return 0
    if args.what == "mlmcvi":
        from stanvi.bench import mlmcvi_bench  # noqa: PLC0415

        problems = args.models.split(",") if args.models else list(mlmcvi_bench.PROBLEMS)
        unknown = sorted(set(problems) - set(mlmcvi_bench.PROBLEMS))
        if unknown:
            raise SystemExit(f"stanvi bench mlmcvi: unknown problems {unknown}; choose from "
                             f"{sorted(mlmcvi_bench.PROBLEMS)}")
        mlmcvi_bench.run(problems, models_dir=Path(args.models_dir), seeds=args.seeds,
                         iters=1000 if args.iters == 5000 else args.iters, output=args.output)
        return 0
    if args.what == "rb":
        from stanvi.bench import rb_bench  # noqa: PLC0415

        rb_bench.run(Path(args.models_dir), seeds=args.seeds, output=args.output)
        return 0
    if args.what == "score-peers":
        from stanvi.bench import score_peers_records  # noqa: PLC0415

        if not args.records:
            raise SystemExit("stanvi bench score-peers: --records DIR[,DIR...] is required")
        print(score_peers_records.check_stores(args.records.split(",")))
        return 0
    if args.what == "task-time":
        from stanvi.bench import task_time  # noqa: PLC0415

        if not args.records:
            raise SystemExit("stanvi bench task-time: --records DIR[,DIR...] is required")
        print(task_time.check_stores(args.records.split(",")))
        return 0
    if args.what == "protocol":
        from stanvi.bench import protocol_seeds  # noqa: PLC0415

        if not args.records:
            raise SystemExit("stanvi bench protocol: --records DIR[,DIR...] is required")
        print(protocol_seeds.check_stores(args.records.split(",")))
        return 0
    if args.what == "jax-native":
        from stanvi.bench import jax_native  # noqa: PLC0415

        jax_native.run(output=args.output)
        return 0
    if args.what == "qsgp":
        from stanvi.bench import qsgp_bench as gp_bench  # noqa: PLC0415

        parts = args.models.split(",") if args.models else ["steps", "cv", "small", "accuracy"]
        unknown = sorted(set(parts) - {"steps", "cv", "small", "accuracy", "walltime", "rvm",
                                       "convergence", "crossover"})
        if unknown:
            raise SystemExit(f"stanvi bench qsgp: unknown parts {unknown}; choose from "
                             "steps,cv,small,accuracy,walltime,rvm,convergence,crossover")
        if "crossover" in parts:     # issue T3-8 item 2 (docs/gp.md#crossover)
            from stanvi.bench.qsgp_crossover import bench_crossover  # noqa: PLC0415

            bench_crossover(budget=args.budget or 600.0, output=args.output)
            parts = [p for p in parts if p != "crossover"]
        if "convergence" in parts:   # issue T3-8's table (docs/gp.md#convergence)
            from stanvi.bench.qsgp_convergence import bench_convergence  # noqa: PLC0415

            print("convergence (n = 4000, d = 3, m = 400 RFF, noise 0.04, θ fixed; relative "
                  "error of the predictive mean vs method='exact')", flush=True)
            bench_convergence()
            parts = [p for p in parts if p != "convergence"]
        if parts:
            gp_bench.run(parts, steps=3000 if args.iters == 5000 else args.iters,
                         output=args.output, dtype=args.dtype)
        return 0
    raise SystemExit(f"unknown benchmark {args.what}")
