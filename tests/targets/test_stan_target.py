"""StanTarget on the example models: derivatives, known answers, constrain/unconstrain, batches.

Reference values come from outside the code under test wherever possible: finite
differences (tests/fd.py, with derived tolerances), closed-form Gaussian
densities computed with numpy, the
``bridgestan.StanModel`` single-point API, and the constraints' own definitions.
"""

from __future__ import annotations

import numpy as np
import pytest

import fd
import stanvi
from conftest import data_dict, data_file, random_points, stan_file
from stanvi.targets import BatchResult

pytestmark = pytest.mark.usefixtures("compile_in_background")

EPS = np.finfo(float).eps

# models whose exact (fvar<var>) HVP Stan Math cannot compute (stan-dev/math#3016:
# ordered_logistic); stanvi must still give a finite HVP of finite-difference accuracy
NO_EXACT_HVP_UPSTREAM = {"constrained_params"}

DERIVATIVE_MODELS = ["eight_schools", "constrained_params", "hierarchical_radon", "tp_gq",
                     "bernoulli", "gaussian", "eight_schools_centered", "logistic_regression",
                     "poisson_glm", "linear_regression"]

EXPECTED_DIMS = {"eight_schools": 10, "eight_schools_centered": 10, "constrained_params": 17,
                 "hierarchical_radon": 2 * 48 + 5, "gaussian": 10, "gaussian_diag": 100,
                 "bernoulli": 1, "tp_gq": 3, "reject_region": 2, "ode": 3}


def _check_fd(estimate, tol, actual, what):
    """actual must agree with the FD estimate to within its derived tolerance, and that
    tolerance must itself be tight (so a rough function cannot pass vacuously)."""
    scale = 1.0 + np.abs(actual)
    assert np.all(tol <= 1e-5 * scale), f"{what}: finite differences too inaccurate here: {tol}"
    err = np.abs(estimate - actual)
    bad = err > tol
    assert not bad.any(), (f"{what}: mismatch at coordinates {np.flatnonzero(bad)}: "
                           f"library {actual[bad]}, finite differences {estimate[bad]}, "
                           f"|err| {err[bad]}, tol {tol[bad]}")


# ---------------------------------------------------------------- description
@pytest.mark.parametrize("key", sorted(EXPECTED_DIMS))
def test_dimension_and_names(load_target, key):
    target = load_target(key)
    assert target.dim == EXPECTED_DIMS[key]
    names = target.unconstrained_names
    assert len(names) == target.dim and len(set(names)) == target.dim
    assert target.name == stan_file(key).stem


def test_hvp_exact_flag_for_ordinary_models(compiled, load_target):
    for key in ("eight_schools", "gaussian", "hierarchical_radon"):
        assert compiled(key).hvp_exact is True
        assert load_target(key).hvp_exact is True


def test_ode_models_get_the_finite_difference_build_at_once(compiled):
    """ODE solvers cannot take fvar<var>: the ODE example is built for finite-difference HVPs
    without a failed exact compile first (the exact build is never tried), and a program
    without such a call is not affected."""
    from stanvi.stan.compiler import nested_autodiff_possible  # noqa: PLC0415

    assert compiled("ode").hvp_exact is False
    assert not nested_autodiff_possible(stan_file("ode").read_text())
    assert not nested_autodiff_possible("y = integrate_ode_rk45(f, y0, t0, ts, th, x_r, x_i);")
    assert nested_autodiff_possible(stan_file("eight_schools").read_text())
    assert nested_autodiff_possible("real node_count; x ~ normal(mode_ (1), 1);")


def test_variables_and_kinds(tp_gq):
    kinds = tp_gq.variable_kinds()
    assert kinds == {"alpha": "parameter", "beta": "parameter", "sigma": "parameter",
                     "mu": "transformed_parameter", "y_rep": "generated_quantity",
                     "log_lik": "generated_quantity"}
    n = data_dict("tp_gq")["N"]
    shapes = {v.name: v.shape for v in tp_gq.variables()}
    assert shapes == {"alpha": (), "beta": (), "sigma": (), "mu": (n,), "y_rep": (n,),
                      "log_lik": (n,)}
    assert [v.name for v in tp_gq.variables(include_tp=False, include_gq=False)] == [
        "alpha", "beta", "sigma"]


