"""The ``stanvi`` command.

    stanvi compile MODEL.stan            compile (cached) and print the library path
    stanvi info MODEL.stan [--data D]    parameters, shapes, unconstrained dimension
    stanvi bench target                  cost of the Stan target layer (see stanvi.bench.target_bench)
    stanvi bench methods                 TrustVI vs ADVI vs HFSGVI on stan_models (methods_bench)

Errors print one readable line (plus stanc's or Stan's own message) and exit with status 1.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stanvi.errors import StanviError

DEFAULT_MODELS_DIR = Path(__file__).resolve().parent.parent / "stan_models"


def _cmd_compile(args: argparse.Namespace) -> int:
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    compiled = compile_model(args.model, progress=not args.quiet, force=args.force)
    print(compiled.library)
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    import stanvi  # noqa: PLC0415

    target = stanvi.load(args.model, args.data, progress=not args.quiet)
    kinds = target.variable_kinds()
    print(f"model: {target.name}")
    print(f"library: {target.library_path}")
    print(f"unconstrained dimension: {target.dim}")
    print(f"Hessian-vector products: {'exact (nested autodiff)' if target.hvp_exact else 'finite differences'}")
    print(f"{'variable':<24} {'block':<22} shape")
    for v in target.variables():
        print(f"{v.name:<24} {kinds[v.name]:<22} {v.shape if v.shape else '()'}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    if args.what == "target":
        from stanvi.bench import target_bench  # noqa: PLC0415

        target_bench.run(Path(args.models_dir), cold=not args.no_cold, batch=args.batch)
        return 0
    if args.what == "methods":
        from stanvi.bench import methods_bench  # noqa: PLC0415

        configs = methods_bench.DEFAULT_CONFIGS
        if args.configs:
            configs = tuple(tuple(c.split(":", 1)) for c in args.configs.split(","))
        methods_bench.run(Path(args.models_dir), models=args.models.split(",") if args.models else None,
                          seeds=args.seeds, configs=configs,
                          output=Path(args.output) if args.output else None)
        return 0
    raise SystemExit(f"unknown benchmark {args.what}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="stanvi", description="Fast variational inference for Stan models.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", help="compile a .stan file (cached) and print the library path")
    p.add_argument("model", help="path of the .stan file")
    p.add_argument("--force", action="store_true", help="rebuild even if a cached library exists")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("info", help="show a model's parameters, shapes and unconstrained dimension")
    p.add_argument("model", help="path of the .stan file or compiled library")
    p.add_argument("--data", default=None, help="data as a JSON file (needed when the model has data)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_info)

    p = sub.add_parser("bench", help="run a benchmark and print its figures")
    p.add_argument("what", choices=["target", "methods"],
                   help="target: cost of gradients/HVPs, batching, JAX bridge, compiles; "
                        "methods: TrustVI vs ADVI vs HFSGVI on stan_models (paper protocol)")
    p.add_argument("--models-dir", default=str(DEFAULT_MODELS_DIR), help="directory of the stan_models set")
    p.add_argument("--no-cold", action="store_true", help="skip the cold compile (fresh cache, ~1 min)")
    p.add_argument("--batch", type=int, default=256, help="draws per batched call (default 256)")
    p.add_argument("--models", default=None, help="methods: comma-separated model names (default: all)")
    p.add_argument("--seeds", type=int, default=5, help="methods: runs per method and model (default 5)")
    p.add_argument("--configs", default=None,
                   help="methods: comma-separated method:profile list (default: trustvi:default,"
                        "trustvi:paper,advi:paper,advi:stan,hfsgvi:paper)")
    p.add_argument("--output", default=None, help="methods: write the figures as JSON here")
    p.set_defaults(func=_cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except StanviError as exc:
        print(f"stanvi: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"stanvi: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
