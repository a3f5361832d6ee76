"""The XLA FFI bridge (stanvi/targets/jax_ffi.py) against the pure_callback bridge.

Both call the same batched C++ entry points with the same thread count and HVP method, so every
result must be identical bit for bit: values, jax.grad, jvp of grad (HVPs), vmap, jit, jax.hessian,
failed rows (-inf / NaN) and NaN input.  The FFI handlers count draws and C++ time into the
target's counter exactly as the target's own methods do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from conftest import data_file, random_points
from stanvi.targets import jax_ffi

pytestmark = pytest.mark.usefixtures("compile_in_background")

jax.config.update("jax_enable_x64", True)

MODELS = ["eight_schools", "hierarchical_radon", "reject_region"]


@pytest.fixture(scope="module", autouse=True)
def _require_ffi():
    assert jax_ffi.ffi_available(), jax_ffi.ffi_unavailable_reason()


def _points(target, key, n, seed):
    if key == "reject_region":  # rows 1 and 4 throw (x > 2)
        z = np.array([[0.2, 0.1], [3.0, 0.0], [1.0, -0.4], [-0.5, 0.3], [2.5, 1.0], [1.5, 0.2]])
        return np.resize(z, (n, 2))
    return random_points(target, n, seed=seed)


def _both(target):
    ffi, cb = target.jax_log_density_with("ffi"), target.jax_log_density_with("callback")
    assert ffi.backend == "ffi" and cb.backend == "callback"
    return ffi, cb


def _delta(before, after):
    return {k: after[k] - before[k] for k in after}


def _assert_same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype == np.float64 and x.shape == y.shape
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("key", MODELS)
def test_values_gradients_hvps_equal_pure_callback(load_target, key):
    t = load_target(key)
    ffi, cb = _both(t)
    z = jnp.asarray(_points(t, key, 12, seed=21))
    v = jnp.asarray(np.random.default_rng(22).standard_normal(z.shape))

    def programs(f):
        grad = jax.grad(f)
        hvp = jax.vmap(lambda a, b: jax.jvp(grad, (a,), (b,)))
        return {
            "value": jax.jit(jax.vmap(f))(z),
            "value_eager": jax.vmap(f)(z),
            "value_and_grad": jax.jit(jax.vmap(jax.value_and_grad(f)))(z),
            "grad": jax.jit(jax.vmap(grad))(z),
            "hvp": jax.jit(hvp)(z, v),
            "hvp_eager": hvp(z, v),
            "single_value": jax.jit(f)(z[0]),
            "single_grad": jax.jit(grad)(z[0]),
            "single_hvp": jax.jvp(grad, (z[0],), (v[0],)),
            "batch_shape": jax.jit(jax.vmap(jax.vmap(grad)))(z.reshape(3, 4, -1)),
            "sum_objective": jax.jit(jax.grad(lambda zz: jnp.mean(jax.vmap(f)(zz))))(z),
        }

    out_ffi, out_cb = programs(ffi), programs(cb)
    for name in out_cb:
        _assert_same(out_ffi[name], out_cb[name])
    # and both equal the target's own batched methods
    res = t.log_density_hvp(np.asarray(z), np.asarray(v))
    np.testing.assert_array_equal(np.asarray(out_ffi["hvp"][1]), res.hvp)
    np.testing.assert_array_equal(np.asarray(out_ffi["grad"]),
                                  t.log_density_gradient(np.asarray(z)).gradient)


def test_failed_rows_and_nan_input(reject_region):
    ffi, cb = _both(reject_region)
    z = jnp.asarray([[0.0, 0.0], [3.0, 0.0], [np.nan, 0.0], [1.0, 0.5]])
    for f in (ffi, cb):
        lp = np.asarray(jax.jit(jax.vmap(f))(z))
        assert lp[1] == -np.inf and np.isnan(lp[2]) and np.isfinite(lp[[0, 3]]).all()
        lp2, g = jax.jit(jax.vmap(jax.value_and_grad(f)))(z)
        np.testing.assert_array_equal(np.asarray(lp2), lp)
        assert np.isnan(np.asarray(g)[1:3]).all() and np.isfinite(np.asarray(g)[[0, 3]]).all()
        _, hv = jax.vmap(lambda a: jax.jvp(jax.grad(f), (a,), (jnp.ones(2),)))(z)
        assert np.isnan(np.asarray(hv)[1:3]).all() and np.isfinite(np.asarray(hv)[[0, 3]]).all()
    _assert_same(jax.vmap(jax.value_and_grad(ffi))(z), jax.vmap(jax.value_and_grad(cb))(z))
    # the messages are where they always were: the target's own batched methods
    assert "x must be at most 2" in reject_region.log_density(np.asarray(z)).messages[1]


def test_jax_hessian_equals_pure_callback(eight_schools):
    t = eight_schools
    ffi, cb = _both(t)
    z = jnp.asarray(random_points(t, 1, seed=23)[0])
    hess_ffi = np.asarray(jax.hessian(ffi)(z))
    np.testing.assert_array_equal(hess_ffi, np.asarray(jax.hessian(cb)(z)))
    assert np.isfinite(hess_ffi).all()


@pytest.mark.parametrize("key", ["eight_schools", "reject_region"])
def test_oracle_counts_and_model_seconds(load_target, key):
    """The FFI handlers count per draw as the target's methods do, C++ time included."""
    t = load_target(key)
    ffi, cb = _both(t)
    z = jnp.asarray(_points(t, key, 8, seed=24))
    v = jnp.ones_like(z)
    grad = jax.grad(ffi)
    programs = [
        (jax.jit(jax.vmap(ffi)), (z,), {"log_density": 8, "gradient": 0, "hvp": 0}),
        (jax.jit(jax.vmap(grad)), (z,), {"log_density": 0, "gradient": 8, "hvp": 0}),
        (jax.jit(jax.vmap(lambda a, b: jax.jvp(grad, (a,), (b,)))), (z, v),
         {"log_density": 0, "gradient": 0, "hvp": 8}),
    ]
    for fn, args, expected in programs:
        jax.block_until_ready(fn(*args))  # compile (and run) once
        before, seconds = t.counter.snapshot(), t.counter.seconds
        jax.block_until_ready(fn(*args))
        assert _delta(before, t.counter.snapshot()) == expected
        assert t.counter.seconds > seconds
    # the same program through pure_callback counts the same
    fn = jax.jit(jax.vmap(jax.grad(cb)))
    jax.block_until_ready(fn(z))
    before = t.counter.snapshot()
    jax.block_until_ready(fn(z))
    assert _delta(before, t.counter.snapshot()) == {"log_density": 0, "gradient": 8, "hvp": 0}


