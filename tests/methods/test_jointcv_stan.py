"""The Stan block target of docs/jointcv.md#block-scheme (stanvi/targets/stan_blocks.py): equality
with the JAX per-datum target of the same model, the additivity validation accepting a
decomposable model and refusing each non-decomposable kind with its message, and
method='jointcv' on a Stan model."""

from __future__ import annotations

import numpy as np
import pytest

import stanvi
from jointcv_problems import simulate_logistic
from stanvi.stan.compiler import compile_model
from stanvi.targets.stan_blocks import BlockDecompositionError, StanBlockTarget, row_variables
from stanvi.targets.subsampled import logistic_regression_target

from conftest import MODELS_DIR, ROOT

LOGISTIC = MODELS_DIR / "jointcv_logistic" / "jointcv_logistic.stan"
NONDECOMPOSABLE = ROOT / "tests" / "models" / "jointcv_nondecomposable.stan"


def _load(path, data):
    model = compile_model(path, progress=False)
    return stanvi.load(model, data, progress=False,
                       hvp_method="exact" if model.hvp_exact else "finite_difference")


@pytest.fixture(scope="module")
def logistic():
    X, y = simulate_logistic(40, 3, seed=0)
    data = {"N": 40, "K": 3, "X": X, "y": y.astype(int)}
    return _load(LOGISTIC, data), logistic_regression_target(X, y)


