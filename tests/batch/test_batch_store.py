"""The pieces of a batch run that need no Stan model (issue P2-2): the results store, the
accuracy figures, posteriordb discovery and reference draws (a fake tree in the database's
layout), the plan and the method list."""

from __future__ import annotations

import io
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest

from stanvi.evaluation.accuracy import labelled_draws, marginal_accuracy
from stanvi.batch.cli import parse_methods, parse_options
from stanvi.batch.discover import ModelCase, load_data
from stanvi.batch.posteriordb import discover_posteriordb, read_reference_draws
from stanvi.batch.runner import BatchConfig, check_config, plan
from stanvi.batch.store import RunStore
from stanvi.batch.tasks import FitSpec

NORMAL = "data { int N; vector[N] y; } parameters { real mu; } model { y ~ normal(mu, 1); }"


def zipped_json(path, obj, inner="x.json"):
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(inner, json.dumps(obj))
    path.write_bytes(buf.getvalue())


# ------------------------------------------------------------------------------ the store

def test_store_records_are_whole_strict_json_and_indexed(tmp_path):
    store = RunStore(tmp_path)
    assert not store.has("fit", "m__a")
    store.put("fit", "m__a", {"model": "m", "method": "advi", "status": "converged",
                              "elbo": np.float64(-3.5), "x": np.arange(3), "bad": math.nan,
                              "inf": [1.0, -math.inf]})
    assert store.has("fit", "m__a")
    text = store.path("fit", "m__a").read_text()
    assert "NaN" not in text and "Infinity" not in text
    rec = store.get("fit", "m__a")
    assert rec["elbo"] == -3.5 and rec["x"] == [0, 1, 2] and rec["bad"] is None
    assert rec["inf"] == [1.0, None]
    # a stray temporary file (a writer killed mid-write) is not a record
    (tmp_path / "records" / "fit" / ".tmp-abc").write_text('{"model": "half')
    store.put("fit", "m__b", {"model": "m", "method": "trustvi", "status": "failed"})
    assert [r["method"] for r in store.records("fit")] == ["advi", "trustvi"]
    assert [r["method"] for r in store.query("fit", status="failed")] == ["trustvi"]
    # the index is derived: deleting it loses nothing
    (tmp_path / "index.sqlite").unlink()
    for extra in ("index.sqlite-wal", "index.sqlite-shm"):
        (tmp_path / extra).unlink(missing_ok=True)
    assert RunStore(tmp_path).sync() == 2
    assert len(RunStore(tmp_path).query("fit", model="m")) == 2
    with pytest.raises(ValueError, match="kind"):
        store.path("other", "k")
    with pytest.raises(ValueError, match="query by"):
        store.query("fit", seed="1")


def test_task_keys_name_every_field_of_the_fit(tmp_path):
    a = FitSpec("ARM/x", "trustvi", "meanfield", None, 0)
    assert a.key.startswith("ARM/x__trustvi-default-meanfield-s0__")
    keys = {a.key, FitSpec("ARM/x", "trustvi", "meanfield", None, 1).key,
            FitSpec("ARM/x", "trustvi", "fullrank", None, 0).key,
            FitSpec("ARM/x", "trustvi", "meanfield", "paper", 0).key,
            FitSpec("ARM/x", "trustvi", "meanfield", None, 0, {"max_iters": 5}).key}
    assert len(keys) == 5
    assert FitSpec("ARM/x", "trustvi").key == a.key      # deterministic
    path = RunStore(tmp_path).path("fit", a.key)   # one file per key, in the kind's directory
    assert path.parent == tmp_path / "records" / "fit" and path.name.startswith("ARM_x__")


# ------------------------------------------------------------------------------ accuracy

def test_accuracy_figures_are_exact_for_shifted_and_scaled_draws():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(4000) * 2.0 + 5.0
    s = float(np.std(ref, ddof=1))
    shifted = ref + 0.3 * s             # mean error 0.3 sd, W1 exactly 0.3 sd, sd ratio 1
    m = float(np.mean(ref))
    scaled = m + (ref - m) * 1.5        # same mean, sd ratio 1.5
    out = marginal_accuracy({"a": shifted, "b": scaled}, {"a": ref, "b": ref, "c": ref})
    a, b = out["marginals"]["a"], out["marginals"]["b"]
    assert a["mean_error_sd"] == pytest.approx(0.3, rel=1e-12)
    assert a["w1_sd"] == pytest.approx(0.3, rel=1e-9) and a["sd_ratio"] == pytest.approx(1.0)
    assert b["mean_error_sd"] == pytest.approx(0.0, abs=1e-12)
    assert b["sd_ratio"] == pytest.approx(1.5, rel=1e-12)
    # W1 of a scaling by c about the mean is |c − 1| · E|x − m|
    assert b["w1"] == pytest.approx(0.5 * np.mean(np.abs(ref - m)), rel=1e-9)
    assert out["missing"] == ["c"] and out["n_marginals"] == 2
    assert out["sd_ratio_worst"] == pytest.approx(1.5)
    assert out["mean_error_sd_max"] == pytest.approx(0.3, rel=1e-12)


