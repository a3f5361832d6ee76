"""BaM and GSM beside TrustVI, all full rank, on posteriordb posteriors with reference draws
(issue T3-7; docs/benchmarks.md#bam-and-gsm).

    python -m stanvi.bench.score_peers --posteriordb PATH --posteriors A,B,... [--seeds 3]

For each posterior and method (``trustvi``, ``bam``, ``gsm``; each its ``default`` profile,
family ``fullrank``) and seeds 0..S−1, the medians over the seeds of: the model evaluations the
fit made (``fit.info["model_evaluations"]``: log densities, gradients and HVPs, warm start
included; output draws not), the method's wall time, and the accuracy against posteriordb's
reference draws (medians over the marginals of |mean − mean_ref|/sd_ref and of the
1-Wasserstein distance / sd_ref, :func:`stanvi.evaluation.accuracy.marginal_accuracy`), with the
statuses seen.  One Markdown table is printed.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np

METHODS = ("trustvi", "bam", "gsm")
OUTPUT_DRAWS = 2000


def run_case(case, seeds: int, methods=METHODS) -> list[dict]:
    """Every method × seed on one posterior (a :class:`stanvi.bench.peers.PeerCase`): one row
    of medians per method."""
    from stanvi.errors import NotConvergedWarning  # noqa: PLC0415
    from stanvi.evaluation.accuracy import labelled_draws, marginal_accuracy  # noqa: PLC0415
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    compiled = compile_model(case.stan, progress=False)
    target = StanTarget(compiled, case.data, progress=False)
    rows = []
    for method in methods:
        runs = []
        for seed in range(seeds):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", NotConvergedWarning)
                try:
                    f = fit(target, method=method, family="fullrank", seed=seed, progress=False,
                            draws=OUTPUT_DRAWS)
                except Exception as exc:  # noqa: BLE001 — a failing fit is a result
                    runs.append({"status": f"error: {type(exc).__name__}"})
                    continue
            acc = marginal_accuracy(labelled_draws(f.stan_variables()), case.reference)
            runs.append({"status": f.status, "wall": f.wall_time,
                         "evaluations": sum((f.info.get("model_evaluations") or {}).values()),
                         "mean_error_sd": acc["mean_error_sd_median"],
                         "w1_sd": acc["w1_sd_median"]})
        ok = [r for r in runs if "wall" in r]
        row = {"model": case.name, "dim": int(target.dim), "method": method,
               "statuses": ",".join(sorted({r["status"] for r in runs}))}
        for key in ("evaluations", "wall", "mean_error_sd", "w1_sd"):
            row[key] = float(np.median([r[key] for r in ok])) if ok else float("nan")
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| posterior | D | method | evaluations | wall s | mean err/sd | W1/sd | statuses |",
             "|---|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['dim']} | {r['method']} | {r['evaluations']:,.0f} | "
                     f"{r['wall']:.2f} | {r['mean_error_sd']:.3f} | {r['w1_sd']:.3f} | "
                     f"{r['statuses']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from stanvi.bench.peers import posteriordb_cases  # noqa: PLC0415

    p = argparse.ArgumentParser(prog="python -m stanvi.bench.score_peers",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--posteriordb", type=Path, required=True, help="a posteriordb checkout")
    p.add_argument("--posteriors", required=True, help="comma-separated posterior names")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--methods", default=",".join(METHODS))
    args = p.parse_args(argv)
    names = [n.strip() for n in args.posteriors.split(",") if n.strip()]
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    rows = []
    for case in posteriordb_cases(args.posteriordb, names):
        rows += run_case(case, args.seeds, methods)
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
