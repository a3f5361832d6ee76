"""The C++ L-BFGS paths of a model library (``StanTarget.lbfgs_paths``, glue/stanvi_lbfgs.hpp;
docs/algorithms.md#lbfgsb): SciPy's L-BFGS-B without bounds, iterate for iterate, where the
model is finite along the way; a path that meets a failing point backs off and still reaches the
mode; the basin stop; failed initial points; counts; thread independence."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import random_points
from stanvi.methods.trustvi_second_start import BASIN_RADIUS, PATH_MAX_ITERS
from stanvi.methods.warm_start import lbfgs_paths
from stanvi.methods.base import OracleLedger
from stanvi.optim.lbfgsb import STOPPED
from stanvi.stan.library import PATH_STATUSES

import scipy.optimize as scipy_optimize  # noqa: E402 (a dependency)

pytestmark = pytest.mark.usefixtures("compile_in_background")


def _neg_log_p(target):
    def f(z):
        r = target.log_density_gradient(z[None, :])
        if not r.ok[0]:
            return np.inf, np.zeros_like(z)
        return -float(r.log_density[0]), -r.gradient[0]
    return f


@pytest.mark.parametrize("key", ["logistic_regression", "constrained_params", "gaussian",
                                 "tp_gq"])
def test_paths_are_scipys_lbfgsb(key, load_target):
    """Same iterations, same evaluations and the same end point (to rounding) as
    scipy.optimize.minimize(method="L-BFGS-B") with its defaults, from each of three starts."""
    target = load_target(key)
    inits = random_points(target, 3, seed=7)
    paths = target.lbfgs_paths(inits, max_iters=1000)
    for i, z0 in enumerate(inits):
        res = scipy_optimize.minimize(_neg_log_p(target), z0, jac=True, method="L-BFGS-B",
                                      options={"maxiter": 1000, "maxfun": 2000})
        assert PATH_STATUSES[paths.status[i]] == "converged" and res.status == 0
        assert paths.iterations[i] == res.nit
        assert paths.evaluations[i] == res.nfev
        np.testing.assert_allclose(paths.x[i], res.x, rtol=1e-9, atol=1e-9)
        assert paths.log_density[i] == pytest.approx(-res.fun, rel=1e-12, abs=1e-9)


def test_a_path_backs_off_from_a_rejecting_region_to_the_mode(load_target):
    """reject_region throws for x > 2 with the mode near 1.4: every path reaches the mode
    (gradient ~0), where SciPy's L-BFGS-B, shown f = inf there, stops short of it."""
    target = load_target("reject_region")
    inits = np.stack([target.initial_point(seed=s) for s in range(3)])
    paths = target.lbfgs_paths(inits, max_iters=1000)
    assert all(PATH_STATUSES[s] == "converged" for s in paths.status)
    grads = target.log_density_gradient(paths.x).gradient
    assert np.abs(grads).max() < 1e-4
    np.testing.assert_allclose(paths.log_density, paths.log_density[0], atol=1e-8)


def test_basin_stop_and_max_iterations(load_target):
    """A centre at the mode with radius 1 (in units of 1/inv_sd) ends each path at its first
    iterate inside the ball, sooner than the full run; max_iters caps the iterations."""
    target = load_target("gaussian")
    inits = random_points(target, 3, seed=3) * 4.0
    full = target.lbfgs_paths(inits, max_iters=1000)
    mode = full.x[0]
    inv_sd = np.full(target.dim, 2.0)
    stopped = target.lbfgs_paths(inits, max_iters=1000, centres=mode[None, :], inv_sd=inv_sd,
                                 radius=1.0)
    assert PATH_STATUSES.index("stopped") == STOPPED
    assert np.all(stopped.status == STOPPED)
    assert np.all(stopped.iterations < full.iterations)
    rms = np.sqrt((((stopped.x - mode) * inv_sd) ** 2).mean(axis=1))
    assert np.all(rms < 1.0)
    capped = target.lbfgs_paths(inits, max_iters=3)
    assert np.all(capped.iterations == 3)
    assert all(PATH_STATUSES[s] == "max_iterations" for s in capped.status)


def test_a_failed_initial_point_is_reported_and_the_others_run(load_target):
    target = load_target("logistic_regression")
    inits = random_points(target, 2, seed=1)
    inits[0, 0] = np.nan
    paths = target.lbfgs_paths(inits, max_iters=1000)
    assert PATH_STATUSES[paths.status[0]] == "failed"
    assert "initial point" in paths.messages[0]
    assert paths.log_density[0] == -np.inf
    assert PATH_STATUSES[paths.status[1]] == "converged" and 1 not in paths.messages


def test_counts_and_threads(load_target):
    """Each path's gradients are charged to the target's counter, and the result does not
    depend on the number of threads (each path runs on one)."""
    one = load_target("eight_schools", threads=1)
    two = load_target("eight_schools", threads=2)
    inits = random_points(one, 4, seed=5)
    before = one.counter.gradient
    a = one.lbfgs_paths(inits, max_iters=1000)
    assert one.counter.gradient - before == a.evaluations.sum() > 0
    b = two._batched.lbfgs_paths(two._handle, inits, max_iters=1000, threads=2)
    np.testing.assert_array_equal(a.x, b.x)
    np.testing.assert_array_equal(a.evaluations, b.evaluations)


def test_second_start_paths_charge_the_ledger(load_target):
    """TrustVI's extra paths through the C++ entry point: the ledger gets the paths' gradients
    and the statuses map to SciPy's codes (0 at a mode, STOPPED in the basin)."""
    target = load_target("gaussian")
    inits = list(random_points(target, 3, seed=9))
    ledger = OracleLedger()
    mode = target.lbfgs_paths(np.array(inits[:1]), max_iters=1000).x[0]
    far = mode + 100.0
    ends = lbfgs_paths(target, ledger, inits, max_iters=PATH_MAX_ITERS, centres=far[None, :],
                       inv_sd=np.ones(target.dim), radius=BASIN_RADIUS)
    assert [e.status for e in ends] == [0, 0, 0]
    direct = target.lbfgs_paths(np.array(inits), max_iters=1000)
    assert ledger.model_evaluations()["gradient"] == direct.evaluations.sum()
    assert ledger.literal == direct.evaluations.max()   # one call per round, paths side by side
    np.testing.assert_array_equal([e.x for e in ends], direct.x)
    near = lbfgs_paths(target, OracleLedger(), inits, max_iters=PATH_MAX_ITERS,
                       centres=mode[None, :], inv_sd=np.ones(target.dim), radius=BASIN_RADIUS)
    assert [e.status for e in near] == [STOPPED] * 3
