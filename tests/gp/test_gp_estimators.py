"""QSGP estimators (docs/gp.md#objective): the exact ELBO identity, exact unbiasedness of the
Gaussian ELBO estimator and of its gradient by enumerating every index draw on tiny problems (no
Monte Carlo: the expectation equals the exact value to rounding), and the corrected lower bound
for logistic and Laplace likelihoods.
"""

from __future__ import annotations

import itertools
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import stanvi  # noqa: F401  (float64)
from stanvi import gp
from stanvi.gp import estimators as E
from stanvi.gp import qsgp
from stanvi.gp.families import VParams, dense_columns


# The programs compiled here run a few thousand tiny evaluations: LLVM's optimisation passes
# would cost more time than they save (compile time dominates these tests).
fast_jit = partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0,
                                              "xla_llvm_disable_expensive_passes": True})


def make_problem(basis="rff", lik="gaussian", n=5, m=4, seed=0, d=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, d))
    f = np.sin(3 * X[:, 0])
    kern = gp.SquaredExponential(lengthscale=0.7, variance=1.3)
    if lik == "gaussian":
        L, y = gp.Gaussian(0.3), f + 0.3 * rng.standard_normal(n)
    elif lik == "laplace":
        L, y = gp.Laplace(0.3), f + 0.3 * rng.laplace(size=n)
    else:
        L, y = gp.BernoulliLogit(), np.where(rng.uniform(size=n) < 1 / (1 + np.exp(-3 * f)), 1., -1.)
    Z = rng.uniform(-1, 1, (m, d))
    B = {"rff": gp.RandomFourierFeatures(m=m, kernel=kern, seed=3),
         "inducing": gp.InducingPoints(kernel=kern, Z=Z),
         "rvm": gp.RVM(kernel=kern, Z=Z)}[basis]
    return gp.BasisGP(X, y, basis=B, likelihood=L)


def random_params(model, k, seed=1, mu_scale=1.0):
    rng = np.random.default_rng(seed)
    m = model.m
    mu = jnp.asarray(rng.normal(size=m) * mu_scale)
    ld = jnp.asarray(rng.normal(size=m) * 0.3 - 0.5)
    L = jnp.asarray(rng.normal(size=(m, k)) * 0.3)
    logs = jnp.asarray(rng.normal(size=m) * 0.5) if model.basis.per_basis_precision else None
    return mu, ld, L, logs


def setup_estimator(model, family, nt, mt, nbar, mr=None, nys=0):
    opts = qsgp.Options(batch_size=nt, basis_batch_size=mt, cv_rank=nbar, diag_batch_size=mr,
                        nystrom_rank=nys)
    sz = qsgp.sizes_for(model, family, opts)
    _, data = qsgp.init_state(model, sz, opts, jax.random.PRNGKey(1))
    return sz, data


def estimator_fn(model, sz, data):
    """(μ, ld, L, θ, log s, l, i, j, r) -> ELBO^ with explicit index vectors."""
    lds = qsgp.logdet_constant(model)

    def f(mu, ld, L, theta, logs, l, i, j, r):
        k = sz.k
        Phi0 = model.basis.features(model.arrays, data.Xp, jnp.arange(sz.m), data.theta0)
        a_mu = Phi0 @ mu   # the incrementally kept a = Φ0[p] μ, as data (no gradient)
        A = Phi0 @ dense_columns(jnp.arange(sz.m), L, ld[:k], k) if k else jnp.zeros((sz.nbar, 0))
        nys = None
        if sz.nys:   # ν = Ψ μ, Ψ = R⁻¹ K(V, Z), as data (no gradient)
            Psi = jax.scipy.linalg.solve_triangular(
                data.R, model.basis.features(model.arrays, data.V, jnp.arange(sz.m), data.theta0),
                lower=True)
            A_nys = Psi @ dense_columns(jnp.arange(sz.m), L, ld[:k], k) if k \
                else jnp.zeros((sz.nys, 0))
            nys = (data.V, data.R, jax.lax.stop_gradient(Psi @ mu),
                   jax.lax.stop_gradient(A_nys))
        b = E.make_batch(sz, data.X, data.y, data.Xp, l, i, j, r, model.basis, data.arrays,
                         data.theta0, jax.lax.stop_gradient(a_mu), jax.lax.stop_gradient(A), nys)
        logs_ = logs if logs is not None else jnp.zeros((0,))
        sl = E.Slices(E.gather(mu, b.W), E.gather(ld, b.W),
                      L.at[b.W].get(mode="fill", fill_value=0.0),
                      E.gather(logs_, b.W) if logs is not None else logs_)
        return -E.objective(model, sz, sl, theta, b, data.arrays, lds)

    return f