def test_labelled_draws_use_stan_column_major_labels():
    draws = np.arange(2 * 2 * 3).reshape(2, 2, 3).astype(float)   # (n=2, 2, 3)
    out = labelled_draws({"beta": draws, "mu": np.array([1.0, 2.0])})
    assert list(out)[:3] == ["beta[1,1]", "beta[2,1]", "beta[1,2]"]
    np.testing.assert_array_equal(out["beta[2,1]"], draws[:, 1, 0])
    np.testing.assert_array_equal(out["beta[1,3]"], draws[:, 0, 2])
    np.testing.assert_array_equal(out["mu"], [1.0, 2.0])


# ------------------------------------------------------------------------------ posteriordb

@pytest.fixture
def fake_pdb(tmp_path):
    db = tmp_path / "posterior_database"

    def posterior(name, model, data, ref):
        (db / "posteriors").mkdir(parents=True, exist_ok=True)
        (db / "posteriors" / f"{name}.json").write_text(json.dumps(
            {"name": name, "model_name": model, "data_name": data,
             "reference_posterior_name": ref}))

    (db / "models" / "stan").mkdir(parents=True)
    (db / "models" / "stan" / "normal.stan").write_text(NORMAL)
    (db / "models" / "stan" / "gq.stan").write_text(
        "generated quantities { real y = normal_rng(0, 1); }")
    zipped_json(db / "data" / "data" / "two.json.zip", {"N": 2, "y": [1.0, 2.0]})
    posterior("two-normal", "normal", "two", "two-normal")
    posterior("two-normal_noref", "normal", "two", None)
    posterior("gone-normal", "normal", "gone", None)
    posterior("two-gq", "gq", "two", None)
    zipped_json(db / "reference_posteriors" / "draws" / "draws" / "two-normal.json.zip",
                [{"mu": [1.0, 2.0, 3.0], "theta[1]": [0.0, 0.0, 1.0]},
                 {"mu": [4.0, 5.0, 6.0], "theta[1]": [1.0, 1.0, 1.0]}])
    return tmp_path


def test_posteriordb_discovery_and_reference_draws(fake_pdb):
    cases = {c.name: c for c in discover_posteriordb(fake_pdb)}
    assert sorted(cases) == ["gone-normal", "two-gq", "two-normal", "two-normal_noref"]
    assert cases["two-normal"].reference.name == "two-normal.json.zip"
    assert cases["two-normal"].source == "posteriordb" and cases["two-normal"].skip is None
    assert cases["two-normal_noref"].reference is None
    assert "gone.json.zip is missing" in cases["gone-normal"].skip
    assert "no parameters block" in cases["two-gq"].skip
    assert load_data(cases["two-normal"]) == {"N": 2, "y": [1.0, 2.0]}
    assert [c.name for c in discover_posteriordb(fake_pdb, with_reference=True)] == ["two-normal"]
    assert [c.name for c in discover_posteriordb(fake_pdb / "posterior_database",
                                                 glob="two-n*")] == ["two-normal",
                                                                     "two-normal_noref"]
    ref = read_reference_draws(cases["two-normal"].reference)
    np.testing.assert_array_equal(ref["mu"], [1, 2, 3, 4, 5, 6])
    assert ref["theta[1]"].shape == (6,)


def test_reference_draws_with_unequal_chains_are_refused(tmp_path):
    path = tmp_path / "r.json.zip"
    zipped_json(path, [{"mu": [1.0, 2.0]}, {"mu": [1.0]}])
    with pytest.raises(ValueError, match="different numbers of draws of 'mu'"):
        read_reference_draws(path)
    zipped_json(path, [{"mu": [1.0]}, {"sigma": [1.0]}])
    with pytest.raises(ValueError, match="chain 2 has no draws of 'mu'"):
        read_reference_draws(path)


# ------------------------------------------------------------------------------ the plan

def test_plan_and_method_list():
    assert parse_methods("trustvi, trustvi:paper,advi:stan", profile=None) == (
        ("trustvi", None), ("trustvi", "paper"), ("advi", "stan"))
    assert parse_methods("hfsgvi", profile="paper") == (("hfsgvi", "paper"),)
    assert parse_options('{"advi": {"eta": 0.1}}') == {"advi": {"eta": 0.1}}
    assert parse_options(None) == {}
    with pytest.raises(ValueError, match="names no method"):
        parse_methods(" , ")
    case = ModelCase("m", Path("m.stan"), None, "none")
    config = BatchConfig(methods=(("trustvi", None), ("advi", "stan")),
                         families=("meanfield", "fullrank"), seeds=3)
    work = plan([case], config)
    assert len(work) == 2 * 2 * 3 and len({s.key for _, s in work}) == 12
    check_config(config)
    with pytest.raises(ValueError, match="unknown method 'nut'"):
        check_config(BatchConfig(methods=(("nut", None),)))
    # Stan's own algorithms: Pathfinder and NUTS run once per seed (no family), Stan's ADVI per
    # family; their profiles and settings are checked like stanvi's
    stan = BatchConfig(methods=(("stan-advi", None), ("pathfinder", "single"), ("nuts", "dense")),
                       families=("meanfield", "fullrank"), seeds=2,
                       options={"nuts": {"num_samples": 100}})
    check_config(stan)
    assert sorted((s.method, s.family) for _, s in plan([case], stan)) == sorted(
        [("stan-advi", "meanfield")] * 2 + [("stan-advi", "fullrank")] * 2
        + [("pathfinder", "none")] * 2 + [("nuts", "none")] * 2)
    with pytest.raises(ValueError, match="no profile 'fast'"):
        check_config(BatchConfig(methods=(("pathfinder", "fast"),)))
    with pytest.raises(TypeError, match="adapt_delta"):
        check_config(BatchConfig(methods=(("nuts", None),), options={"nuts": {"adapt_delta": 1}}))
    with pytest.raises(ValueError, match="unknown profile 'fast'"):
        check_config(BatchConfig(methods=(("advi", "fast"),)))
    with pytest.raises(ValueError, match="unknown family 'sparse'"):
        check_config(BatchConfig(families=("sparse",)))
    check_config(BatchConfig(families=("lowrank",)))   # T3-6: its default rank