def test_initial_point(eight_schools):
    a = eight_schools.initial_point(seed=3)
    b = eight_schools.initial_point(seed=3)
    c = eight_schools.initial_point(seed=4)
    assert a.shape == (10,)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert np.all(np.abs(a) <= 2.0)        # uniform(-2, 2) on the unconstrained scale
    assert np.isfinite(eight_schools.log_density_at(a))


def test_bad_shape_is_value_error(eight_schools):
    with pytest.raises(ValueError, match=r"\(B, 10\)"):
        eight_schools.log_density(np.zeros((3, 9)))
    with pytest.raises(ValueError):
        eight_schools.log_density(np.zeros((2, 3, 10)))


# ---------------------------------------------------------------- derivatives
@pytest.mark.parametrize("key", DERIVATIVE_MODELS)
def test_gradient_matches_finite_differences(load_target, key):
    target = load_target(key)
    for x in random_points(target, 3, seed=11, scale=0.5):
        lp, grad = target.gradient_at(x)
        # double and autodiff evaluations may round differently: a few ulps
        np.testing.assert_allclose(lp, target.log_density_at(x), rtol=4 * EPS)
        est, tol = fd.gradient(lambda z: target.log_density(z).log_density, x)
        _check_fd(est, tol, grad, f"{key} gradient at {x}")


@pytest.mark.parametrize("key", [
    pytest.param(k, marks=pytest.mark.exposes_bug(
        "exact (fvar<var>) HVP is NaN for ordered_logistic (stan-dev/math#3016); stanvi returns "
        "every HVP row of this model as failed instead of falling back to finite differences"))
    if k == "constrained_params" else k for k in DERIVATIVE_MODELS])
def test_hvp_matches_finite_differences_of_gradient(load_target, key, rng):
    target = load_target(key)
    for x in random_points(target, 3, seed=12):
        v = rng.standard_normal(target.dim)
        lp, grad, hv = target.hvp_at(x, v)
        lp_g, grad_g = target.gradient_at(x)
        # the HVP call's value and gradient are the gradient call's (different AD sweeps, so
        # allow rounding: a few ulps of the largest term)
        np.testing.assert_allclose(lp, lp_g, rtol=1e-13)
        np.testing.assert_allclose(grad, grad_g, rtol=1e-11, atol=1e-11 * np.abs(grad_g).max())
        est, tol = fd.hvp(lambda z: target.log_density_gradient(z).gradient, x, v)
        if key in NO_EXACT_HVP_UPSTREAM:
            # Stan Math has no working nested-AD derivative here; a finite-difference fallback
            # (central, step cbrt(u) * max(1, |x|) / |v|) is accurate to ~u^(2/3) ~ 4e-11 relative
            # times the model's curvature scale: 1e-8 of the largest component covers it
            np.testing.assert_allclose(hv, est, rtol=0, atol=1e-8 * np.abs(est).max())
        else:
            _check_fd(est, tol, hv, f"{key} HVP at {x}")


@pytest.mark.parametrize("key", ["logistic_regression", "hierarchical_radon", "eight_schools"])
def test_finite_difference_hvp_agrees_with_exact(compiled, key, rng):
    """hvp_method="finite_difference" in the exact build: central differences of gradients
    (step cbrt(u)·max(1,‖x‖)/‖v‖, error ~u^(2/3) ≈ 4e-11 relative times the curvature scale)
    agree with the nested-autodiff sweep to 1e-7 of the largest component; the value and
    gradient it returns are the gradient call's."""
    exact = stanvi.load(compiled(key), data_file(key), progress=False, hvp_method="exact")
    fdt = stanvi.load(compiled(key), data_file(key), progress=False,
                      hvp_method="finite_difference")
    assert (exact.hvp_method_used, fdt.hvp_method_used) == ("exact", "finite_difference")
    z = np.stack(random_points(exact, 4, seed=21))
    v = rng.standard_normal(z.shape)
    a, b = exact.log_density_hvp(z, v), fdt.log_density_hvp(z, v)
    assert a.ok.all() and b.ok.all()
    np.testing.assert_array_equal(b.log_density, exact.log_density_gradient(z).log_density)
    np.testing.assert_array_equal(b.gradient, exact.log_density_gradient(z).gradient)
    for ha, hb in zip(a.hvp, b.hvp):
        np.testing.assert_allclose(hb, ha, rtol=0, atol=1e-7 * np.abs(ha).max())
        assert not np.array_equal(ha, hb)  # really two different computations