def test_counter_reset_and_add_with_ffi_counts(load_target):
    t = load_target("gaussian", threads=1)
    f = t.jax_log_density_with("ffi")
    z = jnp.asarray(random_points(t, 4, seed=25))
    jax.block_until_ready(jax.vmap(jax.grad(f))(z))
    assert t.counter.gradient >= 4
    t.counter.reset()
    assert t.counter.snapshot() == {"log_density": 0, "gradient": 0, "hvp": 0}
    assert t.counter.seconds == 0.0
    jax.block_until_ready(jax.vmap(jax.grad(f))(z))
    t.log_density(np.asarray(z))
    t.counter.add("hvp", 3, 0.5)
    assert t.counter.snapshot() == {"log_density": 4, "gradient": 4, "hvp": 3}
    assert t.counter.seconds > 0.5


def test_vmap_is_one_custom_call(hierarchical_radon):
    """vmap over draws lowers to ONE custom call of the whole batch (no loop over rows)."""
    f = hierarchical_radon.jax_log_density_with("ffi")
    z = jnp.zeros((16, hierarchical_radon.dim))
    hlo = jax.jit(jax.vmap(jax.grad(f))).lower(z).as_text()
    assert hlo.count("stanvi_gradient") == 1 and "stanvi_log_density" not in hlo
    hlo = jax.jit(jax.vmap(lambda a, b: jax.jvp(jax.grad(f), (a,), (b,)))).lower(z, z).as_text()
    assert hlo.count("stanvi_hvp") == 1 and "stanvi_gradient" not in hlo


def test_thread_count_and_determinism(compiled):
    """Results do not depend on the thread count; a changed target.threads is honoured by
    already-compiled FFI programs (the handler reads it per call)."""
    model = compiled("hierarchical_radon")
    t = stanvi.load(model, data_file("hierarchical_radon"), threads=1, progress=False,
                    hvp_method="exact")
    f = t.jax_log_density_with("ffi")
    z = jnp.asarray(random_points(t, 64, seed=26))
    fn = jax.jit(jax.vmap(jax.value_and_grad(f)))
    one = fn(z)
    t.threads = 2
    two = fn(z)
    _assert_same(one, two)
    _assert_same(two, fn(z))
    with pytest.raises(ValueError):
        t.threads = 0


def test_auto_hvp_method_is_chosen_once_and_shared(compiled):
    """The FFI handler and the target share the HVP mode.  "auto" is decided at load now (and
    stored with the library); the handler's own chooser, for a state whose mode is unset, is
    exercised by unsetting it."""
    model = compiled("eight_schools")
    t = stanvi.load(model, data_file("eight_schools"), progress=False, hvp_method="auto")
    assert t.hvp_method_used in ("exact", "finite_difference")
    t._hvp_fd = None
    assert t.hvp_method_used is None
    f = t.jax_log_density_with("ffi")
    z = random_points(t, 4, seed=27)
    v = np.ones_like(z)
    _, hv = jax.vmap(lambda a, b: jax.jvp(jax.grad(f), (a,), (b,)))(jnp.asarray(z), jnp.asarray(v))
    assert t.hvp_method_used in ("exact", "finite_difference")
    np.testing.assert_array_equal(np.asarray(hv), t.log_density_hvp(z, v).hvp)


