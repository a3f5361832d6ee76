"""``stanvi bench methods``: TrustVI vs ADVI vs HFSGVI on the stan_models set, following the TrustVI
paper's protocol (Regier, Jordan & McAuliffe 2017, §5; docs/algorithms.md#benchmark-protocol)
plus laptop-cost figures (issue P1-2).

For every model and method configuration it runs ``seeds`` fits and keeps the median run by final
ELBO (a failed run ranks as −inf).  ELBOs are evaluated with fixed draws shared by all runs and
methods (common random numbers): ``final_draws`` for the final objective, ``eval_draws`` for
trace points (draws where the model throws are dropped, as in Stan's ADVI); trace points are
a log-spaced subset of iterations (at most ``trace_points``, always including the first and
last), which is how "consistently above the threshold" is evaluated.

Printed per model:

* each configuration's median final ELBO, failed and budget-capped runs, iterations, oracle
  calls (scaled), draw-level evaluations, run time (wall time less JAX compilation of new batch
  shapes) and the wall time of a 20-oracle-unit warm-up fit (compilation included);
* pairwise (paper protocol): threshold = worse median final ELBO − 1 nat; oracle calls until the
  trace is consistently above it; the ratio; pairs where either method needs < 5 iterations are
  excluded;
* "to 1 nat": per configuration, the draw-level evaluations and wall time until the trace is
  consistently within 1 nat of the best final ELBO any configuration found;
* engine overhead of TrustVI: run time / (its draw-level evaluations × the batched C++ cost per
  draw of each kind, timed on 256-draw batches), and run time / the time actually measured
  inside the model's C++ calls during the run (smaller batches parallelize less, so the second
  is the fairer figure).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import numpy as np

from stanvi.evaluation.models import discover_models
from stanvi.evaluation.protocol import (RunSummary, first_consistent,  # noqa: F401
                                        median_run, protocol_pair, summarize_run)

DEFAULT_CONFIGS = (("trustvi", "default"), ("trustvi", "paper"), ("advi", "paper"),
                   ("advi", "stan"), ("hfsgvi", "paper"))


def run_model(name: str, stan: Path, data: Path | None, *, configs=DEFAULT_CONFIGS, seeds: int = 5,
              eval_draws: int = 2000, final_draws: int = 10_000, trace_points: int = 60,
              budget: float | None = None, out=print) -> dict:
    """Benchmark one model (see the module docstring); ``budget``: oracle budget per run
    (scaled units, ``max_oracle_calls``), None for none."""
    from stanvi.bench.target_bench import best_time  # noqa: PLC0415
    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415
    from stanvi.fit import fit as stanvi_fit  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    target = StanTarget(stan, data, progress=False)
    d = target.dim
    eps_eval = standard_normal(jax.random.PRNGKey(20171), eval_draws, d)
    eps_final = standard_normal(jax.random.PRNGKey(20172), final_draws, d)
    results: dict[str, list[RunSummary]] = {}
    first_wall: dict[str, float] = {}
    for method, profile in configs:
        cfg = f"{method}:{profile}"
        # warm-up fit (20 oracle units): JAX compilation of the main batch shapes; its wall
        # time is reported, compilation included
        t0 = time.perf_counter()
        stanvi_fit(target, method=method, profile=profile, seed=10_000, progress=False, draws=10,
                   max_oracle_calls=20.0)
        first_wall[cfg] = time.perf_counter() - t0
        runs = []
        for seed in range(seeds):
            try:
                fit = stanvi_fit(target, method=method, profile=profile, seed=seed,
                                 progress=False, draws=10, max_oracle_calls=budget)
            except Exception as exc:  # a run that cannot even start counts as failed
                out(f"  {cfg} seed {seed}: error {type(exc).__name__}: {exc}")
                continue
            runs.append(summarize_run(fit, cfg, eps_final, eps_eval, trace_points))
        results[cfg] = runs
    medians = {cfg: median_run(runs) for cfg, runs in results.items() if runs}

    z = np.random.default_rng(0).normal(scale=0.5, size=(256, d))
    v = np.random.default_rng(1).normal(size=(256, d))
    cost = {"gradient": best_time(lambda: target.log_density_gradient(z), 5) / 256,
            "hvp": best_time(lambda: target.log_density_hvp(z, v), 5) / 256,
            "log_density": best_time(lambda: target.log_density(z), 5) / 256}

    out(f"\n== {name} (D = {d})")
    out(f"  {'config':<16}{'final ELBO':>12}{'fails':>6}{'budget':>7}{'iters':>7}{'oracle':>10}"
        f"{'draw evals':>12}{'run s':>8}{'warm-up':>8}")
    for cfg, m in medians.items():
        fails = sum(r.status == "failed" for r in results[cfg])
        capped = sum(r.status == "budget" for r in results[cfg])
        out(f"  {cfg:<16}{m.final_elbo:>12.3f}{fails:>6}{capped:>7}{m.iterations:>7}{m.oracle:>10.1f}"
            f"{m.draw_evals:>12}{m.wall:>8.2f}{first_wall[cfg]:>8.2f}")

    pairs = {}
    for ref in ("trustvi:default", "trustvi:paper"):
        for other in medians:
            if other.startswith("trustvi") or ref not in medians:
                continue
            p = protocol_pair(medians[ref], medians[other])
            if p["quality"] is None:
                pairs[(ref, other)] = {"excluded": p["excluded"]}
                continue
            pairs[(ref, other)] = {"threshold": p["threshold"], "oracle_ref": p["oracle_a"],
                                   "oracle_other": p["oracle_b"], "ratio": p["ratio"],
                                   "excluded": p["excluded"]}
            out(f"  {other} vs {ref}: threshold {p['threshold']:.2f}; oracle calls "
                f"{p['oracle_b']:.1f} vs {p['oracle_a']:.1f}; ratio {p['ratio']:.1f}x"
                + (f"  [excluded: {p['excluded']}]" if p["excluded"] else ""))

    best = max(m.final_elbo for m in medians.values())
    to_one_nat = {}
    for cfg, m in medians.items():
        t = first_consistent(m, best - 1.0) if np.isfinite(m.final_elbo) else None
        if t is None:
            to_one_nat[cfg] = None
            out(f"  to 1 nat of best ({best:.2f}): {cfg:<16} never")
        else:
            to_one_nat[cfg] = {"draw_evals": float(m.trace_draws[t]), "wall": float(m.trace_wall[t]),
                               "oracle": float(m.trace_oracle[t])}
            out(f"  to 1 nat of best ({best:.2f}): {cfg:<16} {m.trace_draws[t]:>10.0f} draw evals, "
                f"{m.trace_wall[t]:6.2f} s, {m.trace_oracle[t]:8.1f} oracle")
    overhead = {}
    for cfg in ("trustvi:default", "trustvi:paper"):
        if cfg in medians:
            m = medians[cfg]
            cpp = m.grad_draws * cost["gradient"] + m.hvp_draws * cost["hvp"] + m.ld_draws * cost["log_density"]
            overhead[cfg] = {"estimated": m.wall / cpp if cpp > 0 else math.inf,
                             "measured": m.wall / m.model_seconds if m.model_seconds > 0 else math.inf}
            out(f"  engine overhead {cfg}: run {m.wall:.2f} s / C++ {cpp:.2f} s (draws x 256-batch "
                f"cost) = {overhead[cfg]['estimated']:.2f}; / {m.model_seconds:.2f} s measured in "
                f"C++ calls = {overhead[cfg]['measured']:.2f}")
    return {"dim": d, "medians": {c: {"final_elbo": m.final_elbo, "iterations": m.iterations,
                                      "oracle": m.oracle, "draw_evals": m.draw_evals,
                                      "wall": m.wall, "status": m.status}
                                  for c, m in medians.items()},
            "runs": {c: [{"seed": r.seed, "status": r.status, "final_elbo": r.final_elbo,
                          "iterations": r.iterations, "oracle": r.oracle,
                          "draw_evals": r.draw_evals, "wall": r.wall} for r in rs]
                     for c, rs in results.items()},
            "budget": budget,
            "first_wall": first_wall, "to_one_nat": to_one_nat, "overhead": overhead,
            "pairs": {f"{a}|{b}": p for (a, b), p in pairs.items()}, "cpp_cost_per_draw": cost}


def run(models_dir: Path, *, models: list[str] | None = None, seeds: int = 5,
        configs=DEFAULT_CONFIGS, output: Path | None = None, budget: float | None = None,
        resume: bool = False) -> dict:
    """Run the benchmark over the stan_models set (or the named models) and print it.

    ``output``: the JSON report, rewritten after every model (a killed run keeps the models
    it finished); with ``resume``, models already in it are not rerun (their figures are
    reused for the overall summary)."""
    found = discover_models(models_dir)
    if models:
        unknown = set(models) - {m[0] for m in found}
        if unknown:
            raise ValueError(f"unknown model(s) {sorted(unknown)}; the set has "
                             f"{sorted(m[0] for m in found)}")
        found = [m for m in found if m[0] in models]
    report: dict = {}
    if resume and output is not None and output.exists():
        report = json.loads(output.read_text())
        print(f"resuming: {len(report)} model(s) already in {output}", flush=True)
    for name, stan, data in found:
        if name in report:
            continue
        report[name] = run_model(name, stan, data, configs=configs, seeds=seeds, budget=budget,
                                 out=lambda s: print(s, flush=True))
        if output is not None:
            tmp = output.with_suffix(output.suffix + ".tmp")
            tmp.write_text(json.dumps(report, indent=1, default=float))
            tmp.replace(output)
    _print_overall(report)
    if output is not None:
        output.with_suffix(".md").write_text(markdown_summary(report))
    return report


def _fmt(x, spec: str = ".2f") -> str:
    return "–" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)


def _config_table(report: dict, cfgs: list[str], cell, *, with_dim: bool) -> list[str]:
    """A markdown table with a row per model and a column per configuration."""
    head = "| model | D | " if with_dim else "| model | "
    rows = [head + " | ".join(cfgs) + " |", "|---|" + ("---|" if with_dim else "") + "---|" * len(cfgs)]
    for name, r in report.items():
        lead = f"| {name} | {r['dim']} | " if with_dim else f"| {name} | "
        rows.append(lead + " | ".join(cell(r, c) for c in cfgs) + " |")
    return rows


def markdown_summary(report: dict) -> str:
    """Markdown tables of a report (written next to the JSON as ``.md``): final ELBOs, the paper
    protocol's oracle-call ratios, and the default profile's figures to 1 nat."""
    order = [f"{m}:{p}" for m, p in DEFAULT_CONFIGS]
    cfgs = sorted({c for r in report.values() for c in r["medians"]},
                  key=lambda c: (order.index(c) if c in order else len(order), c))
    def final_cell(r: dict, c: str) -> str:
        m = r["medians"].get(c)
        fails = sum(x["status"] == "failed" for x in r.get("runs", {}).get(c, []))
        return "" if m is None else _fmt(m["final_elbo"]) + (f" ({fails})" if fails else "")

    def to_one_nat_cell(r: dict, c: str) -> str:
        t = r["to_one_nat"].get(c, "absent")
        return ("" if t == "absent" else "never" if t is None
                else f"{t['draw_evals']:.0f} / {t['wall']:.2f} s")

    lines = ["### Median final ELBO (failed runs of 5 in brackets)", "",
             *_config_table(report, cfgs, final_cell, with_dim=True)]
    lines += ["", "### Oracle calls to the threshold (paper protocol, TrustVI §5)", "",
              "| model | pair | threshold | ADVI/HFSGVI calls | TrustVI calls | ratio |",
              "|---|---|---|---|---|---|"]
    for name, r in report.items():
        for key, p in r["pairs"].items():
            ref, other = key.split("|")
            if "threshold" not in p:
                lines.append(f"| {name} | {other} / {ref} | – | – | – | excluded: {p['excluded']} |")
                continue
            ratio = _fmt(p["ratio"], ".1f") + "×" + (" (excluded: < 5 iterations)" if p["excluded"] else "")
            lines.append(f"| {name} | {other} / {ref} | {_fmt(p['threshold'])} | "
                         f"{_fmt(p['oracle_other'], '.1f')} | {_fmt(p['oracle_ref'], '.1f')} | {ratio} |")
    lines += ["", "### To within 1 nat of the best final ELBO: draw-level evaluations / run time", "",
              *_config_table(report, cfgs, to_one_nat_cell, with_dim=False)]
    lines += ["", "### TrustVI engine overhead (run time / C++ time)", "",
              "| model | config | estimated (draws × 256-batch cost) | measured in C++ calls |",
              "|---|---|---|---|"]
    for name, r in report.items():
        for c, o in r["overhead"].items():
            if isinstance(o, dict):
                lines.append(f"| {name} | {c} | {_fmt(o['estimated'])} | {_fmt(o['measured'])} |")
    return "\n".join(lines) + "\n"


def _print_overall(report: dict) -> None:
    """The issue's targets over all models: the paper-protocol oracle-call ratio, TrustVI's
    shortfall, and the default profile's 1-nat figures against ADVI(stan)."""
    print("\n== overall")
    for ref in ("trustvi:paper", "trustvi:default"):
        pairs = [p for r in report.values() for k, p in r["pairs"].items()
                 if k == f"{ref}|advi:paper" and not p.get("excluded") and "ratio" in p]
        if pairs:
            ratios = np.array([p["ratio"] for p in pairs], dtype=float)
            never = int(np.sum(~np.isfinite(ratios)))
            print(f"  median oracle-call ratio ADVI(paper)/{ref}: {np.median(ratios):.1f}x over "
                  f"{len(ratios)} models ({never} where ADVI(paper) never reached the threshold, "
                  f"counted as infinite; target >= 10x)")
    gaps = []
    for name, r in report.items():
        meds = r["medians"]
        best = max(m["final_elbo"] for m in meds.values())
        for cfg in ("trustvi:default", "trustvi:paper"):
            if cfg in meds and np.isfinite(best):
                gaps.append((name, cfg, best - meds[cfg]["final_elbo"]))
    worst = max(gaps, key=lambda g: g[2]) if gaps else None
    if worst:
        print(f"  largest TrustVI shortfall vs the best method: {worst[2]:.2f} nat ({worst[1]} on "
              f"{worst[0]}; target <= 0.5)")
    within, fast, fewer, compared = [], [], [], []
    for name, r in report.items():
        t = r["to_one_nat"].get("trustvi:default", "absent")
        if t == "absent":
            continue
        if t is not None:
            within.append(name)
            if t["wall"] <= 1.0:
                fast.append(name)
        a = r["to_one_nat"].get("advi:stan")
        if a is not None and t is not None:
            compared.append(name)
            if t["draw_evals"] < a["draw_evals"]:
                fewer.append(name)
    if within or compared:
        n = sum("trustvi:default" in r["to_one_nat"] for r in report.values())
        print(f"  trustvi:default within 1 nat of the best: {len(within)}/{n} models; in <= 1 s "
              f"run time: {len(fast)}/{n}")
        print(f"  fewer draw-level evaluations to 1 nat than advi:stan: {len(fewer)} of the "
              f"{len(compared)} models where advi:stan gets there "
              f"(slower on: {', '.join(sorted(set(compared) - set(fewer))) or 'none'})")
