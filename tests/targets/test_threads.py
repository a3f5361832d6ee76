"""Thread safety and thread-count independence (STAN_THREADS builds, TBB-parallel batches).

Every row of a batch is evaluated independently and deterministically, so results must be
bit-for-bit identical whatever the number of TBB threads and however many Python threads call
the same model at once.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import stanvi
from conftest import data_file, random_points

pytestmark = pytest.mark.usefixtures("compile_in_background")

N_PY_THREADS = 8
ROUNDS = 12


def _reference(t, z, v, seed):
    return {
        "lp": t.log_density(z).log_density,
        "grad": t.log_density_gradient(z).gradient,
        "hvp": t.log_density_hvp(z, v).hvp,
        "constrain": t.constrain_flat(z, seed=seed)[0],
    }


def _operations(t, z, v, seed, ref):
    """Closures that each evaluate something and compare it with the serial reference."""
    bs = t._bs

    def batch_lp():
        np.testing.assert_array_equal(t.log_density(z).log_density, ref["lp"])

    def batch_grad():
        np.testing.assert_array_equal(t.log_density_gradient(z).gradient, ref["grad"])

    def batch_hvp():
        np.testing.assert_array_equal(t.log_density_hvp(z, v).hvp, ref["hvp"])

    def half_batch_grad():
        np.testing.assert_array_equal(t.log_density_gradient(z[1::2]).gradient, ref["grad"][1::2])

    def single_grad():
        for i in range(0, len(z), 5):
            np.testing.assert_array_equal(t.gradient_at(z[i])[1], ref["grad"][i])

    def single_hvp():
        for i in range(1, len(z), 5):
            np.testing.assert_array_equal(t.hvp_at(z[i], v[i])[2], ref["hvp"][i])

    def bridgestan_single():
        for i in range(2, len(z), 7):
            _, g = bs.log_density_gradient(z[i], propto=False, jacobian=True)
            np.testing.assert_array_equal(g, ref["grad"][i])

    def constrain():
        np.testing.assert_array_equal(t.constrain_flat(z, seed=seed)[0], ref["constrain"])

    return [batch_lp, batch_grad, batch_hvp, half_batch_grad, single_grad, single_hvp,
            bridgestan_single, constrain]


@pytest.mark.parametrize("key", ["hierarchical_radon", "tp_gq"])
def test_eight_python_threads_equal_serial(load_target, key):
    t = load_target(key)
    z = random_points(t, 24, seed=51)
    v = np.random.default_rng(52).standard_normal(z.shape)
    ref = _reference(t, z, v, seed=9)
    ops = _operations(t, z, v, 9, ref)
    errors: list[BaseException] = []
    barrier = threading.Barrier(N_PY_THREADS)
    before = t.counter.snapshot()

    def worker(k):
        try:
            barrier.wait()
            for r in range(ROUNDS):
                ops[(k + r) % len(ops)]()       # every thread cycles through every kind of call
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(N_PY_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in threads), "a thread hung"
    assert not errors, errors[0]
    # the counter is thread-safe: exactly the draws evaluated, by kind
    n = len(z)
    per_op = {"batch_lp": ("log_density", n), "batch_grad": ("gradient", n),
              "batch_hvp": ("hvp", n), "half_batch_grad": ("gradient", n // 2),
              "single_grad": ("gradient", len(range(0, n, 5))),
              "single_hvp": ("hvp", len(range(1, n, 5))), "bridgestan_single": (None, 0),
              "constrain": (None, 0)}
    expected = {"log_density": 0, "gradient": 0, "hvp": 0}
    for k in range(N_PY_THREADS):
        for r in range(ROUNDS):
            kind, count = per_op[ops[(k + r) % len(ops)].__name__]
            if kind:
                expected[kind] += count
    after = t.counter.snapshot()
    assert {k: after[k] - before[k] for k in after} == expected


def test_many_threads_share_one_model_with_failures(reject_region):
    """Failing rows (reject) raised concurrently on many threads: statuses and messages stay
    per row, nothing leaks between calls."""
    t = reject_region
    rng = np.random.default_rng(3)
    z = np.column_stack([rng.uniform(-1, 4, 64), rng.normal(0, 0.5, 64)])
    ref = t.log_density_gradient(z)
    assert 0 < (~ref.ok).sum() < 64
    errors = []

    def worker():
        try:
            for _ in range(10):
                res = t.log_density_gradient(z)
                np.testing.assert_array_equal(res.ok, ref.ok)
                np.testing.assert_array_equal(res.gradient, ref.gradient)
                assert res.messages == ref.messages
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(N_PY_THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=300)
    assert not errors, errors[0]


@pytest.mark.parametrize("key", ["hierarchical_radon", "tp_gq", "constrained_params"])
def test_thread_count_does_not_change_results(load_target, key):
    t1 = load_target(key, threads=1)
    t4 = load_target(key, threads=4)
    assert (t1.threads, t4.threads) == (1, 4)
    z = random_points(t1, 40, seed=61)
    v = np.random.default_rng(62).standard_normal(z.shape)
    np.testing.assert_array_equal(t1.log_density(z).log_density, t4.log_density(z).log_density)
    np.testing.assert_array_equal(t1.log_density_gradient(z).gradient,
                                  t4.log_density_gradient(z).gradient)
    h1, h4 = t1.log_density_hvp(z, v), t4.log_density_hvp(z, v)
    np.testing.assert_array_equal(h1.hvp, h4.hvp)
    np.testing.assert_array_equal(h1.ok, h4.ok)
    c1 = t1.constrain_flat(z, seed=123)[0]
    np.testing.assert_array_equal(c1, t4.constrain_flat(z, seed=123)[0])


def test_generated_quantities_seeded_and_thread_independent(load_target):
    t1 = load_target("tp_gq", threads=1)
    t4 = load_target("tp_gq", threads=4)
    z = random_points(t1, 32, seed=71)
    a = t1.constrain(z, seed=5)
    b = t4.constrain(z, seed=5)
    c = t4.constrain(z, seed=6)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    # same seed again: identical; another seed: different RNG draws, same deterministic values
    np.testing.assert_array_equal(t4.constrain(z, seed=5)["y_rep"], a["y_rep"])
    assert not np.any(a["y_rep"] == c["y_rep"])
    np.testing.assert_array_equal(a["log_lik"], c["log_lik"])
    np.testing.assert_array_equal(a["mu"], c["mu"])
    # rows get their own streams: identical parameters in two rows give different draws
    zz = np.tile(z[:1], (2, 1))
    d = t4.constrain(zz, seed=5)
    assert not np.any(d["y_rep"][0] == d["y_rep"][1])
    # the default seed is the target's seed
    np.testing.assert_array_equal(t1.constrain(z)["y_rep"], t1.constrain(z, seed=t1.seed)["y_rep"])


def test_default_thread_count_from_environment(monkeypatch, compiled):
    monkeypatch.setenv("STANVI_NUM_THREADS", "3")
    t = stanvi.load(compiled("bernoulli"), data_file("bernoulli"), progress=False)
    assert t.threads == 3
    monkeypatch.delenv("STANVI_NUM_THREADS")
    t = stanvi.load(compiled("bernoulli"), data_file("bernoulli"), progress=False)
    assert t.threads >= 1
