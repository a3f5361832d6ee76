"""``stanvi bench protocol``: the paper's protocol seed by seed over a store where only some
models have every seed (docs/batch.md#protocol-by-seed), counted exactly."""

from __future__ import annotations

from stanvi.batch.store import RunStore
from stanvi.bench.protocol_seeds import check_stores, outcomes_by_seed, protocol_by_seed


def _rec(model, method, seed, final, iters, oracle, elbo, status="converged"):
    return {"kind": "fit", "model": model, "method": method, "profile": "paper",
            "family": "meanfield", "seed": seed, "status": status,
            "final_elbo": final, "iterations": iters[-1], "oracle": {"oracle_scaled": oracle[-1]},
            "trace_points": {"iteration": iters, "oracle": oracle, "draws": oracle,
                             "run_time": iters, "elbo": elbo}}


def _records():
    out = []
    for seed in (0, 1, 2):
        # m1, every seed: TrustVI reaches the threshold at 20 oracle calls, ADVI at 1200 (60×);
        # a tie on seeds 0-1, ADVI 5 nats better on seed 2 (its median run still ties)
        advi_final = -5.0 if seed == 2 else -10.8
        out.append(_rec("m1", "trustvi", seed, -10.0, [0, 5, 10, 20], [0, 10, 20, 40],
                        [-100, -20, -10.5, -10]))
        out.append(_rec("m1", "advi", seed, advi_final, [0, 50, 100, 300], [0, 100, 400, 1200],
                        [-100, -50, -12, advi_final]))
    # seed 0 only: m2's ADVI fails (not judged); m3 TrustVI 2 nats better in < 5 iterations
    out.append(_rec("m2", "trustvi", 0, -5.0, [0, 6, 12], [0, 5, 9], [-50, -6, -5]))
    out.append(_rec("m2", "advi", 0, None, [0, 50], [0, 100], [-50, -8], status="failed"))
    out.append(_rec("m3", "trustvi", 0, -1.0, [0, 2, 3], [0, 2, 3], [-30, -1.5, -1.0]))
    out.append(_rec("m3", "advi", 0, -3.0, [0, 1, 2], [0, 4, 8], [-30, -3.5, -3.0]))
    out.append({**_rec("m4", "advi", 0, None, [0], [0], [0]), "status": "skipped"})
    return out


def _counts(row):
    return (row["models"], row["tested_better"], row["tie"], row["baseline_better"],
            row["not_judged"], row["kept"], row["ge_36x"], row["median_ratio"])


def test_each_seed_alone_and_the_models_with_every_seed():
    rows = {r["view"]: r for r in protocol_by_seed(_records())}
    assert {r["tested"] for r in rows.values()} == {"trustvi:paper:meanfield"}
    assert _counts(rows["every model, median run over its seeds"]) == (3, 1, 1, 0, 1, 1, 1, 60.0)
    assert _counts(rows["every model with seed 0, seed 0"]) == (3, 1, 1, 0, 1, 1, 1, 60.0)
    assert _counts(rows["every model with seed 1, seed 1"]) == (1, 0, 1, 0, 0, 1, 1, 60.0)
    assert _counts(rows["every model with seed 2, seed 2"]) == (1, 0, 0, 1, 0, 1, 1, 60.0)
    assert _counts(rows["the 1 models with every seed, median run"]) == (1, 0, 1, 0, 0, 1, 1, 60.0)
    assert _counts(rows["the 1 models with every seed, seed 0"]) == (1, 0, 1, 0, 0, 1, 1, 60.0)
    # seeds 1 and 2 of the models with every seed are the rows above: not repeated
    assert len(rows) == 6


def test_outcomes_per_configuration_and_seed_leave_out_what_did_not_run():
    out = outcomes_by_seed(_records())
    assert out[("advi:paper:meanfield", 0)] == {"converged": 2, "failed": 1}
    assert out[("trustvi:paper:meanfield", 2)] == {"converged": 1}
    assert len(out) == 6


def test_the_command_reads_a_store(tmp_path):
    store = RunStore(tmp_path / "runs")
    for i, r in enumerate(_records()):
        store.put("fit", f"r{i}", r)
    text = check_stores([tmp_path / "runs"])
    assert "every model with seed 2, seed 2" in text and "0/0/1/0" in text
    assert "advi:paper:meanfield             seed 0:    3 runs  converged 2, failed 1" in text
