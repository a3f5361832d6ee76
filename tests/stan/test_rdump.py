"""The R dump reader (issue P2-2): the forms R's dump() writes and example-models ships,
column-major arrays, integer vs real, NA as a clear skip, and errors that name the place."""

from __future__ import annotations

import math

import pytest

from stanvi.stan.rdump import RDumpError, RDumpNAError, parse_rdump, read_rdump

TRICKY = '''
# comment line
N <- 3
"sigma" <- 2.5
y <-
c(1, 2, 3)
x <- c(0.5, -1e-3, 2E+2)
K = 4L
idx <- 1:4
mix <- c(1:3, 10)
down <- 3:1
neg <- c(-1, -2.5)
empty <- integer(0)
emptyr <- double(0)
M <- structure(c(1, 2, 3, 4, 5, 6), .Dim = c(2, 3))
A <- structure(.Data = c(1L, 2L, 3L, 4L, 5L, 6L, 7L, 8L), .Dim = c(2L, 2L, 2L))
inf <- c(Inf, -Inf); flag <- TRUE
`odd name` <- 7
'''


def test_tricky_file_values_and_types():
    d = parse_rdump(TRICKY)
    assert d["N"] == 3 and isinstance(d["N"], int)
    assert d["sigma"] == 2.5 and isinstance(d["sigma"], float)
    assert d["y"] == [1, 2, 3] and all(isinstance(v, int) for v in d["y"])
    assert d["x"] == [0.5, -0.001, 200.0] and all(isinstance(v, float) for v in d["x"])
    assert d["K"] == 4 and d["idx"] == [1, 2, 3, 4] and d["mix"] == [1, 2, 3, 10]
    assert d["down"] == [3, 2, 1] and d["neg"] == [-1.0, -2.5]
    assert d["empty"] == [] and d["emptyr"] == []
    assert d["inf"] == [math.inf, -math.inf] and d["flag"] == 1 and d["odd name"] == 7


def test_structure_is_column_major():
    d = parse_rdump(TRICKY)
    # R fills a 2x3 matrix by columns: [1 3 5; 2 4 6]
    assert d["M"] == [[1, 3, 5], [2, 4, 6]]
    # 2x2x2: element [i, j, k] is 1 + i + 2j + 4k (0-based), first index fastest
    A = d["A"]
    assert all(A[i][j][k] == 1 + i + 2 * j + 4 * k for i in range(2) for j in range(2)
               for k in range(2))


def test_a_mixed_vector_is_real():
    assert parse_rdump("v <- c(1, 2.0, 3)")["v"] == [1.0, 2.0, 3.0]
    assert isinstance(parse_rdump("v <- c(1, 2.0, 3)")["v"][0], float)


def test_na_is_a_named_skip(tmp_path):
    path = tmp_path / "m.data.R"
    path.write_text("N <- 2\ny <- c(1, NA)\n")
    with pytest.raises(RDumpNAError, match=r"m\.data\.R:2: variable 'y' has a missing value"):
        read_rdump(path)


@pytest.mark.parametrize("text, words", [
    ("N <- ", "expected a number"),
    ("M <- structure(c(1, 2, 3), .Dim = c(2, 2))", ".Dim = [2, 2] needs 4 values, found 3"),
    ("x <- c(1, 2", "expected ',' or ')'"),
    ("x <- list(a = 1)", "expected a number"),
    ("<- 3", "expected a variable name"),
])
def test_errors_name_the_problem(text, words):
    with pytest.raises(RDumpError, match=None) as info:
        parse_rdump(text, "bad.R")
    assert words in str(info.value) and "bad.R" in str(info.value)


def test_missing_file_is_an_rdump_error(tmp_path):
    with pytest.raises(RDumpError, match="cannot read the file"):
        read_rdump(tmp_path / "nope.R")


def test_values_load_into_a_stan_model(tmp_path, load_target):
    """The reader's output is accepted by the Stan data layer: bernoulli's data as an R dump."""
    import stanvi
    from conftest import stan_file

    data = parse_rdump("N <- 10\ny <- c(0, 1, 0, 0, 0, 0, 0, 0, 0, 1)\n")
    target = stanvi.load(stan_file("bernoulli"), data, progress=False)
    assert target.dim == 1


def test_character_variables_are_left_out():
    """example-models' radon data carry county names; Stan data cannot hold strings."""
    d = parse_rdump('county_name <- c("AITKIN", "ANOKA")\nN <- 2\nx <- structure(c("a", "b"), .Dim = c(2))\n')
    assert d == {"N": 2}


def test_a_fit_reads_an_r_dump_data_file_as_cmdstan_does(tmp_path):
    """``stanvi.fit(model, data="x.data.R")`` (example-models ships R dump; before, "is not valid
    JSON"): the same data as the JSON file, so the same target; R dump text under another
    name is read too, and an NA names its variable."""
    import json

    import numpy as np

    from stanvi.errors import StanDataError
    from stanvi.stan.data import data_to_json

    rdump = tmp_path / "eight.data.R"
    rdump.write_text('J <- 3L\ny <- c(28, 8, -3)\nsigma <-\nc(15, 10, 16)\n'
                     'm <- structure(c(1, 2, 3, 4, 5, 6), .Dim = c(2, 3))\n')
    got = json.loads(data_to_json(rdump))
    assert got == {"J": 3, "y": [28, 8, -3], "sigma": [15, 10, 16],
                   "m": [[1, 3, 5], [2, 4, 6]]}
    assert isinstance(got["J"], int)
    unnamed = tmp_path / "eight.txt"
    unnamed.write_text("# written by R\n" + rdump.read_text())
    assert json.loads(data_to_json(unnamed)) == got
    bad = tmp_path / "na.R"
    bad.write_text("N <- 2\nx <- c(1, NA)\n")
    with pytest.raises(StanDataError, match="x"):
        data_to_json(bad)
    not_json = tmp_path / "broken.json"
    not_json.write_text("{J: 3")
    with pytest.raises(StanDataError, match="not valid JSON"):
        data_to_json(not_json)
    np.testing.assert_array_equal(got["y"], [28, 8, -3])
