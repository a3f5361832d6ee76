"""``stanvi bench public-stopping`` end to end on a tiny fake posteriordb tree (no posteriordb
checkout needed): one posterior with the Bernoulli model and zipped data, one whose model uses
pre-2.33 syntax that stanc rejects, one that does not exist."""

from __future__ import annotations

import json
import math
import zipfile

import pytest

from stanvi.bench import public_stopping as ps
from stanvi.cli import main

from conftest import stan_file

DATA = {"N": 10, "y": [0, 1, 0, 0, 0, 0, 0, 0, 0, 1]}
OLD_SYNTAX = """data { int N; real y[N]; }
parameters { real mu; }
model { y ~ normal(mu, 1); }
"""


def _posterior(root, name: str, model: str, data: str) -> None:
    (root / "posteriors" / f"{name}.json").write_text(json.dumps(
        {"name": name, "model_name": model, "data_name": data,
         "reference_posterior_name": None}))


@pytest.fixture
def fake_pdb(tmp_path):
    root = tmp_path / "posteriordb" / "posterior_database"
    for sub in ("posteriors", "models/stan", "data/data"):
        (root / sub).mkdir(parents=True)
    # the Bernoulli model under its own name and code: the compile cache serves it
    (root / "models/stan/bernoulli.stan").write_text(stan_file("bernoulli").read_text())
    (root / "models/stan/old_normal.stan").write_text(OLD_SYNTAX)
    for data in ("tiny", "tiny_normal"):
        with zipfile.ZipFile(root / f"data/data/{data}.json.zip", "w") as z:
            z.writestr(f"{data}.json", json.dumps(DATA if data == "tiny" else
                                                  {"N": 2, "y": [0.1, -0.3]}))
    _posterior(root, "tiny-bernoulli", "bernoulli", "tiny")
    _posterior(root, "tiny_normal-old_normal", "old_normal", "tiny_normal")
    return tmp_path / "posteriordb"


def test_helpers(fake_pdb):
    root = ps.database_root(fake_pdb)
    assert ps.database_root(root) == root
    with pytest.raises(FileNotFoundError):
        ps.database_root(fake_pdb / "nowhere")
    info, stan, zipped = ps.posterior_files(root, "tiny-bernoulli")
    assert info["model_name"] == "bernoulli" and stan.exists()
    assert ps.read_data(zipped) == DATA
    assert ps.source_digest("a", DATA) != ps.source_digest("b", DATA)
    assert ps.source_digest("a", DATA) == ps.source_digest("a", dict(reversed(DATA.items())))


def test_end_to_end(fake_pdb, tmp_path, capsys):
    optima = tmp_path / "optima"
    out = tmp_path / "public_stopping.json"
    records, runs = ps.run(fake_pdb, posteriors=["tiny-bernoulli", "tiny_normal-old_normal",
                                                 "missing"],
                           seeds=1, output=out, optima_dir=optima)
    by = {r.name: r for r in records}
    ok = by["tiny-bernoulli"]
    assert ok.status == "ok" and ok.dim == 1 and not ok.optimum_cached
    assert by["tiny_normal-old_normal"].status == "skipped"
    assert "StanCompileError" in by["tiny_normal-old_normal"].reason
    assert by["missing"].status == "skipped" and "no posterior" in by["missing"].reason

    # the optimum: computed by the shared procedure, cached with its source digest
    opt = json.loads((optima / "tiny-bernoulli.optimum.json").read_text())
    assert opt["posterior"] == "tiny-bernoulli" and opt["source_sha256"]
    assert opt["n_draws_fit"] == 4096 and opt["starts_agree"] is True
    assert math.isclose(opt["elbo"], ok.optimum_elbo)

    # the run: measured as stanvi bench stopping measures it
    (run,) = runs
    assert run.model == "tiny-bernoulli" and run.config == "trustvi:default" and run.seed == 0
    assert run.status == "converged" and abs(run.gap) < 0.1
    assert math.isfinite(run.to_one_nat_draws) and run.draw_evals > 0
    # seconds to 1 nat count the warm start that runs before the trace's clock starts
    assert 0.0 <= run.untraced_seconds <= run.run_time
    assert run.untraced_seconds <= run.to_one_nat_seconds <= run.run_time + 1e-9
    assert ps.false_converged(runs) == []

    saved = json.loads(out.read_text())
    assert [p["name"] for p in saved["posteriors"]] == ["tiny-bernoulli",
                                                        "tiny_normal-old_normal", "missing"]
    assert len(saved["runs"]) == 1 and saved["runs"][0]["status"] == "converged"
    text = capsys.readouterr().out
    assert "converged runs within 1 nat of the optimum: 1/1" in text
    assert "skipped: tiny_normal-old_normal" in text

    # a second time the optimum comes from the cache; changed data recompute it
    import stanvi  # noqa: PLC0415

    target = stanvi.load(str(stan_file("bernoulli")), data=DATA, progress=False)
    digest = opt["source_sha256"]
    again, cached, _ = ps.cached_optimum("tiny-bernoulli", target, digest, optima)
    assert cached and again == opt


def test_false_converged_helper():
    base = dict(model="m", config="c", seed=0, to_one_nat_draws=1.0, to_one_nat_seconds=0.1,
                draw_evals=1, run_time=0.1, mean_error_sd=math.nan, sd_error=math.nan,
                message="")
    runs = [ps.StopRun(status="converged", gap=0.5, **base),
            ps.StopRun(status="converged", gap=3.0, **base),
            ps.StopRun(status="converged", gap=math.nan, **base),
            ps.StopRun(status="max_iters", gap=9.0, **base)]
    assert [r.gap for r in ps.false_converged(runs)][:1] == [3.0]
    assert len(ps.false_converged(runs)) == 2  # a NaN gap is not "within 1 nat"


def test_cli_needs_posteriordb(capsys):
    with pytest.raises(SystemExit, match="--posteriordb"):
        main(["bench", "public-stopping"])
