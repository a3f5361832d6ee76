"""The first fit in a new process (issue 8, part 3): JAX's persistent compilation cache is on by
default in stanvi's cache directory and can be turned off, it actually serves a new process (no
program compiled again), bucketed batch sizes give exactly the values of unpadded evaluation, and
the same seed gives the same result in one process and across processes.

These tests check correctness, not wall time (``stanvi bench coldstart`` measures that).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import stanvi
from stanvi.bench import coldstart
from stanvi.estimators.registry import estimator_for
from stanvi.estimators.elbo import ElboEstimator, bucket
from stanvi.families import make_family

from conftest import data_file, stan_file

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, env_changes: dict[str, str | None], timeout: float = 600) -> str:
    """Run ``code`` in a fresh interpreter with the environment changed; return its stdout."""
    env = dict(os.environ)
    for name, value in env_changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


_SHOW_CONFIG = """
import json, jax, stanvi
print(json.dumps({"dir": jax.config.jax_compilation_cache_dir,
                  "enabled": jax.config.jax_enable_compilation_cache,
                  "min_time": jax.config.jax_persistent_cache_min_compile_time_secs,
                  "reported": stanvi.jax_config.persistent_cache_dir()}))
"""


# ------------------------------------------------------------------ configuration

def test_persistent_cache_on_by_default_in_stanvi_cache_dir(tmp_path):
    out = json.loads(_python(_SHOW_CONFIG, {"STANVI_CACHE_DIR": str(tmp_path),
                                            "STANVI_JAX_CACHE": None,
                                            "JAX_COMPILATION_CACHE_DIR": None}))
    assert out["dir"] == str(tmp_path / "jax")
    assert out["enabled"] is True
    assert out["min_time"] == 0.0  # small programs are persisted too
    assert out["reported"] == str(tmp_path / "jax")


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_persistent_cache_off_by_environment(tmp_path, value):
    out = json.loads(_python(_SHOW_CONFIG, {"STANVI_CACHE_DIR": str(tmp_path),
                                            "STANVI_JAX_CACHE": value,
                                            "JAX_COMPILATION_CACHE_DIR": None}))
    assert out["enabled"] is False
    assert out["reported"] is None


def test_persistent_cache_off_and_on_in_process(tmp_path):
    code = f"""
