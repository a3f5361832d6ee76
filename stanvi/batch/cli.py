"""``stanvi batch``: the command line of a batch run (issue P2-2); docs/batch.md.

    stanvi batch SOURCE --methods trustvi,trustvi:paper,advi:stan,hfsgvi --seeds 5 \\
        [--family meanfield,fullrank] [--scheduler tcp://host:8786 | --workers N] \\
        [--timeout S] [--skip-after-timeout] [--glob P,Q] [--exclude P,Q] [--names A,B] \\
        [--max-dim D] [--sample N --sample-seed S] [--plan] --out RUNS_DIR

SOURCE is a stan-dev/example-models or stan-dev/posteriordb checkout (told apart by posteriordb's
``posteriors/`` directory).  The same command again resumes: finished tasks are skipped.

    stanvi report RUNS_DIR [--out DIR] [--family FAMILY]

writes the batch's HTML page, CSV tables and plots (:mod:`stanvi.batch.report`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["add_batch_parser", "add_report_parser", "parse_methods", "parse_options",
           "cases_from_source"]


def parse_methods(text: str, profile: str | None = None) -> tuple[tuple[str, str | None], ...]:
    """``"trustvi,trustvi:paper,advi:stan"`` → ((method, profile), ...); ``profile`` applies to
    entries that name none."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        method, _, prof = item.partition(":")
        out.append((method.strip(), prof.strip() or profile))
    if not out:
        raise ValueError(f"--methods names no method: {text!r}")
    return tuple(out)


def parse_options(text: str | None) -> dict[str, dict]:
    """``--options`` JSON, ``{"trustvi": {"max_iters": 50}}``: each method's options (the
    keyword options of ``stanvi.fit``), checked against the method when the batch starts."""
    if not text:
        return {}
    import json  # noqa: PLC0415

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--options is not valid JSON ({exc})") from None
    if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
        raise ValueError('--options must map method names to option objects, e.g. '
                         '\'{"trustvi": {"max_iters": 50}}\'')
    return value


def is_posteriordb(source: Path) -> bool:
    return (source / "posteriors").is_dir() or (source / "posterior_database" / "posteriors").is_dir()


def cases_from_source(source: str | Path, *, glob: str | None = None, exclude: str | None = None,
                      names: list[str] | None = None, max_data_bytes: int | None = None,
                      with_reference: bool = False, sample: int | None = None,
                      sample_seed: int = 0):
    """The model cases of an example-models or posteriordb checkout, filtered by name
    (:func:`stanvi.batch.discover.name_selected`); with ``sample``, a random subset of that many
    runnable cases (``random.Random(sample_seed).sample`` of the runnable cases in name order,
    returned sorted by name), so the same filters and seed on the same checkout give the same
    subset."""
    from stanvi.batch.discover import discover_example_models  # noqa: PLC0415
    from stanvi.batch.posteriordb import discover_posteriordb  # noqa: PLC0415

    source = Path(source).expanduser()
    if not source.is_dir():
        raise FileNotFoundError(f"{source} is not a directory (an example-models or posteriordb "
                                "checkout)")
    if is_posteriordb(source):
        cases = discover_posteriordb(source, glob=glob, exclude=exclude, names=names,
                                     with_reference=with_reference, max_data_bytes=max_data_bytes)
    else:
        cases = discover_example_models(source, glob=glob, exclude=exclude, names=names,
                                        max_data_bytes=max_data_bytes)
    if sample is None:
        return cases
    import random  # noqa: PLC0415

    runnable = [c for c in cases if c.skip is None]
    return sorted(random.Random(sample_seed).sample(runnable, min(sample, len(runnable))),
                  key=lambda c: c.name)


