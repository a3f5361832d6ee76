"""``stanvi bench local-optima``: does TrustVI certify a local optimum without saying so?
(issue T3-1, target 5; docs/benchmarks.md#second-start-bench).

The models are the five on which TrustVI once certified convergence far below another
run's ELBO: posteriordb's ``bball_drive_event_0-hmm_drive_0`` (an HMM with two modes, 60
nats apart full-rank), example-models' ``bugs_examples/vol2/mvn_orange`` (51 nats below
ADVI) and ``bugs_examples/vol2/stagnant`` (a change-point model, 12 nats below), and, found by
issue T3-4's batch, ``ARM/Ch.23/electric`` (full rank 439 nats below mean-field) and
``ARM/Ch.23/electric_1b`` (mean-field seed 0, 303 nats below seeds 1 and 2).  Each runs
through :func:`stanvi.bench.peers.run_case` (same compiled model, same common draws, NUTS as the
reference posterior where posteriordb has none): TrustVI ``default`` mean-field and full-rank,
Stan's C++ ADVI (mean-field) and single-path Pathfinder, ``seeds`` seeds each.

A TrustVI run is then

* ``ok``: not ``converged``-and-beaten: its ELBO is within 1 nat of the best peer's;
* ``flagged``: a peer's ELBO is ≥ 1 nat higher and the run does not claim ``converged`` (its
  status message says why);
* ``unflagged``: ``converged`` while a peer's ELBO is ≥ 1 nat higher — the miss the target
  forbids.

The peers compared are those of the same family (``PEERS``): Stan's mean-field ADVI and every
seed of mean-field TrustVI for mean-field TrustVI; ADVI, Pathfinder (a dense Gaussian) and
every TrustVI run, mean-field included, for full-rank TrustVI.  Their ELBOs are on the same common
base draws as TrustVI's (Pathfinder's: the mean of lp − lp_approx over its own draws).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from stanvi.bench.peers import PeerCase, posteriordb_cases, run_case
from stanvi.bench.peers_report import print_model

POSTERIORDB = ("bball_drive_event_0-hmm_drive_0",)
EXAMPLE_MODELS = ("bugs_examples/vol2/mvn_orange", "bugs_examples/vol2/stagnant",
                  "ARM/Ch.23/electric", "ARM/Ch.23/electric_1b")
METHODS = ("trustvi", "trustvi-fullrank", "stan-advi", "pathfinder")
#: A run's peers: the other methods of its family, and its own family's TrustVI runs of every
#: seed (electric_1b's mean-field seed 0 was certified 303 nats below seeds 1 and 2); full rank
#: also mean-field TrustVI, whose every q it contains (electric: 439 nats below)
PEERS = {"trustvi": ("stan-advi", "trustvi"),
         "trustvi-fullrank": ("stan-advi", "pathfinder", "trustvi", "trustvi-fullrank")}
NAT = 1.0


def example_models_case(root: Path, relative: str) -> PeerCase:
    """The example-models model named ``relative`` as the batch names it
    (:func:`stanvi.batch.discover.discover_example_models`: ``ARM/Ch.23/electric``), or the
    folder of one whose program has the folder's name (``bugs_examples/vol2/stagnant``), its
    data read as the batch reads them (JSON or R dump); NUTS is the reference."""
    from stanvi.batch.discover import discover_example_models, load_data  # noqa: PLC0415

    found = (discover_example_models(Path(root), names=[relative])
             or discover_example_models(Path(root), names=[f"{relative}/{Path(relative).name}"]))
    if not found:
        raise FileNotFoundError(f"{relative} not found under {root}: pass the root of a "
                                f"stan-dev/example-models checkout (--example-models)")
    return PeerCase(relative, found[0].stan, load_data(found[0]))


def classify(elbo: float, status: str, best_peer: float | None) -> str:
    """``ok``, ``flagged`` or ``unflagged`` (module docstring) for one TrustVI run."""
    beaten = (best_peer is not None and math.isfinite(best_peer)
              and not (math.isfinite(elbo) and elbo > best_peer - NAT))
    if not beaten:
        return "ok"
    return "unflagged" if status == "converged" else "flagged"


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per TrustVI run of ``result`` (a :func:`run_case` output): family, seed, status,
    ELBO, the best peer ELBO of its family (any seed), the verdict and the status message."""
    rows = []
    for method, peers in PEERS.items():
        peer_elbos = [r.get("elbo") for p in peers for r in result["runs"].get(p, [])]
        peer_elbos = [e for e in peer_elbos if e is not None and math.isfinite(e)]
        best = max(peer_elbos) if peer_elbos else None
        for seed, run in enumerate(result["runs"].get(method, [])):
            elbo = run.get("elbo", math.nan)
            elbo = math.nan if elbo is None else elbo
            status = run.get("status", "failed")
            rows.append({"model": result["model"], "method": method, "seed": seed,
                         "status": status, "elbo": elbo, "best_peer": best,
                         "evaluations": run.get("evaluations"),
                         "mean_error_sd": run.get("mean_error_sd"),
                         "verdict": classify(elbo, status, best),
                         "message": run.get("message", "")})
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The per-run table and the counts the target is read from."""
    print(f"{'model':34s} {'method':17s} seed {'status':10s} {'ELBO':>10s} {'best peer':>10s} "
          f"{'evals':>7s} {'mean err':>8s} verdict")
    for r in rows:
        peer = f"{r['best_peer']:10.2f}" if r["best_peer"] is not None else f"{'-':>10s}"
        err = f"{r['mean_error_sd']:8.3f}" if r["mean_error_sd"] is not None else f"{'-':>8s}"
        print(f"{r['model'][:34]:34s} {r['method']:17s} {r['seed']:4d} {r['status']:10s} "
              f"{r['elbo']:10.2f} {peer} {r['evaluations'] or 0:7d} {err} {r['verdict']}")
        if r["verdict"] != "ok" and r["message"]:
            print(f"    {r['message'][:300]}")
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "flagged", "unflagged")}
    print(f"\nTrustVI runs: {len(rows)}; ok {counts['ok']}, flagged {counts['flagged']}, "
          f"unflagged (converged ≥ {NAT:g} nat below a peer) {counts['unflagged']} "
          f"(target: 0)")


def run(posteriordb: Path | None, example_models: Path | None, *, seeds: int = 5,
        output: Path | None = None) -> list[dict[str, Any]]:
    """Run the cases found under the given checkouts; print and (``output``) write the rows."""
    if posteriordb is None and example_models is None:
        raise SystemExit("stanvi bench local-optima: give --posteriordb and/or --example-models "
                         "(checkouts of stan-dev/posteriordb and stan-dev/example-models)")
    cases: list[PeerCase] = []
    if posteriordb is not None:
        cases += posteriordb_cases(Path(posteriordb), list(POSTERIORDB))
    if example_models is not None:
        cases += [example_models_case(Path(example_models), rel) for rel in EXAMPLE_MODELS]
    rows: list[dict[str, Any]] = []
    for case in cases:
        print(f"{case.name}: {seeds} seeds of {', '.join(METHODS)}", flush=True)
        result = run_case(case, seeds, METHODS)
        print_model(result)
        rows += verdicts(result)
        if output is not None:
            Path(output).write_text(json.dumps(rows, indent=1, default=float))
    print()
    print_rows(rows)
    return rows
