"""``stanvi bench run-cpu`` (stanvi/bench/run_cpu.py) reports the run's thread CPU that every fit
now records (``fit.info["run_cpu_seconds"]``)."""

from __future__ import annotations

from stanvi.bench import run_cpu
from stanvi.evaluation.models import MODELS_DIR


def test_run_cpu_reports_the_runs_cpu_per_model_and_family(compiled, capsys):
    compiled("bernoulli")
    out = run_cpu.run(MODELS_DIR, ("bernoulli",), families=("fullrank",), seeds=2)
    cpu, wall = out["bernoulli"]["fullrank"]
    assert 0 < cpu and 0 < wall
    assert cpu <= wall * 1.5 + 1.0   # one thread's CPU cannot much exceed the run's wall time
    assert "bernoulli" in capsys.readouterr().out
