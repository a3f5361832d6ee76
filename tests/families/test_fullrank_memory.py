"""Full-rank memory scaling (issue 17 item 6): at D = 2,000 a full-rank fit used to grow past
20 GB.  The causes and what bounds them now, each checked at a small size:

* per-draw ELBO gradients were materialized as an (n, P) matrix, P = D + D(D+1)/2, for TrustVI's
  jackknife and for the refinement's 4,096-draw gradient: now kept factored as (∇log p, ε) per
  draw (``FullRankRows``), equal to the dense computation to rounding;
* the Lanczos basis of a trust-region solve grew to hundreds of P-vectors: bounded in bytes;
* the trace kept ~1,100 iterates of 16 MB: bounded in bytes;
* ADVI's compiled chunk carried a (100, P) iterate history: fewer steps per call for large P;
* the refinement's Hessian sample (256 draws) was singular for D ≥ 256.

The benchmark at the real size is ``stanvi bench fullrank`` (docs/benchmarks.md).
"""

from __future__ import annotations

import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stanvi.estimators.elbo import (ElboEstimator, FullRankRows, gradient_with_redraws,
                                    per_draw_gradients)
from stanvi.families import FullRank, MeanField
from stanvi.methods import advi_sgd
from stanvi.methods.base import OracleLedger, Trace
from stanvi.methods.refine import hessian_draws
from stanvi.optim import gltr
from stanvi.optim.jackknife import jackknife_snr


def _log_density(z):
    """A non-Gaussian density with correlated coordinates (so every entry of G varies)."""
    return (-0.5 * jnp.sum((z - 1.0) ** 2) / 4.0 + 0.3 * jnp.sum(jnp.sin(z))
            - 0.05 * jnp.sum(z[1:] * z[:-1]))


def _params(family, rng):
    p = family.initial_params(rng.normal(size=family.dim), -0.4)
    p[family.dim:] += rng.normal(0.0, 0.1, family.n_params - family.dim)
    return p


