"""Stan-exact ADVI (Kucukelbir et al. 2017, as Stan's advi.hpp implements it:
docs/algorithms.md#advi; oracle accounting: #oracle-calls; the TrustVI paper's ADVI settings:
#advi-profiles)."""

from __future__ import annotations

import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from stanvi.errors import VIError
from stanvi.estimators import ElboEstimator, GradientFailure, gradient_with_redraws, standard_normal
from stanvi.families import FullRank, MeanField
from stanvi.methods import advi, get_method, make_options
from stanvi.methods import advi_rules
from stanvi.methods import advi_output
from stanvi.methods import advi_sgd
from stanvi.estimators import stan_advi
from stanvi.optim import step_size
from stanvi.methods.base import RunContext, purpose_key
from stanvi.progress import IterationProgress

DBL_MAX = advi_rules.DBL_MAX

# A correlated Gaussian target N(m, Σ); the constant −100 keeps the ELBO away from 0 so that
# relative ELBO changes are meaningful (the optimum ELBO is about −100 + log-normalizer).
D = 4
_rng = np.random.default_rng(0)
_A = _rng.normal(size=(D, D))
SIGMA = _A @ _A.T / D + 0.5 * np.eye(D)
LAMBDA = np.linalg.inv(SIGMA)
M = _rng.normal(size=D)


def _gauss_lp(z):
    d = z - M
    return -0.5 * d @ (LAMBDA @ d) - 100.0


def _half_plane_lp(z):
    """Fails (−inf) where z[0] > 0; standard normal elsewhere."""
    return jnp.where(z[0] > 0.0, -jnp.inf, -0.5 * jnp.sum(z * z) - 50.0)


def _box_lp(z):
    """Fails (−inf) outside |z_i| ≤ 5; standard normal inside."""
    return jnp.where(jnp.all(jnp.abs(z) <= 5.0), -0.5 * jnp.sum(z * z) - 50.0, -jnp.inf)


GAUSS = stanvi.JaxTarget(_gauss_lp, D, name="gaussian")
HALF = stanvi.JaxTarget(_half_plane_lp, 2, name="half_plane")
BOX = stanvi.JaxTarget(_box_lp, 2, name="box")

_ESTIMATORS: dict = {}


def estimator(target, family) -> ElboEstimator:
    key = (target.name, family)
    if key not in _ESTIMATORS:
        _ESTIMATORS[key] = ElboEstimator(family, target.jax_log_density)
    return _ESTIMATORS[key]


def run_advi(target, family, seed=0, profile="stan", *, init_mu=None, budget=None, **overrides):
    est = estimator(target, family)
    random_init = np.random.default_rng(seed).uniform(-2, 2, target.dim)
    ctx = RunContext(None if init_mu is None else np.asarray(init_mu, float), random_init, budget,
                     est, IterationProgress("advi", enabled=False))
    options = make_options(advi, profile, overrides)
    return advi.run(target, family, key=jax.random.PRNGKey(seed), options=options, context=ctx)


def scripted_elbo(values):
    """A stand-in for advi.calc_elbo returning ``values`` in order (None = ElboFailure)."""
    calls = []
    it = iter(values)

    def fake(est, params, key, n, ledger=None):
        calls.append(np.array(params))
        v = next(it)
        if v is None:
            raise advi.ElboFailure("scripted failure")
        return v

    return fake, calls


def rows(result, phase):
    return [r for r in result.trace.rows if r.get("phase") == phase]


# ============================================================================ registry / options
def test_registry_profiles_and_options():
    assert get_method("advi") is advi
    stan = make_options(advi, None, {})
    assert advi.DEFAULT_PROFILE == "stan" and stan == advi.Options()
    assert (stan.max_iterations, stan.grad_samples, stan.elbo_samples, stan.eta, stan.adapt_iter,
            stan.tol_rel_obj, stan.eval_elbo, stan.output_samples) == (10000, 1, 100, 1.0, 50,
                                                                       0.01, 100, 1000)
    assert stan.adapt_engaged and stan.init == "random" and stan.init_log_scale == 0.0
    assert not stan.elbo_before_loop
    paper = make_options(advi, "paper", {})
    assert (paper.grad_samples, paper.tol_rel_obj, paper.init_log_scale, paper.init,
            paper.elbo_before_loop) == (256, 1e-4, -1.0, "zero", True)
    assert advi_rules.ETA_GRID == (100.0, 10.0, 1.0, 0.1, 0.01)
    with pytest.raises(ValueError, match="grad_samples"):
        advi.Options(grad_samples=0)
    with pytest.raises(ValueError, match="init"):
        advi.Options(init="uniform")


def test_initial_point_rule():
    mf = MeanField(D)
    r = run_advi(GAUSS, mf, seed=3, max_iterations=1, adapt_engaged=False)
    np.testing.assert_array_equal(r.trace.params[0],
                                  np.r_[np.random.default_rng(3).uniform(-2, 2, D), np.zeros(D)])
    assert r.info["init"] == "random"
    r = run_advi(GAUSS, mf, profile="paper", max_iterations=1, adapt_engaged=False, grad_samples=2)
    np.testing.assert_array_equal(r.trace.params[0], np.r_[np.zeros(D), -np.ones(D)])
    assert r.info["init"] == "zero"
    r = run_advi(GAUSS, mf, profile="paper", init_mu=M, max_iterations=1, adapt_engaged=False,
                 grad_samples=2)
    np.testing.assert_array_equal(r.trace.params[0][:D], M)
    fr = FullRank(D)
    r = run_advi(GAUSS, fr, profile="paper", max_iterations=1, adapt_engaged=False, grad_samples=2)
    np.testing.assert_allclose(np.asarray(fr.cholesky(r.trace.params[0])), np.exp(-1) * np.eye(D))


