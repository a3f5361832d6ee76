"""The equal-wall-time crossover bench (stanvi/bench/qsgp_crossover.py; docs/gp.md#crossover):
its timed run on a tiny problem, and its resumability (a finished run is not run again)."""

from __future__ import annotations

import json

import numpy as np

from stanvi.bench import qsgp_crossover as X
from stanvi.bench.qsgp_bench import simulate
from stanvi.gp.model import rff_regression


def test_timed_run_plans_its_schedule_and_scores_every_checkpoint():
    Xa, y, f = simulate(1200, "gaussian", seed=0, truth_m=200, d=4)
    model = rff_regression(Xa[:1000], y[:1000], m=300, lengthscale=0.5, noise=0.01)
    run = X.timed_run("qsgp", model, 1.0, Xa[1000:], f[1000:])
    rows = run["checkpoints"]
    assert [r["seconds"] >= frac * 1.0 for r, frac in zip(rows, X.CHECKPOINTS)] == [True] * 5
    steps = [r["steps"] for r in rows]
    assert steps == sorted(steps) and steps[0] >= 1
    # the schedule is planned for the budget at the step time measured before the run (how many
    # steps the clock then allows depends on the machine's load: not checked)
    assert abs(run["planned_steps"] - max(1, int(1e3 / run["plan_step_ms"]))) <= 1
    assert 0 < run["plan_step_ms"] < 1e3 and run["step_ms"] > 0
    # training improves on q's start (μ = 0: RMSE = the rms of f)
    assert rows[-1]["rmse_f"] < 0.9 * float(np.sqrt(np.mean(f[1000:] ** 2)))


def test_finished_runs_are_kept_and_not_run_again(tmp_path, monkeypatch):
    calls = []

    def fake_run(method, model, budget, Xte, fte, schedule="planned"):
        calls.append((model.m, method))
        return {"method": method, "budget_s": budget, "schedule": schedule, "planned_steps": 5,
                "compile_s": 0.0, "step_ms": 2.0,
                "checkpoints": [{"seconds": budget, "steps": 5, "rmse_f": 0.25}]}

    monkeypatch.setattr(X, "timed_run", fake_run)
    monkeypatch.setattr(X, "simulate", lambda n, kind, seed: simulate(n, kind, seed, truth_m=50))
    out = tmp_path / "crossover.json"
    X.bench_crossover(sizes=(40, 60), budget=3.0, n_train=200, n_test=20, output=out)
    assert calls == [(40, "svi"), (40, "qsgp"), (60, "svi"), (60, "qsgp")]
    X.bench_crossover(sizes=(40, 60, 80), budget=3.0, n_train=200, n_test=20, output=out)
    assert calls[4:] == [(80, "svi"), (80, "qsgp")]
    done = json.loads(out.read_text())
    assert sorted(done) == sorted(f"cpu,{m},{k},3,planned" for m in (40, 60, 80)
                                  for k in ("svi", "qsgp"))
    table = X.crossover_table(done)
    assert "| cpu | 8e+01 | qsgp | planned | 3 | 2.0 | 5 | 0.250 |" in table