def test_bad_input_raises_not_crashes(eight_schools):
    f = eight_schools.jax_log_density_with("ffi")
    with pytest.raises(Exception, match="shape"):
        jax.block_until_ready(jax.jit(f)(jnp.zeros(eight_schools.dim + 1)))
    from stanvi.targets.jax_bridge import jax_log_density  # noqa: PLC0415

    with pytest.raises(ValueError, match="StanTarget"):
        jax_log_density(stanvi.JaxTarget(lambda z: -jnp.sum(z**2), 2), backend="ffi")


def test_backend_selection(eight_schools, monkeypatch):
    with pytest.raises(ValueError):
        jax_ffi.resolve_backend("fast")
    assert jax_ffi.resolve_backend("callback") == "callback"
    assert jax_ffi.resolve_backend(None) == "ffi"
    monkeypatch.setenv("STANVI_JAX_BRIDGE", "callback")
    assert jax_ffi.resolve_backend(None) == "callback"
    assert eight_schools.jax_log_density_with(None).backend == "callback"
    monkeypatch.setenv("STANVI_JAX_BRIDGE", "ffi")
    assert eight_schools.jax_log_density_with(None).backend == "ffi"


def test_platform_switch_used_when_an_accelerator_is_present(compiled, monkeypatch):
    """With an accelerator, each call is a lax.platform_dependent of the FFI call (CPU) and
    pure_callback (elsewhere); on the CPU it must still give the FFI results."""
    from stanvi.targets import jax_bridge  # noqa: PLC0415

    model = compiled("eight_schools")
    t = stanvi.load(model, data_file("eight_schools"), progress=False, hvp_method="exact")
    monkeypatch.setattr(jax_bridge, "_only_cpu_devices", lambda: False)
    switched = jax_bridge.jax_log_density(t, backend="ffi")
    plain = t.jax_log_density_with("callback")
    z = jnp.asarray(random_points(t, 6, seed=28))
    v = jnp.ones_like(z)
    grad = jax.grad(switched)
    fn = jax.jit(jax.vmap(lambda a, b: (jax.value_and_grad(switched)(a), jax.jvp(grad, (a,), (b,)))))
    hlo = fn.lower(z, v).as_text()
    assert "stanvi_gradient" in hlo and "stanvi_hvp" in hlo
    before = t.counter.snapshot()
    out = fn(z, v)
    assert _delta(before, t.counter.snapshot()) == {"log_density": 0, "gradient": 6, "hvp": 6}
    grad_cb = jax.grad(plain)
    ref = jax.vmap(lambda a, b: (jax.value_and_grad(plain)(a), jax.jvp(grad_cb, (a,), (b,))))(z, v)
    _assert_same(out, ref)


def test_function_keeps_its_target_alive_and_released_state_errors(compiled):
    """A bridge function keeps its target alive; raw FFI calls on the state of a collected
    target raise (the model slot is zeroed) instead of touching a destroyed model."""
    import gc  # noqa: PLC0415

    model = compiled("gaussian")
    t = stanvi.load(model, data_file("gaussian"), progress=False, hvp_method="exact")
    z = jnp.asarray(random_points(t, 3, seed=29))
    expected = t.log_density_gradient(np.asarray(z)).gradient
    f = jax.jit(jax.vmap(jax.grad(t.jax_log_density_with("ffi"))))
    raw_value, _, _ = jax_ffi.ffi_calls(t.ffi_state_address)  # holds no reference
    del t
    gc.collect()
    np.testing.assert_array_equal(np.asarray(f(z)), expected)
    del f
    gc.collect()
    with pytest.raises(Exception, match="released"):
        jax.block_until_ready(jax.jit(raw_value)(z))


def test_fallback_to_pure_callback_when_ffi_is_unavailable(compiled, monkeypatch):
    """When the handlers could not be built, "auto" silently uses pure_callback (same
    results), an explicit "ffi" raises with the reason."""
    monkeypatch.setattr(jax_ffi, "_state", {"lib": None, "path": None,
                                            "error": "RuntimeError: no FFI headers"})
    assert not jax_ffi.ffi_available()
    assert jax_ffi.resolve_backend(None) == "callback"
    with pytest.raises(RuntimeError, match="no FFI headers"):
        jax_ffi.resolve_backend("ffi")
    model = compiled("eight_schools")
    t = stanvi.load(model, data_file("eight_schools"), progress=False, hvp_method="exact")
    f = t.jax_log_density
    assert f.backend == "callback"
    z = random_points(t, 3, seed=30)
    np.testing.assert_array_equal(np.asarray(jax.vmap(jax.grad(f))(jnp.asarray(z))),
                                  t.log_density_gradient(z).gradient)


def test_a_broken_handler_source_fails_to_build_with_the_compiler_message(tmp_path, monkeypatch):
    broken = tmp_path / "stanvi_ffi.cpp"
    broken.write_text('#include "xla/ffi/api/ffi.h"\nint this is not C++;\n')
    monkeypatch.setattr(jax_ffi, "FFI_SOURCE", broken)
    monkeypatch.setenv("STANVI_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match="compiling the XLA FFI handlers failed"):
        jax_ffi._build()
    assert not list((tmp_path / "cache" / "ffi").glob("*.so"))
