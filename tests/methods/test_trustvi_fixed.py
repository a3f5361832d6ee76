"""TrustVI's fixed-sample iterations and their certification (stanvi.methods.trustvi_fixed, the
``default`` profile; docs/algorithms.md#trustvi-fixed) and the second-start check
(stanvi.methods.trustvi_second_start): exact on Gaussian targets, refusing to certify a run that
is short, and continuing from a second start that is higher."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

import stanvi
from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.keys import make_key
from stanvi.families import FullRank, MeanField
from stanvi.methods.base import OracleLedger, RunContext, Trace
from stanvi.methods import trustvi_fixed
from stanvi.methods.trustvi_fixed import certify_tolerance, stage_iteration_limit
from stanvi.methods.trustvi_options import PROFILES, Options
from stanvi.methods.trustvi_second_start import run_fixed, run_from_fallback
from stanvi.progress import IterationProgress
from stanvi.targets import JaxTarget
from gaussian_targets import make_problem

DEFAULT = Options(**PROFILES["default"])


@pytest.mark.parametrize("dim, correlated", [(2, False), (10, True)])
@pytest.mark.parametrize("family", ["meanfield", "fullrank"])
def test_exact_on_gaussian_targets(dim, correlated, family):
    """Moment-matched draws make the fixed-sample ELBO of a Gaussian exact, so the certified
    optimum is the family's exact optimum (closed form), not one within Monte Carlo error."""
    problem = make_problem(dim, correlated)
    target = JaxTarget(problem.log_density, dim)
    fit = stanvi.fit(target, method="trustvi", family=family, seed=3, progress=False)
    assert fit.status == "converged", fit.message
    assert "certified on" in fit.message
    if family == "meanfield":
        problem.assert_mf_optimum(fit.family, fit.params, gap_tol=1e-8)
    else:
        kl = problem.kl(np.asarray(fit.family.mean(fit.params)),
                        np.asarray(fit.family.covariance(fit.params)))
        assert kl <= 1e-8, kl


def test_exact_on_a_stan_gaussian_through_the_host_path(load_target):
    """stan_models/gaussian (a correlated 10-D normal) on the host path: the mean-field optimum
    (μ = m, σ_i = 1/√Λ_ii) to rounding, certified on the first 64-draw sample."""
    target = load_target("gaussian")
    data = target.data_dict()
    m = np.asarray(data["m"], dtype=float)
    prec = np.linalg.inv(np.asarray(data["Sigma"], dtype=float))
    fit = stanvi.fit(target, method="trustvi", seed=0, progress=False)
    assert fit.status == "converged", fit.message
    d = target.dim
    assert np.allclose(fit.params[:d], m, atol=1e-7)
    assert np.allclose(np.exp(fit.params[d:]), 1 / np.sqrt(np.diag(prec)), rtol=1e-7)
    assert fit.info["certify_draws"] == DEFAULT.fixed_n0
    assert fit.info["hessian_model"] == "stein"
    assert fit.compile_time == 0.0


@pytest.mark.parametrize("dense_max", [trustvi_fixed.DENSE_SOLVE_MAX_PARAMS, 10])
def test_a_small_stein_matrix_is_solved_exactly_and_a_larger_one_by_gltr(load_target, dense_max,
                                                                         monkeypatch):
    """Mean-field on stan_models/gaussian has P = 20 parameters: at or below
    ``DENSE_SOLVE_MAX_PARAMS`` every subproblem is solved from the Stein matrix's
    eigendecomposition and GLTR is never called; above it (the limit lowered to 10), GLTR only.
    Both reach the exact mean-field optimum."""
    from stanvi.optim.trust_region import MatrixModel  # noqa: PLC0415

    calls = {"dense": 0, "gltr": 0}
    dense_solve, gltr = MatrixModel.solve, trustvi_fixed.solve_gltr

    def counted(kind, fn):
        def wrapper(*args, **kwargs):
            calls[kind] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(MatrixModel, "solve", counted("dense", dense_solve))
    monkeypatch.setattr(trustvi_fixed, "solve_gltr", counted("gltr", gltr))
    monkeypatch.setattr(trustvi_fixed, "DENSE_SOLVE_MAX_PARAMS", dense_max)
    target = load_target("gaussian")
    data = target.data_dict()
    prec = np.linalg.inv(np.asarray(data["Sigma"], dtype=float))
    fit = stanvi.fit(target, method="trustvi", seed=0, progress=False)
    assert fit.status == "converged", fit.message
    assert np.allclose(fit.params[:target.dim], np.asarray(data["m"]), atol=1e-7)
    assert np.allclose(np.exp(fit.params[target.dim:]), 1 / np.sqrt(np.diag(prec)), rtol=1e-7)
    exact = 2 * target.dim <= dense_max
    assert (calls["dense"] > 0, calls["gltr"] > 0) == (exact, not exact), calls


