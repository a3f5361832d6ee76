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


def test_dense_limits_are_compared_in_one_process_and_the_setting_is_restored(compiled, capsys):
    """``--dense-limits 0,48``: bernoulli (P = 2) with GLTR and with the exact solve; the same
    model evaluations (its path does not change), and the module's limit is put back."""
    from stanvi.methods import trustvi_fixed  # noqa: PLC0415

    compiled("bernoulli")
    kept = trustvi_fixed.DENSE_SOLVE_MAX_PARAMS
    out = run_cpu.run(MODELS_DIR, ("bernoulli",), families=("meanfield",), seeds=2,
                      dense_limits=(0, 48), rounds=1)
    row = out["bernoulli"]["meanfield"]
    assert set(row) == {0, 48}
    assert row[0][2] == row[48][2] > 0
    assert trustvi_fixed.DENSE_SOLVE_MAX_PARAMS == kept
    assert "[48] CPU ms" in capsys.readouterr().out
