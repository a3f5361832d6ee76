"""Behaviour stays put while the code moves (issue P2-1b): the per-model figures of
``stanvi bench methods`` (``evaluation.protocol.summarize_run``: status, final ELBO on fixed draws,
iterations, oracle calls, draw-level evaluations, the ELBO at fixed trace points) and the final
variational parameters, for three models × two methods, seed 0, must equal the ones recorded in
``tests/golden/bench_baseline.json`` before the refactoring.

Regenerate only on purpose (a change meant to alter results), and say so in the commit:
``STANVI_REGEN_BASELINE=1 .venv/bin/python -m pytest tests/test_refactor_baseline.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import numpy as np
import pytest

import stanvi
from stanvi.evaluation import protocol
from stanvi.estimators.elbo import standard_normal

GOLDEN = Path(__file__).resolve().parent / "golden" / "bench_baseline.json"
MODELS = ("bernoulli", "linear_regression", "eight_schools")
CONFIGS = (("trustvi", "default"), ("advi", "stan"))
# Relative tolerance: same seeds must give the same numbers; 1e-9 leaves room only for
# reassociated floating-point sums, not for a changed rule.
RTOL = 1e-9


def figures(target, method: str, profile: str) -> dict:
    fit = stanvi.fit(target, method=method, profile=profile, seed=0, progress=False, draws=10)
    eps_eval = standard_normal(jax.random.PRNGKey(20171), 500, target.dim)
    eps_final = standard_normal(jax.random.PRNGKey(20172), 2000, target.dim)
    run = protocol.summarize_run(fit, f"{method}:{profile}", eps_final, eps_eval, 8)
    return {"status": run.status, "final_elbo": run.final_elbo, "iterations": run.iterations,
            "oracle": run.oracle, "draw_evals": run.draw_evals,
            "trace_elbo": [float(x) for x in run.trace_elbo],
            "params": [float(x) for x in fit.params]}


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("method, profile", CONFIGS)
def test_bench_figures_equal_the_recorded_baseline(load_target, golden, model, method, profile):
    key = f"{model}|{method}:{profile}"
    now = figures(load_target(model), method, profile)
    if os.environ.get("STANVI_REGEN_BASELINE") == "1":
        data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        data[key] = now
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return
    assert key in golden, f"no baseline for {key}: regenerate (see the module docstring)"
    was = golden[key]
    assert now["status"] == was["status"]
    assert (now["iterations"], now["draw_evals"]) == (was["iterations"], was["draw_evals"])
    for name in ("final_elbo", "oracle", "trace_elbo", "params"):
        np.testing.assert_allclose(now[name], was[name], rtol=RTOL, atol=1e-12, err_msg=name)