def test_refuses_to_certify_a_run_that_is_short(load_target):
    """Cut short by the iteration cap, or unable to reach the precision asked by the largest
    sample allowed: never ``converged``."""
    target = load_target("eight_schools")
    with pytest.warns(stanvi.NotConvergedWarning):
        fit = stanvi.fit(target, method="trustvi", seed=0, progress=False, max_iters=3)
    assert fit.status == "max_iters"
    with pytest.warns(stanvi.NotConvergedWarning):
        fit = stanvi.fit(target, method="trustvi", seed=0, progress=False, certify_rms=1e-5,
                         certify_gap=1e-7, fixed_n_max=128, second_start_iters=0)
    assert fit.status == "max_iters"
    assert fit.message.startswith("not certified"), fit.message


def test_a_run_that_ran_out_of_iterations_climbing_is_not_called_kinked():
    """Three samples that each spent their iterations climbing a flat slope (−Σ log cosh z
    from 10⁵ away, five iterations a sample) stop ``max_iters`` "not concave", since the fresh
    Newton step is long; the message says the run was still climbing, not that the objective is
    kinked at an optimum it never reached (example-models' earnings_latin_square_chr)."""
    from stanvi.methods.trustvi_stops import NOT_CONCAVE, not_concave_message

    target = JaxTarget(lambda z: -jnp.sum(jnp.logaddexp(z, -z)), 2)
    family = MeanField(2)
    est = ElboEstimator(family, target.jax_log_density)
    context = RunContext(init_mu=None, random_init_mu=np.zeros(2), max_oracle_calls=None,
                         estimator=est, progress=IterationProgress("trustvi", enabled=False))
    options = dataclasses.replace(DEFAULT, fixed_stage_iters=5, second_start_iters=0)
    status, message, params, _ = run_fixed(options, est, family, make_key(0, host=False),
                                           OracleLedger(), Trace(),
                                           np.array([1e5, -1e5, 0.0, 0.0]), [], context)
    assert status == "max_iters"
    assert message.startswith(NOT_CONCAVE) and "no sample reached its optimum" in message
    assert "kinked" not in message
    assert np.max(np.abs(params[:2])) > 10.0     # still far from the mode at 0
    # a sample among the three that solved its problem: the optimum was reached, so kinked
    assert "kinked" in not_concave_message(64, 256, 3, 2)
    assert "no sample reached" in not_concave_message(64, 256, 3, 3)


def test_certification_tolerance_and_stage_limits():
    o = DEFAULT
    assert certify_tolerance(o, 20) == pytest.approx(0.5 * 20 * o.certify_rms ** 2)
    assert certify_tolerance(o, 10 ** 7) == o.certify_gap
    assert stage_iteration_limit(o, o.fixed_n0) == o.fixed_stage_iters
    assert stage_iteration_limit(o, 2 * o.fixed_n0) == o.fixed_stage_iters // 2
    assert stage_iteration_limit(o, 10 ** 6) == 5


def _bimodal():
    """1-D: 0.1·N(−3, 0.5²) + 0.9·N(3, 0.5²).  The mean-field optima sit at each mode; the
    right one's ELBO is higher by about log 9 ≈ 2.2 nats."""
    def lp(z):
        a = math.log(0.1) - 0.5 * ((z[0] + 3.0) / 0.5) ** 2
        b = math.log(0.9) - 0.5 * ((z[0] - 3.0) / 0.5) ** 2
        return jnp.logaddexp(a, b) - math.log(0.5 * math.sqrt(2 * math.pi))
    return JaxTarget(lp, 1)


def _run(first: float, other: float | None = None, random_init: float = 0.0,
         second_path: bool = False, paths: int = 4):
    target = _bimodal()
    family = MeanField(1)
    est = ElboEstimator(family, target.jax_log_density)
    ledger = OracleLedger()
    context = RunContext(init_mu=None, random_init_mu=np.array([random_init]),
                         max_oracle_calls=None, estimator=est,
                         progress=IterationProgress("trustvi", enabled=False))
    alternatives = [] if other is None else [np.array([other, math.log(0.5)])]
    start = np.array([first, math.log(0.5)])
    # start_elbo None: the exploratory run is made; a start ELBO at the first optimum's: not
    start_elbo = None if not second_path else 1e9
    options = dataclasses.replace(DEFAULT, second_paths=paths)
    return run_fixed(options, est, family, make_key(0, host=False), ledger, Trace(), start,
                     alternatives, context, start_elbo=start_elbo,
                     target=target if second_path else None)


