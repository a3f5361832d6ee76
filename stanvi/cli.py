"""The ``stanvi`` command.

    stanvi compile MODEL.stan            compile (cached) and print the library path
    stanvi info MODEL.stan [--data D]    parameters, shapes, dims, unconstrained dimension
    stanvi fit MODEL.stan --data D --method M [--family F] [--seed S] [--output DIR]
                                         fit, print the summary and diagnostics, write the Stan
                                         CSV and the ArviZ DataTree (NetCDF); --family mixture
                                         --family-options '{"n_components": 3}' for a mixture
    stanvi bench target                  cost of the Stan target layer (see stanvi.bench.target_bench)
    stanvi bench methods                 TrustVI vs ADVI vs HFSGVI on stan_models (methods_bench)
    stanvi bench public-stopping --posteriordb PATH
                                         does TrustVI's "converged" mean converged on
                                         posteriordb posteriors (stanvi.bench.public_stopping)
    stanvi bench coldstart               first fit in a new process: fresh processes per
                                         method x family (stanvi.bench.coldstart)
    stanvi bench fullrank                full-rank fits at D = 500, 1000, 2000: peak memory,
                                         time, accuracy (stanvi.bench.fullrank_bench)
    stanvi batch SOURCE --out RUNS       every model of an example-models or posteriordb
                                         checkout x methods x seeds, on Dask; resumable
    stanvi report RUNS                   HTML page, CSV tables and plots of a batch's records
                                         (docs/batch.md)

Errors print one readable line (plus stanc's or Stan's own message) and exit with status 1
(status 2 for a bad command line); ``--debug`` (or ``STANVI_DEBUG=1``) shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path

from stanvi.batch.cli import add_batch_parser, add_report_parser
from stanvi.bench.cli import add_bench_parser
from stanvi.evaluation.cli import add_compare_parser
from stanvi.reference.cli import add_build_services_parser
from stanvi.bench.cli import DEFAULT_MODELS_DIR  # noqa: F401  (re-exported: it was defined here)
from stanvi.errors import StanviError


def _cmd_compile(args: argparse.Namespace) -> int:
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    compiled = compile_model(args.model, progress=not args.quiet, force=args.force)
    print(compiled.library)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    target = StanTarget(args.model, args.data, progress=not args.quiet)
    kinds = target.variable_kinds()
    print(f"model: {target.name}")
    print(f"library: {target.library_path}")
    print(f"unconstrained dimension: {target.dim}")
    print(f"Hessian-vector products: {'exact (nested autodiff)' if target.hvp_exact else 'finite differences'}")
    dims = _declared_dims(target)
    print(f"{'variable':<24} {'block':<22} {'shape':<14} dims")
    for v in target.variables():
        names = dims.get(v.name)
        dim_text = ("(" + ", ".join(n or "?" for n in names) + ")"
                    if names is not None and len(names) == len(v.shape) and v.shape else "")
        print(f"{v.name:<24} {kinds[v.name]:<22} {str(v.shape if v.shape else '()'):<14} {dim_text}")
    return 0


def _declared_dims(target) -> dict:
    """Size names per variable from the Stan program (``vector[J] theta`` -> ('J',))."""
    from stanvi.stan.declarations import declarations  # noqa: PLC0415

    stan_file = getattr(getattr(target, "compiled", None), "stan_file", None)
    try:
        return {k: d.dims for k, d in declarations(Path(stan_file).read_text()).items()}
    except (OSError, TypeError):
        return {}


def _parse_option(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    name = name.strip().replace("-", "_")
    low = value.strip().lower()
    if low in ("true", "false"):
        return name, low == "true"
    try:
        return name, json.loads(value)
    except json.JSONDecodeError:
        return name, value


def _family_options(text: str | None, family: str) -> dict:
    """``--family-options``: a JSON object of the family's settings (e.g. the mixture's
    ``{"n_components": 3}``, docs/discrete.md), its keys checked against the family's
    parameters (``dim`` and ``name`` are set by the fit; the full-rank storage comes from the
    method option ``fullrank_diagonal``)."""
    if text is None:
        return {}
    try:
        values = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--family-options is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"--family-options must be a JSON object of settings by name, e.g. "
                         f"'{{\"n_components\": 3}}', got {text!r}")
    import dataclasses  # noqa: PLC0415

    from stanvi.families import FAMILIES  # noqa: PLC0415

    known = sorted(f.name for f in dataclasses.fields(FAMILIES[family])
                   if f.name not in ("dim", "name", "diagonal"))
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(f"--family-options: unknown setting(s) {unknown} for family "
                         f"{family!r}; " + (f"choose from {known}" if known else
                                            "it takes none"))
    return values


def _var_names(text: str) -> list[str]:
    """``--var-names mu,tau``: the variables to summarize, in order."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give at least one variable name")
    return names


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _group_spec(values: list[str] | None):
    """``["y=log_lik", "z"]`` -> ``{"y": "log_lik", "z": "z"}`` (None when empty)."""
    if not values:
        return None
    spec = {}
    for v in values:
        group_name, _, stan_name = v.partition("=")
        spec[group_name] = stan_name or group_name
    return spec


