"""Data that a model cannot use: the StanDataError says what is wrong in the user's terms
(stanvi/stan/data.py; issue T3-5 item 4): no data at all is "needs data and none were given",
a variable the data lack is "needs data variable N, which the data do not give", anything
else is what Stan rejected."""

from __future__ import annotations

import json

import pytest

import stanvi
from stanvi.errors import StanDataError
from stanvi.reference import pathfinder
from stanvi.stan.data import data_error_from_stan
from conftest import data_file

MISSING_N = ("Error in model construction: Exception: variable does not exist; processing "
             "stage=data initialization; variable name=N; base type=int (in 'bernoulli.stan', "
             "line 4, column 2 to column 17)")


def test_no_data_is_said_to_be_missing():
    err = data_error_from_stan(MISSING_N, "bernoulli", "")
    assert err.variable == "N"
    assert str(err).startswith("model 'bernoulli' needs data (it reads 'N' first) and none "
                               "were given")
    assert "--data" in str(err) and "rejected" not in str(err)


def test_a_variable_the_data_lack_is_named_with_what_they_give():
    err = data_error_from_stan(MISSING_N, "bernoulli", json.dumps({"y": [1, 0], "K": 2}))
    assert str(err).startswith("model 'bernoulli' needs data variable 'N', which the data do "
                               "not give (they give K, y)")


def test_other_rejections_and_unknown_data_keep_stans_words():
    bad = ("Error in model construction: Exception: bernoulli_model: y[1] is 3, but must be "
           "in the interval [0, 1]")
    assert str(data_error_from_stan(bad, "bernoulli", '{"N": 1, "y": [3]}')).startswith(
        "model 'bernoulli' rejected data variable 'y'")
    # without the data as given (an older caller), the message stays Stan's
    assert "rejected data variable 'N'" in str(data_error_from_stan(MISSING_N, "bernoulli"))


def test_a_fit_and_a_stan_algorithm_without_data_say_so(compiled):
    with pytest.raises(StanDataError, match="needs data .* none were given"):
        stanvi.fit(compiled("bernoulli"), progress=False)
    with pytest.raises(StanDataError, match="needs data variable 'N', which the data do not give"):
        stanvi.fit(compiled("bernoulli"), {"y": [0, 1]}, progress=False)
    with pytest.raises(StanDataError, match="needs data .* none were given"):
        pathfinder(compiled("bernoulli"))
    assert json.loads(data_file("bernoulli").read_text())["N"] > 0   # the model does read N
