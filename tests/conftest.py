"""Shared fixtures: the project's example models, each compiled once per test run.

Compiling a model takes ~10 s (the ODE model more: it needs the finite-difference toolchain
build), so the first fixture that asks for a model starts compiling *all* of them in the
background, two at a time (g++ is single-threaded), in the order the test files need them.
A test then waits only for the model it uses.  Loaded targets are session-scoped too: tests that
look at the oracle counter compare snapshots, never absolute values.

The compile cache is whatever ``$STANVI_CACHE_DIR`` (default ``~/.cache/stanvi``) says; tests that
exercise the cache itself use programs with a random comment, so they never meet a stale entry.
Models are built at ``-O1`` (``$STANVI_OPT_LEVEL``, set below): the level is part of the
toolchain fingerprint, so these builds have cache entries of their own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

# The suite builds its Stan models at -O1, not the users' -O3 (stanvi/stan/toolchain.py; figures
# in docs/models_and_targets.md#optimization-level): a fresh clone's run compiles ~45 models,
# ~20% less g++ time, while the suite's model evaluations cost about the same CPU.  Set here,
# before anything compiles, so the xdist workers and every subprocess a test starts (CLI, batch
# workers) inherit it and share one cache; an explicit $STANVI_OPT_LEVEL is kept.
os.environ.setdefault("STANVI_OPT_LEVEL", "-O1")
# One BLAS thread per test process (NumPy's and SciPy's OpenBLAS), as stanvi's fits already run
# (stanvi.methods.blas_threads), here for the tests' own NumPy too: two xdist workers share two
# cores with background g++ compiles, and idle OpenBLAS workers spin.  With two busy processes
# beside it, tests/optim/test_warm_start_lbfgsb.py's quad30 case took 37 s with two BLAS
# threads, 2.3 s with one (1.4 s on an idle machine).  tests/methods/test_blas_threads.py gives
# itself two.  Set before NumPy is imported, so subprocesses inherit it too.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# XLA compiles the suite's JAX programs with LLVM's optimizations off, as tests/gp's estimator
# tests already did: the suite compiles thousands of small programs that each run briefly, and a
# fresh clone (empty JAX cache) spends about as much CPU compiling them as compiling Stan models.
# On the JAX-heavy tests (estimators, discrete, families, test_trustvi; cache off) it cut CPU
# time 447 -> 334 s.  XLA_FLAGS is part of JAX's cache key: these programs are never served to a
# user's process.  Set before JAX starts its backend; flags already in XLA_FLAGS are kept.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join(filter(None, (
        os.environ.get("XLA_FLAGS", "").strip(), "--xla_backend_optimization_level=0",
        "--xla_llvm_disable_expensive_passes=true")))

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import stanvi  # noqa: E402
from stanvi.stan.compiler import CompiledModel, compile_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = ROOT / "stan_models"

# key -> (stan file, data file), in the order compilation is started (slowest first).
MODELS: dict[str, tuple[str, str | None]] = {
    "ode": ("ode/ode.stan", "ode/ode.data.json"),
    "eight_schools": ("eight_schools/eight_schools_noncentered.stan",
                      "eight_schools/eight_schools.data.json"),
    "gaussian": ("gaussian/gaussian.stan", "gaussian/gaussian.data.json"),
    "constrained_params": ("constrained_params/constrained_params.stan",
                           "constrained_params/constrained_params.data.json"),
    "hierarchical_radon": ("hierarchical_radon/hierarchical_radon.stan",
                           "hierarchical_radon/hierarchical_radon.data.json"),
    "reject_region": ("reject_region/reject_region.stan", "reject_region/reject_region.data.json"),
    "tp_gq": ("tp_gq/tp_gq.stan", "tp_gq/tp_gq.data.json"),
    "bernoulli": ("bernoulli/bernoulli.stan", "bernoulli/bernoulli.data.json"),
    "eight_schools_centered": ("eight_schools/eight_schools_centered.stan",
                               "eight_schools/eight_schools.data.json"),
    "logistic_regression": ("logistic_regression/logistic_regression.stan",
                            "logistic_regression/logistic_regression.data.json"),
    "poisson_glm": ("poisson_glm/poisson_glm.stan", "poisson_glm/poisson_glm.data.json"),
    "linear_regression": ("linear_regression/linear_regression.stan",
                          "linear_regression/linear_regression.data.json"),
    "gaussian_diag": ("gaussian_diag/gaussian_diag.stan", "gaussian_diag/gaussian_diag.data.json"),
}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "exposes_bug(reason): the test fails because of a bug in stanvi/ (or in Stan "
        "upstream that stanvi should work around); the reason says which. Never skipped.")


def stan_file(key: str) -> Path:
    return MODELS_DIR / MODELS[key][0]


def data_file(key: str) -> Path:
    return MODELS_DIR / MODELS[key][1]


def data_dict(key: str) -> dict:
    return json.loads(data_file(key).read_text())


class ModelCompiler:
    """Compiles every example model in the background (2 workers) on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._futures: dict[str, Future] = {}

    def _start(self) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="stan-compile")
                for key in MODELS:
                    self._futures[key] = self._pool.submit(compile_model, stan_file(key),
                                                           progress=False)

    def __call__(self, key: str) -> CompiledModel:
        self._start()
        return self._futures[key].result()

    def wait_all(self) -> None:
        """Block until every background compile has finished (successfully or not)."""
        self._start()
        for fut in self._futures.values():
            fut.exception()

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="session")
def compiled():
    """``compiled(key) -> CompiledModel`` for the keys of :data:`MODELS`."""
    compiler = ModelCompiler()
    yield compiler
    compiler.shutdown()