def _init_value(text: str | None):
    """``--init``: 'zero', 'random', or a JSON file of constrained parameter values (read here,
    before the fit, so a bad file is named at once)."""
    if text is None or text in ("zero", "random"):
        return text
    path = Path(text)
    if not path.is_file():
        raise FileNotFoundError(f"--init {text}: expected 'zero', 'random' or a JSON file of "
                                f"initial parameter values; no such file")
    try:
        values = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"--init {text} is not valid JSON: {exc}") from None
    if not isinstance(values, dict):
        raise ValueError(f"--init {text} must hold a JSON object of parameter values by name, "
                         f"as CmdStan's init file does")
    return values


def _default_name(model: Path, args: argparse.Namespace) -> str:
    """``MODEL-METHOD-FAMILY-seedSEED`` (as :func:`stanvi.output.writers.default_basename` names it),
    known before the fit so that the output can be checked first."""
    stem = model.stem.removeprefix("lib") if model.suffix != ".stan" else model.stem
    return f"{stem}-{args.method}-{args.family}-seed{args.seed}"


def _cmd_fit(args: argparse.Namespace) -> int:
    import logging  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    from stanvi.fit import check_seed  # noqa: PLC0415
    from stanvi.fit import fit as stanvi_fit  # noqa: PLC0415
    from stanvi.methods import STAN_METHODS  # noqa: PLC0415
    from stanvi.reference.cli import cmd_fit_stan  # noqa: PLC0415
    from stanvi.log import get_logger  # noqa: PLC0415
    from stanvi.output.writers import check_writable  # noqa: PLC0415

    model = Path(args.model)
    if not model.exists():
        raise FileNotFoundError(f"model file not found: {model}")
    if args.data is not None and not Path(args.data).is_file():
        raise FileNotFoundError(f"data file not found: {args.data}")
    check_seed(args.seed)
    init = _init_value(args.init)
    if args.method in STAN_METHODS:
        return cmd_fit_stan(args, init)
    out_dir = Path(args.output)
    base = args.name or _default_name(model, args)
    check_writable(out_dir, base, zarr=args.zarr, overwrite=args.overwrite)  # before the fit
    options = dict(args.option or [])
    family_options = _family_options(args.family_options, args.family)
    fit_logger = get_logger("fit")
    level = fit_logger.level
    fit_logger.setLevel(logging.WARNING)   # the verdict is printed once, with the diagnostics
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit = stanvi_fit(str(model), args.data, method=args.method, family=args.family,
                             seed=args.seed, profile=args.profile, draws=args.draws,
                             init=init, max_oracle_calls=args.max_oracle_calls,
                             hvp_method=args.hvp_method, progress=not args.quiet,
                             family_options=family_options, **options)
    finally:
        fit_logger.setLevel(level)
    from stanvi.errors import NotConvergedWarning  # noqa: PLC0415

    # a fit that did not converge says so once, in the diagnostics printed below (their
    # warnings and 'stopped:' line); the NotConvergedWarning repeating it is not printed again
    method_warnings = list(dict.fromkeys(str(w.message) for w in caught
                                         if not issubclass(w.category, NotConvergedWarning)))
    tree_kwargs = {"log_likelihood": _group_spec(args.log_likelihood),
                   "posterior_predictive": _group_spec(args.posterior_predictive)}
    paths = fit.save(out_dir, basename=base, zarr=args.zarr, data_file=args.data,
                     tree_kwargs=tree_kwargs, overwrite=args.overwrite,
                     cmdstan_compatible=args.cmdstan_compatible)

    from stanvi.output.summary import summary_text  # noqa: PLC0415

    print(f"{fit.target.name}: {fit.method} ({fit.family_name}, profile {fit.profile}), "
          f"seed {fit.seed}, {len(fit.trace) - 1} iterations, "
          f"{fit.oracle['oracle_scaled']:.1f} oracle calls, {fit.wall_time:.2f} s "
          f"(JAX compile {fit.compile_time:.2f} s)")
    print(summary_text(fit, args.var_names, args.max_rows))
    print()
    print(fit.diagnostics())
    for w in method_warnings[:5]:
        print(f"warning: {w}")
    print()
    for kind, path in paths.items():
        print(f"wrote {kind + ':':<12} {path}")
    return 0