def random_draws(sz, num, seed):
    """``num`` iid (l~, i~, j~, r~) draws with the distribution of E.draw_indices
    (docs/gp.md#sampling: iid uniform with replacement; r~ from {k..m−1}), drawn with numpy: no
    compiled program."""
    rng = np.random.default_rng(seed)
    return tuple(jnp.asarray(rng.integers(lo, hi, (num, size)))
                 for lo, hi, size in ((0, sz.n, sz.nt), (0, sz.m, sz.mt), (0, sz.m, sz.mt),
                                      (sz.k, sz.m, sz.mr)))


def all_draws(n, m, k, nt, mt, mr):
    """Every (l~, i~, j~, r~) with its probability weight (uniform)."""
    ls = np.array(list(itertools.product(range(n), repeat=nt)))
    ii = np.array(list(itertools.product(range(m), repeat=mt)))
    rs = (np.array(list(itertools.product(range(k, m), repeat=mr))) if mr
          else np.zeros((1, 0), int))
    grid = np.array(list(itertools.product(range(len(ls)), range(len(ii)), range(len(ii)),
                                           range(len(rs)))))
    return (jnp.asarray(ls[grid[:, 0]]), jnp.asarray(ii[grid[:, 1]]), jnp.asarray(ii[grid[:, 2]]),
            jnp.asarray(rs[grid[:, 3]]))


# ------------------------------------------------------------------ exact ELBO identity

@pytest.mark.parametrize("basis", ["rff", "inducing"])
def test_exact_elbo_eq2_identity(basis):
    """docs/gp.md#exact-elbo: −½(L_μ + L_Σ + L_const) equals E_q log p(y|w) − KL(q‖p)
    (n = 60, m = 12, full C; dense S for inducing points)."""
    model = make_problem(basis, n=60, m=12)
    mu, ld, L, _ = random_params(model, 12)
    p = VParams(mu, ld, L)
    assert model.exact_elbo_eq2(p) == pytest.approx(model.exact_elbo(p), abs=1e-10, rel=1e-12)


# ------------------------------------------------------------------ exact enumeration

CASES = [
    # (basis, family, nbar, nys): Thm 1 + diagonal columns + diag S; with the data-Gram CV;
    # Chevron(2) with CV; full C with dense S (Thm 2 per column); dense S with both the
    # data-Gram and the Nyström CV (App. F.2 (i)); RVM (Prop 2, learned s)
    ("rff", gp.MeanField(), 0, 0),
    ("rff", gp.MeanField(), 2, 0),
    ("rff", gp.Chevron(2), 2, 0),
    ("inducing", gp.FullCholesky(), 0, 0),
    ("inducing", gp.Chevron(1), 3, 2),
    ("rvm", gp.Chevron(1), 0, 0),
]