# ============================================================================ step sizes (docs/algorithms.md#advi-step-size)
def test_stepsize_sequence_scripted_gradients():
    """s_1 = g_1², s_k = 0.1 g_k² + 0.9 s_{k−1}, ρ_k = η k^{-1/2} / (1 + √s_k)
    (docs/algorithms.md#advi-step-size)."""
    grads = [np.array([2.0, -0.5, 0.0]), np.array([-1.0, 3.0, 0.25]),
             np.array([0.5, 0.5, -4.0]), np.array([0.0, -2.0, 1.0])]
    eta = 0.7
    params, s = np.array([0.1, -0.2, 0.3]), np.zeros(3)
    ref_params, ref_s = params.copy(), np.zeros(3)
    for k, g in enumerate(grads, start=1):
        params, s, rho = (np.asarray(a) for a in step_size.stan_step(params, s, g, k, eta))
        for i in range(3):   # Stan's arithmetic, element by element, in plain floats
            ref_s[i] = g[i] ** 2 if k == 1 else 0.9 * ref_s[i] + 0.1 * g[i] ** 2
            eta_scaled = eta / math.sqrt(k)
            ref_params[i] += (eta_scaled * g[i]) / (1.0 + math.sqrt(ref_s[i]))
            assert rho[i] == pytest.approx(eta * k ** -0.5 / (1 + math.sqrt(ref_s[i])), rel=1e-15)
        np.testing.assert_array_equal(s, ref_s)
        np.testing.assert_array_equal(params, ref_params)
    # s_1 = g_1² exactly (not 0.1 g_1²), and the first step is η g / (1 + |g|)
    p1, s1, _ = step_size.stan_step(np.zeros(1), np.zeros(1), np.array([3.0]), 1, 2.0)
    assert float(s1[0]) == 9.0 and float(p1[0]) == 2.0 * 3.0 / 4.0


def test_sgd_chunk_matches_gradient_with_redraws_and_stan_step():
    """The jitted chunk = gradient_with_redraws (same draws, same drop rule) + stan_step."""
    for target, family, n in ((GAUSS, MeanField(D), 1), (GAUSS, FullRank(D), 3),
                              (HALF, MeanField(2), 2)):
        est = estimator(target, family)
        key = jax.random.PRNGKey(11)
        p0 = family.initial_params(np.full(family.dim, -0.3), -0.2)
        chunk = advi_sgd.advance(est, p0, np.zeros_like(p0), k0=0, n_steps=7, t0=20, eta=0.5,
                             key=key, absorb=False, grad_samples=n)
        assert chunk.n_done == 7 and not chunk.fatal
        params, s = p0, np.zeros_like(p0)
        for i in range(7):
            ref = gradient_with_redraws(est, params, purpose_key(key, 21 + i, "gradient"), n,
                                        10 * n)
            assert chunk.drops[i] == ref.n_dropped
            params, s, _ = (np.asarray(a) for a in step_size.stan_step(params, s, ref.gradient, i + 1,
                                                                  0.5))
            np.testing.assert_allclose(chunk.history[i], params, rtol=1e-12, atol=1e-14)
        if target is HALF:
            assert chunk.drops.sum() > 0   # the redraw path was exercised


def test_chunking_does_not_change_results(monkeypatch):
    """Chunk boundaries (k, t, s carried across compiled calls) are invisible in the result."""
    def strip(r):
        return [{k: v for k, v in row.items() if k not in ("wall_time", "compile_time")} for row in r.trace.rows]

    kwargs = dict(seed=6, max_iterations=230, eval_elbo=40, adapt_iter=30)
    a = run_advi(GAUSS, MeanField(D), **kwargs)
    monkeypatch.setattr(advi_sgd, "_CHUNK", 7)
    b = run_advi(GAUSS, MeanField(D), **kwargs)
    assert strip(a) == strip(b)
    np.testing.assert_allclose(np.array(a.trace.params), np.array(b.trace.params), rtol=1e-13)


# ============================================================================ eta adaptation (docs/algorithms.md#advi-eta)
def _select(elbos, elbo_init=-1000.0):
    calls = []

    def trial(eta):
        calls.append(eta)
        return elbos[len(calls) - 1]

    return advi.select_eta(elbo_init, trial), calls


def test_eta_adaptation_rule():
    assert _select([-np.inf, -500, -400, -450]) == (1.0, [100.0, 10.0, 1.0, 0.1])
    assert _select([-300, -350]) == (100.0, [100.0, 10.0])
    assert _select([-DBL_MAX, -DBL_MAX, -900, -800, -700]) == (0.01, list(advi_rules.ETA_GRID))
    # a drop while the previous trial was no better than elbo_init does not stop the search
    assert _select([-1200, -1300, -1100, -1150, -900])[0] == 0.01
    assert _select([-1200, -1300, -1100, -1150, -900])[1] == list(advi_rules.ETA_GRID)
    for bad in ([-2000, -1500, -1200, -1100, -1000], [-DBL_MAX] * 5, [np.nan] * 5):
        with pytest.raises(VIError, match="All proposed step-sizes failed"):
            _select(bad)


def test_eta_adaptation_in_run_and_reset_to_q0(monkeypatch):
    fake, calls = scripted_elbo([-1000.0, None, -500.0, -400.0, -450.0, -300.0])
    monkeypatch.setattr(advi, "calc_elbo", fake)
    family = MeanField(D)
    r = run_advi(GAUSS, family, seed=5, max_iterations=100)
    assert r.status == "max_iters"
    assert r.info["eta"] == 1.0 and r.info["eta_adapted"]
    assert [(a["eta"], a["elbo"]) for a in r.info["adapt_elbos"]] == [
        (100.0, -DBL_MAX), (10.0, -500.0), (1.0, -400.0), (0.1, -450.0)]
    adapt = rows(r, "adapt")
    assert [row["iteration"] for row in adapt] == list(range(1, 201))
    assert [row["eta"] for row in adapt] == [e for e in (100.0, 10.0, 1.0, 0.1) for _ in range(50)]
    assert [row["step"] for row in adapt] == list(range(1, 51)) * 4
    assert adapt[49]["elbo"] == -math.inf and adapt[49]["elbo_failed"]
    assert [adapt[i]["elbo"] for i in (99, 149, 199)] == [-500.0, -400.0, -450.0]
    assert all("elbo" not in row for i, row in enumerate(adapt) if i % 50 != 49)
    assert r.trace.rows[0]["elbo"] == -1000.0 and r.trace.rows[0]["oracle_scaled"] == 0.0
    # each trial ELBO was taken at that trial's last iterate
    for j in range(4):
        np.testing.assert_array_equal(calls[1 + j], r.trace.params[50 * (j + 1)])
    # every trial, and the SGD phase, starts from q₀ with a fresh step-size history
    est, key, q0 = estimator(GAUSS, family), jax.random.PRNGKey(5), r.trace.params[0]
    for t, eta in ((1, 100.0), (51, 10.0), (101, 1.0), (151, 0.1), (201, 1.0)):
        g = gradient_with_redraws(est, q0, purpose_key(key, t, "gradient"), 1, 10).gradient
        expected, _, _ = step_size.stan_step(q0, np.zeros_like(q0), g, 1, eta)
        np.testing.assert_allclose(r.trace.params[t], expected, rtol=1e-12)
    sgd = rows(r, "sgd")
    assert len(sgd) == 100 and sgd[0]["iteration"] == 201 and sgd[-1]["elbo"] == -300.0
    # 300 gradients of 1 draw, 6 ELBOs of 100 draws; elbo_init is charged to row 1
    # (docs/algorithms.md#oracle-calls)
    assert r.trace.rows[1]["oracle_scaled"] == pytest.approx(1 / 256 + 100 / 128)
    assert r.ledger.scaled == pytest.approx(300 / 256 + 6 * 100 / 128)
    assert r.ledger.literal == 306