class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``stanvi fit: error: ...`` (and a pointer to --help)."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    from stanvi.methods import STAN_METHODS, available  # noqa: PLC0415

    parser = _Parser(prog="stanvi", description="Fast variational inference for Stan models.")
    parser.add_argument("--debug", action="store_true",
                        help="show the full traceback on errors (also: STANVI_DEBUG=1)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("compile", help="compile a .stan file (cached) and print the library path")
    p.add_argument("model", help="path of the .stan file")
    p.add_argument("--force", action="store_true", help="rebuild even if a cached library exists")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("info", help="show a model's parameters, shapes, dims and unconstrained dimension")
    p.add_argument("model", help="path of the .stan file or compiled library")
    p.add_argument("--data", default=None,
                   help="data as a JSON or R dump (.R) file (needed when the model has data)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser(
        "fit", help="fit a model; print the summary and diagnostics; write CSV and NetCDF",
        description="Fit a variational approximation, print the summary table and the Pareto "
                    "k-hat diagnostics, and write <name>.csv (Stan CSV, CmdStan 'variational' "
                    "layout), <name>.nc (ArviZ DataTree), <name>_summary.csv and "
                    "<name>_diagnostics.txt to the output directory.")
    p.add_argument("model", help="path of the .stan file (compiled and cached on first use) or "
                                 "of a compiled model library")
    p.add_argument("--data", default=None,
                   help="data as a Stan JSON or R dump (.R) file (needed when the model has a "
                   "data block)")
    p.add_argument("--method", default="trustvi", choices=[*available(), *STAN_METHODS],
                   help="variational method (default: trustvi), or Stan's own nuts, pathfinder "
                        "or stan-advi (--option NAME=VALUE under Stan's names)")
    p.add_argument("--family", default="meanfield",
                   choices=["meanfield", "fullrank", "lowrank", "mixture"],
                   help="variational family (default: meanfield); 'lowrank' (diagonal plus rank "
                        "k, --family-options '{\"rank\": k}'; docs/algorithms.md#lowrank); "
                        "'mixture' (a Gaussian mixture, methods advi and mlmcvi; docs/discrete.md)")
    p.add_argument("--family-options", default=None, metavar="JSON",
                   help="the family's settings as a JSON object, e.g. --family-options "
                        "'{\"n_components\": 3}' for the mixture (docs/discrete.md), "
                        "'{\"rank\": 5}' for lowrank")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed, 0 to 4294967295 (default: 0)")
    p.add_argument("--hvp-method", choices=["auto", "exact", "finite_difference"], default=None,
                   help="Hessian-vector products of the Stan model: nested autodiff ('exact'), "
                        "central differences of gradients, or 'auto' (default: decided once per "
                        "compiled model and data, and stored with the library)")
    p.add_argument("--profile", default=None,
                   help="the method's named option set, e.g. 'paper' or 'stan' (default: the "
                        "method's default profile; see docs/methods.md)")
    p.add_argument("--draws", type=_positive_int, default=1000,
                   help="number of output draws from the approximation (default: 1000)")
    p.add_argument("--init", default=None, metavar="zero|random|FILE.json",
                   help="initial mean: 'zero', 'random' (Stan's uniform(-2, 2)), or a JSON file "
                        "of constrained parameter values by name, as CmdStan's init file; "
                        "default: the method's rule")
    p.add_argument("--max-oracle-calls", type=float, default=None,
                   help="budget in scaled oracle calls; the fit stops with status 'budget'")
    p.add_argument("--option", action="append", type=_parse_option, metavar="NAME=VALUE",
                   help="a method option, e.g. --option max_iters=200 (repeatable; values are "
                        "read as JSON, else as text)")
    p.add_argument("--output", default=".",
                   help="directory for the output files (default: the current directory)")
    p.add_argument("--name", default=None,
                   help="base name of the output files (default: MODEL-METHOD-FAMILY-seedSEED)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing output files (default: an existing file is an error, "
                        "reported before the fit starts)")
    p.add_argument("--zarr", action="store_true",
                   help="also write the DataTree as a Zarr store (needs the zarr package)")
    p.add_argument("--cmdstan-compatible", action="store_true",
                   help="write every CmdStan variational setting cmdstanpy.from_csv requires in "
                        "the CSV header, defaults for those the method has none of (default: "
                        "only the true ones; ADVI's are all true)")
    p.add_argument("--log-likelihood", action="append", metavar="[OBS=]GQ",
                   help="move generated quantity GQ to the log_likelihood group (named OBS), "
                        "e.g. --log-likelihood y=log_lik (repeatable)")
    p.add_argument("--posterior-predictive", action="append", metavar="[OBS=]GQ",
                   help="move generated quantity GQ to the posterior_predictive group, e.g. "
                        "--posterior-predictive y=y_rep (repeatable)")
    p.add_argument("--var-names", type=_var_names, default=None, metavar="NAME[,NAME...]",
                   help="summarize only these variables (default: all)")
    p.add_argument("--max-rows", type=int, default=40,
                   help="rows of the summary table to print (default: 40)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the full traceback on errors")
    p.set_defaults(func=_cmd_fit)

    add_build_services_parser(sub)
    add_compare_parser(sub)
    add_bench_parser(sub)
    add_batch_parser(sub)
    add_report_parser(sub)
    return parser


def _exit_on_interrupt(signum, frame) -> None:  # noqa: ARG001
    """Ctrl-C: one line and exit status 130 wherever the signal lands (a KeyboardInterrupt
    raised inside a JAX host callback used to surface as a 95-line XLA traceback).  Nothing is
    lost: a fit writes its outputs only at the end, atomically."""
    sys.stderr.write("stanvi: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get("STANVI_DEBUG", "") not in ("", "0")
    if not debug and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _exit_on_interrupt)
    try:
        return args.func(args)
    except StanviError as exc:
        if debug:
            raise
        print(f"stanvi: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError,
            PermissionError, ConnectionError) as exc:
        if debug:
            raise
        print(f"stanvi: error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, TypeError, KeyError, ImportError) as exc:
        # Bad options (unknown profile or option name, wrong value type), bad group names.
        if debug:
            raise
        text = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"stanvi: error: {text} (run with --debug for the traceback)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stanvi: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