@pytest.mark.parametrize("basis,family,nbar,nys", CASES)
def test_gaussian_estimator_exactly_unbiased_by_enumeration(basis, family, nbar, nys):
    """E[ELBO^] = ELBO and E[∇ELBO^] = ∇ELBO (w.r.t. μ, log c_rr, L, θ and the RVM's log s),
    the expectation taken exactly over every (l~, i~, j~, r~) with n = 4, m = 4, n~ = m~ = 2
    (repeated indices occur; docs/gp.md#unbiased), the m/|U| rescaling of the sparse gradient
    included (docs/gp.md#control-variates); with the control variates (data-Gram, Nyström) the
    mean is unchanged, i.e. they have mean zero."""
    model = make_problem(basis, n=4, m=4)
    k = family.num_dense(model.m)
    mu, ld, L, logs = random_params(model, k)
    sz, data = setup_estimator(model, family, nt=2, mt=2, nbar=nbar, mr=2, nys=nys)
    assert sz.nys == nys
    f = estimator_fn(model, sz, data)
    theta = model.theta
    argnums = (0, 1, 2, 3) + ((4,) if logs is not None else ())
    vg = fast_jit(jax.vmap(jax.value_and_grad(f, argnums=argnums),
                           in_axes=(None,) * 5 + (0, 0, 0, 0)))
    l, i, j, r = all_draws(model.n, model.m, k, sz.nt, sz.mt, sz.mr)
    vals, grads = vg(mu, ld, L, theta, logs, l, i, j, r)
    exact_f = lambda *a: model.exact_elbo_jax(*a)  # noqa: E731
    ex_val, ex_grad = fast_jit(jax.value_and_grad(exact_f, argnums=argnums))(mu, ld, L, theta,
                                                                              logs)
    assert float(jnp.mean(vals)) == pytest.approx(float(ex_val), rel=1e-10, abs=1e-9)
    mean_grads = jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)
    learned = qsgp.hyper_mask(model, True)   # fixed hyperparameters (inducing) enter log|S| only
    mean_grads = (*mean_grads[:3], {kk: v for kk, v in mean_grads[3].items() if learned[kk]},
                  *mean_grads[4:])
    ex_grad = (*ex_grad[:3], {kk: v for kk, v in ex_grad[3].items() if learned[kk]}, *ex_grad[4:])
    for got, want in zip(jax.tree.leaves(mean_grads), jax.tree.leaves(ex_grad)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)
    assert float(jnp.std(vals)) > 1e-3   # genuinely stochastic


def test_control_variate_reduces_variance():
    """The data-Gram CV (docs/gp.md#control-variates; n_bar = n/3) leaves the mean unchanged
    and lowers the variance of the ELBO estimate for smooth RFF data
    (Var(with)/Var(without) < 0.7)."""
    model = make_problem("rff", n=60, m=12, seed=2)
    mu, ld, L, _ = random_params(model, 0, seed=3)
    out = {}
    l = i = j = r = None
    for nbar in (0, 20):
        sz, data = setup_estimator(model, gp.MeanField(), nt=7, mt=5, nbar=nbar)
        f = fast_jit(jax.vmap(estimator_fn(model, sz, data),
                              in_axes=(None,) * 5 + (0, 0, 0, 0)))
        if l is None:   # the same draws for both: a paired comparison
            l, i, j, r = random_draws(sz, 5000, seed=5)
        out[nbar] = np.asarray(f(mu, ld, L, model.theta, None, l, i, j, r))
    ex = model.exact_elbo(VParams(mu, ld, L))
    for v in out.values():
        assert abs(v.mean() - ex) < 4 * v.std() / np.sqrt(len(v))
    assert out[20].var() / out[0].var() < 0.7