def test_eta_adaptation_failures(monkeypatch):
    family = MeanField(D)
    fake, _ = scripted_elbo([-1000.0, -2000.0, -1500.0, -1200.0, -1100.0, -1000.0])
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, family, seed=1)
    assert r.status == "failed" and "All proposed step-sizes failed" in r.message
    assert len(rows(r, "adapt")) == 250 and not rows(r, "sgd")
    np.testing.assert_array_equal(r.params, r.trace.params[0])
    fake, _ = scripted_elbo([None])
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, family, seed=1)
    assert r.status == "failed" and "Cannot compute ELBO using the initial" in r.message
    assert len(r.trace) == 1


# ============================================================================ convergence (docs/algorithms.md#advi-convergence)
def test_relative_tolerance_bookkeeping():
    assert advi.Options().cb_size == 10
    assert advi.Options(max_iterations=100).cb_size == 2
    assert advi.Options(max_iterations=25000).cb_size == 25
    mon = advi_rules.RelativeTolerance(10, 0.01)
    first = mon.update(-200.0)
    assert first.rel_change == 1.0 and not first.converged          # elbo_prev = 0
    second = mon.update(-250.0)
    assert second.rel_change == pytest.approx(50 / 250)             # current ELBO below
    assert second.rel_change != pytest.approx(50 / 200)
    # upper median for an even count: sorted [0.0005, 0.001, 0.2, 1.0] → 0.2
    mon = advi_rules.RelativeTolerance(10, 0.01)
    mon.buffer.extend([1.0, 0.2, 0.001])
    mon.elbo = -100.0
    check = mon.update(-100.05)                                     # δ ≈ 0.0005
    assert check.rel_median == 0.2 and not check.converged_median
    assert advi_rules.circ_buff_median([3.0, 1.0, 2.0]) == 2.0
    assert advi_rules.circ_buff_median([4.0, 1.0, 3.0, 2.0]) == 3.0
    # capacity: the oldest entry leaves the buffer
    mon = advi_rules.RelativeTolerance(2, 0.01)
    for e in (-100.0, -100.0, -100.0):
        check = mon.update(e)
    assert list(mon.buffer) == [0.0, 0.0] and check.converged_mean and check.converged_median
    assert math.isinf(advi_rules.rel_difference(0.0, 1.0)) and math.isnan(advi_rules.rel_difference(0.0, 0.0))


def test_earliest_stop_is_300_in_stan_profile_and_100_in_paper(monkeypatch):
    fake, _ = scripted_elbo([-100.0] * 50)
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, MeanField(D), adapt_engaged=False)
    checks = [row for row in rows(r, "sgd") if "elbo" in row]
    assert r.status == "converged" and r.info["sgd_iterations"] == 300
    assert [c["rel_change"] for c in checks] == [1.0, 0.0, 0.0]
    assert [c["rel_median"] for c in checks] == [1.0, 1.0, 0.0]     # upper median of [0, 1]
    assert r.info["converged_by"] == "median"
    fake, _ = scripted_elbo([-100.0] * 50)
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, MeanField(D), profile="paper", adapt_engaged=False, grad_samples=4)
    assert r.status == "converged" and r.info["sgd_iterations"] == 100
    assert r.info["pre_loop_elbo"] == -100.0 and r.info["converged_by"] == "mean+median"


def test_diverging_warning_and_informational_messages(monkeypatch):
    fake, _ = scripted_elbo([-100.0, -300.0] * 20)
    monkeypatch.setattr(advi, "calc_elbo", fake)
    with pytest.warns(advi.ADVIWarning, match="MAY BE DIVERGING"):
        r = run_advi(GAUSS, MeanField(D), adapt_engaged=False, eval_elbo=10, max_iterations=200)
    flagged = [row["step"] for row in rows(r, "sgd") if row.get("diverging")]
    assert flagged == list(range(110, 201, 10))             # only once k > 10·eval_elbo
    assert r.status == "max_iters" and any("maximum number" in m for m in r.info["messages"])
    fake, _ = scripted_elbo([-100.0, -100.0, -150.0, -150.0, -150.0])
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, MeanField(D), adapt_engaged=False)
    assert r.status == "converged" and r.info["sgd_iterations"] == 500
    assert r.info["elbo_best"] == -100.0
    assert any("previous iteration is larger" in m for m in r.info["messages"])