def test_hvp_method_auto_and_bad_values(compiled):
    auto = stanvi.load(compiled("logistic_regression"), data_file("logistic_regression"),
                       progress=False)
    # decided at load, once per (library, data), and stored with the library (issue P2-1c)
    assert auto.hvp_method_used in ("exact", "finite_difference")
    z = np.zeros((3, auto.dim))
    auto.log_density_hvp(z, np.ones_like(z))
    again = stanvi.load(compiled("logistic_regression"), data_file("logistic_regression"),
                        progress=False)
    assert again.hvp_method_used == auto.hvp_method_used
    with pytest.raises(ValueError, match="hvp_method"):
        stanvi.load(compiled("bernoulli"), data_file("bernoulli"), hvp_method="fd")
    with pytest.raises(ValueError, match="nested-autodiff build"):
        stanvi.load(compiled("ode"), data_file("ode"), hvp_method="exact")
    ode = stanvi.load(compiled("ode"), data_file("ode"), progress=False)
    assert ode.hvp_method_used == "finite_difference"


def test_hvp_is_linear_in_v(hierarchical_radon, rng):
    target = hierarchical_radon
    x = random_points(target, 1, seed=5)[0]
    v1, v2 = rng.standard_normal((2, target.dim))
    h1 = target.hvp_at(x, v1)[2]
    h2 = target.hvp_at(x, v2)[2]
    h12 = target.hvp_at(x, 2.0 * v1 - 3.0 * v2)[2]
    np.testing.assert_allclose(h12, 2.0 * h1 - 3.0 * h2, rtol=1e-10,
                               atol=1e-10 * np.abs(h12).max())
    np.testing.assert_array_equal(target.hvp_at(x, np.zeros(target.dim))[2], 0.0)


def test_hvp_columns_form_symmetric_hessian(hierarchical_radon):
    """H e_j for every j gives a symmetric matrix (exact nested AD: symmetric to rounding)."""
    t = hierarchical_radon
    x = random_points(t, 1, seed=8)[0]
    d = t.dim
    res = t.log_density_hvp(np.tile(x, (d, 1)), np.eye(d))
    assert res.ok.all()
    hess = res.hvp.T    # column j = H e_j
    np.testing.assert_allclose(hess, hess.T, rtol=0, atol=1e-10 * np.abs(hess).max())


@pytest.mark.exposes_bug(
    "exact (fvar<var>) HVP of ordered_logistic_lpmf is NaN (stan-dev/math#3016, open upstream); "
    "stanvi's exact build has no fallback, so every HVP of such a model fails")
def test_exact_hvp_of_ordered_logistic_is_finite(compiled):
    """The smallest model from stan-dev/math#3016: its HVP must be finite and right.

    With Y = 3 and cutpoints [-1, 1], log p(mu) = log(1 - inv_logit(mu - 1)) - mu^2 / 2 + const,
    whose Hessian is -inv_logit(mu - 1) (1 - inv_logit(mu - 1)) - 1."""
    code = """
data { int Y; }
parameters { real mu; }
model {
  target += ordered_logistic_lpmf(Y | mu, [-1, 1]');
  target += std_normal_lpdf(mu);
}
"""
    t = stanvi.load(code, {"Y": 3}, progress=False)
    x = np.array([0.3])
    res = t.log_density_hvp(x[None, :], np.ones((1, 1)))
    assert res.ok[0], res.messages
    p = 1.0 / (1.0 + np.exp(-(x[0] - 1.0)))
    # exact AD gives ~1e-15; a finite-difference fallback (step cbrt(u) ~ 6e-6, central) has
    # truncation ~h^2/6 |f'''| ~ 1e-11 and rounding ~u |g| / h ~ 4e-11: 1e-8 covers either
    np.testing.assert_allclose(res.hvp[0], [-p * (1 - p) - 1.0], rtol=1e-8)


# ---------------------------------------------------------------- the Gaussian's known answer
def _gaussian_truth():
    data = data_dict("gaussian")
    m = np.asarray(data["m"], dtype=float)
    sigma = np.asarray(data["Sigma"], dtype=float)
    return m, sigma


