"""The multilevel reparameterized gradient (stanvi/estimators/mlmc.py) on the reference Gaussian
of docs/mlmcvi.md#reference-gaussian: the per-draw gradient against autodiff, level-0 and
level-difference unbiasedness (mean-field and full-rank, both scales), the level variance
against its closed form, coupling (docs/mlmcvi.md#levels), the G-form against the momentum form
(docs/mlmcvi.md#update-rule), the noise-free reduction, and the RQMC base draws.
Every statistical tolerance is 4 standard errors estimated from the same replicates."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlmc_gaussian import (C_MAX, C_MIN, D, MU, P, V0, GaussianTarget, free_energy,
                           grad_free_energy, level_variance, scale_matrix)
from stanvi.estimators.mlmc import (Coordinates, MultilevelGradient, level_difference,
                                    plain_level, replicate_estimates, variance_and_snr)
from stanvi.estimators.mlmc_schedule import Scheduler, sample_size
from stanvi.estimators.qmc import base_draws
from stanvi.families.gaussian import FullRank, MeanField

CASES = [("meanfield", "direct"), ("meanfield", "log"), ("fullrank", "log"),
         ("fullrank", "direct")]


def _coords(family: str, scale: str) -> Coordinates:
    fam = MeanField(D) if family == "meanfield" else FullRank(D, diagonal="log")
    return Coordinates(fam, scale)


def _theta(coords: Coordinates, rng, spread: float = 0.3) -> np.ndarray:
    """A point away from the optimum: m near μ*/2, scales in (0.5, 1.5), small off-diagonals."""
    theta = np.zeros(coords.n_params)
    theta[:D] = 0.5 * MU + spread * rng.standard_normal(D)
    idx = coords.scale_index()
    s = rng.uniform(0.5, 1.5, len(idx))
    theta[idx] = np.log(s) if coords.scale == "log" else s
    if coords.fullrank:
        off = np.setdiff1d(np.arange(D, coords.n_params), idx)
        theta[off] = 0.2 * rng.standard_normal(len(off))
    return theta


def _draw(rng):
    return lambda n: rng.standard_normal((n, D))


def _mean_within(samples: np.ndarray, expected: np.ndarray, k: float = 4.0) -> None:
    """Every coordinate's mean within k s.e. (sample s.d./√R) of ``expected``."""
    mean = samples.mean(axis=0)
    se = samples.std(axis=0, ddof=1) / np.sqrt(len(samples))
    z = np.abs(mean - expected) / np.maximum(se, 1e-300)
    assert np.all(z <= k), f"max |mean − expected|/se = {z.max():.2f} at {int(z.argmax())}"


@pytest.mark.parametrize("family,scale", CASES)
def test_per_draw_gradient_is_the_autodiff_gradient(family, scale, rng):
    """The table of docs/mlmcvi.md#per-draw-gradient equals ∇_θ[log q(T(ε;θ)) − log p(T(ε;θ))]
    by JAX autodiff."""
    coords = _coords(family, scale)
    target = GaussianTarget()
    theta = _theta(coords, rng)
    eps = rng.standard_normal((5, D))
    gamma = target.log_density_gradient(coords.sample(theta, eps)).gradient
    got = coords.per_draw(theta, eps, gamma)

    def f(t, e):
        m, L = scale_matrix(coords, t)
        z = m + L @ e
        r = z - jnp.asarray(MU)
        return 0.5 * r @ (jnp.asarray(P) @ r) - jnp.sum(jnp.log(jnp.abs(jnp.diag(L))))

    want = np.stack([np.asarray(jax.grad(f)(jnp.asarray(theta), jnp.asarray(e))) for e in eps])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(coords.sample(theta, eps),
                               np.asarray(scale_matrix(coords, theta)[0])
                               + eps @ np.asarray(scale_matrix(coords, theta)[1]).T, atol=1e-12)


@pytest.mark.parametrize("family,scale", CASES)
def test_coordinates_round_trip_keeps_q(family, scale, rng):
    coords = _coords(family, scale)
    theta = _theta(coords, rng)
    params = coords.to_family(theta)
    np.testing.assert_allclose(coords.from_family(params), theta, atol=1e-12)
    fam = coords.family
    _, L = scale_matrix(coords, theta)
    np.testing.assert_allclose(np.asarray(fam.covariance(params)), np.asarray(L @ L.T), atol=1e-12)


