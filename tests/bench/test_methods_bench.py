"""The protocol pieces of ``stanvi bench methods`` (Regier, Jordan & McAuliffe 2017, §5;
docs/algorithms.md#benchmark-protocol): the median run, "consistently above the threshold", the
report's markdown, and resuming a killed run from its JSON."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import MODELS_DIR
from stanvi.bench import methods_bench as mb


def summary(seed, final, elbos=(), status="converged"):
    n = len(elbos)
    return mb.RunSummary(config="x", seed=seed, status=status, final_elbo=final, iterations=n,
                         oracle=0.0, draw_evals=0, wall=0.0, trace_iter=np.arange(n),
                         trace_oracle=np.arange(n, dtype=float) * 10, trace_draws=np.zeros(n),
                         trace_wall=np.zeros(n), trace_elbo=np.asarray(elbos, dtype=float))


def test_median_run_is_the_third_of_five_and_failures_rank_lowest():
    runs = [summary(0, -3.0), summary(1, -math.inf, status="failed"), summary(2, -1.0),
            summary(3, -2.0), summary(4, -5.0)]
    assert mb.median_run(runs).seed == 0          # order: -inf, -5, -3, -2, -1
    # even count: the lower middle one
    assert mb.median_run(runs[:4]).seed == 0      # -inf, -3, -2, -1 → -3


def test_first_consistent_means_above_from_then_on():
    run = summary(0, -1.0, elbos=[-10, -4, -6, -3, -2])
    assert mb.first_consistent(run, -5.0) == 3    # -6 at index 2 breaks the run of passes
    assert mb.first_consistent(run, -20.0) == 0
    assert mb.first_consistent(run, -2.5) == 4
    assert mb.first_consistent(run, -1.0) is None  # never above at the end


REPORT = {"toy": {
    "dim": 2,
    "medians": {"trustvi:default": {"final_elbo": -1.0, "status": "converged"},
                "advi:stan": {"final_elbo": -1.5, "status": "converged"}},
    "runs": {"advi:stan": [{"status": "failed"}, {"status": "converged"}]},
    "pairs": {"trustvi:default|advi:stan": {"threshold": -2.5, "oracle_ref": 4.0,
                                            "oracle_other": 10.0, "ratio": 2.5, "excluded": ""}},
    "to_one_nat": {"trustvi:default": {"draw_evals": 100.0, "wall": 0.5, "oracle": 4.0},
                   "advi:stan": None},
    "overhead": {"trustvi:default": {"estimated": 1.25, "measured": 1.5}},
}}


def test_markdown_summary_tables():
    md = mb.markdown_summary(REPORT)
    assert "| toy | 2 | -1.00 | -1.50 (1) |" in md
    assert "| toy | advi:stan / trustvi:default | -2.50 | 10.0 | 4.0 | 2.5× |" in md
    assert "| toy | 100 / 0.50 s | never |" in md
    assert "| toy | trustvi:default | 1.25 | 1.50 |" in md


def test_resume_skips_models_already_in_the_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"bernoulli": REPORT["toy"]}))
    report = mb.run(MODELS_DIR, models=["bernoulli"], output=out, resume=True)
    assert report == {"bernoulli": REPORT["toy"]}   # nothing was rerun
    assert "resuming: 1 model(s)" in capsys.readouterr().out
    assert out.with_suffix(".md").read_text() == mb.markdown_summary(report)


def test_unknown_model_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown model"):
        mb.run(MODELS_DIR, models=["no_such_model"])
