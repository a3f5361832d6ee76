"""``stanvi compare``: several methods on one model, the table and the recommendation
(:mod:`stanvi.evaluation.compare`; docs/cli.md#compare)."""

from __future__ import annotations

import argparse
import warnings


def add_compare_parser(sub) -> None:
    """Register ``stanvi compare`` on the ``stanvi`` command's subparsers."""
    from stanvi.evaluation.compare import DEFAULT_METHODS  # noqa: PLC0415

    p = sub.add_parser("compare", help="fit several methods on one model; a table and a "
                                       "recommendation with its reason")
    p.add_argument("model", help="path of the .stan file")
    p.add_argument("--data", default=None, help="data as a JSON or R dump (.R) file")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma-separated METHOD or METHOD/FAMILY (default: "
                        f"{','.join(DEFAULT_METHODS)}); Stan's nuts, pathfinder, stan-advi too")
    p.add_argument("--reference", choices=["nuts"], default=None,
                   help="run NUTS and score every approximation against it")
    p.add_argument("--seed", type=int, default=0, help="seed of every fit (default: 0)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_cmd_compare)


def _cmd_compare(args: argparse.Namespace) -> int:
    from stanvi.evaluation.compare import compare  # noqa: PLC0415

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    with warnings.catch_warnings():
        # a fit that did not converge shows it in the table (its status, its verdict)
        warnings.simplefilter("ignore")
        result = compare(args.model, args.data, methods=methods, reference=args.reference,
                         seed=args.seed, progress=not args.quiet)
    print(result)
    return 0