@pytest.mark.parametrize("family,scale", CASES)
def test_level0_is_unbiased(family, scale, rng):
    """Over R = 2000 replicates of a 10-draw level 0, the mean equals ∇F(θ)."""
    coords = _coords(family, scale)
    target = GaussianTarget()
    theta = _theta(coords, rng)
    reps, evaluated = replicate_estimates(target, coords, theta=theta, theta_prev=None, base=None,
                                          draw=_draw(rng), n=10, reps=2000)
    assert evaluated == 20_000
    _mean_within(reps, grad_free_energy(coords, theta))


@pytest.mark.parametrize("family,scale", CASES)
def test_level_difference_is_unbiased(family, scale, rng):
    """The mean of Δ̂ over R = 2000 replicates equals ∇F(θ) − ∇F(θ')."""
    coords = _coords(family, scale)
    target = GaussianTarget()
    theta = _theta(coords, rng)
    theta_prev = theta + 0.05 * rng.standard_normal(coords.n_params)
    reps, evaluated = replicate_estimates(target, coords, theta=theta, theta_prev=theta_prev,
                                          base=None, draw=_draw(rng), n=5, reps=2000)
    assert evaluated == 2 * 5 * 2000
    _mean_within(reps, grad_free_energy(coords, theta) - grad_free_energy(coords, theta_prev))


def test_level_variance_matches_closed_form(rng):
    """The one-sample trace variance V̂ of a level difference (M = 2·10⁵ pairs) equals the
    closed form V(λ, λ') of docs/mlmcvi.md#reference-gaussian within 4 ŝe,
    ŝe = sd_n(‖Δ_n − Δ̄‖²)/√M; and V_0 at λ_0 = (0, 1) is 158.0617."""
    assert abs(V0 - 158.0617) < 1e-4
    coords = _coords("meanfield", "direct")
    target = GaussianTarget()
    theta = _theta(coords, rng)
    theta_prev = theta + 0.1 * rng.standard_normal(coords.n_params)
    M = 200_000
    eps = rng.standard_normal((M, D))
    z = np.concatenate([coords.sample(theta, eps), coords.sample(theta_prev, eps)])
    gamma = target.log_density_gradient(z).gradient
    rows = coords.per_draw(theta, eps, gamma[:M]) - coords.per_draw(theta_prev, eps, gamma[M:])
    sq = np.sum((rows - rows.mean(axis=0)) ** 2, axis=1)
    se = sq.std(ddof=1) / np.sqrt(M)
    v = level_variance(theta, theta_prev)
    assert abs(sq.mean() - v) <= 4 * se, (sq.mean(), v, se)
    stats = level_difference(target, coords, theta, theta_prev, lambda n: eps[:n], M)
    np.testing.assert_allclose(stats.var, rows.var(axis=0, ddof=1).sum(), rtol=1e-10)
    # level 0 at λ_0
    theta0 = np.concatenate([np.zeros(D), np.ones(D)])
    g0 = plain_level(target, coords, theta0, lambda n: eps[:n], M)
    sq0 = np.sum((coords.per_draw(theta0, eps, target.log_density_gradient(
        coords.sample(theta0, eps)).gradient) - g0.mean) ** 2, axis=1)
    assert abs(g0.var - V0) <= 4 * sq0.std(ddof=1) / np.sqrt(M), (g0.var, V0)