def _cmd_batch(args: argparse.Namespace) -> int:
    from stanvi.batch.runner import (BatchConfig, check_config, require_dask,  # noqa: PLC0415
                                     run_batch)

    if not args.plan:
        require_dask()   # before the models are read: the batch cannot run without it
    methods = (() if args.methods.strip().lower() in ("", "none")
               else parse_methods(args.methods, args.profile))
    families = tuple(f.strip() for f in args.family.split(",") if f.strip())
    options = parse_options(args.options)
    config = BatchConfig(methods=methods, families=families, seeds=args.seeds, options=options,
                         max_dim=args.max_dim, fullrank_max_dim=args.fullrank_max_dim,
                         timeout=args.timeout, compile_timeout=args.compile_timeout,
                         draws=args.draws, reference=args.reference,
                         reference_timeout=args.reference_timeout,
                         skip_after_timeout=args.skip_after_timeout)
    check_config(config)   # a bad method, profile or family fails before any work
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    cases = cases_from_source(args.source, glob=args.glob, exclude=args.exclude, names=names,
                              max_data_bytes=args.max_data_bytes,
                              with_reference=args.with_reference, sample=args.sample,
                              sample_seed=args.sample_seed)
    runnable = sum(c.skip is None for c in cases)
    fits = (f"{len(methods)} method(s) x {len(families)} family(ies) x {args.seeds} seed(s)"
            if methods else "no fits")
    print(f"stanvi batch: {len(cases)} models in {args.source} ({runnable} runnable), {fits}"
          f"{', NUTS references' if args.reference else ''} -> {args.out}")
    if args.plan:   # what the store has and what is left; nothing is run
        from stanvi.batch.plan_status import format_plan_status, plan_status  # noqa: PLC0415

        print(format_plan_status(plan_status(cases, args.out, config)))
        return 0
    counts = run_batch(cases, args.out, config, scheduler=args.scheduler, workers=args.workers,
                       progress=not args.quiet)
    print("fit records by status: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 0


def add_batch_parser(sub) -> None:
    """Add the ``batch`` subcommand to the ``stanvi`` parser's subparsers."""
    p = sub.add_parser("batch", help="fit every model of an example-models or posteriordb "
                       "checkout with several methods and seeds, on Dask; resumable")
    p.add_argument("source", help="a stan-dev/example-models or stan-dev/posteriordb checkout")
    p.add_argument("--out", required=True, help="runs directory (the results store)")
    p.add_argument("--methods", default="trustvi,advi",
                   help="comma-separated method[:profile] list (default trustvi,advi; 'none': "
                        "only the references of --reference)")
    p.add_argument("--reference", choices=("nuts",), default=None,
                   help="nuts: give every model without reference draws a NUTS reference "
                        "(4 chains, Stan's defaults; judged by R-hat, ESS and divergences, "
                        "rerun once with 4x the warmup when it fails them) and score the fits "
                        "against it (docs/batch.md#nuts-references)")
    p.add_argument("--reference-timeout", type=float, default=3600.0,
                   help="seconds per NUTS reference (default 3600)")
    p.add_argument("--profile", default=None, help="profile for methods that name none")
    p.add_argument("--family", default="meanfield",
                   help="meanfield, fullrank, lowrank (default rank), comma-separated")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 per configuration (default 5)")
    p.add_argument("--scheduler", default=None,
                   help="address of a running Dask scheduler (default: a local cluster)")
    p.add_argument("--workers", type=int, default=None,
                   help="local cluster workers (default: the number of CPUs)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per fit (default 600)")
    p.add_argument("--skip-after-timeout", action="store_true",
                   help="run every configuration's seed 0 first, then seed 1, ...; a seed whose "
                        "configuration timed out on a lower seed gets a 'not_run' record instead "
                        "of running (docs/batch.md#skip-after-timeout)")
    p.add_argument("--compile-timeout", type=float, default=1800.0,
                   help="seconds per compile task (default 1800)")
    p.add_argument("--glob", default=None,
                   help="only models whose name matches one of these comma-separated patterns "
                        "('ARM/*,BPA/*')")
    p.add_argument("--exclude", default=None,
                   help="leave out models whose name matches one of these comma-separated "
                        "patterns ('knitr/*,misc/*')")
    p.add_argument("--names", default=None, help="only these models (comma-separated names)")
    p.add_argument("--max-dim", type=int, default=None, help="skip models of larger dimension")
    p.add_argument("--fullrank-max-dim", type=int, default=100,
                   help="full-rank fits only up to this dimension (default 100)")
    p.add_argument("--max-data-bytes", type=int, default=None, help="skip larger data files")
    p.add_argument("--with-reference", action="store_true",
                   help="posteriordb: only posteriors with reference draws")
    p.add_argument("--sample", type=int, default=None,
                   help="a random subset of this many runnable models (seed --sample-seed)")
    p.add_argument("--sample-seed", type=int, default=0,
                   help="seed of the random subset of --sample (default 0)")
    p.add_argument("--options", default=None,
                   help='method options as JSON, e.g. \'{"advi": {"eta": 0.1}}\' (part of each '
                        'task\'s identity)')
    p.add_argument("--draws", type=int, default=2000, help="output draws per fit (default 2000)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--plan", action="store_true",
                   help="run nothing: print the tasks planned, those already in --out and those "
                        "left, by configuration and by model (docs/batch.md#plan)")
    p.set_defaults(func=_cmd_batch)


def _cmd_report(args: argparse.Namespace) -> int:
    from stanvi.batch.report import write_report  # noqa: PLC0415

    runs = Path(args.runs_dir).expanduser()
    if not (runs / "records").is_dir():
        raise FileNotFoundError(f"{runs} is not a runs directory of stanvi batch (no records/ in it)")
    index = write_report(runs, args.out, family=args.family)
    print(f"stanvi report: {index}")
    return 0


def add_report_parser(sub) -> None:
    """Add the ``report`` subcommand to the ``stanvi`` parser's subparsers."""
    p = sub.add_parser("report", help="write the HTML report, CSV tables and plots of a batch run")
    p.add_argument("runs_dir", help="the runs directory given to stanvi batch --out")
    p.add_argument("--out", default=None, help="output directory (default RUNS_DIR/report)")
    p.add_argument("--family", default=None,
                   help="report only the fits of this variational family (meanfield, fullrank, "
                        "...) and those of methods without one (Pathfinder, NUTS)")
    p.set_defaults(func=_cmd_report)