def test_cli_errors_name_what_is_wrong(tmp_path, capsys):
    from stanvi.cli import main

    assert main(["batch", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    assert main(["batch", str(tmp_path), "--out", str(tmp_path / "r"), "--methods", "nut"]) == 1
    assert "unknown method 'nut'" in capsys.readouterr().err
    assert main(["batch", str(tmp_path), "--out", str(tmp_path / "r"), "--family", "x"]) == 1
    assert "unknown family 'x'" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 1
    assert "not a runs directory" in capsys.readouterr().err
    assert main(["batch", str(tmp_path), "--out", str(tmp_path / "r"),
                 "--options", '{"advi": {"no_such": 1}}']) == 1
    assert "unknown option(s) ['no_such'] for advi" in capsys.readouterr().err
    assert main(["batch", str(tmp_path), "--out", str(tmp_path / "r"), "--options", "[1]"]) == 1
    assert "must map method names" in capsys.readouterr().err


# ------------------------------------------------------- damaged stores (issue T3-2 items 5-7)

def _record(key: str, model: str = "m", status: str = "converged") -> dict:
    return {"key": key, "kind": "fit", "model": model, "method": "trustvi", "status": status}


@pytest.mark.parametrize("content", [b"", b'{"key": "a", "sta', b"{}", b"null", b"[1, 2]"])
def test_an_unreadable_record_is_set_aside_and_its_task_runs_again(tmp_path, content):
    """Item 5: a truncated or empty record counted as done (14 of 16 fits, nothing said of the
    others); item 7: ``{}`` or ``null`` broke the report.  Such a file is moved aside, named by
    ``unreadable()``, and its task is not done."""
    store = RunStore(tmp_path)
    store.put("fit", "a", _record("a"))
    store.put("fit", "b", _record("b"))
    store.path("fit", "b").write_bytes(content)
    assert store.has("fit", "a") and not store.has("fit", "b")
    assert [r["key"] for r in store.records("fit")] == ["a"]
    assert len(store.unreadable()) == 1 and store.unreadable()[0].startswith("fit/b.json")
    assert not store.path("fit", "b").exists()
    store.put("fit", "b", _record("b"))   # the task ran again
    assert store.has("fit", "b")


def test_record_files_are_injective_in_the_key(tmp_path):
    """Item 6: ``x/m`` and ``x_m`` shared one record file; on resume ``x_m``'s fit ran ``x/m``'s
    library.  Different keys have different files, and a record is its task's only."""
    store = RunStore(tmp_path)
    assert store.path("compile", "x/m") != store.path("compile", "x_m")
    store.put("compile", "x/m", {**_record("x/m", "x/m"), "kind": "compile"})
    assert not store.has("compile", "x_m")
    # a store written before the hash suffix: x/m's record under the shared name x_m.json
    legacy = tmp_path / "records" / "compile" / "x_m.json"
    store.path("compile", "x/m").rename(legacy)
    assert store.get("compile", "x/m")["model"] == "x/m"     # still found where it was
    assert store.get("compile", "x_m") is None               # ... and never taken for x_m's


def test_a_garbage_index_is_rebuilt(tmp_path):
    """Item 7: a garbage index.sqlite ended ``batch`` with sqlite3.DatabaseError, although it is
    derived data; it is rebuilt from the records."""
    store = RunStore(tmp_path)
    store.put("fit", "a", _record("a"))
    (tmp_path / "index.sqlite").write_bytes(b"this is not a database" * 100)
    assert [r["key"] for r in store.query("fit")] == ["a"]


def test_an_unreachable_scheduler_is_one_line(monkeypatch):
    """Item 7: ``--scheduler tcp://127.0.0.1:9`` printed an OSError traceback after 30 s."""
    from stanvi.batch import runner  # noqa: PLC0415

    monkeypatch.setattr(runner, "SCHEDULER_TIMEOUT", 2.0)
    with pytest.raises(ConnectionError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        runner._client("tcp://127.0.0.1:9", None)