def test_second_start_continues_from_a_higher_optimum():
    status, message, params, info = _run(first=-3.0, other=3.0)
    assert status == "converged"
    assert abs(params[0] - 3.0) < 0.05, params
    assert info["second_start_used"]
    assert info["second_start_gap"] == pytest.approx(math.log(9), abs=0.3)
    assert "exploratory run" in message and "a local one" in message


def test_second_lbfgs_path_from_the_random_init_finds_the_higher_optimum():
    """The first run certifies the lower mode; L-BFGS from Stan's random initialization (here
    placed in the other basin) finds the higher one, and the fit continues from it."""
    status, message, params, info = _run(first=-3.0, random_init=2.0, second_path=True)
    assert status == "converged"
    assert abs(params[0] - 3.0) < 0.05, params
    assert info["second_path"] and info["second_start_used"]
    assert "second L-BFGS path" in message and "a local one" in message


def test_more_lbfgs_paths_find_the_higher_optimum_the_first_path_missed():
    """``second_paths``: Stan's random initialization (here in the lower mode's basin) leads its
    path back to the lower mode, as on hmm_drive_0's seed 0; with 4 paths, a later one, from a
    uniform(−2, 2) point of the fit's key, reaches the higher mode and the fit continues from
    it.  With 1 path (the default before issue T3-1's end) the lower mode is kept: that path
    stops on entering the certified optimum's basin, and no Laplace q is screened; with 0 paths
    none is run."""
    status, message, params, info = _run(first=-3.0, random_init=-2.5, second_path=True,
                                         paths=1)
    assert abs(params[0] + 3.0) < 0.05
    assert (info["second_paths_run"], info["second_paths_stopped"],
            info["second_paths_tried"]) == (1, 1, 0)
    status, message, params, info = _run(first=-3.0, random_init=-2.5, second_path=True,
                                         paths=4)
    assert status == "converged"
    assert abs(params[0] - 3.0) < 0.05, params
    assert info["second_paths_run"] == 4 and info["second_paths_stopped"] >= 1
    assert info["second_paths_tried"] >= 1 and info["second_start_used"]
    assert "L-BFGS path" in message and "from a random initialization" in message
    status, message, params, info = _run(first=-3.0, random_init=2.0, second_path=True,
                                         paths=0)
    assert abs(params[0] + 3.0) < 0.05 and "second_paths_tried" not in info


def test_path_initial_points_are_uniform_on_stans_radius():
    from stanvi.methods.trustvi_second_start import _uniform_init  # noqa: PLC0415

    key = make_key(3, host=True)
    points = np.array([_uniform_init(key, path, 2000) for path in (1, 2)])
    assert np.all(np.abs(points) < 2.0)
    assert not np.allclose(points[0], points[1])
    np.testing.assert_array_equal(points[0], _uniform_init(key, 1, 2000))   # reproducible
    # uniform(−2, 2): mean 0, variance 4/3 (standard errors of 4,000 draws: 0.018, 0.019)
    assert abs(points.mean()) < 0.08 and abs(points.var() - 4 / 3) < 0.09


def test_random_inits_are_redrawn_until_the_density_is_finite():
    """As Stan initializes: a uniform(−2, 2) point where log p is −inf is drawn again (here
    log p is finite only where every coordinate is negative: 1 point in 8 in three
    dimensions); each try's gradient is charged to the ledger, and the points are
    reproducible."""
    import types  # noqa: PLC0415

    from stanvi.methods.trustvi_second_start import _random_inits  # noqa: PLC0415

    def lp(z):
        return jnp.where(jnp.all(z < 0), -0.5 * jnp.sum(z ** 2), -jnp.inf)
    target = JaxTarget(lp, 3)
    setup = types.SimpleNamespace(family=MeanField(3), key=make_key(5, host=True),
                                  ledger=OracleLedger())
    points = _random_inits(setup, target, [1, 2, 3])
    assert len(points) == 3 and all(np.all(p < 0) and np.all(p > -2) for p in points)
    assert len({tuple(p) for p in points}) == 3
    assert setup.ledger.model_evaluations()["gradient"] > 3    # some were drawn again
    again = _random_inits(types.SimpleNamespace(family=MeanField(3), key=make_key(5, host=True),
                                                ledger=OracleLedger()), target, [1, 2, 3])
    np.testing.assert_array_equal(np.array(points), np.array(again))


