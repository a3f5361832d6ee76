"""Discovering work in an example-models checkout (issue P2-2): the data-file conventions, the
skip reasons, the filters, and loading the data (a fake tree in the repository's layout)."""

from __future__ import annotations

import shutil

import pytest

from stanvi.batch.discover import discover_example_models, load_data, program_blocks
from stanvi.stan.rdump import RDumpNAError

NORMAL = "data { int N; vector[N] y; } parameters { real mu; } model { y ~ normal(mu, 1); }"


@pytest.fixture
def tree(tmp_path):
    def put(rel, text):
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    put("ARM/Ch.3/json_model.stan", NORMAL)
    put("ARM/Ch.3/json_model.data.json", '{"N": 2, "y": [1.0, 2.0]}')
    put("ARM/Ch.3/json_model.data.R", "N <- 1\ny <- 5\n")        # JSON wins
    put("ARM/Ch.3/rdump_model.stan", NORMAL)
    put("ARM/Ch.3/rdump_model.data.R", "N <- 2\ny <- c(1, 2)\n")
    put("bugs/plain_r.stan", NORMAL)
    put("bugs/plain_r.R", "N <- 3\ny <- c(1, 2, 3)\n")
    put("bugs/na_model.stan", NORMAL)
    put("bugs/na_model.data.R", "N <- 2\ny <- c(1, NA)\n")
    put("bugs/no_data_file.stan", NORMAL)
    put("misc/no_data_needed.stan", "parameters { real x; } model { x ~ std_normal(); }")
    put("misc/gq_only.stan", "data { int N; } generated quantities { real y = normal_rng(0, 1); }")
    put("misc/commented.stan", "// parameters { real z; }\ndata { int N; }\n"
        "transformed parameters { real w = 1; }\nmodel { }")
    return tmp_path


def test_conventions_and_skip_reasons(tree):
    cases = {c.name: c for c in discover_example_models(tree)}
    assert sorted(cases) == ["ARM/Ch.3/json_model", "ARM/Ch.3/rdump_model", "bugs/na_model",
                             "bugs/no_data_file", "bugs/plain_r", "misc/commented",
                             "misc/gq_only", "misc/no_data_needed"]
    assert cases["ARM/Ch.3/json_model"].data.name == "json_model.data.json"
    assert cases["ARM/Ch.3/rdump_model"].data_format == "rdump"
    assert cases["bugs/plain_r"].data.name == "plain_r.R"
    assert cases["misc/no_data_needed"].data is None and cases["misc/no_data_needed"].skip is None
    assert "no data file" in cases["bugs/no_data_file"].skip
    assert "no parameters block" in cases["misc/gq_only"].skip
    # a commented-out block and a 'transformed parameters' block are not a parameters block
    assert "no parameters block" in cases["misc/commented"].skip
    runnable = [n for n, c in cases.items() if c.skip is None]
    assert runnable == ["ARM/Ch.3/json_model", "ARM/Ch.3/rdump_model", "bugs/na_model",
                        "bugs/plain_r", "misc/no_data_needed"]


def test_filters(tree):
    assert [c.name for c in discover_example_models(tree, glob="ARM/*")] == [
        "ARM/Ch.3/json_model", "ARM/Ch.3/rdump_model"]
    assert [c.name for c in discover_example_models(tree, names=["bugs/plain_r"])] == [
        "bugs/plain_r"]
    assert [c.name for c in discover_example_models(tree, glob="ARM/*,misc/no*")] == [
        "ARM/Ch.3/json_model", "ARM/Ch.3/rdump_model", "misc/no_data_needed"]
    assert [c.name for c in discover_example_models(tree, exclude="ARM/*, misc/*")] == [
        "bugs/na_model", "bugs/no_data_file", "bugs/plain_r"]
    assert [c.name for c in discover_example_models(tree, glob="bugs/*", exclude="*_r")] == [
        "bugs/na_model", "bugs/no_data_file"]
    big = {c.name: c for c in discover_example_models(tree, max_data_bytes=20)}
    assert "bytes (max_data_bytes 20)" in big["ARM/Ch.3/json_model"].skip
    with pytest.raises(FileNotFoundError, match="example-models checkout"):
        discover_example_models(tree / "nope")


def test_random_subsets_of_the_runnable_models_and_their_strata(tree):
    """``--sample N --sample-seed S``: Random(S).sample of the runnable models in name order.
    The example-models run samples 100 of the 304 runnable models outside knitr/misc/
    regression_tests and 25 of the 76 inside (``--exclude`` / ``--glob`` with the same
    patterns): the subset outside is the one drawn from a checkout that lacked them."""
    import random  # noqa: PLC0415

    from stanvi.batch.cli import cases_from_source  # noqa: PLC0415

    runnable = [c.name for c in discover_example_models(tree) if c.skip is None]
    for seed in (0, 1, 2):
        picked = [c.name for c in cases_from_source(tree, sample=3, sample_seed=seed)]
        assert picked == sorted(random.Random(seed).sample(runnable, 3))
    assert len(cases_from_source(tree, sample=99)) == len(runnable)     # all of them
    outside = [c.name for c in cases_from_source(tree, exclude="misc/*", sample=2)]
    without_misc = tree.parent / "without_misc"
    shutil.copytree(tree, without_misc, ignore=lambda d, names: ["misc"] if d == str(tree)
                    else [])
    assert outside == [c.name for c in cases_from_source(without_misc, sample=2)]
    inside = [c.name for c in cases_from_source(tree, glob="misc/*", sample=1)]
    assert inside == ["misc/no_data_needed"]    # the one runnable misc model


def test_load_data_reads_both_formats_and_names_na(tree):
    cases = {c.name: c for c in discover_example_models(tree)}
    assert load_data(cases["ARM/Ch.3/json_model"]) == {"N": 2, "y": [1.0, 2.0]}
    assert load_data(cases["ARM/Ch.3/rdump_model"]) == {"N": 2, "y": [1, 2]}
    assert load_data(cases["misc/no_data_needed"]) is None
    with pytest.raises(RDumpNAError, match="variable 'y'"):
        load_data(cases["bugs/na_model"])


def test_program_blocks_nesting_and_names():
    blocks = program_blocks("functions { real f(real x) { return x; } }\n"
                            "transformed   data { real c = 1; }\nparameters { real a; }\n"
                            "model { { a ~ normal(0, 1); } }\n/* data { int no; } */")
    assert set(blocks) == {"functions", "transformed data", "parameters", "model"}
    assert "real a;" in blocks["parameters"] and "a ~ normal" in blocks["model"]
