"""``stanvi bench task-time``: the hours of a batch run's fit records, per configuration and
stage, summed exactly (docs/batch.md#partial-records)."""

from __future__ import annotations

import pytest

from stanvi.batch.store import RunStore
from stanvi.bench.task_time import check_stores, task_time_table


def _rec(method, seconds, wall=None, stages=None, status="converged", **extra):
    return {"kind": "fit", "model": "m", "method": method, "profile": None, "family": "meanfield",
            "status": status, "task_seconds": seconds, "wall_time": wall,
            **({"stage_seconds": stages} if stages else {}), **extra}


RECORDS = [
    _rec("trustvi", 3600.0, 720.0, {"fit": 900.0, "elbo": 1800.0, "verdict": 720.0,
                                    "trace": 180.0}),
    _rec("trustvi", 1800.0, 360.0),                                  # written before stages
    _rec("trustvi", 300.0, status="timeout"),
    _rec("trustvi", 300.0, 36.0, {"fit": 72.0, "elbo": 36.0}, incomplete="stopped after 300 s"),
    _rec("advi", 7200.0, 3600.0, {"fit": 3600.0, "elbo": 0.0, "verdict": 3600.0}),
    _rec("advi", 0.0, status="skipped"),
]


def test_the_hours_add_up_per_configuration_and_overall():
    rows = {r["config"]: r for r in task_time_table(RECORDS)}
    tv, advi, every = rows["trustvi:default:meanfield"], rows["advi:stan:meanfield"], rows["all"]
    assert (tv["tasks"], tv["staged"], tv["timeouts"], tv["incomplete"]) == (4, 2, 1, 1)
    assert tv["task_h"] == pytest.approx(6000 / 3600)
    assert tv["wall_h"] == pytest.approx(1116 / 3600)
    assert (tv["fit_h"], tv["elbo_h"], tv["verdict_h"], tv["trace_h"]) == pytest.approx(
        (972 / 3600, 1836 / 3600, 0.2, 0.05))
    assert tv["timeout_h"] == tv["incomplete_h"] == pytest.approx(300 / 3600)
    assert advi["tasks"] == 1 and advi["verdict_h"] == pytest.approx(1.0)   # skipped left out
    assert every["tasks"] == 5 and every["task_h"] == pytest.approx(tv["task_h"] + 2.0)
    # the dearest configuration first, the total last
    assert [r["config"] for r in task_time_table(RECORDS)] == [
        "advi:stan:meanfield", "trustvi:default:meanfield", "all"]


def test_a_record_without_a_profile_is_labelled_with_the_profile_that_ran():
    """ADVI's default profile is ``stan``: the label is the one the report groups runs by."""
    from stanvi.batch.summary import config_of

    assert [r["config"] for r in task_time_table(RECORDS[4:5])] == [config_of(RECORDS[4]), "all"]
    assert config_of(RECORDS[4]) == "advi:stan:meanfield"


def test_the_table_reads_a_store(tmp_path):
    store = RunStore(tmp_path)
    for i, r in enumerate(RECORDS):
        store.put("fit", f"task{i}", r)
    text = check_stores([tmp_path])
    assert "trustvi:default:meanfield" in text and "[verdict] h" in text
    assert text.splitlines()[-2].split()[:3] == ["all", "5", "3.67"]