def test_second_start_in_the_same_basin_changes_nothing():
    status, message, params, info = _run(first=3.0, other=2.0)
    assert status == "converged"
    assert abs(params[0] - 3.0) < 0.05
    assert "second start" not in message
    assert abs(info["second_start_gap"]) < 0.1
    status, message, params, info = _run(first=3.0, random_init=1.0, second_path=True)
    assert abs(params[0] - 3.0) < 0.05 and "second start" not in message


def _setup(target, family, counts=None):
    est = ElboEstimator(family, target.jax_log_density)
    context = RunContext(init_mu=None, random_init_mu=np.zeros(target.dim),
                         max_oracle_calls=None, estimator=est,
                         progress=IterationProgress("trustvi", enabled=False))
    setup = trustvi_fixed.FixedSetup(DEFAULT, est, family, make_key(0, host=False),
                                     OracleLedger(), {}, counts or {"accepted": 0})
    return setup, context


def test_the_mean_field_run_reaches_the_mean_field_optimum_inside_full_rank():
    """The second-start check's mean-field run (docs/algorithms.md#second-start) is the
    mean-field fit's certified run from the member nearest the start: on a correlated
    Gaussian it ends at the mean-field optimum (μ = m, σ_i = 1/√Λ_ii, exact to 1e-8 nats),
    returned as the full-rank λ of that q, its evaluations charged to the fit's ledger; a
    mean-field fit has no such run."""
    from stanvi.methods.trustvi_second_start import _meanfield_run  # noqa: PLC0415

    problem = make_problem(5, True)
    target = JaxTarget(problem.log_density, 5)
    family = FullRank(5, diagonal="log")
    setup, context = _setup(target, family)
    start = family.initial_params(np.zeros(5), 0.0)
    candidate, k = _meanfield_run(setup, target, start, 0, context)
    assert setup.info["second_start_meanfield_status"] == "converged" and k > 0
    problem.assert_mf_optimum(MeanField(5), family.meanfield_member(candidate), gap_tol=1e-8)
    assert setup.ledger.model_evaluations()["gradient"] > 0
    setup, context = _setup(target, MeanField(5))
    assert _meanfield_run(setup, target, setup.family.initial_params(np.zeros(5)), 0,
                          context) == (None, 0)


def test_a_higher_mean_field_optimum_replaces_a_certified_full_rank_one():
    """A full-rank optimum below the mean-field family's is local (ARM's electric: 439 nats
    below).  Here the run is certified at the bimodal target's lower mode, and the mean-field
    run starts in the higher one's basin (a full-rank family whose nearest mean-field member
    of the start is placed there: in one dimension the two families are the same, so the
    real member would only find the same mode): the fit continues from it and says so.
    With the real member, the check finds the same mode and changes nothing."""
    @dataclasses.dataclass(frozen=True)
    class Elsewhere(FullRank):
        def meanfield_member(self, params):
            return np.array([3.0, math.log(0.5)])

    target = _bimodal()
    options = dataclasses.replace(DEFAULT, second_paths=0)
    for family, moved in ((Elsewhere(1, diagonal="log"), True),
                          (FullRank(1, diagonal="log"), False)):
        setup, context = _setup(target, family)
        context = dataclasses.replace(context, random_init_mu=np.array([-3.0]))
        start = np.array([-3.0, math.log(0.5)])
        status, message, params, info = run_fixed(
            options, setup.est, family, setup.key, setup.ledger, Trace(), start, [], context,
            start_elbo=-50.0, target=target)
        assert status == "converged", message
        if moved:
            assert abs(params[0] - 3.0) < 0.05, params
            assert info["second_start_meanfield_gap"] == pytest.approx(math.log(9), abs=0.3)
            assert info["second_start_used"] and "a mean-field run" in message
        else:
            assert abs(params[0] + 3.0) < 0.05, params
            assert abs(info["second_start_meanfield_gap"]) < 0.1
            assert "second start" not in message