def test_block_target_equals_jax_per_datum_target(logistic):
    """One row per block (M = N): ∇k_β and ∇²k_β v of the Stan block target equal the JAX
    per-datum target's ∇k_n, ∇²k_n v for the block's row; full-data gradients agree."""
    full, jt = logistic
    bt = StanBlockTarget(full, n_blocks=40, seed=3)
    rows = np.array([b[0] for b in bt.blocks])
    rng = np.random.default_rng(0)
    idx = rng.permutation(40)[:9]
    z = rng.normal(size=3)
    np.testing.assert_allclose(bt.term_gradients(idx, z), jt.term_gradients(rows[idx], z),
                               rtol=1e-10, atol=1e-10)
    zs, v = rng.normal(size=(9, 3)), rng.normal(size=(9, 3))
    g1, h1 = bt.term_hvps(idx, zs, v)
    g2, h2 = jt.term_hvps(rows[idx], zs, v)
    np.testing.assert_allclose(g1, g2, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(h1, h2, rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(bt.full_gradient(z), jt.full_gradient(z), rtol=1e-10, atol=1e-10)
    assert bt.terms.snapshot() == {"term_gradient": 9, "term_hvp": 9, "full_gradient": 1}


def test_blocks_of_several_rows(logistic):
    """M = 7 blocks of 5-6 rows: k_β = −M Σ_{n∈β} ℓ_n − log p0, i.e. from the per-datum terms
    ∇k_β = (M/N) Σ_{n∈β} ∇k_n + (1 − M|β|/N) ∇(−log p0); the mean over blocks is the full
    gradient; the validation's errors are at round-off."""
    full, jt = logistic
    bt = StanBlockTarget(full, n_blocks=7, seed=1)
    assert sorted(len(b) for b in bt.blocks) == [5, 5, 6, 6, 6, 6, 6]
    assert bt.validation["value_rel_error"] < 1e-12
    assert bt.validation["gradient_rel_error"] < 1e-12
    z = np.random.default_rng(2).normal(size=3)
    got = bt.term_gradients(np.arange(7), z)
    for beta, rows in enumerate(bt.blocks):
        want = 7 / 40 * jt.term_gradients(rows, z).sum(axis=0) + (1 - 7 * len(rows) / 40) * z
        np.testing.assert_allclose(got[beta], want, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(got.mean(axis=0), jt.full_gradient(z), rtol=1e-10, atol=1e-10)


def _nondecomposable(kind: int):
    x = np.linspace(0.0, 1.0, 30)
    return _load(NONDECOMPOSABLE, {"N": 30, "kind": kind, "x": x, "y": np.sin(7 * x)})


@pytest.mark.parametrize("kind,check,words", [
    (1, "value additivity", "transformed data computed from all rows"),
    (2, "evaluation", "couples rows"),
])
def test_refuses_non_additive_models(kind, check, words):
    """Transformed data standardizing with its own rows, and a GP likelihood, are refused with
    the failed check named and the alternatives (lik_weight protocol, full-batch methods)."""
    with pytest.raises(BlockDecompositionError) as info:
        StanBlockTarget(_nondecomposable(kind), n_blocks=5)
    assert info.value.check == check
    assert words in str(info.value)
    assert "lik_weight" in str(info.value) and "trustvi" in str(info.value)


def test_refuses_n_lower_bound_one():
    """`int<lower=1> N` rejects the prior instance (N = 0): check 'construction', Stan's message."""
    target = _load(MODELS_DIR / "raw_logistic" / "raw_logistic.stan",
                   MODELS_DIR / "raw_logistic" / "raw_logistic.data.json")
    with pytest.raises(BlockDecompositionError) as info:
        StanBlockTarget(target, n_blocks=4)
    assert info.value.check == "construction"
    assert "greater than or equal to 1" in str(info.value)


def test_refuses_per_observation_parameters(compiled):
    """Eight schools has one parameter per school (row): check 'dimension'."""
    target = stanvi.load(compiled("eight_schools"),
                         MODELS_DIR / "eight_schools" / "eight_schools.data.json", progress=False,
                         hvp_method="finite_difference")
    with pytest.raises(BlockDecompositionError) as info:
        StanBlockTarget(target, n_blocks=4)
    assert info.value.check == "dimension"
    assert "per-observation parameters" in str(info.value)


def test_row_variable_inference():
    X = np.zeros((6, 2))
    assert row_variables({"N": 6, "K": 2, "X": X, "y": [0] * 6}) == ("N", 6, ["X", "y"])
    with pytest.raises(BlockDecompositionError, match="pass obs_var"):
        row_variables({"N": 3, "M": 3, "a": [1, 2, 3], "b": [4, 5, 6]})
    assert row_variables({"N": 3, "M": 3, "a": [1, 2, 3]}, obs_var="M")[0] == "M"
    with pytest.raises(BlockDecompositionError, match="no data variable"):
        row_variables({"N": 3, "x": [1.0, 2.0]})


def test_fit_jointcv_on_a_stan_model(logistic):
    """stanvi.fit(..., method='jointcv') on a Stan model: blocks built and validated, one warm-up
    epoch, per-term oracle counts as docs/jointcv.md#cost, ELBO improves, Stan names in the
    draws."""
    full, _ = logistic
    fit = stanvi.fit(full, method="jointcv", n_blocks=10, batch_size=2, max_iters=60,
                     learning_rate=2e-3, elbo_every=20, progress=False, seed=1)
    assert fit.status == "max_iters"
    assert fit.info["blocks"]["n_blocks"] == 10
    assert fit.info["warmup_iterations"] == 5
    # warm-up: 2 gradients per block; main (55 iterations): 2 gradients + 1 HVP per block
    assert fit.oracle["term_gradients"] == 2 * 2 * 5 + 2 * 2 * 55
    assert fit.oracle["term_hvps"] == 2 * 55
    elbo = fit.trace.column("elbo")
    assert np.isfinite(elbo[-1]) and elbo[-1] > elbo[0]
    assert fit.stan_variable("beta").shape == (1000, 3)


def test_one_call_across_block_instances_equals_per_instance_calls(logistic):
    """stanvi_multi_gradient / stanvi_multi_hvp evaluate row i with instance idx[i], all rows
    in one multithreaded C++ call: equal to one call per row into that instance."""
    full, _ = logistic
    bt = StanBlockTarget(full, n_blocks=7, seed=2)
    rng = np.random.default_rng(5)
    idx = rng.integers(0, 7, size=12)
    handles = [bt._block_handles[i] for i in idx]
    z, v = rng.normal(size=(12, 3)), rng.normal(size=(12, 3))
    lp, g, st = bt._lib.multi_gradient(handles, z, propto=False, jacobian=True, threads=2)
    lp2, g2, h2, st2 = bt._lib.multi_hvp(handles, z, v, propto=False, jacobian=True, threads=2)
    assert st.ok.all() and st2.ok.all()
    for i, h in enumerate(handles):
        lp_i, g_i, _ = bt._lib.gradient(h, z[i:i + 1], propto=False, jacobian=True, threads=1)
        lph_i, gh_i, hv_i, _ = bt._lib.hvp(h, z[i:i + 1], v[i:i + 1], propto=False,
                                           jacobian=True, threads=1)
        assert lp[i] == lp_i[0] and lp2[i] == lph_i[0]
        np.testing.assert_array_equal(g[i], g_i[0])
        np.testing.assert_array_equal(g2[i], gh_i[0])   # (the HVP's own gradient pass)
        np.testing.assert_array_equal(h2[i], hv_i[0])
    assert len(set(np.round(lp, 12))) > 1   # the instances really differ
    with pytest.raises(ValueError, match="handles"):
        bt._lib.multi_gradient(handles[:3], z, propto=False, jacobian=True, threads=1)