def test_convergence_trace_on_real_run_and_max_iterations():
    """Bookkeeping recomputed from a real run's trace; max_iterations is honoured."""
    r = run_advi(GAUSS, MeanField(D), seed=2, max_iterations=1000, eval_elbo=10,
                 tol_rel_obj=1e-12)
    assert r.info["cb_size"] == 10
    assert r.status == "max_iters" and r.info["sgd_iterations"] == 1000
    sgd = rows(r, "sgd")
    assert len(sgd) == 1000 and sgd[-1]["step"] == 1000
    checks = [row for row in sgd if "elbo" in row]
    assert [c["step"] for c in checks] == list(range(10, 1001, 10))
    elbos = [c["elbo"] for c in checks]
    deltas = [abs((p - c) / c) for p, c in zip([0.0] + elbos[:-1], elbos)]
    assert deltas[0] == 1.0
    for j, c in enumerate(checks):
        window = deltas[max(0, j - 9): j + 1]
        assert c["rel_change"] == deltas[j]
        assert c["rel_mean"] == pytest.approx(sum(window) / len(window), rel=1e-14)
        assert c["rel_median"] == sorted(window)[len(window) // 2]
    # the ledger: 1000 + adaptation gradients, one ELBO per check, trial and elbo_init
    n_elbo = 1 + len(r.info["adapt_elbos"]) + len(checks)
    grads = r.info["adapt_steps"] + 1000
    assert r.ledger.scaled == pytest.approx(grads / 256 + n_elbo * 100 / 128)
    assert np.all(np.diff(r.trace.column("oracle_scaled")) > 0)


# ============================================================================ failures (docs/algorithms.md#failed-draws, #advi-gradient)
def _failures_before(flags, n_needed):
    """Sequential reference (Stan's loop): failures among ``flags`` before the n_needed-th
    success (all failures if it never comes); the caller compares with the drop limit."""
    fails = ok = 0
    for f in flags:
        if f:
            fails += 1
        else:
            ok += 1
            if ok == n_needed:
                return fails
    return fails


@pytest.mark.parametrize("n", [1, 2])
def test_gradient_drop_limit_is_ten_per_draw(n):
    """10·n − 1 dropped draws are absorbed, the 10·n-th drop fails the gradient
    (docs/algorithms.md#advi-gradient)."""
    family = MeanField(2)
    est = estimator(HALF, family)
    params = family.initial_params(np.array([1.28, 0.0]))    # P(fail) = Φ(1.28) ≈ 0.9
    base = jax.random.PRNGKey(0)
    found = {}
    for t in range(1, 1000):
        k = purpose_key(base, t, "gradient")
        z0 = np.concatenate([standard_normal(jax.random.fold_in(k, a), n, 2)[:, 0]
                             for a in range(15)]) + 1.28
        f = _failures_before(list(z0 > 0), n)
        if f in (10 * n - 1, 10 * n):
            found.setdefault(f, t)
        if len(found) == 2:
            break
    assert set(found) == {10 * n - 1, 10 * n}

    def one_step(t, absorb):
        return advi_sgd.advance(est, params, np.zeros(4), k0=0, n_steps=1, t0=t - 1, eta=1.0,
                            key=base, absorb=absorb, grad_samples=n)

    ok = one_step(found[10 * n - 1], False)
    assert not ok.fatal and ok.drops[0] == 10 * n - 1
    bad = one_step(found[10 * n], False)
    assert bad.fatal and bad.n_done == 0
    with pytest.raises(GradientFailure):
        gradient_with_redraws(est, params, purpose_key(base, found[10 * n], "gradient"), n,
                              10 * n)
    # absorbed (adaptation): a zero gradient, even if some draws had succeeded, so λ does not
    # move and s stays 0
    absorbed = one_step(found[10 * n], True)
    assert absorbed.n_done == 1 and absorbed.grad_failed[0]
    np.testing.assert_array_equal(absorbed.history[0], params)
    np.testing.assert_array_equal(absorbed.s, np.zeros(4))


def test_elbo_drop_limit():
    """calc_ELBO with n draws: n − 1 drops are absorbed, the n-th drop raises."""
    family, n = MeanField(2), 10
    est = estimator(HALF, family)
    params = family.initial_params(np.zeros(2))              # P(fail) = 1/2
    seen = {}
    for seed in range(300):
        key = jax.random.PRNGKey(seed)
        eps = np.concatenate([standard_normal(jax.random.fold_in(key, a), n, 2) for a in range(6)])
        f = _failures_before(list(eps[:, 0] > 0), n)
        case = "ok" if f == n - 1 else "fail" if f == n else None
        if case and case not in seen:
            seen[case] = (key, eps)
    assert set(seen) == {"ok", "fail"}
    key, eps = seen["ok"]
    kept = eps[eps[:, 0] <= 0][:n]
    expected = float(np.mean(est.values(params, kept)))
    assert advi.calc_elbo(est, params, key, n) == pytest.approx(expected, rel=1e-14)
    with pytest.raises(advi.ElboFailure, match="maximum amount"):
        advi.calc_elbo(est, params, seen["fail"][0], n)


def test_failures_absorbed_during_adaptation_fatal_during_sgd():
    family = MeanField(2)
    # eta = 100 throws the iterate far outside the box: failed gradients are zero gradients, the
    # failed trial ELBO is −DBL_MAX, and adaptation goes on to a smaller eta.
    r = run_advi(BOX, family, seed=0, init_mu=[0.5, -0.5], max_iterations=200)
    assert r.status in ("converged", "max_iters")
    first = [row for row in rows(r, "adapt") if row["eta"] == 100.0]
    assert any(row.get("grad_failed") for row in first)
    assert r.info["adapt_elbos"][0] == {"eta": 100.0, "elbo": -DBL_MAX}
    assert first[-1]["elbo_failed"] and first[-1]["elbo"] == -math.inf
    assert r.info["eta"] < 100.0
    # without adaptation, the same eta aborts the SGD phase with Stan's message
    r = run_advi(BOX, family, seed=0, init_mu=[0.5, -0.5], adapt_engaged=False, eta=100.0)
    assert r.status == "failed" and "dropped evaluations" in r.message
    assert "(10)" in r.message
    np.testing.assert_array_equal(r.params, r.trace.params[-1])
    assert np.all(np.isfinite(r.params))
    assert r.ledger.gradient_draws == len(r.trace) - 1 + 1    # the failed gradient is charged


def test_elbo_failure_during_sgd_is_fatal(monkeypatch):
    fake, _ = scripted_elbo([-100.0, None])
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, MeanField(D), adapt_engaged=False)
    assert r.status == "failed" and "scripted failure" in r.message
    assert r.trace.rows[-1]["step"] == 200 and r.trace.rows[-1]["elbo_failed"]
    np.testing.assert_array_equal(r.params, r.trace.params[-1])


