"""``stanvi batch --plan`` (docs/batch.md#plan): what the store has and what is left, by
configuration, by model and for the NUTS references, counted from the models of the source
(a model the batch has not reached has no records, and a count over the records misses it)."""

from __future__ import annotations

from pathlib import Path

from stanvi.batch.discover import ModelCase
from stanvi.batch.plan_status import format_plan_status, plan_status
from stanvi.batch.runner import BatchConfig, plan
from stanvi.batch.store import RunStore
from stanvi.batch.tasks import fit_identity, write_record


def cases() -> list[ModelCase]:
    names = ["a/one", "a/two", "b/three", "b/four"]
    out = [ModelCase(n, Path(f"{n}.stan"), Path(f"{n}.json"), "json") for n in names]
    out.append(ModelCase("b/no_data", Path("b/no_data.stan"), None, "none",
                         skip="no data file"))
    return out


CONFIG = BatchConfig(methods=(("trustvi", "default"), ("pathfinder", "single")),
                     families=("meanfield", "fullrank"), seeds=2, reference="nuts", max_dim=100)


def test_counts_by_configuration_model_and_reference(tmp_path):
    models = cases()
    work = plan(models, CONFIG)
    assert len(work) == 5 * (2 * 2 + 2)          # trustvi per family and seed, pathfinder per seed
    store = RunStore(tmp_path)
    by_model = {}
    for case, spec in work:
        by_model.setdefault(case.name, []).append((case, spec))
    # a/one: every task; a/two: its trustvi tasks only; b/three: one; the rest: none
    done = (by_model["a/one"]
            + [(c, s) for c, s in by_model["a/two"] if s.method == "trustvi"]
            + by_model["b/three"][:1])
    for case, spec in done:
        write_record(store, "fit", spec.key, fit_identity(spec, case), {"status": "converged"})
    # a record of another task under a colliding name does not count (RunStore.has)
    other = by_model["b/four"][0][1]
    store.path("fit", other.key).write_text('{"model": "b/four", "key": "someone else"}')
    write_record(store, "reference", "a/one", {"model": "a/one"}, {"status": "ok"})
    write_record(store, "compile", "b/three", {"model": "b/three"}, {"status": "ok", "dim": 500})

    status = plan_status(models, tmp_path, CONFIG)
    assert status["planned"] == 30 and status["done"] == 6 + 4 + 1
    assert status["by_config"]["trustvi:default:meanfield"] == {"planned": 10, "done": 2 + 2 + 1}
    assert status["by_config"]["pathfinder:single:none"] == {"planned": 10, "done": 2}
    assert status["complete"] == 1
    assert status["partial"] == ["a/two", "b/three"]
    assert status["untouched"] == ["b/four", "b/no_data"]
    # references: a/one has one; b/three is over --max-dim (skipped, no record); the model
    # without data is not runnable
    assert status["references_planned"] == 3 and status["references_missing"] == ["a/two",
                                                                                  "b/four"]
    text = format_plan_status(status, shown=1)
    assert "fit tasks: 30 planned, 11 in the store, 19 to run" in text
    assert "trustvi:default:fullrank: 6 to run of 10" in text   # b/three: meanfield s0
    assert "1 with every fit task in the store, 2 with some, 2 with none" in text
    assert "not reached: b/four, ... (1 more)" in text
    assert "NUTS references: 1 of the 3" in text and "2 to run" in text


def test_a_runs_directory_that_does_not_exist_is_read_as_empty_and_not_created(tmp_path):
    runs = tmp_path / "never_run"
    status = plan_status(cases(), runs, CONFIG)
    assert status["done"] == 0 and status["complete"] == 0 and len(status["untouched"]) == 5
    assert len(status["references_missing"]) == 4
    assert not runs.exists()


def test_the_command_prints_the_plan_and_runs_nothing(tmp_path, capsys):
    from stanvi.cli import main

    source = tmp_path / "example-models"
    (source / "x").mkdir(parents=True)
    (source / "x" / "m.stan").write_text("parameters { real y; } model { y ~ normal(0, 1); }")
    (source / "x" / "m.data.json").write_text("{}")
    runs = tmp_path / "runs"
    assert main(["batch", str(source), "--methods", "trustvi", "--seeds", "2", "--out",
                 str(runs), "--plan"]) == 0
    out = capsys.readouterr().out
    assert "fit tasks: 2 planned, 0 in the store, 2 to run" in out
    assert "not reached: x/m" in out
    assert not runs.exists()   # nothing compiled, nothing written
