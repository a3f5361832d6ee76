"""``stanvi fit --method nuts | pathfinder | stan-advi``: Stan's own algorithm on the model, its
summary and diagnostics printed and its files written as for stanvi's methods (issue T3-5
item 2; docs/cli.md#stans-algorithms); and ``stanvi build-services``, which builds Stan's
services once per installation ahead of their first use (docs/stan_reference.md#services)."""

from __future__ import annotations

import argparse
from pathlib import Path

#: ``stanvi fit`` flags of stanvi's output that Stan's runs do not write (flag → its argparse
#: attribute and value when not given); the arguments of stanvi's methods (--profile,
#: --max-oracle-calls, ...) are refused by :func:`~stanvi.reference.as_fit.run_stan_method`.
STANVI_ONLY_FLAGS = {"--zarr": ("zarr", False),
                     "--cmdstan-compatible": ("cmdstan_compatible", False),
                     "--log-likelihood": ("log_likelihood", None),
                     "--posterior-predictive": ("posterior_predictive", None)}


def cmd_fit_stan(args: argparse.Namespace, init) -> int:
    """Run Stan's ``args.method`` (already validated paths and seed), save it and print it."""
    from stanvi.output.summary import summary_text  # noqa: PLC0415
    from stanvi.output.writers import check_writable  # noqa: PLC0415
    from stanvi.reference.as_fit import run_stan_method  # noqa: PLC0415

    for flag, (attr, unset) in STANVI_ONLY_FLAGS.items():
        if getattr(args, attr, unset) not in (unset, [], ()):
            raise ValueError(f"{flag} is an option of stanvi's own methods; Stan's "
                             f"{args.method} does not take it")
    model = Path(args.model)
    stem = model.stem.removeprefix("lib") if model.suffix != ".stan" else model.stem
    family = f"-{args.family}" if args.method == "stan-advi" else ""
    base = args.name or f"{stem}-{args.method}{family}-seed{args.seed}"
    out_dir = Path(args.output)
    check_writable(out_dir, base, overwrite=args.overwrite)   # before the run
    fit = run_stan_method(args.method, str(model), args.data, family=args.family,
                          seed=args.seed, init=init, progress=not args.quiet,
                          given={"draws": args.draws, "profile": args.profile,
                                 "max_oracle_calls": args.max_oracle_calls,
                                 "family_options": args.family_options,
                                 "hvp_method": args.hvp_method},
                          **dict(args.option or []))
    paths = fit.save(out_dir, basename=base, overwrite=args.overwrite)
    evaluations = ("" if fit.gradient_evaluations is None
                   else f", {fit.gradient_evaluations} gradient evaluations")
    print(f"{fit.model_name}: Stan's {fit.algorithm} (stanvi.reference), seed {args.seed}, "
          f"{fit.num_draws} draws{evaluations}, {fit.wall_time:.2f} s")
    print(summary_text(fit, args.var_names, args.max_rows))
    print()
    print(fit.diagnostics_text())
    print()
    for kind, path in paths.items():
        print(f"wrote {kind + ':':<12} {path}")
    return 0


def add_build_services_parser(sub) -> None:
    """Register ``stanvi build-services`` on the ``stanvi`` command's subparsers."""
    p = sub.add_parser("build-services",
                       help="build Stan's services (NUTS, ADVI, Pathfinder) once, ahead of use")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=cmd_build_services)


def cmd_build_services(args: argparse.Namespace) -> int:
    """Build Stan's services object (what every model's first use of NUTS, ADVI or Pathfinder
    would otherwise build, a few minutes) for this installation, with progress."""
    from stanvi.stan.services_build import build_services_ahead  # noqa: PLC0415

    path, built = build_services_ahead(progress=not args.quiet)
    print(f"Stan's services {'built' if built else 'were already built'}: {path}")
    return 0