@pytest.fixture(scope="session")
def compile_in_background(compiled):
    """Start compiling every example model now, so the compiles overlap with tests that do not
    need them (the compile-cache tests, the error tests).  The Stan-layer test modules request
    it with ``pytestmark = pytest.mark.usefixtures("compile_in_background")``; other test
    modules never trigger these compiles."""
    compiled._start()


@pytest.fixture(scope="session")
def all_compiled(compiled):
    """Waits for every background compile: tests that touch the toolchain lookup or the
    environment (``$CXX``) must not race with compiles running in other threads."""
    compiled.wait_all()
    return compiled


@pytest.fixture(scope="session")
def load_target(compiled):
    """``load_target(key, threads=None) -> StanTarget``, memoized per (key, threads).

    HVPs are the build's own (exact where the build has nested autodiff), not ``"auto"``: the
    derivative tests check the exact sweep, and results must not depend on a timing."""
    cache: dict = {}
    lock = threading.Lock()

    def load(key: str, threads: int | None = None):
        with lock:
            if (key, threads) not in cache:
                model = compiled(key)
                cache[(key, threads)] = stanvi.load(
                    model, data_file(key), threads=threads, progress=False,
                    hvp_method="exact" if model.hvp_exact else "finite_difference")
            return cache[(key, threads)]

    return load


def _target_fixture(key: str):
    @pytest.fixture(scope="session")
    def fixture(load_target):
        return load_target(key)

    return fixture


eight_schools = _target_fixture("eight_schools")
eight_schools_centered = _target_fixture("eight_schools_centered")
gaussian = _target_fixture("gaussian")
gaussian_diag = _target_fixture("gaussian_diag")
constrained_params = _target_fixture("constrained_params")
hierarchical_radon = _target_fixture("hierarchical_radon")
reject_region = _target_fixture("reject_region")
tp_gq = _target_fixture("tp_gq")
bernoulli = _target_fixture("bernoulli")
ode = _target_fixture("ode")
logistic_regression = _target_fixture("logistic_regression")


def random_points(target, n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """n points near the model's typical set: Stan initial points (uniform(-2, 2) on the
    unconstrained scale, retried until finite) plus a little Gaussian jitter."""
    rng = np.random.default_rng(seed)
    base = np.stack([target.initial_point(seed=seed * 1000 + i) for i in range(n)])
    return base * scale + 0.1 * rng.standard_normal(base.shape)


@pytest.fixture
def rng(request):
    """A numpy Generator seeded from the test's name (reproducible, different per test)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def stanvi_log(caplog):
    """The records of the ``stanvi`` logger at every level (it does not propagate to the root's
    handlers, where caplog listens)."""
    logger = logging.getLogger("stanvi")
    logger.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.DEBUG)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield caplog
    logger.setLevel(level)
    logger.removeHandler(caplog.handler)