def test_an_exploratory_run_still_climbing_goes_on_with_the_fit_s_options():
    """The cheap exploratory run (16 draws, the Stein model, ``second_start_iters``
    iterations) that spends its iterations while it still climbs goes on from where it is
    with the fit's sample and Hessian rule (ARM's electric_1b, docs/algorithms.md#second-start):
    with 2 cheap iterations from a start on the higher mode's side (μ = 1, σ = 0.5) it does
    not reach that mode, the continuation does, and the fit moves there.  With the default
    budget the cheap run solves its problem (in 4 iterations) and is not continued."""
    target = _bimodal()
    for cheap_iters, continued in ((2, True), (DEFAULT.second_start_iters, False)):
        setup, context = _setup(target, MeanField(1))
        options = dataclasses.replace(DEFAULT, second_paths=0, second_start_iters=cheap_iters)
        status, message, params, info = run_fixed(
            options, setup.est, setup.family, setup.key, setup.ledger, Trace(),
            np.array([-3.0, math.log(0.5)]), [np.array([1.0, math.log(0.5)])], context,
            start_elbo=-50.0, target=None)
        assert status == "converged", message
        assert info.get("second_start_continued", False) is continued
        assert abs(params[0] - 3.0) < 0.05, (cheap_iters, params)
        assert info["second_start_used"] and "exploratory run" in message
        assert info["second_start_iterations"] > cheap_iters or not continued


def test_a_continuation_heading_for_the_certified_optimum_stops_in_its_basin(monkeypatch):
    """The continuation stops once q's mean is within one of λ₁'s sds of λ₁'s mean: here λ₁
    is the higher mode and the other start lies on its side, so the continuation heads there;
    it stops sooner than with the basin test off (radius 0), and the fit keeps λ₁ either way."""
    from stanvi.methods import trustvi_second_start  # noqa: PLC0415

    target = _bimodal()
    options = dataclasses.replace(DEFAULT, second_paths=0, second_start_iters=2)
    iterations = {}
    for radius in (trustvi_second_start.BASIN_RADIUS, 0.0):
        monkeypatch.setattr(trustvi_second_start, "BASIN_RADIUS", radius)
        setup, context = _setup(target, MeanField(1))
        status, message, params, info = run_fixed(
            options, setup.est, setup.family, setup.key, setup.ledger, Trace(),
            np.array([3.0, math.log(0.5)]), [np.array([1.0, math.log(0.5)])], context,
            start_elbo=-50.0, target=None)
        assert status == "converged" and abs(params[0] - 3.0) < 0.05
        assert info["second_start_continued"] and "second start" not in message
        iterations[radius] = info["second_start_iterations"]
    assert iterations[1.0] < iterations[0.0], iterations


def test_a_cheap_run_levelled_off_far_below_is_not_continued():
    """The continuation is made only where the cheap run's climb over its last 10 iterations,
    kept up for ``fixed_stage_iters`` more, would pass the floor: the mean-field cheap run on
    posteriordb's eight_schools_centered rose 0.03 nats per iteration 74 nats below λ₁'s floor
    (not continued); electric_1b's rose 19 per iteration 25 below (continued)."""
    import types  # noqa: PLC0415

    from stanvi.methods.trustvi_second_start import _may_pass  # noqa: PLC0415

    def rows(elbos):
        return types.SimpleNamespace(rows=[{"elbo": e} for e in elbos])
    flat = rows(np.linspace(-110.2, -109.9, 30))
    climbing = rows(np.linspace(-1200.0, -1004.4, 30))
    assert not _may_pass(flat, -36.1, 50)
    assert _may_pass(climbing, -979.0, 50)
    assert not _may_pass(climbing, -979.0 + 50 * (195.6 / 29) + 1.0, 50)   # just out of reach
    assert not _may_pass(rows([-5.0]), -10.0, 50)      # no climb measured: not continued


def test_the_trace_ends_at_the_fit_and_keeps_exploration_out(load_target):
    """The checks of the second start add one trace row, at the fit's result; the exploratory
    run's iterates (not the fit's) are not in the trace, so an ELBO along the trace never dips
    into them (``stanvi bench stopping``'s "to 1 nat" read them as the fit's)."""
    fit = stanvi.fit(load_target("eight_schools"), method="trustvi", seed=1, progress=False)
    rows = fit.trace.rows
    phases = [r.get("phase") for r in rows]
    assert phases[-1] == "second_start" and phases.count("second_start") == 1
    assert fit.info["second_start_iterations"] > 0     # the exploratory run was made
    np.testing.assert_array_equal(fit.trace.params_at(len(rows) - 1), fit.params)
    assert rows[-1]["gradient_draws"] == fit.oracle["gradient_draws"]   # its cost is charged


