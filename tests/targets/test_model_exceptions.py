"""C++ exceptions from the model in a process that has compiled many XLA programs.

XLA's CPU JIT registers the unwind tables of every compiled executable with libgcc's
``__register_frame``; with the shared unwinder of libgcc_s < 13 every throw then searches them
all.  Model libraries carry their own unwinder and C++ runtime (``toolchain.STATIC_RUNTIME_FLAGS``)
so a throwing draw stays cheap; the timing is in ``stanvi bench target``.  These tests check
correctness after many compilations: a throwing row is still -inf / NaN with the model's
message, through the batched calls (1 and several TBB threads), the single-point helpers, the
bridgestan client and the JAX bridge.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stanvi.errors import ModelEvaluationError

pytestmark = pytest.mark.usefixtures("compile_in_background")

jax.config.update("jax_enable_x64", True)

MESSAGE = "x must be at most 2"


@pytest.fixture(scope="module")
def many_compiled_programs():
    """60 distinct jitted programs, kept alive (their unwind tables stay registered)."""
    kept = []
    for k in range(60):
        def program(x, k=k):
            y = jax.lax.fori_loop(0, 2 + k % 3, lambda i, c: jnp.tanh(c + i * k), x)
            return jnp.sum(jnp.sin(y) ** (k % 4 + 1))

        fn = jax.jit(jax.grad(program))
        fn(jnp.ones(3)).block_until_ready()
        kept.append(fn)
    yield kept


@pytest.mark.parametrize("threads", [1, 2])
def test_throwing_rows_after_many_compilations(load_target, many_compiled_programs, threads):
    t = load_target("reject_region", threads=threads)
    z = np.array([[0.5, 0.1], [3.0, 0.0], [1.0, -0.2], [2.5, 1.0]] * 8)
    bad = z[:, 0] > 2
    for res in (t.log_density(z), t.log_density_gradient(z), t.log_density_hvp(z, np.ones_like(z))):
        np.testing.assert_array_equal(res.ok, ~bad)
        assert np.all(res.log_density[bad] == -np.inf) and np.isfinite(res.log_density[~bad]).all()
        assert sorted(res.messages) == list(np.flatnonzero(bad))
        for row in np.flatnonzero(bad):
            assert MESSAGE in res.messages[row] and f"got {z[row, 0]:g}" in res.messages[row]
        for deriv in (res.gradient, res.hvp):
            if deriv is not None:
                assert np.isnan(deriv[bad]).all() and np.isfinite(deriv[~bad]).all()


def test_single_point_and_bridgestan_errors_after_many_compilations(reject_region,
                                                                     many_compiled_programs):
    t = reject_region
    with pytest.raises(ModelEvaluationError, match=MESSAGE):
        t.gradient_at(np.array([3.0, 0.0]))
    # the BridgeStan ABI entry points catch inside the library and hand the message over
    with pytest.raises(RuntimeError, match=MESSAGE):
        t._bs.log_density_gradient(np.array([3.0, 0.0]), propto=False, jacobian=True)
    assert np.isfinite(t.gradient_at(np.array([1.0, 0.0]))[0])


def test_jax_bridge_failures_after_many_compilations(reject_region, many_compiled_programs):
    f = reject_region.jax_log_density
    z = jnp.asarray([[0.0, 0.0], [3.0, 0.0], [1.0, 0.5]])
    lp = np.asarray(jax.jit(jax.vmap(f))(z))
    assert lp[1] == -np.inf and np.isfinite(lp[[0, 2]]).all()
    g = np.asarray(jax.jit(jax.vmap(jax.grad(f)))(z))
    assert np.isnan(g[1]).all() and np.isfinite(g[[0, 2]]).all()


def test_model_library_has_a_private_runtime(reject_region):
    """The build record says the library was linked with its own C++ runtime and unwinder."""
    record = json.loads((reject_region.library_path.parent / "build.json").read_text())
    assert record["static_runtime"] is True