# ============================================================================ budget
def test_budget_stops_runs():
    family = MeanField(D)
    # adaptation: elbo_init 0.78125, trial 1 = 50/256 + 0.78125 → 1.7578125; then 37 more
    # gradients reach 1.9 (1.7578125 + 37/256 = 1.90234)
    r = run_advi(GAUSS, family, budget=1.9)
    assert r.status == "budget" and r.info["eta"] is None
    assert r.trace.rows[-1]["iteration"] == 87
    assert r.trace.rows[-2]["oracle_scaled"] < 1.9 <= r.trace.rows[-1]["oracle_scaled"]
    np.testing.assert_array_equal(r.params, r.trace.params[-1])
    # SGD: 77/256 ≥ 0.3
    r = run_advi(GAUSS, family, budget=0.3, adapt_engaged=False)
    assert r.status == "budget" and r.trace.rows[-1]["step"] == 77
    # an ELBO check completes the iteration that spends the budget
    r = run_advi(GAUSS, family, budget=1.0, adapt_engaged=False)
    assert r.status == "budget" and r.trace.rows[-1]["step"] == 100 and "elbo" in r.trace.rows[-1]


# ============================================================================ output (docs/algorithms.md#advi-output)
def test_output_draws_format():
    family = FullRank(D)
    est = estimator(GAUSS, family)
    params = family.initial_params(M, -0.5)
    key = jax.random.PRNGKey(9)
    out = advi_output.output_draws(est, params, key, 1000)
    assert out["z"].shape == (1001, D)
    for name in ("lp__", "log_p__", "log_g__"):
        assert out[name].shape == (1001,) and out[name][0] == 0.0
    assert np.all(out["lp__"] == 0.0)
    np.testing.assert_array_equal(out["z"][0], M)
    eps = standard_normal(key, 1000, D)
    np.testing.assert_allclose(out["log_g__"][1:], -0.5 * np.sum(eps**2, axis=1), rtol=1e-14)
    np.testing.assert_allclose(out["z"][1:], np.asarray(family.sample(params, eps)), rtol=1e-14)
    np.testing.assert_allclose(out["log_p__"][1:], GAUSS.log_density(out["z"][1:]).log_density,
                               rtol=1e-14)


# ============================================================================ determinism (docs/algorithms.md#random-keys)
def test_same_seed_same_result_different_seed_differs():
    def strip(r):
        return [{k: v for k, v in row.items() if k not in ("wall_time", "compile_time")} for row in r.trace.rows]

    for family in (MeanField(D), FullRank(D)):
        a = run_advi(GAUSS, family, seed=4, max_iterations=300)
        b = run_advi(GAUSS, family, seed=4, max_iterations=300)
        c = run_advi(GAUSS, family, seed=5, max_iterations=300, init_mu=a.trace.params[0][:D])
        assert strip(a) == strip(b)
        np.testing.assert_array_equal(np.array(a.trace.params), np.array(b.trace.params))
        np.testing.assert_array_equal(a.params, b.params)
        assert not np.array_equal(a.params, c.params)
        assert strip(a) != strip(c)


# ============================================================================ convergence
def _sgd_sd(eta, k, n, noise_var, curvature):
    """Stationary sd of SGD on a quadratic, linearized: x ← x − ρ(c x + ξ), var ξ = v/n, gives
    var x ≈ ρ v / (2 c n) for small ρ c; Stan's ρ ≤ η/√k (the 1/(1+√s) factor only shrinks it)."""
    return np.sqrt(eta / np.sqrt(k) * noise_var / (2.0 * curvature * n))


def test_meanfield_converges_to_gaussian_optimum():
    """Mean-field optimum for N(m, Λ⁻¹): μ = m, σ_i = 1/√Λ_ii
    (docs/algorithms.md#gaussian-closed-forms); tolerance 5 sd of the SGD noise at the last
    iterate (per-draw gradient variances at the optimum, worked out below)."""
    family = MeanField(D)
    n, k = 256, 2000
    r = run_advi(GAUSS, family, seed=0, profile="paper", max_iterations=k)
    assert r.status in ("max_iters", "converged")
    eta, k = r.info["eta"], r.info["sgd_iterations"]
    sigma = 1 / np.sqrt(np.diag(LAMBDA))
    # μ-gradient per draw at the optimum: −Λ(σ⊙ε), variance Σ_j Λ_ij² σ_j²; curvature Λ_ii
    var_mu = (LAMBDA**2) @ sigma**2
    # ω-gradient per draw: −(Λ σ⊙ε)_i σ_i ε_i + 1, variance 2 + Σ_{j≠i} Λ_ij² σ_j² σ_i²;
    # curvature of −½Λ_ii e^{2ω} + ω at the optimum: 2
    off = LAMBDA**2 * np.outer(sigma**2, sigma**2)
    var_omega = 2.0 + off.sum(axis=1) - np.diag(off)
    tol_mu = 5 * _sgd_sd(eta, k, n, var_mu, np.diag(LAMBDA))
    tol_omega = 5 * _sgd_sd(eta, k, n, var_omega, 2.0)
    mu, sd = np.asarray(family.mean(r.params)), np.asarray(family.marginal_sd(r.params))
    assert np.all(np.abs(mu - M) < tol_mu), (mu - M, tol_mu)
    assert np.all(np.abs(np.log(sd / sigma)) < tol_omega), (np.log(sd / sigma), tol_omega)
    assert np.max(tol_mu) < 0.05 and np.max(tol_omega) < 0.05   # the check is tight


def test_fullrank_recovers_covariance():
    """Full-rank optimum: μ = m, L Lᵀ = Σ.  Noise: per-draw μ-gradient −ΛLε has covariance Λ
    (curvature Λ); an L_ij-gradient (−ΛLε)_i ε_j has variance ≤ 3Λ_ii (curvature Λ_ii), and
    δ(LLᵀ)_ij = (δL Lᵀ + L δLᵀ)_ij has sd ≤ sd(δL)·√(2(Σ_ii + Σ_jj))."""
    family = FullRank(D)
    n, k = 256, 2000
    r = run_advi(GAUSS, family, seed=0, profile="paper", max_iterations=k)
    eta, k = r.info["eta"], r.info["sgd_iterations"]
    tol_mu = 5 * _sgd_sd(eta, k, n, np.diag(LAMBDA), np.diag(LAMBDA))
    sd_l = _sgd_sd(eta, k, n, 3.0, 1.0)
    tol_cov = 5 * sd_l * np.sqrt(2 * (np.diag(SIGMA)[:, None] + np.diag(SIGMA)[None, :]))
    mu, cov = np.asarray(family.mean(r.params)), np.asarray(family.covariance(r.params))
    assert np.all(np.abs(mu - M) < tol_mu), (mu - M, tol_mu)
    assert np.all(np.abs(cov - SIGMA) < tol_cov), (cov - SIGMA, tol_cov)
    assert np.max(tol_cov) < 0.25