def test_coupling_makes_the_level_variance_vanish(rng):
    """Coupling (docs/mlmcvi.md#levels): with shared ε, V(λ, λ+δ)/‖δ‖² stays in
    [c_min, c_max] = [1.08, 13] as δ shrinks from 10⁻¹ to 10⁻⁴ (within 4 s.e.); with independent
    ε the one-sample variance stays at tr Cov g_λ + tr Cov g_λ' (≈ 2 V_0 at λ_0), within
    4 s.e."""
    assert abs(C_MIN - 1.08) < 0.01 and abs(C_MAX - 13.0) < 1e-9
    coords = _coords("meanfield", "direct")
    target = GaussianTarget()
    theta = np.concatenate([np.zeros(D), np.ones(D)])
    direction = rng.standard_normal(coords.n_params)
    direction /= np.linalg.norm(direction)
    M = 50_000
    for scale in (1e-1, 1e-2, 1e-3, 1e-4):
        delta = scale * direction
        eps = rng.standard_normal((M, D))
        z = np.concatenate([coords.sample(theta + delta, eps), coords.sample(theta, eps)])
        gamma = target.log_density_gradient(z).gradient
        rows = (coords.per_draw(theta + delta, eps, gamma[:M])
                - coords.per_draw(theta, eps, gamma[M:]))
        sq = np.sum((rows - rows.mean(axis=0)) ** 2, axis=1) / scale ** 2
        se = sq.std(ddof=1) / np.sqrt(M)
        assert C_MIN - 4 * se <= sq.mean() <= C_MAX + 4 * se, (scale, sq.mean())
        # independent draws for the two terms: no variance reduction at any scale
        eps2 = rng.standard_normal((M, D))
        g_new = coords.per_draw(theta + delta, eps, target.log_density_gradient(
            coords.sample(theta + delta, eps)).gradient)
        g_old = coords.per_draw(theta, eps2, target.log_density_gradient(
            coords.sample(theta, eps2)).gradient)
        indep = g_new - g_old
        sq_i = np.sum((indep - indep.mean(axis=0)) ** 2, axis=1)
        expected = g_new.var(axis=0, ddof=1).sum() + g_old.var(axis=0, ddof=1).sum()
        assert abs(sq_i.mean() - expected) <= 4 * sq_i.std(ddof=1) / np.sqrt(M)
        assert abs(expected - 2 * V0) < 0.05 * 2 * V0


def _run_g_form(target, coords, theta0, rng_seed, sched, n0, lr0, T):
    rng = np.random.default_rng(rng_seed)
    mlrg = MultilevelGradient(target, coords)
    mlrg.start(theta0, _draw(rng), n0)
    thetas = [theta0, theta0 - lr0 * sched.eta(0) * mlrg.G]
    for t in range(1, T + 1):
        mlrg.add_level(thetas[-1], thetas[-2], _draw(rng), sample_size(sched, t, n0))
        thetas.append(thetas[-1] - lr0 * sched.eta(t) * mlrg.G)
    return np.array(thetas)


@pytest.mark.parametrize("family,scale", [("meanfield", "direct"), ("meanfield", "log"),
                                          ("fullrank", "log")])
def test_g_form_equals_momentum_form(family, scale):
    """λ_{t+1} = λ_t + (η_t/η_{t−1})(λ_t − λ_{t−1}) − α_t Δ̂_t (the paper's Algorithm 1;
    docs/mlmcvi.md#update-rule) follows the G-form trajectory to 1e−10 over 300 iterations with
    the same draws."""
    coords = _coords(family, scale)
    target = GaussianTarget()
    theta0 = coords.from_family(coords.family.initial_params(np.zeros(D), 0.0))
    sched, n0, lr0, T = Scheduler("step", 0.5, 100), 20, 0.05, 300
    g_form = _run_g_form(target, coords, theta0, 5, sched, n0, lr0, T)
    rng = np.random.default_rng(5)
    g0 = plain_level(target, coords, theta0, _draw(rng), n0).mean
    lam = [theta0, theta0 - lr0 * g0]
    for t in range(1, T + 1):
        inc = level_difference(target, coords, lam[-1], lam[-2], _draw(rng),
                               sample_size(sched, t, n0)).mean
        lam.append(lam[-1] + sched.eta(t) / sched.eta(t - 1) * (lam[-1] - lam[-2])
                   - lr0 * sched.eta(t) * inc)
    assert np.max(np.abs(np.array(lam) - g_form)) < 1e-10