def test_nystrom_control_variate_is_mean_zero_and_reduces_variance():
    """App. F.2 (i) (docs/gp.md#control-variates): on an inducing-point regression (Z = X,
    dense S = K), the Nyström control variate with n_bar = 20 support inputs leaves the
    estimator's mean at the exact ELBO (4 SE) and lowers its variance: Var(with)/Var(without)
    + 3 SE(ratio) < 1, the ratio's SE by the delta method on the paired draws.  Both runs use the
    data-Gram CV; noisy data (σ² = 10) give the prior term, the one the Nyström CV targets, a
    large share of the variance (measured ratio 0.13; 0.86 at σ² = 1, where the data term
    dominates)."""
    X = np.random.default_rng(7).uniform(-1, 1, (40, 1))
    y = np.sin(3 * X[:, 0])
    model = gp.inducing_regression(X, y, lengthscale=0.5, variance=1.0, noise=10.0)
    rng = np.random.default_rng(8)
    mu = jnp.asarray(rng.normal(size=40) * 0.5)
    ld = jnp.asarray(rng.normal(size=40) * 0.1 - 1.0)
    L = jnp.zeros((40, 0))
    out = {}
    for nys in (0, 20):
        sz, data = setup_estimator(model, gp.MeanField(), nt=40, mt=10, nbar=40, nys=nys)
        f = fast_jit(jax.vmap(estimator_fn(model, sz, data), in_axes=(None,) * 5 + (0, 0, 0, 0)))
        l, i, j, r = random_draws(sz, 2000, seed=9)   # the same draws: a paired comparison
        out[nys] = np.asarray(f(mu, ld, L, model.theta, None, l, i, j, r))
    ex = model.exact_elbo(VParams(mu, ld, L))
    for v in out.values():
        assert abs(v.mean() - ex) < 4 * v.std() / np.sqrt(len(v))
    a, b = (out[20] - out[20].mean()) ** 2, (out[0] - out[0].mean()) ** 2
    ratio = a.mean() / b.mean()
    cov = np.cov(a, b) / len(a)
    se = ratio * np.sqrt(cov[0, 0] / a.mean() ** 2 + cov[1, 1] / b.mean() ** 2
                         - 2 * cov[0, 1] / (a.mean() * b.mean()))
    assert ratio + 3 * se < 1.0, (ratio, se)
    assert ratio < 0.3   # a substantial reduction, not just a significant one (measured 0.13)


# ------------------------------------------------------------------ lower bound

@pytest.mark.parametrize("lik", ["bernoulli_logit", "laplace"])
def test_lower_bound_holds_and_tightens(lik):
    """The corrected bound (docs/gp.md#lower-bound): for logistic and Laplace likelihoods
    (n = 40, m = 20, Chevron(3)) E[ELBO_LB^] <= ELBO (+3 SE) for m~ in {5, 10, 20}, the gap
    shrinks as m~ grows, and the deterministic full batch equals the exact ELBO.  n~ = n and
    m~_r = m − k throughout (the row average is linear in the site terms and r~ enters only the
    unbiased KL part, so neither moves the Jensen gap), which lets the m~ = 20 program also
    evaluate the full batch."""
    model = make_problem("rff", lik, n=40, m=20, seed=4)
    family = gp.Chevron(3)
    mu, ld, L, _ = random_params(model, 3, seed=5, mu_scale=0.5)
    exact = model.exact_elbo(VParams(mu, ld, L))
    gaps = []
    for mt in (5, 10, 20):
        sz, data = setup_estimator(model, family, nt=40, mt=mt, nbar=0, mr=17)
        f = fast_jit(jax.vmap(estimator_fn(model, sz, data), in_axes=(None,) * 5 + (0, 0, 0, 0)))
        l, i, j, r = random_draws(sz, 1000, seed=mt)   # gap/SE >= 30 at every m~
        if mt == 20:   # last row: the deterministic full batch, every row and column once
            full = (jnp.arange(40), jnp.arange(20), jnp.arange(20), jnp.arange(3, 20))
            l, i, j, r = (jnp.concatenate([a, b[None]]) for a, b in zip((l, i, j, r), full))
        v = np.asarray(f(mu, ld, L, model.theta, None, l, i, j, r))
        if mt == 20:
            assert float(v[-1]) == pytest.approx(exact, abs=1e-8)
            v = v[:-1]
        se = v.std() / np.sqrt(len(v))
        assert v.mean() <= exact + 3 * se, (mt, v.mean(), exact, se)
        gaps.append((exact - v.mean(), se))
    for (g1, s1), (g2, s2) in zip(gaps, gaps[1:]):
        assert g2 <= g1 + 3 * np.hypot(s1, s2)
    assert gaps[0][0] > 3 * gaps[0][1]   # the bound is not trivially tight at m~ = 5