def test_a_low_rank_start_s_deficit_does_not_trigger_the_exploratory_run():
    """On a Gaussian posterior with three strong factors, a rank-2 Laplace start gives up
    KL(q₀ ‖ N(mode, H⁻¹)) ≈ 6.9 nats, which the fit climbs back without the posterior being
    non-Gaussian: the climb that triggers the exploratory run is counted net of it
    (docs/algorithms.md#second-start), so no run is made (the raw climb, ~6.6 nats, would
    make one: 62 of 138 low-rank posteriordb fits did, for ~1,100 evaluations each)."""
    rng = np.random.default_rng(3)
    dim = 12
    factors = rng.normal(size=(dim, 3)) * 2.0
    cov = np.diag(rng.uniform(0.3, 1.0, dim)) + factors @ factors.T
    precision, mean = jnp.asarray(np.linalg.inv(cov)), jnp.asarray(rng.normal(size=dim))
    fit = stanvi.fit(lambda z: -0.5 * (z - mean) @ precision @ (z - mean), dim=dim,
                     method="trustvi", family="lowrank",
                     family_options={"rank": 2, "laplace_fit": "ppca"}, seed=0,
                     progress=False)
    assert fit.status == "converged" and fit.info["warm_start"] == "laplace"
    assert fit.info["laplace_deficit"] > DEFAULT.second_start_trigger + 5.0
    assert abs(fit.info["second_start_climb"]) < DEFAULT.second_start_trigger
    assert "second_start_iterations" not in fit.info


def _fallback_run(first_at: float, fallback_at: float):
    """run_from_fallback on the bimodal target: a first run that ended uncertified at
    ``first_at`` and a fallback start at ``fallback_at`` (mean-field, sd 0.5; the second-start
    checks off, so that each run stays in its basin)."""
    target = _bimodal()
    family = MeanField(1)
    est = ElboEstimator(family, target.jax_log_density)
    ledger = OracleLedger()
    context = RunContext(init_mu=None, random_init_mu=np.array([0.0]), max_oracle_calls=None,
                         estimator=est, progress=IterationProgress("trustvi", enabled=False))
    trace = Trace()
    first = np.array([first_at, math.log(0.5)])
    trace.record(0, first, ledger)
    trace.record(7, first, ledger, phase="fixed")
    options = dataclasses.replace(DEFAULT, second_start_iters=0)
    counts = {"accepted": 0, "rejected_lambda": 0, "rejected_change": 0, "rejected_failure": 0}
    result = run_from_fallback(("max_iters", "stuck", first, {"iterations": 7}),
                               (np.array([fallback_at, math.log(0.5)]), None), options, est,
                               family, make_key(0, host=False), ledger, trace, [], context,
                               counts)
    return (*result, trace)


def test_the_fallback_start_s_run_is_kept_when_higher():
    """The low-rank family's PPCA fallback (docs/algorithms.md#lowrank-start), on a stand-in:
    the first run ended uncertified in the lower mode; the run from the fallback start certifies
    the higher one, log 9 ≈ 2.2 nats above on common draws, and is the result, its iterations
    numbered after the first run's and one trace row recording the choice at the result."""
    status, message, params, info, trace = _fallback_run(-3.0, 3.0)
    assert status == "converged" and abs(params[0] - 3.0) < 0.05
    assert info["laplace_fallback_used"] and info["laplace_fallback_first"] == "stuck"
    assert info["laplace_fallback_gap"] == pytest.approx(math.log(9), abs=0.3)
    assert "from the PPCA Laplace start" in message and "stuck" in message
    iterations = [row["iteration"] for row in trace.rows]
    assert iterations == sorted(set(iterations)) and iterations[2] == 8
    assert trace.rows[-1]["phase"] == "laplace_fallback"
    np.testing.assert_array_equal(trace.params_at(len(trace.rows) - 1), params)


def test_the_first_run_is_kept_when_the_fallback_ends_lower():
    status, message, params, info, trace = _fallback_run(3.0, -3.0)
    assert status == "max_iters" and params[0] == 3.0
    assert not info["laplace_fallback_used"]
    assert info["laplace_fallback_gap"] == pytest.approx(-math.log(9), abs=0.3)
    assert message.startswith("stuck; a run from the PPCA Laplace start ended")
    assert trace.rows[-1]["phase"] == "laplace_fallback" and not trace.rows[-1]["accepted"]