def test_noise_free_reduction_is_gradient_descent():
    """With ε ≡ 0 every g_θ(ε) is the deterministic g_θ(0), and MLMC's telescoping sum gives
    G_t = g_{θ_t}(0) exactly: the run is gradient descent θ_{t+1} = θ_t − α_0 η_t g_{θ_t}(0)
    to 1e−12 (the bookkeeping of Lemma 1)."""
    coords = _coords("meanfield", "direct")
    target = GaussianTarget()
    sched, n0, lr0 = Scheduler("step", 0.5, 50), 7, 0.05
    zeros = lambda n: np.zeros((n, D))  # noqa: E731
    theta0 = np.concatenate([np.zeros(D), np.ones(D)])
    mlrg = MultilevelGradient(target, coords)
    mlrg.start(theta0, zeros, n0)
    thetas = [theta0, theta0 - lr0 * mlrg.G]
    gd = theta0.copy()

    def g_at_zero(th):
        return coords.per_draw(th, np.zeros((1, D)), target.log_density_gradient(
            coords.sample(th, np.zeros((1, D)))).gradient)[0]

    gd = gd - lr0 * g_at_zero(gd)
    for t in range(1, 200):
        stats = mlrg.add_level(thetas[-1], thetas[-2], zeros, sample_size(sched, t, n0))
        assert stats.n < 2 or stats.var == 0.0
        thetas.append(thetas[-1] - lr0 * sched.eta(t) * mlrg.G)
        gd = gd - lr0 * sched.eta(t) * g_at_zero(gd)
        assert np.max(np.abs(thetas[-1] - gd)) < 1e-12


def test_failed_draws_are_redrawn_as_pairs_and_counted():
    """docs/mlmcvi.md#failed-draws: a pair with a failed evaluation is redrawn (both terms), the
    extra evaluations are reported, and too many failures raise GradientFailure."""
    from stanvi.estimators.elbo import GradientFailure
    from stanvi.targets.base import BatchResult

    class Flaky(GaussianTarget):
        def log_density_gradient(self, z):
            res = super().log_density_gradient(z)
            ok = z[:, 0] < 1.5                      # fails on part of q's mass
            g = np.where(ok[:, None], res.gradient, np.nan)
            return BatchResult(np.where(ok, res.log_density, -np.inf), gradient=g, ok=ok)

    coords = _coords("meanfield", "direct")
    theta = np.concatenate([np.zeros(D), np.ones(D)])
    rng = np.random.default_rng(0)
    stats = level_difference(Flaky(), coords, theta, theta + 0.01, _draw(rng), 50, max_fail=0.5)
    assert stats.n == 50 and stats.redrawn > 0 and stats.evaluated == 100 + stats.redrawn
    assert np.all(np.isfinite(stats.mean))
    with pytest.raises(GradientFailure):
        level_difference(Flaky(), coords, theta + np.r_[np.full(D, 3.0), np.zeros(D)],
                         theta, _draw(rng), 50, max_fail=0.1)


def test_rqmc_draws_are_normal_and_reduce_variance(rng):
    """RQMC base draws (scrambled Sobol', docs/mlmcvi.md#baselines): unbiased level-0 gradient
    (4 s.e.) and, on this smooth target at N = 64, a variance below plain MC's."""
    coords = _coords("meanfield", "direct")
    target = GaussianTarget()
    theta = _theta(coords, rng)
    out = {}
    for kind in ("mc", "rqmc"):
        reps, _ = replicate_estimates(target, coords, theta=theta, theta_prev=None, base=None,
                                      draw=lambda n: base_draws(kind, rng, n, D), n=64, reps=500)
        _mean_within(reps, grad_free_energy(coords, theta))
        out[kind] = variance_and_snr(reps)
    assert out["rqmc"]["grad_var"] < 0.5 * out["mc"]["grad_var"], out
    u = base_draws("rqmc", rng, 100, 3)   # non power of two: still works
    assert u.shape == (100, 3) and np.all(np.isfinite(u))
    with pytest.raises(ValueError, match="unknown base-draw kind"):
        base_draws("sobol", rng, 4, 2)


def test_free_energy_helper_is_consistent():
    """The test's exact F: its gradient at the mean-field optimum is zero."""
    coords = _coords("meanfield", "direct")
    opt = np.concatenate([MU, 1.0 / np.sqrt(np.diag(P))])
    assert np.max(np.abs(grad_free_energy(coords, opt))) < 1e-12
    assert np.isfinite(float(free_energy(coords, opt)))