def test_stan_profile_converges_by_relative_tolerance():
    """Stan defaults (1 draw per gradient) stop by the relative-tolerance rule, near the optimum
    within the (much larger) 1-draw SGD noise."""
    family = MeanField(D)
    r = run_advi(GAUSS, family, seed=1)
    assert r.status == "converged" and r.info["sgd_iterations"] >= 300
    assert r.info["sgd_iterations"] % 100 == 0
    eta, k = r.info["eta"], r.info["sgd_iterations"]
    sigma = 1 / np.sqrt(np.diag(LAMBDA))
    tol_mu = 5 * _sgd_sd(eta, k, 1, (LAMBDA**2) @ sigma**2, np.diag(LAMBDA))
    assert np.all(np.abs(np.asarray(family.mean(r.params)) - M) < tol_mu)


def test_sgd_overhead_per_iteration():
    family = MeanField(D)
    run_advi(GAUSS, family, seed=0, max_iterations=200, tol_rel_obj=1e-12)   # compile
    start = time.perf_counter()
    r = run_advi(GAUSS, family, seed=0, max_iterations=3000, tol_rel_obj=1e-12)
    per_iteration = (time.perf_counter() - start) / (len(r.trace) - 1)
    assert len(rows(r, "sgd")) == 3000
    assert per_iteration < 1e-3, f"{per_iteration * 1e6:.0f} µs per iteration"


# ============================================================================ a Stan model
@pytest.mark.slow
def test_stan_model_with_reject_region(reject_region):
    """A real reject(): the chunk's callbacks into C++ inside the jitted loop follow the same
    drop-and-redraw rule as gradient_with_redraws; dropped draws are evaluated but not charged."""
    target = reject_region
    family = MeanField(target.dim)
    est = ElboEstimator(family, target.jax_log_density)
    key = jax.random.PRNGKey(3)
    p0 = family.initial_params(np.array([2.0, 0.0]), -0.5)      # half the draws reject
    chunk = advi_sgd.advance(est, p0, np.zeros_like(p0), k0=0, n_steps=5, t0=0, eta=0.1, key=key,
                         absorb=True, grad_samples=2)
    params, s = p0, np.zeros_like(p0)
    for i in range(5):
        ref = gradient_with_redraws(est, params, purpose_key(key, i + 1, "gradient"), 2, 20)
        assert chunk.drops[i] == ref.n_dropped
        params, s, _ = step_size.stan_step(params, s, ref.gradient, i + 1, 0.1)
        np.testing.assert_allclose(chunk.history[i], np.asarray(params), rtol=1e-12)
    assert chunk.drops.sum() > 0

    target.counter.reset()
    ctx = RunContext(np.array([1.0, 0.0]), target.initial_point(1), None, est,
                     IterationProgress("advi", enabled=False))
    r = advi.run(target, family, key=jax.random.PRNGKey(0), options=advi.Options(), context=ctx)
    # Stan's estimator drops rejected draws, which can let the iterate drift into the rejection
    # region until calc_ELBO's drop limit ends the run: both outcomes are Stan's behaviour
    # and Stan's advi::run fails when an output draw throws (half of q is in the region)
    assert r.status in ("converged", "max_iters") or (
        r.status == "failed" and ("dropped evaluations" in r.message
                                  or "output draw" in r.message)), r.message
    assert r.info["grad_draws_dropped"] > 0
    # draws evaluated = accepted draws + dropped draws (1 draw per gradient)
    accepted = r.ledger.gradient_draws - r.info["grad_failures"]
    assert target.counter.gradient == accepted + r.info["grad_draws_dropped"]


# ============================================================================ issue 8: Stan's control flow, line for line
# Each test below pins one path of [S] advi.hpp / normal_meanfield.hpp / normal_fullrank.hpp
# that stanvi used to take differently.

def test_eta_adaptation_keeps_nan_and_minus_infinity_as_stan_does():
    """adapt_eta maps only a *thrown* calc_ELBO to −DBL_MAX; a NaN or −∞ ELBO is compared as it
    is (IEEE comparisons, as in C++)."""
    # NaN becomes elbo_best (NaN < −500 is false) and then blocks nothing: Stan goes on to η = 1
    # and stops at 0.1.  Mapping NaN to −DBL_MAX stopped at once with η = 100.
    assert _select([-500.0, np.nan, -600.0, -700.0]) == (1.0, [100.0, 10.0, 1.0, 0.1])
    # with elbo_init = −∞ (calc_ELBO's sum overflowed), a first trial at −∞ stops at once with
    # eta_best = 0: −∞ < −DBL_MAX and −DBL_MAX > −∞
    assert _select([-np.inf], elbo_init=-np.inf) == (0.0, [100.0])
    # ... while a failed first trial (−DBL_MAX) does not, and η = 0.01 then beats −∞
    assert _select([-DBL_MAX] * 5, elbo_init=-np.inf) == (0.01, list(advi_rules.ETA_GRID))
    # a NaN elbo_init makes every comparison false: no early stop, and the last η fails
    with pytest.raises(VIError, match="All proposed step-sizes failed"):
        _select([-500.0, -600.0, -700.0, -800.0, -900.0], elbo_init=np.nan)


def test_nan_trial_elbo_in_a_run(monkeypatch):
    fake, _ = scripted_elbo([-1000.0, -500.0, np.nan, -600.0, -700.0, -300.0])
    monkeypatch.setattr(advi, "calc_elbo", fake)
    r = run_advi(GAUSS, MeanField(D), seed=2, max_iterations=100)
    assert r.info["eta"] == 1.0
    assert [a["eta"] for a in r.info["adapt_elbos"]] == [100.0, 10.0, 1.0, 0.1]
    assert math.isnan(r.info["adapt_elbos"][1]["elbo"])