def test_gaussian_log_density_is_closed_form(gaussian, rng):
    m, sigma = _gaussian_truth()
    d = m.size
    chol = np.linalg.cholesky(sigma)
    z = m + (rng.standard_normal((20, d)) * 2.0) @ chol.T
    z[0] = m   # the mode
    res = gaussian.log_density(z)
    resid = np.linalg.solve(chol, (z - m).T)
    logdet = 2.0 * np.sum(np.log(np.diag(chol)))
    expected = -0.5 * (d * np.log(2 * np.pi) + logdet + np.sum(resid**2, axis=0))
    # both sides are cond(Sigma)-limited Cholesky solves; |lp| is O(10), so 1e-11 relative is
    # tens of ulps -- far below any missing constant (propto=True would drop D/2 log 2pi ~ 9.2)
    np.testing.assert_allclose(res.log_density, expected, rtol=1e-11, atol=0)
    assert res.ok.all()


def test_gaussian_gradient_and_exact_hvp(gaussian, rng):
    m, sigma = _gaussian_truth()
    prec = np.linalg.inv(sigma)
    z = m + rng.standard_normal((16, m.size))
    v = rng.standard_normal((16, m.size))
    res = gaussian.log_density_hvp(z, v)
    expected_grad = -(z - m) @ prec
    expected_hvp = -v @ prec                       # H = -inv(Sigma) everywhere
    # relative error of either side is ~cond(Sigma) * u (cond < 1e4 for the shipped Sigma,
    # asserted below), so 1e-8 relative leaves a factor 100 and catches any wrong entry of H
    assert np.linalg.cond(sigma) < 1e4
    for got, want in ((res.gradient, expected_grad), (res.hvp, expected_hvp)):
        rel = np.linalg.norm(got - want, axis=1) / np.linalg.norm(want, axis=1)
        assert rel.max() <= 1e-8, rel.max()


def test_gaussian_diag_log_density(gaussian_diag, rng):
    data = data_dict("gaussian_diag")
    mu = np.asarray(data["mu"], dtype=float)
    sd = np.asarray(data["sigma"], dtype=float)
    z = mu + sd * rng.standard_normal((8, mu.size))
    expected = np.sum(-0.5 * ((z - mu) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi), axis=1)
    res = gaussian_diag.log_density_hvp(z, np.ones_like(z))
    np.testing.assert_allclose(res.log_density, expected, rtol=1e-12)
    np.testing.assert_allclose(res.gradient, -(z - mu) / sd**2, rtol=1e-12)
    np.testing.assert_allclose(res.hvp, np.broadcast_to(-1.0 / sd**2, z.shape), rtol=1e-12)


