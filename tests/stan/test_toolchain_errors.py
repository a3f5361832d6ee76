"""Bad input gives one clear exception per kind (issue P1-1, "Errors (each a test)").

Compile errors, data errors, a model that throws at some points, NaN input, a zero-parameter
model, missing files and a missing C++ compiler.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

import stanvi
from conftest import data_dict, data_file, stan_file
from stanvi.stan import toolchain
from stanvi.stan.compiler import compile_model

pytestmark = pytest.mark.usefixtures("compile_in_background")


# ---------------------------------------------------------------- compile errors
SYNTAX_ERROR = """\
parameters {
  real mu;
}
model {
  mu ~ normal(0, 1) +;
}
"""

UNKNOWN_FUNCTION = """\
data {
  real y;
}
parameters {
  real mu;
}
model {
  mu ~ normal(0, 1);
  y ~ normal(no_such_function(mu), 1);
}
"""


def test_syntax_error_in_file(tmp_path):
    path = tmp_path / "broken_syntax.stan"
    path.write_text(SYNTAX_ERROR)
    with pytest.raises(stanvi.StanCompileError) as info:
        stanvi.compile(path, progress=False)
    err = info.value
    assert err.line == 5                         # the line with the stray '+'
    assert err.column is not None and err.column >= 19
    assert "Syntax error" in err.stanc_message
    assert err.stanc_message in str(err)
    assert "broken_syntax.stan" in str(err)      # the user's file, not the cache copy
    assert err.path == str(path)


def test_syntax_error_missing_semicolon_points_at_next_token():
    code = "parameters {\n  real mu\n}\nmodel {\n  mu ~ normal(0, 1);\n}\n"
    with pytest.raises(stanvi.StanCompileError) as info:
        compile_model(code, progress=False)
    assert info.value.line == 3
    assert 'Expected ";"' in info.value.stanc_message


def test_unknown_function(tmp_path):
    path = tmp_path / "unknown_fn.stan"
    path.write_text(UNKNOWN_FUNCTION)
    with pytest.raises(stanvi.StanCompileError) as info:
        stanvi.load(path, {"y": 1.0}, progress=False)
    err = info.value
    assert err.line == 9
    assert "no_such_function" in err.stanc_message
    assert "Semantic error" in err.stanc_message


def test_compile_error_is_a_stanvi_error():
    with pytest.raises(stanvi.StanviError):
        compile_model("parameters { real mu; } model { mu ~ normal(0, 1) }", progress=False)


# ---------------------------------------------------------------- data errors
BERNOULLI_BAD_DATA = [
    pytest.param({"N": 10}, "y", id="missing-variable"),
    pytest.param({"y": [0] * 10}, "N", id="missing-N"),
    pytest.param({"N": 10, "y": [0] * 9}, "y", id="wrong-length"),
    pytest.param({"N": 10, "y": [[0] * 10]}, "y", id="wrong-number-of-dimensions"),
    pytest.param({"N": 10.5, "y": [0] * 10}, "N", id="real-for-int"),
    pytest.param({"N": 10, "y": [0.5] * 10}, "y", id="real-array-for-int-array"),
    pytest.param({"N": -1, "y": []}, "N", id="lower-bound-violated"),
    pytest.param({"N": 10, "y": [2] + [0] * 9}, "y", id="upper-bound-violated"),
]


@pytest.mark.parametrize(("data", "variable"), BERNOULLI_BAD_DATA)
def test_data_error_names_variable(compiled, data, variable):
    with pytest.raises(stanvi.StanDataError) as info:
        stanvi.load(compiled("bernoulli"), data, progress=False)
    assert info.value.variable == variable
    assert f"'{variable}'" in str(info.value)


def test_constraint_on_real_array_violated(compiled):
    data = data_dict("eight_schools")
    data["sigma"] = [15, 10, -16, 11, 9, 11, 10, 18]
    with pytest.raises(stanvi.StanDataError) as info:
        stanvi.load(compiled("eight_schools"), data, progress=False)
    assert info.value.variable == "sigma"
    assert "-16" in str(info.value)


def _asymmetric(sigma):
    sigma = sigma.copy()
    sigma[0, 1] += 0.5
    return sigma


def _indefinite(sigma):
    sigma = sigma.copy()
    sigma[0, 0] = -1.0
    return sigma


@pytest.mark.exposes_bug(
    "stanvi/stan/data.py _VARIABLE_PATTERNS only recognizes '<var> is X, but must be Y' "
    "messages; Stan's matrix-constraint messages ('Sigma is not symmetric. ...', 'Sigma is not "
    "positive definite.') do not contain 'but must be', so StanDataError.variable is None")
@pytest.mark.parametrize("corrupt", [_asymmetric, _indefinite], ids=["asymmetric", "indefinite"])
def test_cov_matrix_constraint_violated(compiled, corrupt):
    data = data_dict("gaussian")
    data["Sigma"] = corrupt(np.asarray(data["Sigma"], dtype=float))
    with pytest.raises(stanvi.StanDataError) as info:
        stanvi.load(compiled("gaussian"), data, progress=False)
    assert "Sigma" in str(info.value)
    assert info.value.variable == "Sigma"


@pytest.mark.parametrize("text", ['{"N": 10, "y": [0, 1,', "{N: 10}", '{"N": 10, "y": [0]]}'])
def test_invalid_json_string(compiled, text):
    with pytest.raises(stanvi.StanDataError, match="not valid JSON"):
        stanvi.load(compiled("bernoulli"), text, progress=False)


def test_invalid_json_file_and_missing_data_file(compiled, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"N": 10,')
    with pytest.raises(stanvi.StanDataError, match="bad.json"):
        stanvi.load(compiled("bernoulli"), bad, progress=False)
    with pytest.raises(stanvi.StanDataError, match="not found"):
        stanvi.load(compiled("bernoulli"), tmp_path / "missing.json", progress=False)


def test_unconstrain_invalid_values_is_data_error(constrained_params):
    good = constrained_params.constrain(np.zeros((1, constrained_params.dim)), include_tp=False,
                                        include_gq=False)
    values = {k: v[0] for k, v in good.items()}
    values["pi"] = np.array([0.5, 0.5, 0.5, 0.5])      # not a simplex
    with pytest.raises(stanvi.StanDataError, match="simplex"):
        constrained_params.unconstrain(values)


# ---------------------------------------------------------------- models that throw
def _reject_points(target):
    names = target.unconstrained_names
    assert names == ["x", "sigma"]
    # rows 1 and 3 have x > 2 (rejected); x == 2 exactly is allowed
    return np.array([[0.0, 0.0], [3.0, 0.0], [2.0, 0.1], [2.5, -1.0], [1.5, 0.3], [1e6, 0.0]])


REJECTED = np.array([False, True, False, True, False, True])


@pytest.mark.parametrize("kind", ["log_density", "gradient", "hvp"])
def test_reject_gives_row_status(reject_region, kind):
    t = reject_region
    z = _reject_points(t)
    call = {"log_density": lambda a: t.log_density(a),
            "gradient": lambda a: t.log_density_gradient(a),
            "hvp": lambda a: t.log_density_hvp(a, np.ones_like(a))}[kind]
    res = call(z)
    np.testing.assert_array_equal(res.ok, ~REJECTED)
    assert np.all(res.log_density[REJECTED] == -np.inf)
    assert set(res.messages) == set(np.flatnonzero(REJECTED).tolist())
    for row, msg in res.messages.items():
        assert "x must be at most 2" in msg
        assert f"got {z[row, 0]:g}" in msg
    # the good rows are what they would be on their own
    alone = call(z[~REJECTED])
    assert alone.ok.all()
    np.testing.assert_array_equal(res.log_density[~REJECTED], alone.log_density)
    assert np.all(np.isfinite(res.log_density[~REJECTED]))
    if kind != "log_density":
        assert np.isnan(res.gradient[REJECTED]).all()
        np.testing.assert_array_equal(res.gradient[~REJECTED], alone.gradient)
        assert np.isfinite(res.gradient[~REJECTED]).all()
    if kind == "hvp":
        assert np.isnan(res.hvp[REJECTED]).all()
        np.testing.assert_array_equal(res.hvp[~REJECTED], alone.hvp)


def test_reject_single_calls_raise(reject_region):
    t = reject_region
    bad = np.array([3.0, 0.0])
    for call in (lambda: t.log_density_at(bad), lambda: t.gradient_at(bad),
                 lambda: t.hvp_at(bad, np.ones(2))):
        with pytest.raises(stanvi.ModelEvaluationError, match="x must be at most 2, got 3"):
            call()
    # a good point does not raise, and the model is still usable after the failures
    assert np.isfinite(t.log_density_at(np.array([1.0, 0.0])))


def test_reject_region_log_density_is_right_where_defined(reject_region):
    """Closed form on x <= 2: normal(0, 5) prior, exponential(1) on sigma = exp(s), normal
    likelihood, plus the log Jacobian s."""
    y = np.asarray(data_dict("reject_region")["y"], dtype=float)
    x, s = 1.2, -0.3
    sigma = np.exp(s)
    expected = (-0.5 * (x / 5) ** 2 - np.log(5) - 0.5 * np.log(2 * np.pi)
                - sigma
                + np.sum(-0.5 * ((y - x) / sigma) ** 2 - np.log(sigma) - 0.5 * np.log(2 * np.pi))
                + s)
    np.testing.assert_allclose(reject_region.log_density_at(np.array([x, s])), expected,
                               rtol=1e-13)


# ---------------------------------------------------------------- NaN in, NaN out
@pytest.mark.parametrize("key", ["reject_region", "gaussian", "eight_schools"])
def test_nan_input_gives_nan_not_crash(load_target, key):
    t = load_target(key)
    z = np.zeros((4, t.dim))
    z[1, 0] = np.nan
    z[3, :] = np.nan
    for res in (t.log_density(z), t.log_density_gradient(z), t.log_density_hvp(z, np.ones_like(z))):
        assert np.isnan(res.log_density[[1, 3]]).all()
        np.testing.assert_array_equal(res.ok, [True, False, True, False])
        assert np.isfinite(res.log_density[[0, 2]]).all()
        if res.gradient is not None:
            assert np.isnan(res.gradient[[1, 3]]).all()
            assert np.isfinite(res.gradient[[0, 2]]).all()
    with pytest.raises(stanvi.ModelEvaluationError):
        t.log_density_at(z[1])
    # constrain of a NaN row: NaN values (or the row reported failed), never a crash
    flat, status = t.constrain_flat(z)
    assert np.isfinite(flat[0]).all()
    assert (not status.ok[1]) or np.isnan(flat[1]).any()


def test_infinite_input_fails_cleanly(gaussian):
    z = np.zeros((2, gaussian.dim))
    z[0, 3] = np.inf
    res = gaussian.log_density_gradient(z)
    np.testing.assert_array_equal(res.ok, [False, True])
    assert res.log_density[0] == -np.inf or np.isnan(res.log_density[0])


# ---------------------------------------------------------------- zero parameters
# data { real y; } parameters { } model { } generated quantities { real y2 = 2 * y; }
ZERO_PARAMETER_MODEL = Path(__file__).resolve().parents[1] / "models" / "zero_parameters.stan"


def test_zero_parameter_model():
    """Loads with dim 0.  Evaluating it at a (1, 0) point currently works and gives log density
    0 (an empty model block); fitting it is to be rejected at fit time (a later issue)."""
    t = stanvi.load(ZERO_PARAMETER_MODEL, {"y": 1.25}, progress=False)
    assert t.dim == 0
    assert t.unconstrained_names == []
    res = t.log_density(np.zeros((1, 0)))
    assert res.ok.all() and res.log_density.tolist() == [0.0]
    res = t.log_density_gradient(np.zeros((3, 0)))
    assert res.gradient.shape == (3, 0) and res.log_density.tolist() == [0.0] * 3
    assert t.constrain(np.zeros((2, 0)))["y2"].tolist() == [2.5, 2.5]
    assert t.initial_point().shape == (0,)


# ---------------------------------------------------------------- missing files
def test_missing_stan_file(tmp_path):
    missing = tmp_path / "nope.stan"
    with pytest.raises(FileNotFoundError):
        stanvi.compile(missing, progress=False)
    with pytest.raises(FileNotFoundError):
        stanvi.load(missing, progress=False)
    with pytest.raises(FileNotFoundError):
        stanvi.load(str(missing), progress=False)
    with pytest.raises(FileNotFoundError):
        compile_model(str(tmp_path / "no_extension"), progress=False)


def test_missing_library(tmp_path):
    with pytest.raises(FileNotFoundError):
        stanvi.load(tmp_path / "libmissing.so")


def test_library_without_stanvis_entry_points_is_named(tmp_path):
    """A library built by an older stanvi bridge (an example-models run's cache, loaded by
    path) lacked ``stanvi_multi_gradient``: a ctypes AttributeError before, a ToolchainError
    naming the missing entry points and the remedy now."""
    import subprocess  # noqa: PLC0415

    from stanvi.stan.library import BatchedLibrary  # noqa: PLC0415

    source = tmp_path / "other.cpp"
    source.write_text('extern "C" int stanvi_hvp_is_exact() { return 1; }\n')
    lib = tmp_path / "libother.so"
    subprocess.run([toolchain.find_toolchain().cxx, "-shared", "-fPIC", "-o", str(lib),
                    str(source)], check=True)
    with pytest.raises(stanvi.ToolchainError, match="lacks stanvi's entry point") as caught:
        BatchedLibrary(lib)
    text = str(caught.value)
    assert "stanvi_batch_log_density" in text and "stanvi_multi_gradient" in text
    assert "stanvi_hvp_is_exact" not in text and "recompile the model" in text


# ---------------------------------------------------------------- no compiler
@pytest.fixture
def fresh_toolchain_lookup(monkeypatch, all_compiled):
    """Clears find_toolchain's cache around a test that changes $CXX (after every background
    compile has finished, so none of them sees the fake compiler), and restores it after."""
    toolchain.find_toolchain.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    toolchain.find_toolchain.cache_clear()


def test_missing_compiler_says_what_to_install(fresh_toolchain_lookup, tmp_path, compiled):
    fresh_toolchain_lookup.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(stanvi.ToolchainError) as info:
        compile_model("parameters { real a; } model { a ~ normal(0, 1); }", progress=False)
    msg = str(info.value)
    assert "no-such-g++" in msg
    assert "install" in msg.lower() and "g++" in msg
    with pytest.raises(stanvi.ToolchainError):
        stanvi.load(stan_file("bernoulli"), progress=False)
    # an already-built library needs no compiler
    t = stanvi.load(compiled("bernoulli").library, data_file("bernoulli"))
    assert np.isfinite(t.log_density_at(np.zeros(1)))


def test_broken_compiler_is_toolchain_error(fresh_toolchain_lookup):
    fresh_toolchain_lookup.setenv("CXX", "false")        # exists, but fails to run --version
    with pytest.raises(stanvi.ToolchainError):
        toolchain.find_toolchain()


def test_opt_level_is_in_the_flags_and_the_cache_key(all_compiled, monkeypatch):
    """$STANVI_OPT_LEVEL (the suite's -O1, tests/conftest.py) replaces -O3 in every build's
    flags and gives those builds their own fingerprint, so their own cache directory: a test
    build is never served to a user's fit.  Unset, flags and fingerprint are the -O3 ones every
    existing cache was built with.  (After the background compiles: none of them may see the
    variable change.)"""
    tc = toolchain.find_toolchain()
    monkeypatch.delenv(toolchain.OPT_LEVEL_ENV, raising=False)
    assert toolchain.opt_level() == "-O3"
    before = hashlib.sha256()   # the fingerprint as computed before the setting existed
    for part in (tc.stanc_version, tc.cxx_version, str(tc.include_dir),
                 " ".join(toolchain.BASE_FLAGS)):
        before.update(part.encode() + b"\0")
    assert tc.fingerprint == before.hexdigest()[:16]
    prints = {tc.fingerprint}
    for value, level in (("-O1", "-O1"), ("O2", "-O2"), (" -O0 ", "-O0"), ("-O3", "-O3")):
        monkeypatch.setenv(toolchain.OPT_LEVEL_ENV, value)
        assert toolchain.opt_level() == level
        for exact in (True, False):
            flags = tc.compile_flags(exact)
            assert [f for f in flags if f.startswith("-O")] == [level]
            assert len(flags) == len(toolchain.BASE_FLAGS) + 1 + exact
        prints.add(tc.fingerprint)
    assert len(prints) == 4
    monkeypatch.setenv(toolchain.OPT_LEVEL_ENV, "-O7")
    with pytest.raises(stanvi.ToolchainError, match="STANVI_OPT_LEVEL='-O7'.*-O1"):
        tc.fingerprint  # noqa: B018
    with pytest.raises(stanvi.ToolchainError, match="STANVI_OPT_LEVEL"):
        tc.compile_flags(True)


def test_toolchain_found_normally(all_compiled):
    tc = toolchain.find_toolchain()
    assert tc.stanc.is_file()
    assert (tc.include_dir / "stan" / "model" / "model_header.hpp").is_file()
    assert "stanc" in tc.stanc_version.lower()


def test_a_library_or_a_zip_given_as_program_or_data_is_named(tmp_path):
    """A compiled library passed where a .stan program is expected, and a zipped data file, were
    a raw UnicodeDecodeError; now a StanCompileError / StanDataError saying what the file is."""
    import zipfile

    from stanvi.errors import StanCompileError, StanDataError
    from stanvi.stan.compiler import compile_model
    from stanvi.stan.data import data_to_json

    lib = tmp_path / "model.so"
    lib.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 4)
    with pytest.raises(StanCompileError, match="compiled model library"):
        compile_model(lib, progress=False)
    zipped = tmp_path / "data.json.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("data.json", '{"N": 1}')
    with pytest.raises(StanDataError, match="zip archive"):
        data_to_json(zipped)