# log p = −1e307 everywhere: every draw is finite, but 100 of them overflow Stan's running sum
_HUGE = stanvi.JaxTarget(lambda z: -1e307 + 0.0 * jnp.sum(jnp.tanh(z)), 2, name="huge_negative")


def test_elbo_sum_overflow_is_minus_infinity_and_eta_zero_fails_sgd():
    """calc_ELBO sums log p in draw order, then divides: 100 × (−1e307) is −∞ with no dropped
    draw.  With elbo_init = −∞ and the first trial at −∞, adapt_eta returns eta_best = 0 and
    stochastic_gradient_ascent's check_positive("Eta stepsize") fails the run."""
    family = MeanField(2)
    est = estimator(_HUGE, family)
    p0 = family.initial_params(np.zeros(2))
    assert advi.calc_elbo(est, p0, jax.random.PRNGKey(0), 100) == -math.inf
    # 10 draws do not overflow: the mean of −1e307 plus the entropy
    h = float(family.entropy(jnp.asarray(p0)))
    assert advi.calc_elbo(est, p0, jax.random.PRNGKey(0), 10) == pytest.approx(-1e307 + h)
    r = run_advi(_HUGE, family, seed=0, max_iterations=100)
    assert r.info["elbo_init"] == -math.inf
    assert r.info["adapt_elbos"] == [{"eta": 100.0, "elbo": -math.inf}]
    assert r.info["eta"] == 0.0
    assert r.status == "failed" and "Eta stepsize is 0, but must be positive" in r.message
    assert not rows(r, "sgd")
    np.testing.assert_array_equal(r.params, r.trace.params[0])


# log p = −5 with a zero gradient everywhere, ±∞ included
_FLAT = stanvi.JaxTarget(lambda z: -5.0 + 0.0 * jnp.sum(jnp.tanh(z)), 2, name="flat")
# bounded log p (|log p| ≤ 1e300) with a gradient of order 1e300
_WAVY = stanvi.JaxTarget(lambda z: 1e300 * jnp.sum(jnp.sin(z)), 1, name="wavy")


def test_nan_gradient_fails_calc_grad_without_dropping_draws():
    """σ = exp(710) = ∞: every ζ is ±∞, where this target is finite with a zero gradient, so Stan
    keeps every draw; ω's gradient mean(g·ε)·exp(ω) = 0·∞ is NaN and set_omega throws
    std::domain_error: the gradient fails with no draw dropped (autodiff of the per-draw ℓ
    instead found a NaN per draw and dropped ten)."""
    family = MeanField(2)
    est = estimator(_FLAT, family)
    p0 = family.initial_params(np.zeros(2), 710.0)
    chunk = advi_sgd.advance(est, p0, np.zeros(4), k0=0, n_steps=3, t0=0, eta=1.0,
                         key=jax.random.PRNGKey(0), absorb=False, grad_samples=1)
    assert chunk.fatal and chunk.n_done == 0
    assert chunk.fatal_kind == stan_advi.GRAD_NAN and chunk.fatal_drops == 0
    # adaptation absorbs it as a zero gradient
    chunk = advi_sgd.advance(est, p0, np.zeros(4), k0=0, n_steps=2, t0=0, eta=1.0,
                         key=jax.random.PRNGKey(0), absorb=True, grad_samples=1)
    assert list(chunk.grad_failed) == [stan_advi.GRAD_NAN] * 2 and list(chunk.drops) == [0, 0]
    np.testing.assert_array_equal(chunk.params, p0)
    r = run_advi(_FLAT, family, seed=0, init_mu=[0.0, 0.0], adapt_engaged=False,
                 init_log_scale=710.0)
    assert r.status == "failed" and "nan" in r.message and "SGD iteration 1" in r.message
    assert r.info["grad_draws_dropped"] == 0 and r.info["grad_failures"] == 1


def test_overflowing_scale_gradient_is_not_a_drop():
    """Stan checks only ∇ log p(ζ) for finiteness; ω's gradient mean(g·ε)·exp(ω) may overflow
    to ±∞ and is used as it is.  The step-size rule then gives ∞/∞ = NaN, so ω becomes NaN (as
    in Stan, where operator/ does not check), and the next gradient drops its ten draws."""
    family = MeanField(1)
    est = estimator(_WAVY, family)
    p0 = family.initial_params(np.zeros(1), 20.0)          # σ = 4.9e8, g·ε·σ ~ 1e308+
    chunk = advi_sgd.advance(est, p0, np.zeros(2), k0=0, n_steps=2, t0=0, eta=1.0,
                         key=jax.random.PRNGKey(1), absorb=False, grad_samples=1)
    assert chunk.n_done == 1 and chunk.drops[0] == 0
    assert np.isfinite(chunk.history[0][0]) and np.isnan(chunk.history[0][1])
    assert chunk.fatal and chunk.fatal_kind == stan_advi.GRAD_DROP_LIMIT and chunk.fatal_drops == 10


def test_gradient_is_stans_arithmetic():
    """The chunk's gradient is Stan's calc_grad: Σ g and Σ g∘ε (or the lower triangle of g εᵀ)
    over the kept draws, divided by n, then ω's part times exp(ω) plus 1 (full-rank: 1/L_dd
    on the diagonal); checked against numpy with the same draws."""
    for family, n in ((MeanField(D), 3), (FullRank(D), 2)):
        est = estimator(GAUSS, family)
        key = jax.random.PRNGKey(4)
        p0 = family.initial_params(np.linspace(-1, 1, D), -0.4)
        if isinstance(family, FullRank):
            p0 = p0 + 0.05 * np.r_[np.zeros(D), np.arange(family.n_params - D)]
        chunk = advi_sgd.advance(est, p0, np.zeros_like(p0), k0=0, n_steps=1, t0=6, eta=0.7,
                             key=key, absorb=False, grad_samples=n)
        eps = np.asarray(jax.random.normal(jax.random.fold_in(purpose_key(key, 7, "gradient"), 0),
                                           (n, D), dtype=jnp.float64))
        z = np.asarray(family.sample(jnp.asarray(p0), eps))
        g = np.array([-(LAMBDA @ (zi - M)) for zi in z])
        mu_grad = g.sum(0) / n
        if isinstance(family, MeanField):
            rest = (g * eps).sum(0) / n * np.exp(p0[D:]) + 1.0
        else:
            r_, c_ = np.tril_indices(D)
            rest = (g[:, r_] * eps[:, c_]).sum(0) / n
            rest[r_ == c_] += 1.0 / p0[D:][r_ == c_]
        expected, _, _ = step_size.stan_step(p0, np.zeros_like(p0), np.r_[mu_grad, rest], 1, 0.7)
        np.testing.assert_allclose(chunk.history[0], np.asarray(expected), rtol=1e-13)