def test_log_density_includes_jacobian(bernoulli):
    """Unconstrained density: Beta(3, 9) posterior times the logit Jacobian theta (1 - theta),
    with the normalizing constants of the likelihood's data terms kept (propto=False)."""
    u = np.linspace(-3, 2, 7)
    theta = 1.0 / (1.0 + np.exp(-u))
    data = data_dict("bernoulli")
    s = sum(data["y"])
    n = data["N"]
    # beta(1, 1) prior density is 1; likelihood theta^s (1-theta)^(n-s); Jacobian theta(1-theta)
    expected = (s + 1) * np.log(theta) + (n - s + 1) * np.log1p(-theta)
    got = bernoulli.log_density(u[:, None]).log_density
    np.testing.assert_allclose(got, expected, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------- constrain / unconstrain
def _rows(values: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    return {k: v[i] for k, v in values.items()}


@pytest.mark.parametrize("key", ["constrained_params", "eight_schools", "hierarchical_radon",
                                 "tp_gq"])
def test_constrain_unconstrain_round_trip(load_target, key, rng):
    target = load_target(key)
    z = rng.standard_normal((6, target.dim))
    params = target.constrain(z, include_tp=False, include_gq=False)
    assert set(params) == {v.name for v in target.variables(include_tp=False, include_gq=False)}
    for i in range(z.shape[0]):
        back = target.unconstrain(_rows(params, i))
        # each transform and its inverse lose a few ulps; |z| <= ~4 here
        np.testing.assert_allclose(back, z[i], rtol=0, atol=1e-12)


def test_constrained_values_respect_constraints(constrained_params, rng):
    t = constrained_params
    z = 1.5 * rng.standard_normal((32, t.dim))
    out = t.constrain(z, seed=1)
    b = z.shape[0]
    pi = out["pi"]
    assert pi.shape == (b, data_dict("constrained_params")["K_mult"])
    assert np.all(pi > 0)
    np.testing.assert_allclose(pi.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    c = out["c"]
    assert np.all(np.diff(c, axis=1) > 0)
    assert np.all(out["tau"] > 0)
    L = out["L_Omega"]
    d = data_dict("constrained_params")["D"]
    assert L.shape == (b, d, d)
    # lower triangular (a wrong reshape order would give an upper-triangular matrix)
    assert np.all(np.triu(L, k=1) == 0.0)
    assert np.all(np.einsum("bii->bi", L) > 0)
    np.testing.assert_allclose(np.linalg.norm(L, axis=2), 1.0, rtol=0, atol=1e-14)
    # generated quantity Omega = L L^T, a correlation matrix
    np.testing.assert_allclose(out["Omega"], L @ np.swapaxes(L, 1, 2), rtol=0, atol=1e-14)
    np.testing.assert_allclose(np.einsum("bii->bi", out["Omega"]), 1.0, atol=1e-14)


def test_constrained_values_match_stan_transforms(constrained_params, eight_schools, rng):
    """Spot-check the unconstrained -> constrained maps against their definitions."""
    z = rng.standard_normal((4, eight_schools.dim))
    out = eight_schools.constrain(z)
    np.testing.assert_array_equal(out["mu"], z[:, 0])
    np.testing.assert_allclose(out["tau"], np.exp(z[:, 1]), rtol=1e-15)
    np.testing.assert_array_equal(out["theta_tilde"], z[:, 2:])
    # transformed parameter theta = mu + tau * theta_tilde
    np.testing.assert_allclose(out["theta"], z[:, :1] + np.exp(z[:, 1:2]) * z[:, 2:],
                               rtol=1e-14, atol=1e-14)
    # ordered: c[1] = y[1], c[k] = c[k-1] + exp(y[k]); the unconstrained names say where c is
    names = constrained_params.unconstrained_names
    zc = rng.standard_normal((3, constrained_params.dim))
    idx = [i for i, n in enumerate(names) if n.split(".")[0] == "c"]
    assert len(idx) == data_dict("constrained_params")["K_ord"] - 1
    raw = zc[:, idx]
    expected = np.cumsum(np.concatenate([raw[:, :1], np.exp(raw[:, 1:])], axis=1), axis=1)
    np.testing.assert_allclose(constrained_params.constrain(zc)["c"], expected, rtol=1e-14)


def test_constrain_flat_order_matches_names(tp_gq, rng):
    z = rng.standard_normal((3, tp_gq.dim))
    flat, status = tp_gq.constrain_flat(z, seed=5)
    names = tp_gq._bs.param_names(include_tp=True, include_gq=True)
    assert flat.shape == (3, len(names))
    assert status.ok.all()
    by_name = tp_gq.constrain(z, seed=5)
    n = data_dict("tp_gq")["N"]
    for j in (0, 1, 2, 3, 3 + n - 1, 3 + n, 3 + 2 * n, len(names) - 1):
        base, *idx = names[j].split(".")
        got = by_name[base][:, int(idx[0]) - 1] if idx else by_name[base]
        np.testing.assert_array_equal(got, flat[:, j])


def test_constrain_matches_bridgestan(tp_gq, rng):
    z = rng.standard_normal((4, tp_gq.dim))
    flat, _ = tp_gq.constrain_flat(z, include_gq=False)
    for i in range(4):
        np.testing.assert_array_equal(
            flat[i], tp_gq._bs.param_constrain(z[i], include_tp=True, include_gq=False))


def test_generated_quantities(tp_gq, rng):
    data = data_dict("tp_gq")
    x, y = np.asarray(data["x"]), np.asarray(data["y"])
    z = rng.standard_normal((200, tp_gq.dim)) * 0.3
    out = tp_gq.constrain(z, seed=3)
    alpha, beta, sigma = out["alpha"], out["beta"], out["sigma"]
    mu = alpha[:, None] + beta[:, None] * x[None, :]
    np.testing.assert_allclose(out["mu"], mu, rtol=1e-14, atol=1e-14)
    log_lik = -0.5 * ((y - mu) / sigma[:, None]) ** 2 - np.log(sigma[:, None]) \
        - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(out["log_lik"], log_lik, rtol=1e-12)
    # y_rep ~ normal(mu, sigma): standardized residuals are N(0, 1) -- 10,000 values, so the
    # sample mean is within 5 standard errors (0.05) and the sd within 0.05 of 1
    resid = ((out["y_rep"] - mu) / sigma[:, None]).ravel()
    assert abs(resid.mean()) < 0.05 and abs(resid.std() - 1.0) < 0.05
    # without generated quantities, no RNG output
    assert set(tp_gq.constrain(z[:2], include_gq=False)) == {"alpha", "beta", "sigma", "mu"}


# ---------------------------------------------------------------- batch == single == bridgestan
@pytest.mark.parametrize("key", ["eight_schools", "hierarchical_radon", "tp_gq"])
def test_batch_equals_single_calls_and_bridgestan(load_target, key, rng):
    t = load_target(key)
    z = random_points(t, 12, seed=21)
    v = rng.standard_normal(z.shape)
    ld = t.log_density(z)
    gr = t.log_density_gradient(z)
    hv = t.log_density_hvp(z, v)
    assert isinstance(ld, BatchResult)
    assert ld.ok.all() and gr.ok.all() and hv.ok.all()
    assert ld.log_density.shape == (12,) and gr.gradient.shape == (12, t.dim)
    assert hv.hvp.shape == (12, t.dim)
    bs = t._bs
    for i in range(z.shape[0]):
        # stanvi's single-point helpers: the same C++ on a batch of one -> bit-for-bit
        assert t.log_density_at(z[i]) == ld.log_density[i]
        lp, g = t.gradient_at(z[i])
        assert lp == gr.log_density[i]
        np.testing.assert_array_equal(g, gr.gradient[i])
        lp, g, h = t.hvp_at(z[i], v[i])
        assert lp == hv.log_density[i]
        np.testing.assert_array_equal(g, hv.gradient[i])
        np.testing.assert_array_equal(h, hv.hvp[i])
        # the bridgestan client's single-point API on the same library
        assert bs.log_density(z[i], propto=False, jacobian=True) == ld.log_density[i]
        lp, g = bs.log_density_gradient(z[i], propto=False, jacobian=True)
        assert lp == gr.log_density[i]
        np.testing.assert_array_equal(g, gr.gradient[i])
        lp, h = bs.log_density_hessian_vector_product(z[i], v[i], propto=False, jacobian=True)
        assert lp == hv.log_density[i]
        np.testing.assert_array_equal(h, hv.hvp[i])


def test_bridgestan_dense_hessian_agrees_with_hvp(eight_schools_centered, rng):
    t = eight_schools_centered
    x = random_points(t, 1, seed=31)[0]
    v = rng.standard_normal(t.dim)
    lp, g, hess = t._bs.log_density_hessian(x, propto=False, jacobian=True)
    lp2, g2, hv = t.hvp_at(x, v)
    assert lp == lp2
    np.testing.assert_allclose(g, g2, rtol=1e-12, atol=1e-12 * np.abs(g2).max())
    np.testing.assert_allclose(hess @ v, hv, rtol=1e-10, atol=1e-10 * np.abs(hv).max())
    # the bridgestan propto=True density differs from propto=False by a constant only
    z2 = x + 0.1
    d1 = t._bs.log_density(x, propto=True) - t._bs.log_density(x, propto=False)
    d2 = t._bs.log_density(z2, propto=True) - t._bs.log_density(z2, propto=False)
    np.testing.assert_allclose(d1, d2, rtol=1e-9)


def test_counter_counts_draws(eight_schools):
    t = eight_schools
    z = random_points(t, 5, seed=2)
    before = t.counter.snapshot()
    t.log_density(z)
    t.log_density_gradient(z[:3])
    t.log_density_hvp(z[:2], z[:2])
    t.gradient_at(z[0])
    after = t.counter.snapshot()
    assert {k: after[k] - before[k] for k in after} == {"log_density": 5, "gradient": 4, "hvp": 2}


def test_data_as_dict_path_and_string_agree(compiled, eight_schools):
    import json as _json

    d = data_dict("eight_schools")
    z = random_points(eight_schools, 3, seed=9)
    ref = eight_schools.log_density(z).log_density
    for data in (d, str(data_file("eight_schools")), data_file("eight_schools"), _json.dumps(d)):
        t = stanvi.load(compiled("eight_schools"), data, progress=False)
        np.testing.assert_array_equal(t.log_density(z).log_density, ref)
    # and by library path
    t = stanvi.load(compiled("eight_schools").library, d)
    np.testing.assert_array_equal(t.log_density(z).log_density, ref)


# ---------------------------------------------------------------- ODE: finite-difference HVP build
def test_ode_model_uses_finite_difference_hvp(compiled, ode):
    assert compiled("ode").hvp_exact is False
    assert ode.hvp_exact is False
    assert "finite_difference" in ode._bs.model_info()


def _ode_closed_form():
    """The ODE model's log density in closed form (logistic growth has an analytic solution
    y(t) = K / (1 + (K / y0 - 1) exp(-r (t - t0)))), as a JAX function of the unconstrained
    (log r, log K, log sigma), Jacobian included."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    d = data_dict("ode")
    ts, y_obs = jnp.asarray(d["ts"], dtype=float), jnp.asarray(d["y_obs"], dtype=float)
    y0, t0 = float(d["y0"]), float(d["t0"])
    half_log_2pi = 0.5 * jnp.log(2 * jnp.pi)

    def lp(u):
        r, k, sigma = jnp.exp(u)
        y_hat = k / (1 + (k / y0 - 1) * jnp.exp(-r * (ts - t0)))
        out = -u[0] - half_log_2pi - 0.5 * u[0] ** 2                                # lognormal(0, 1)
        out += -u[1] - jnp.log(0.5) - half_log_2pi - 0.5 * ((u[1] - jnp.log(10.0)) / 0.5) ** 2
        out += jnp.log(2.0) - 2.0 * sigma                                            # exponential(2)
        out += jnp.sum(-0.5 * ((y_obs - y_hat) / sigma) ** 2 - u[2] - half_log_2pi)
        return out + jnp.sum(u)                                                      # log Jacobian

    return lp, jax.grad(lp), jax.hessian(lp)


def test_ode_against_closed_form_and_finite_differences(ode, rng):
    """ode_rk45 solves to relative and absolute tolerance 1e-6 (Stan's defaults), the
    sensitivities included, so the log density, its gradient and the finite-difference HVP agree
    with the closed form to a small multiple of that: we allow 3e-5 relative to the largest
    component (30x the solver tolerance, for the accumulation of local errors over the 20 output
    times and the 1/sigma^2 weighting of residuals; a wrong Jacobian, sign or FD step would be off
    by O(1)).

    The HVP is, in this build, the library's own central difference of gradients (step
    cbrt(u) ~ 6e-6, error O(h^2) ~ 1e-11 relative); our independent fourth-order difference of
    the library's gradient (step ~7e-4) must agree to 1e-4 relative: the gradient is the
    solver's, smooth in theta only up to its 1e-6 tolerance, and that noise over our step bounds
    the comparison."""
    lp_cf, grad_cf, hess_cf = _ode_closed_form()
    x0 = np.log(np.array([0.8, 10.0, 0.5]))   # r, K, sigma near the data-generating values
    for p in x0 + 0.2 * rng.standard_normal((4, 3)):
        v = rng.standard_normal(3)
        lp, g, hv = ode.hvp_at(p, v)
        assert abs(lp - float(lp_cf(p))) <= 3e-5 * abs(lp)
        g_cf = np.asarray(grad_cf(p))
        np.testing.assert_allclose(g, g_cf, rtol=0, atol=3e-5 * np.abs(g_cf).max())
        hv_cf = np.asarray(hess_cf(p)) @ v
        np.testing.assert_allclose(hv, hv_cf, rtol=0, atol=3e-5 * np.abs(hv_cf).max())
        est, _ = fd.hvp(lambda z: ode.log_density_gradient(z).gradient, p, v)
        np.testing.assert_allclose(hv, est, rtol=0, atol=1e-4 * np.abs(est).max())