@pytest.mark.parametrize("diagonal", ["stan", "log"])
def test_factored_rows_equal_the_dense_per_draw_gradients(diagonal):
    """Values, rows, means (whole and halves) and the jackknife equal the dense (n, P)
    computation to rounding, for Stan's diagonal and the log diagonal."""
    rng = np.random.default_rng(3)
    fam = FullRank(7, diagonal=diagonal)
    est = ElboEstimator(fam, _log_density)
    params = _params(fam, rng)
    eps = rng.standard_normal((33, fam.dim))
    values_dense, G = est.values_and_grads(params, eps)
    values, rows = per_draw_gradients(est, params, eps)
    assert isinstance(rows, FullRankRows) and rows.shape == G.shape and len(rows) == 33
    np.testing.assert_allclose(values, values_dense, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(rows.dense(), G, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(rows.mean(axis=0), G.mean(axis=0), rtol=1e-12, atol=1e-13)
    for part in (slice(None, 16), slice(16, None)):
        np.testing.assert_allclose(rows[part].mean(axis=0), G[part].mean(axis=0), rtol=1e-12,
                                   atol=1e-13)
    for sub in (slice(None), slice(None, 16), np.arange(3, 30, 2)):
        a, b = jackknife_snr(G[sub]), jackknife_snr(rows[sub])
        assert b.theta_hat == pytest.approx(a.theta_hat, rel=1e-10, abs=1e-12)
        assert b.sd == pytest.approx(a.sd, rel=1e-8, abs=1e-12)
        assert b.noise == pytest.approx(a.noise, rel=1e-10, abs=1e-12)
    assert rows.finite_rows().all()


def test_jackknife_of_factored_rows_at_a_large_offset():
    """The centred moments stay accurate when the mean gradient dwarfs the noise (q far from
    the optimum): θ̂ and sd as the dense computation gives them."""
    rng = np.random.default_rng(5)
    fam = FullRank(5, diagonal="log")
    est = ElboEstimator(fam, lambda z: -0.5 * jnp.sum((z - 40.0) ** 2))
    params = _params(fam, rng)
    eps = rng.standard_normal((64, fam.dim))
    _, G = est.values_and_grads(params, eps)
    _, rows = per_draw_gradients(est, params, eps)
    a, b = jackknife_snr(G), jackknife_snr(rows)
    assert b.theta_hat == pytest.approx(a.theta_hat, rel=1e-10)
    assert b.sd == pytest.approx(a.sd, rel=1e-6)
    assert b.noise == pytest.approx(a.noise, rel=1e-6)


def test_gradient_with_redraws_keeps_no_n_by_p_matrix():
    """TrustVI's gradient for full rank: drops and redraws as before, the mean equals the dense
    mean of the same draws, and what is stored per draw is O(D), not O(P)."""
    rng = np.random.default_rng(11)
    fam = FullRank(6, diagonal="log")

    def truncated(z):  # fails on a third of q's draws or so
        return jnp.where(z[0] > 0.8, -jnp.inf, _log_density(z))

    est = ElboEstimator(fam, truncated)
    params = _params(fam, rng)
    params[0] = 0.5
    ge = gradient_with_redraws(est, params, jax.random.PRNGKey(2), 40, max_drops=400)
    rows = ge.per_draw
    assert isinstance(rows, FullRankRows) and ge.n_dropped > 0
    assert rows.g.shape == (40, fam.dim) and rows.eps.shape == (40, fam.dim)
    assert all(np.asarray(a).size <= max(40 * fam.dim, fam.n_params)
               for a in vars(rows).values() if isinstance(a, np.ndarray))
    _, G = est.values_and_grads(params, rows.eps)
    np.testing.assert_allclose(ge.gradient, G.mean(axis=0), rtol=1e-12, atol=1e-13)
    assert np.all(rows.eps @ np.asarray(fam.cholesky(params))[0] + params[0] <= 0.8)
    # mean-field keeps its dense (n, 2D) rows
    mf = ElboEstimator(MeanField(6), truncated)
    assert isinstance(gradient_with_redraws(mf, np.zeros(12), jax.random.PRNGKey(2), 8,
                                            max_drops=80).per_draw, np.ndarray)


def test_jackknife_memory_grows_with_n_d_not_n_p():
    """Peak traced (NumPy) memory of the jackknife on factored rows at D = 120, n = 256 is a
    small fraction of the dense n × P matrix (31 MB), and the compiled gradient returns (n, D)."""
    rng = np.random.default_rng(0)
    dim, n = 120, 256
    fam = FullRank(dim, diagonal="log")
    params = _params(fam, rng)
    g, eps = rng.standard_normal((n, dim)), rng.standard_normal((n, dim))
    const = np.zeros(fam.n_params)
    rows = FullRankRows(fam, params, g, eps, const)
    dense_bytes = n * fam.n_params * 8
    tracemalloc.start()
    try:
        jackknife_snr(rows)
        rows[: n // 2].mean(axis=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < dense_bytes / 8, (peak, dense_bytes)
    est = ElboEstimator(FullRank(4), _log_density)
    values, grads = est.values_and_model_grads(np.asarray(FullRank(4).initial_params(np.zeros(4))),
                                               rng.standard_normal((9, 4)))
    assert values.shape == (9,) and grads.shape == (9, 4)


def test_lanczos_basis_is_bounded_and_a_cut_solve_certifies_nothing(monkeypatch):
    assert gltr.krylov_limit(2_003_000) == 16          # full rank, D = 2,000
    assert gltr.krylov_limit(5_792) >= 5_792           # small problems: unchanged
    n = 400
    monkeypatch.setattr(gltr, "KRYLOV_BYTES", 8 * n * 10)   # 10 vectors
    diag = np.linspace(1.0, 50.0, n)                    # needs many Lanczos steps
    c = np.ones(n)
    sol = gltr.solve_gltr(lambda v: diag * v, c, 1e300, tol_interior=1e-12, max_krylov=n)
    assert sol.n_hvp == 10 and sol.Q.shape == (n, 10) and sol.status == "max_iter"
    assert gltr.truncated(sol, n)
    gain, _ = gltr_certified_gain(lambda v: diag * v, c)
    assert gain == float("inf")


def gltr_certified_gain(hvp, c):
    """TrustVI's certified Newton gain, wherever the module keeps it."""
    certified = getattr(gltr, "certified_newton_gain", None)
    if certified is None:
        from stanvi.methods import trustvi  # noqa: PLC0415
        certified = trustvi._certified_gain
    return certified(hvp, c, 1e-6)


def test_trace_keeps_iterates_within_its_byte_cap():
    ledger = OracleLedger()
    small = Trace()
    for i in range(1200):
        small.record(i, np.zeros(10), ledger)
    assert len(small.kept_rows()) > 1000                  # small iterates: as before
    big = Trace(keep_bytes=20 * 800)                     # room for 20 iterates of 800 bytes
    for i in range(1000):
        big.record(i, np.full(100, float(i)), ledger)
    kept = big.kept_rows()
    assert len(kept) <= 21 and kept[0] == 0 and kept[-1] == 999
    assert big.params_at(0)[0] == 0.0 and big.params_at(999)[0] == 999.0
    assert all(big.params_at(int(i))[0] == i for i in kept)


def test_advi_chunk_and_refinement_hessian_sizes():
    assert advi_sgd.chunk_for(MeanField(10)) == advi_sgd._CHUNK
    assert advi_sgd.chunk_for(FullRank(100)) == advi_sgd._CHUNK
    assert advi_sgd.chunk_for(FullRank(2000)) == 8           # 8 × 16 MB of history, not 100
    assert hessian_draws(MeanField(2000), 256) == 256
    assert hessian_draws(FullRank(20), 256) == 256
    assert hessian_draws(FullRank(500), 256) == 1002      # > D: a non-singular sampled Hessian


def test_exact_q_in_high_dimension_is_diagnosed_good():
    """q = p exactly at D = 1,500: log p − log q is 0 up to the rounding of sums of size ~3,000,
    which used to exceed the 1e-12 'constant ratios' tolerance and made k̂ NaN and the verdict
    'unreliable' (TrustVI's exact full-rank fit at D = 2,000 in stanvi bench fullrank)."""
    import math  # noqa: PLC0415

    from stanvi.diagnostics.report import compute  # noqa: PLC0415

    dim = 1500
    eps = np.random.default_rng(0).standard_normal((2000, dim))
    z = 1.0 + 2.0 * eps
    const = dim * math.log(2.0) + 0.5 * dim * math.log(2 * math.pi)
    log_p = -0.5 * np.sum(((z - 1.0) / 2.0) ** 2, axis=1) - const
    log_q = -0.5 * np.einsum("ij,ij->i", eps, eps) - const
    assert np.ptp(log_p - log_q) > 1e-12          # rounding, not a real difference
    d = compute(log_p, log_q)
    assert d.khat == -math.inf and d.verdict == "good" and not d.warnings