import json, jax, stanvi
from stanvi import jax_config
jax_config.set_persistent_cache(False)
off = (jax_config.persistent_cache_dir(), jax.config.jax_enable_compilation_cache)
jax.jit(lambda x: x + 1)(1.0).block_until_ready()
jax_config.set_persistent_cache(True, directory={str(tmp_path / 'elsewhere')!r})
on = jax_config.persistent_cache_dir()
jax.jit(lambda x: x * 3.0 - 1)(1.0).block_until_ready()
print(json.dumps({{"off": off, "on": on}}))
"""
    out = json.loads(_python(code, {"STANVI_CACHE_DIR": str(tmp_path), "STANVI_JAX_CACHE": None,
                                    "JAX_COMPILATION_CACHE_DIR": None}))
    assert out["off"] == [None, False]
    assert out["on"] == str(tmp_path / "elsewhere")
    # nothing was written while off (the default directory stays empty); the program compiled
    # after turning it on was persisted in the new directory
    assert not list((tmp_path / "jax").glob("*-cache")) if (tmp_path / "jax").exists() else True
    assert list((tmp_path / "elsewhere").glob("*-cache"))


def test_users_own_jax_cache_directory_is_kept(tmp_path):
    out = json.loads(_python(_SHOW_CONFIG, {"STANVI_CACHE_DIR": str(tmp_path / "stanvi"),
                                            "STANVI_JAX_CACHE": None,
                                            "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "mine")}))
    assert out["dir"] == str(tmp_path / "mine")
    assert out["min_time"] == 0.0


# ------------------------------------------------------------------ the cache serves a new process

_FIT_COUNTING = """
import json, sys, jax, numpy as np, stanvi
from stanvi import jax_config
jax_config.set_persistent_cache(True, directory=sys.argv[1])
events = {"hits": 0, "misses": 0}
def listen(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits":
        events["hits"] += 1
    elif event == "/jax/compilation_cache/cache_misses":
        events["misses"] += 1
jax.monitoring.register_event_listener(listen)
fit = stanvi.fit(sys.argv[2], data=sys.argv[3], method=sys.argv[4], family=sys.argv[5],
                 seed=11, progress=False)
print("RESULT " + json.dumps({**events, "params": fit.params.tolist(),
                              "theta": fit.stan_variable("theta")[:50].tolist(),
                              "bridge": fit.target.jax_log_density.backend}))
"""


def _fit_in_new_process(cache_dir: Path, method: str, family: str, host_path: str = "1") -> dict:
    env = dict(os.environ, STANVI_HOST_PATH=host_path)
    env.pop("STANVI_JAX_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", _FIT_COUNTING, str(cache_dir),
                           str(stan_file("eight_schools")), str(data_file("eight_schools")),
                           method, family], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line.split(" ", 1)[1])


@pytest.mark.parametrize("method,family,host_path", [("trustvi", "fullrank", "0"),
                                                     ("advi", "meanfield", "1")])
def test_persistent_cache_serves_the_next_process(tmp_path, eight_schools, method, family,
                                                  host_path):
    """A second process fitting the same model compiles nothing: every program comes from the
    cache (with the state's address in the FFI attribute, every lookup missed), and both
    processes give the same result for the same seed.  TrustVI runs on the NumPy host path and
    compiles no program at all (tests/estimators/test_host_estimator.py); with ``STANVI_HOST_PATH=0`` it
    runs its JAX programs, the ones to cache."""
    del eight_schools  # compiled (and its HVP choice stored) by the session fixture
    cache_dir = tmp_path / "jax"
    first = _fit_in_new_process(cache_dir, method, family, host_path)
    entries = sorted(p.name for p in cache_dir.glob("*-cache"))
    assert first["misses"] > 0 and entries
    second = _fit_in_new_process(cache_dir, method, family, host_path)
    if second["bridge"] == "ffi":  # pure_callback programs are never persisted by JAX
        assert second["misses"] == 0
        assert second["hits"] >= first["misses"]
        assert sorted(p.name for p in cache_dir.glob("*-cache")) == entries
    assert second["params"] == first["params"]
    assert second["theta"] == first["theta"]


# ------------------------------------------------------------------ bucketing

def test_bucket_is_the_next_power_of_two():
    assert [bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 100, 128, 129, 1000, 4096, 4097)] == [
        1, 2, 4, 4, 8, 8, 16, 128, 128, 256, 1024, 4096, 8192]
    with pytest.raises(ValueError):
        bucket(0)


def _all_rowwise(est: ElboEstimator, params, other, eps) -> list[np.ndarray]:
    return [est.values(params, eps, bucketed=True),
            *est.values_and_grads(params, eps, bucketed=True),
            est.pair_differences(other, params, eps, bucketed=True),
            *est.log_p_and_q(params, eps)]


def _setup(target, family_name: str, rng, near_boundary: bool = False):
    fam = make_family(family_name, target.dim)
    params = np.asarray(fam.initial_params(rng.normal(size=target.dim) * 0.5, -0.3))
    params = params + 0.05 * rng.normal(size=fam.n_params)
    if near_boundary:  # reject_region: x's mean near the rejection boundary (x > 2 throws)
        params[0] = 1.9
    other = params + 0.01 * rng.normal(size=fam.n_params)
    padded = ElboEstimator(fam, target.jax_log_density, counter=target.counter)
    plain = ElboEstimator(fam, target.jax_log_density, counter=target.counter, bucketing=False)
    return fam, params, other, padded, plain


SIZES = (1, 3, 5, 100, 1000, 1500)


@pytest.mark.parametrize("family_name", ["meanfield", "fullrank"])
@pytest.mark.parametrize("key", ["eight_schools", "gaussian"])
def test_bucketed_rowwise_calls_equal_unpadded_exactly(load_target, key, family_name):
    """Values, per-draw gradients, matched pairs and output draws at padded batch sizes are
    bit-for-bit those of the unpadded call, and the target's counter counts the real draws
    only."""
    target = load_target(key)
    rng = np.random.default_rng(7)
    fam, params, other, padded, plain = _setup(target, family_name, rng)
    for n in SIZES:
        eps = rng.normal(size=(n, target.dim))
        c0 = target.counter.snapshot()
        got = _all_rowwise(padded, params, other, eps)
        c1 = target.counter.snapshot()
        want = _all_rowwise(plain, params, other, eps)
        c2 = target.counter.snapshot()
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.shape[0] == n
            np.testing.assert_array_equal(g, w)
        assert {k: c1[k] - c0[k] for k in c0} == {k: c2[k] - c1[k] for k in c0}
        assert c2["gradient"] - c1["gradient"] == n
    # only bucket sizes were compiled for the padded estimator
    rows = padded._rows["values"]
    assert {sig[rows.rows_arg][0] for sig in rows.compiled.signatures} == {
        bucket(n) for n in SIZES}


@pytest.mark.parametrize("family_name", ["meanfield", "fullrank"])
def test_bucketing_with_failing_draws_and_tiny_dimension(load_target, family_name):
    """reject_region (D = 2) throws on part of q's mass: padded calls fail at exactly the same
    draws and count exactly the real draws.  With D = 2 XLA vectorizes elementwise work across
    the flattened rows, so a draw's value can move in its last bits with the batch size; that
    is already so between two unpadded sizes, and padding moves it no further."""
    target = load_target("reject_region")
    rng = np.random.default_rng(7)
    fam, params, other, padded, plain = _setup(target, family_name, rng, near_boundary=True)
    big = rng.normal(size=(2048, target.dim))
    reference = _all_rowwise(plain, params, other, big)  # unpadded, 2048 draws
    saw_failure = False
    for n in SIZES:
        eps = big[:n]
        c0 = target.counter.snapshot()
        got = _all_rowwise(padded, params, other, eps)
        c1 = target.counter.snapshot()
        want = _all_rowwise(plain, params, other, eps)
        c2 = target.counter.snapshot()
        assert {k: c1[k] - c0[k] for k in c0} == {k: c2[k] - c1[k] for k in c0}
        for g, w, r in zip(got, want, reference):
            assert g.shape == w.shape and g.shape[0] == n
            np.testing.assert_array_equal(np.isfinite(g), np.isfinite(w))
            np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
            ok = np.isfinite(w)
            np.testing.assert_allclose(g[ok], w[ok], rtol=1e-13, atol=1e-13)
            np.testing.assert_allclose(w[ok], r[:n][ok], rtol=1e-13, atol=1e-13)
        saw_failure |= bool(np.isneginf(want[0]).any())
    assert saw_failure  # the comparison covered draws where the model throws


def test_bucketing_jax_target_counts_nothing_extra():
    """A plain JAX target's counter does not see draws inside XLA; nothing is subtracted."""
    target = stanvi.JaxTarget(lambda z: -0.5 * (z @ z), 3)
    fam = make_family("meanfield", 3)
    est = estimator_for(target, fam)
    before = target.counter.snapshot()
    v = est.values(np.zeros(fam.n_params), np.ones((5, 3)))
    assert v.shape == (5,)
    assert target.counter.snapshot() == before


@pytest.mark.parametrize("method,family", [("advi", "meanfield"), ("trustvi", "fullrank")])
def test_fit_with_bucketing_equals_fit_without(load_target, compiled, method, family):
    """Whole fits: bucketed (the 1000 output draws run at 1024) and unpadded runs give identical
    parameters, draws, diagnostics and counts."""
    results = []
    for bucketing in (True, False):
        target = stanvi.load(compiled("eight_schools"), data_file("eight_schools"),
                             progress=False, hvp_method="exact")
        fam = make_family(family, target.dim)
        estimator_for(target, fam).bucketing = bucketing
        before = target.counter.snapshot()
        fit = stanvi.fit(target, method=method, family=family, seed=5, progress=False,
                         max_oracle_calls=60.0)
        results.append((fit, {k: v - before[k] for k, v in target.counter.snapshot().items()}))
    (a, count_a), (b, count_b) = results
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.unconstrained_draws, b.unconstrained_draws)
    np.testing.assert_array_equal(a.log_p, b.log_p)
    np.testing.assert_array_equal(a.log_q, b.log_q)
    for name in a.draws:
        np.testing.assert_array_equal(a.draws[name], b.draws[name])
    assert a.oracle == b.oracle
    assert count_a == count_b
    assert a.diagnostics().khat == b.diagnostics().khat


def test_same_seed_same_result_in_one_process(eight_schools):
    fits = [stanvi.fit(eight_schools, method="trustvi", family="meanfield", seed=3,
                       progress=False) for _ in range(2)]
    np.testing.assert_array_equal(fits[0].params, fits[1].params)
    for name in fits[0].draws:
        np.testing.assert_array_equal(fits[0].draws[name], fits[1].draws[name])
    other = stanvi.fit(eight_schools, method="trustvi", family="meanfield", seed=4, progress=False)
    assert not np.array_equal(other.params, fits[0].params)


# ------------------------------------------------------------------ the benchmark's plumbing

def test_coldstart_child_reports_every_figure():
    """One child process of ``stanvi bench coldstart`` (no timing is checked)."""
    out = coldstart.run_child(coldstart.DEFAULT_MODEL, coldstart.DEFAULT_DATA, "advi",
                              "meanfield")
    for figure in coldstart.FIGURES:
        assert out[figure] >= 0.0
    assert out["fit"] >= out["setup"] + out["wall"] - 1e-9
    assert out["e2e"] >= out["import"] + out["fit"]
    assert out["status"] in ("converged", "max_iters", "budget")
    assert out["cpu"] > 0.0 and out["cpu_import"] > 0.0 and out["cpu_fit"] > 0.0
    assert out["cpu"] >= out["cpu_import"] + out["cpu_fit"] - 0.05  # the child's own share
    assert "verdict" not in out             # progress=False: the verdict is left to be asked for
    res = coldstart.ColdStartResult("advi", "meanfield", runs=[out])
    table = coldstart.format_table([res])
    assert "advi" in table and "cpu" in table and "load" in table


def test_coldstart_child_with_the_verdict_times_it_apart():
    out = coldstart.run_child(coldstart.DEFAULT_MODEL, coldstart.DEFAULT_DATA, "trustvi",
                              "meanfield", verdict=True)
    assert out["verdict"] > 0.0
    assert out["e2e"] >= out["import"] + out["fit"] + out["verdict"]


# ------------------------------------------------------------------ what a fit imports

HEAVY_MODULES = ("arviz_stats", "arviz_base", "arviz_plots", "pandas", "xarray", "matplotlib",
                 "scipy.stats")

_IMPORTS_OF_A_FIT = """
import json, sys
import stanvi
after_import = sorted(m for m in sys.modules if m.split(".")[0] in
                      ("arviz_stats", "arviz_base", "arviz_plots", "pandas", "xarray",
                       "matplotlib", "scipy"))
fit = stanvi.fit(sys.argv[1], data=sys.argv[2], method=sys.argv[3], family=sys.argv[4],
                 progress=False)
fit.diagnostics()
print("IMPORTS " + json.dumps({"import": after_import, "fit": sorted(sys.modules),
                               "verdict": fit.diagnostics().verdict}))
"""


@pytest.mark.parametrize("method,family", [("trustvi", "fullrank"), ("advi", "meanfield")])
def test_import_and_fit_import_nothing_heavy(eight_schools, method, family):
    """``import stanvi`` and a fit (with its diagnostics line) import neither ArviZ nor pandas,
    xarray, matplotlib or scipy.stats (issue 8 part 3: ~1 s of a first fit was arviz_stats'
    import for the k-hat); ``import stanvi`` imports no SciPy at all, a mean-field ADVI fit
    none, and TrustVI's Laplace warm start only SciPy's L-BFGS-B extension, not scipy.optimize
    (~0.3 s).  (jaxlib imports scipy.linalg.cython_lapack for its LAPACK kernels when a program
    with a Cholesky or a triangular solve is lowered: full-rank.)"""
    out = subprocess.run([sys.executable, "-c", _IMPORTS_OF_A_FIT, str(coldstart.DEFAULT_MODEL),
                          str(coldstart.DEFAULT_DATA), method, family], capture_output=True,
                         text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("IMPORTS ")][-1]
    got = json.loads(line.split(" ", 1)[1])
    assert got["import"] == []
    loaded = set(got["fit"])
    assert not [m for m in loaded if m.split(".")[0] in HEAVY_MODULES or m in HEAVY_MODULES
                or m.startswith("scipy.stats")]
    if method == "advi":
        assert not [m for m in loaded if m.split(".")[0] == "scipy"]
    assert "scipy.optimize" not in loaded
    assert got["verdict"] in ("good", "use with care", "unreliable")