def test_sgd_gradient_failure_message_names_the_family():
    for family, name in ((MeanField(2), "normal_meanfield"), (FullRank(2), "normal_fullrank")):
        r = run_advi(BOX, family, seed=0, init_mu=[0.5, -0.5], adapt_engaged=False, eta=100.0)
        assert r.status == "failed"
        assert f"stan::variational::{name}::calc_grad: The number of dropped evaluations" in r.message
        assert r.info["grad_draws_dropped"] >= 10


def test_a_throwing_output_draw_fails_the_run_as_in_stans_run():
    """[S] advi::run evaluates log_prob<false, true> at every output draw outside any try: the
    first failing draw ends the run with an error after the SGD phase."""
    family = MeanField(2)
    key = jax.random.PRNGKey(3)
    r = run_advi(BOX, family, seed=3, init_mu=[4.0, 0.0], adapt_engaged=False, eta=0.001,
                 max_iterations=100)
    assert r.status == "failed" and "output draw" in r.message and "max_iters" in r.message
    assert r.info["sgd_status"] == "max_iters"
    # the first output draw (purpose_key(key, 0, 'output'), as stanvi.fit draws them) outside
    # the box
    eps = standard_normal(purpose_key(key, 0, "output"), 1000, 2)
    z = np.asarray(family.sample(jnp.asarray(r.params), eps))
    outside = np.flatnonzero(np.any(np.abs(z) > 5.0, axis=1))
    assert r.info["output_failed_draw"] == outside[0]
    assert f"output draw {outside[0] + 1} of 1000" in r.message
    np.testing.assert_array_equal(r.params, r.trace.params[-1])
    # the check can be turned off; a run whose output draws are all fine is unaffected
    off = run_advi(BOX, family, seed=3, init_mu=[4.0, 0.0], adapt_engaged=False, eta=0.001,
                   max_iterations=100, output_check=False)
    assert off.status == "max_iters"
    np.testing.assert_array_equal(off.params, r.params)
    ok = run_advi(BOX, family, seed=3, init_mu=[0.0, 0.0], adapt_engaged=False, eta=0.001,
                  max_iterations=100)
    assert ok.status == "max_iters" and "output_failed_draw" not in ok.info


# ============================================================================ raw-unit regressions (issue 8)
TEST_MODELS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "models")


def _load_test_model(name):
    # the toolchain is a requirement of the suite: a model that does not build is a failure
    return stanvi.load(os.path.join(TEST_MODELS, f"{name}.stan"),
                       os.path.join(TEST_MODELS, f"{name}.data.json"), progress=False)


def _stan_calc_grad(target, params, key, n):
    """normal_meanfield::calc_grad in numpy on target.log_density_gradient (the same draws as the
    kernel): (gradient or None when the 10·n-th draw is dropped, dropped draws)."""
    dim = target.dim
    mu, omega = params[:dim], params[dim:]
    acc_mu, acc_omega = np.zeros(dim), np.zeros(dim)
    have = dropped = attempt = 0
    while have < n:
        eps = np.asarray(jax.random.normal(jax.random.fold_in(key, attempt), (n, dim),
                                           dtype=jnp.float64))
        attempt += 1
        res = target.log_density_gradient(mu + np.exp(omega) * eps)
        for j in range(n):
            if have == n:
                break
            if res.ok[j] and np.all(np.isfinite(res.gradient[j])):
                acc_mu, acc_omega = acc_mu + res.gradient[j], acc_omega + res.gradient[j] * eps[j]
                have += 1
            else:
                dropped += 1
                if dropped >= 10 * n:
                    return None, dropped
    return np.r_[acc_mu / n, acc_omega / n * np.exp(omega) + 1.0], dropped


@pytest.mark.slow
@pytest.mark.parametrize("name", ["raw_height_weight", "raw_income"])
def test_raw_unit_regression_steps_follow_stans_calc_grad(name):
    """On raw-unit regressions (tests/models/) the kernel's steps, drops and absorbed failures
    equal Stan's calc_grad and step-size rule recomputed in numpy from the Stan target's own
    gradients (on raw_height_weight the η = 100 trial throws σ to where most draws fail)."""
    target = _load_test_model(name)
    family = MeanField(target.dim)
    est = ElboEstimator(family, target.jax_log_density)
    key = jax.random.PRNGKey(1)
    p0 = family.initial_params(target.initial_point(1))
    for eta, absorb, n in ((100.0, True, 1), (10.0, False, 1), (1.0, True, 3)):
        chunk = advi_sgd.advance(est, p0, np.zeros_like(p0), k0=0, n_steps=30, t0=0, eta=eta,
                             key=key, absorb=absorb, grad_samples=n)
        params, s = p0, np.zeros_like(p0)
        for i in range(30):
            g, dropped = _stan_calc_grad(target, params, purpose_key(key, i + 1, "gradient"), n)
            if g is None and not absorb:
                assert chunk.fatal and chunk.n_done == i and chunk.fatal_drops == 10 * n
                break
            assert chunk.drops[i] == dropped
            assert bool(chunk.grad_failed[i]) == (g is None)
            params, s, _ = (np.asarray(a) for a in step_size.stan_step(
                params, s, np.zeros_like(p0) if g is None else g, i + 1, eta))
            np.testing.assert_allclose(chunk.history[i], params, rtol=1e-12, atol=1e-300)
        if eta == 100.0 and name == "raw_height_weight":   # the drop path was exercised
            assert chunk.grad_failed.any() and chunk.drops.sum() > 0