def test_paper_literal_variance_overestimates_when_s_below_one():
    """The paper's Eq. 5 is no bound (docs/gp.md#lower-bound): putting the *variance* s² in
    place of the sd s inside F gives more than the true expected log-likelihood when s < 1, so
    it is not a bound; the corrected F(a, s) is what stanvi uses."""
    lik = gp.BernoulliLogit(nodes=101)
    a = jnp.asarray([0.1, -0.3, 0.5])
    s = jnp.asarray([0.3, 0.5, 0.8])
    y = jnp.asarray([1.0, -1.0, 1.0])
    true = lik.expected_log_site(y, a, s, {})
    literal = lik.expected_log_site(y, a, s * s, {})
    assert bool(jnp.all(literal > true))


# ------------------------------------------------------------------ full basis pass

@pytest.mark.parametrize("basis,family", [("rff", gp.MeanField()), ("rff", gp.Chevron(2)),
                                          ("inducing", gp.FullCholesky()),
                                          ("rvm", gp.Chevron(1))])
def test_full_basis_pass_is_exactly_unbiased_and_only_data_noise(basis, family):
    """m~ >= m (docs/gp.md#convergence): i~ = j~ = every basis and r~ = every diagonal column,
    deterministically, so E[ELBO^] and E[∇ELBO^] over every l~ (n = 4, n~ = 2) equal the exact
    ELBO and gradient to rounding; the data-Gram control variate is dropped (it would be 0); and
    with every data row at once (l~ = (0..n−1)) the estimate is the exact ELBO (no basis noise
    at all, where m iid draws of the old default left O(1) relative noise)."""
    model = make_problem(basis, n=4, m=4)
    k = family.num_dense(model.m)
    mu, ld, L, logs = random_params(model, k)
    sz, data = setup_estimator(model, family, nt=2, mt=4, nbar=2)
    assert sz.full and sz.nbar == 0 and sz.mr == model.m - k
    _, i, j, r = E.draw_indices(jax.random.PRNGKey(0), sz)
    np.testing.assert_array_equal(np.asarray(i), np.arange(4))
    np.testing.assert_array_equal(np.asarray(r), np.arange(k, 4))
    f = estimator_fn(model, sz, data)
    argnums = (0, 1, 2) + ((4,) if logs is not None else ())
    vg = fast_jit(jax.vmap(jax.value_and_grad(f, argnums=argnums),
                           in_axes=(None,) * 5 + (0, None, None, None)))
    ls = jnp.asarray(list(itertools.product(range(4), repeat=2)))
    vals, grads = vg(mu, ld, L, model.theta, logs, ls, i, j, r)
    ex_val, ex_grad = fast_jit(jax.value_and_grad(
        lambda *a: model.exact_elbo_jax(*a), argnums=argnums))(mu, ld, L, model.theta, logs)
    assert float(jnp.mean(vals)) == pytest.approx(float(ex_val), rel=1e-10, abs=1e-9)
    for got, want in zip(jax.tree.leaves(jax.tree.map(lambda g: jnp.mean(g, axis=0), grads)),
                         jax.tree.leaves(ex_grad)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)
    sz_all = E.Sizes(**{**sz.__dict__, "nt": 4})
    one = estimator_fn(model, sz_all, data)(mu, ld, L, model.theta, logs, jnp.arange(4), i, j, r)
    assert float(one) == pytest.approx(float(ex_val), rel=1e-10, abs=1e-9)
    off = qsgp.sizes_for(model, family, qsgp.Options(basis_batch_size=4, full_basis_pass=False))
    assert not off.full
