"""The fixed-sample TrustVI run and its checks against independent starts
(docs/algorithms.md#second-start, issue T3-1 target 5).

A Newton certificate is local: on posteriordb's hmm_drive_0 the Laplace warm start from the zero
initialization lands in a mode 60 nats below the one Stan's ADVI and Pathfinder find; on
example-models' mvn_orange TrustVI ends 51 nats below ADVI.  After the run certifies an optimum
λ₁, up to three candidates are tried:

1. ``second_paths`` = k L-BFGS paths, the first from Stan's random initialization
   (Pathfinder's start), the others from uniform(−2, 2) points drawn from the fit's key (redrawn
   until the density is finite, as Stan initializes), run in lockstep, one batched model call
   per round (:func:`_second_paths`; multi-path Pathfinder's idea: on hmm_drive_0 about half
   the random inits reach the higher mode).  A path stops as soon as it enters λ₁'s basin
   (within ``BASIN_RADIUS`` q₁-sds of λ₁'s mean or of the warm start's mode); the Laplace q of
   each other mode it reaches is a candidate when its ELBO on 64 common draws beats λ₁'s by
   more than ``MARGIN``;
2. when that found nothing and the climb (below) is more than ``second_start_trigger``, for a
   family with a mean-field family inside it (``inner_meanfield``: full rank), the mean-field
   fit's certified run from the member nearest the start (:func:`_meanfield_run`): full rank's
   optimum is at least mean-field's, so a certified one below it is local (ARM's electric);
3. when neither found anything and the certified optimum's fixed-sample ELBO is more than
   ``second_start_trigger`` nats above its start's (the posterior is not the Gaussian its mode
   suggests, so the mode's basin need not hold the best q; on 40 of 46 posteriordb posteriors the
   Laplace start is within a nat of the optimum; for the low-rank family the climb is counted
   net of KL(q₀ ‖ N(mode, H⁻¹)), the ELBO its compression of the Laplace Gaussian gives up,
   which a fit from q₀ climbs back on a Gaussian posterior), or the start's ELBO is unknown, an
   *exploratory* run from the other start — the method's own initial q when the Laplace start
   was used, the Laplace start when it lost the warm start's comparison, Stan's random
   initialization when there was none — on ``second_start_draws`` fixed draws, with the Stein
   model and no certification (:func:`stanvi.methods.trustvi_fixed.step` with
   ``explore_floor``), stopped after ``second_start_iters`` iterations, when its own problem is
   solved, or as soon as its model predicts that it stays 2 nats below λ₁ (ELBO + 2·gain < floor);
   when it spent its iterations still climbing, continued with the fit's own options
   (:func:`_explore`).

A candidate is compared with λ₁ on ``COMPARE_DRAWS`` common fresh draws.  When it is higher by
more than 1 nat plus twice the standard error of the paired difference, the fixed-sample run
starts again from it, certifies its own optimum, and the better of the two certified optima (on
the common draws) is the result; the message says so, with the figures.  Otherwise the
comparison is recorded in ``info`` (``second_start_gap``: ELBO₂ − ELBO₁) and the result is λ₁.
Every evaluation is charged to the fit's ledger; the checks add one trace row (``phase``
'second_start', at the fit's iterate after them: the exploratory run's iterates are not the
fit's and stay out of its trace).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from stanvi.estimators.elbo import GradientFailure, standard_normal
from stanvi.estimators.keys import uniform
from stanvi.estimators.registry import estimator_for
from stanvi.methods import trustvi_fixed
from stanvi.methods.base import OracleLedger, RunContext, Trace, iterate, purpose_key
from stanvi.methods.trustvi_options import Options
from stanvi.methods.warm_start import (LAPLACE_COMPARE_DRAWS, laplace_q, lbfgs_paths,
                                      mean_elbo, near)
from stanvi.optim.lbfgsb import STOPPED

#: Common fresh draws on which the two starts' ELBOs are compared.
COMPARE_DRAWS = 256
#: The second start must be higher by this many nats (plus twice the standard error).
MARGIN = 1.0
#: Draws on which each path's Laplace q is screened against λ₁ (paired, common draws)
SCREEN_DRAWS = 64
#: A path is in λ₁'s basin within this many q₁-sds (root mean square over coordinates)
BASIN_RADIUS = 1.0
#: Iterations of an L-BFGS path at most (Pathfinder's default)
PATH_MAX_ITERS = 1000
#: Key index of the random initial points of paths 2, 3, … (their L-BFGS paths' own draws use
#: indices 2, 3, …: never the same key for two roles)
INIT_KEYS = 1_000_000
#: Tries for a random initial point with a finite density and gradient (Stan's limit)
INIT_ATTEMPTS = 100
#: Iterations over which the cheap exploratory run's rate of climb is measured (:func:`_may_pass`)
CLIMB_WINDOW = 10


def run_fixed(o: Options, est, family, key, ledger: OracleLedger, trace: Trace,
              params: np.ndarray, alternatives: list, context: RunContext,
              counts: dict | None = None, start_elbo: float | None = None, target=None,
              basin_centres: list | None = None, start_deficit: float = 0.0,
              k0: int = 0) -> tuple[str, str, np.ndarray, dict]:
    """The fixed-sample iterations, their certification and the second-start checks, on the
    shared loop; returns (status, message, params, info).  ``counts`` (accepted and rejected
    steps, as :func:`stanvi.methods.checks.honest_outcome` reads them) is updated;
    ``start_elbo``: the warm start's ELBO estimate at ``params`` (None: unknown), which decides
    whether the exploratory run is made; ``target``: for the L-BFGS paths; ``basin_centres``:
    points besides λ₁'s mean whose neighbourhood is λ₁'s basin (the warm start's mode);
    ``start_deficit``: the ELBO the start gives up against the Laplace Gaussian by its family's
    form (the low-rank family's KL(q₀ ‖ N(mode, H⁻¹))), discounted from the climb (module
    docstring); ``k0``: the trace's last iteration (a run after another: its own budget of
    ``max_iters`` iterations)."""
    info: dict = {}
    if counts is None:
        counts = {"accepted": 0, "rejected_lambda": 0, "rejected_change": 0,
                  "rejected_failure": 0}
    setup = trustvi_fixed.FixedSetup(o, est, family, key, ledger, info, counts)
    end = _certified_run(setup, params, k0, trace, context, max_iters=o.max_iters)
    status, message, first, first_elbo, k = end.status, end.message, end.params, end.elbo, end.k
    # a run that moved and then stuck uncertified (its trust region collapsed, or its model of
    # the ELBO is not concave at the optimum) is checked as a certified one is
    # (docs/algorithms.md#second-start); one that never accepted a step is left to
    # checks.honest_outcome, which says why
    stuck = status == "max_iters" and end.stuck and counts["accepted"] > 0
    if not (status == "converged" or stuck) or not o.second_start_iters:
        return status, message, first, info
    certified = status == "converged"
    first_what = ("the first certified optimum" if certified else
                  "the point where the first run stopped, uncertified")
    candidate, where = None, ""
    if target is not None and o.second_paths:
        candidate, path = _second_paths(setup, target, first, context.random_init_mu,
                                        basin_centres)
        if candidate is not None:
            where = ("a second L-BFGS path, from Stan's random initialization" if path == 0 else
                     f"L-BFGS path {path + 1} of {o.second_paths}, from a random initialization")
    climbed = first_elbo - start_elbo - start_deficit if start_elbo is not None else np.inf
    info["second_start_climb"] = climbed
    gap = se = -np.inf
    if candidate is not None:
        gap, se = _paired_gap(est, family, candidate, first, key, ledger)
    if not gap > MARGIN + 2.0 * se and climbed > o.second_start_trigger:
        inner, k = _meanfield_run(setup, target, params, k, context)
        if inner is not None:
            inner_gap, inner_se = _paired_gap(est, family, inner, first, key, ledger)
            info.update(second_start_meanfield_gap=inner_gap)
            if inner_gap > MARGIN + 2.0 * inner_se:
                candidate, gap, se = inner, inner_gap, inner_se
                where = "a mean-field run from the same start"
    if not gap > MARGIN + 2.0 * se and climbed > o.second_start_trigger:
        if alternatives:
            other, where = alternatives[0], "the start the warm start did not choose"
        else:
            other = family.initial_params(context.random_init_mu, o.log_scale0)
            where = "Stan's random initialization"
        candidate, k = _explore(setup, other, first_elbo - 2.0 * MARGIN, k, first, context)
        where = f"an exploratory run from {where}"
        if candidate is not None:
            gap, se = _paired_gap(est, family, candidate, first, key, ledger)
    if np.isfinite(gap):
        info.update(second_start_gap=gap, second_start_gap_se=se)
    switch = candidate is not None and gap > MARGIN + 2.0 * se
    # one trace row for the checks (their evaluations; the exploratory run's iterates are not
    # the fit's and stay out of its trace), at the fit's iterate after them
    k += 1
    trace.record(k, candidate if switch else first, ledger, phase="second_start",
                 second_start_gap=gap if np.isfinite(gap) else None, accepted=bool(switch))
    if not switch:
        return status, message, first, info
    end2 = _certified_run(setup, candidate, k, trace, context)
    status2, message2, second, k = end2.status, end2.message, end2.params, end2.k
    final_gap, _ = _paired_gap(est, family, second, first, key, ledger)
    info.update(second_start_final_gap=final_gap, second_start_used=final_gap > 0)
    found = (f"a second start ({where}) reached an ELBO {gap:.3g} ± {se:.2g} nats above "
             f"{first_what}")
    if final_gap <= 0:
        kept = "the first optimum" if certified else "the first run's end"
        return status, (f"{message}; {found}, but its own run ended {-final_gap:.3g} nats "
                        f"lower ({message2}): {kept} is kept"), first, info
    end_what = "the first optimum, a local one" if certified else first_what
    return status2, (f"{message2}; {found}: the fit continued from it and ends "
                     f"{final_gap:.3g} nats above {end_what} ({message})"), second, info


def _uniform_init(key, path: int, dim: int, attempt: int = 0) -> np.ndarray:
    """Path ``path``'s initial point, try ``attempt``: uniform(−2, 2) in each coordinate (Stan's
    init radius), drawn from the fit's key, so the fit stays reproducible."""
    return uniform(purpose_key(key, INIT_KEYS + INIT_ATTEMPTS * path + attempt, "init"), dim,
                   -2.0, 2.0)


def _random_inits(setup, target, paths: list[int]) -> list[np.ndarray]:
    """An initial point for each of ``paths``, as Stan initializes: uniform(−2, 2) draws until
    the log density and its gradient are finite there (at most ``INIT_ATTEMPTS`` tries; a path
    with none gets its last try, and L-BFGS ends it at once).  The candidates of all paths are
    evaluated in one batched call per round, charged to the ledger."""
    dim = setup.family.dim
    found: dict[int, np.ndarray] = {}
    for attempt in range(INIT_ATTEMPTS):
        todo = [p for p in paths if p not in found]
        if not todo:
            break
        points = np.array([_uniform_init(setup.key, p, dim, attempt) for p in todo])
        res = target.log_density_gradient(points)
        setup.ledger.gradient(len(todo))
        finite = (np.asarray(res.ok, dtype=bool) & np.isfinite(res.log_density)
                  & np.all(np.isfinite(res.gradient), axis=1))
        for p, z, good in zip(todo, points, finite):
            if good or attempt == INIT_ATTEMPTS - 1:
                found[p] = z
    return [found[p] for p in paths]


def _second_paths(setup, target, first: np.ndarray, random_init: np.ndarray,
                  centres: list) -> tuple[np.ndarray | None, int]:
    """``second_paths`` L-BFGS paths (the first from Stan's random initialization, Pathfinder's
    start, Zhang et al. 2022; the others from :func:`_uniform_init` points)
    (:func:`stanvi.methods.warm_start.lbfgs_paths`: in C++ on a Stan model, else in lockstep).
    A path stops as soon as an iterate comes within ``BASIN_RADIUS`` q₁-sds (root mean square
    over coordinates) of λ₁'s mean or of a point of ``centres`` (the warm start's mode): it is
    in the basin whose optimum is certified, and its Laplace q could not beat λ₁.  Of the
    paths that reach a mode elsewhere (one per mode), in order, the first whose Laplace q's
    ELBO on 64 common draws beats λ₁'s by more than ``MARGIN`` is returned with its index;
    else (None, −1)."""
    o, family, ledger = setup.o, setup.family, setup.ledger
    inits = [np.asarray(random_init, dtype=float)]
    inits += _random_inits(setup, target, list(range(1, o.second_paths)))
    inv_sd = 1.0 / np.asarray(family.marginal_sd(first), dtype=float)
    results = lbfgs_paths(target, ledger, inits, max_iters=PATH_MAX_ITERS,
                          centres=np.array([family.mean(first), *(centres or [])], dtype=float),
                          inv_sd=inv_sd, radius=BASIN_RADIUS)
    info = setup.info
    info.update(second_paths_run=len(results), second_path=False, second_paths_tried=0,
                second_paths_stopped=sum(r.status == STOPPED for r in results))
    eps = standard_normal(purpose_key(setup.key, 1, "init"), SCREEN_DRAWS, family.base_dim)
    first_elbo = None
    modes: list = []
    for path, res in enumerate(results):
        z = np.asarray(res.x, dtype=float)
        if (res.status == STOPPED or not np.isfinite(res.fun)
                or (modes and near(np.array(modes), inv_sd, BASIN_RADIUS)(z))):
            continue
        modes.append(z)
        info["second_paths_tried"] += 1
        laplace, _ = laplace_q(target, family, z, ledger, o.log_scale0)
        if laplace is None:
            continue
        if first_elbo is None:
            first_elbo = mean_elbo(setup.est, first, eps)
            ledger.elbo_estimate(SCREEN_DRAWS)
        ledger.elbo_estimate(SCREEN_DRAWS)
        # the comparison on common draws is paired: a candidate within MARGIN of λ₁ there is
        # not worth the 256-draw confirmation
        if mean_elbo(setup.est, laplace, eps) - first_elbo > MARGIN:
            info["second_path"] = True
            return laplace, path
    return None, -1


def _certified_run(setup, params: np.ndarray, k0: int, trace: Trace, context: RunContext,
                   max_iters: int | None = None) -> trustvi_fixed.RunEnd:
    """One fixed-sample run with certification from ``params``, its iterations numbered from
    ``k0`` + 1, at most ``max_iters`` of them (default: what is left of the option's)."""
    o = setup.o
    try:
        state = trustvi_fixed.start(setup, params)
    except GradientFailure as exc:
        return trustvi_fixed.RunEnd("failed", f"failed_gradient: the first fixed sample: {exc}",
                                    params, -np.inf, k0)
    budget = max(1, o.max_iters - k0) if max_iters is None else max_iters
    state, k, status, message = iterate(partial(trustvi_fixed.step, setup), state,
                                        max_iters=budget, trace=trace,
                                        ledger=setup.ledger, context=context, start=k0)
    setup.info.update(iterations=k, final_delta=state.delta,
                      fixed_draws=int(state.eps.shape[0]))
    return trustvi_fixed.RunEnd(status, message, state.params, float(np.mean(state.values)), k,
                                trustvi_fixed.stuck(state))


def _explore(setup, params: np.ndarray, floor: float, k0: int, first: np.ndarray,
             context: RunContext) -> tuple[np.ndarray | None, int]:
    """The exploratory run from ``params`` (module docstring); its last iterate, or None when
    its first sample cannot be drawn.  When it runs all its ``second_start_iters`` iterations
    and still climbs (neither solved nor below the floor), it goes on from there with the fit's
    own sample size and Hessian rule, without the floor, until it solves its problem or spends
    ``fixed_stage_iters`` more (ARM's electric_1b, mean-field seed 0: the run from the default
    start was 28 nats below λ₁ after 30 cheap iterations, and 303 nats above it after 21
    more; docs/algorithms.md#second-start).  A run whose stage ends sooner (full rank's larger
    sample: the same gradient budget in fewer iterations) is not continued: its family's climb
    is checked by the mean-field run (:func:`_meanfield_run`).  The continuation stops as soon
    as q's mean comes within ``BASIN_RADIUS`` sds of λ₁'s (``first``; its marginal sds, root
    mean square over coordinates), as the L-BFGS paths do: it is heading for the optimum
    already certified (on posteriordb's gp_pois_regr and logearn_interaction it ended there
    after up to 11,000 evaluations)."""
    o = setup.o
    setup.info["second_start_iterations"] = 0
    family = setup.family
    cheap = setup._replace(o=_explore_options(o), explore_floor=floor, stein_only=True)
    sd = np.asarray(family.marginal_sd(first), dtype=float)
    basin = near(np.array([family.mean(first)], dtype=float),
                 1.0 / np.maximum(sd, np.finfo(float).tiny), BASIN_RADIUS)
    full = setup._replace(explore_floor=-np.inf, explore_basin=basin)
    for explore, budget in ((cheap, o.second_start_iters), (full, o.fixed_stage_iters)):
        try:
            state = trustvi_fixed.start(explore, params)
        except GradientFailure:
            return (None if explore is cheap else params), k0
        rows = Trace()
        state, k, status, message = iterate(partial(trustvi_fixed.step, explore), state,
                                            max_iters=budget, trace=rows,
                                            ledger=setup.ledger, context=context, start=k0)
        spent = k - k0 >= budget and (status == "max_iters"
                                      or message == trustvi_fixed.EXPLORE_SPENT)
        setup.info["second_start_iterations"] += k - k0
        params, k0 = state.params, k
        if explore is full or not spent or not _may_pass(rows, floor, o.fixed_stage_iters):
            break
        setup.info["second_start_continued"] = True
    return params, k0


def _may_pass(rows: Trace, floor: float, iterations: int) -> bool:
    """Whether the cheap exploratory run, at the rate its fixed-sample ELBO rose over its last
    ``CLIMB_WINDOW`` iterations, would pass ``floor`` within ``iterations`` more: one that has
    levelled off far below λ₁ is not continued (posteriordb's eight_schools_centered,
    mean-field: 0.03 nats per iteration, 74 nats below; electric_1b: 19 per iteration, 25
    below)."""
    elbo = np.array([r.get("elbo", np.nan) for r in rows.rows], dtype=float)
    elbo = elbo[np.isfinite(elbo)]
    if len(elbo) < 2:
        return False
    window = min(CLIMB_WINDOW, len(elbo) - 1)
    rate = (elbo[-1] - elbo[-1 - window]) / window
    return bool(elbo[-1] + rate * iterations > floor)


def _meanfield_run(setup, target, start: np.ndarray, k0: int,
                   context: RunContext) -> tuple[np.ndarray | None, int]:
    """The fixed-sample run, certified, of the mean-field family inside ``setup``'s family
    (``inner_meanfield``: full rank's diagonal members) from the mean-field member nearest
    ``start`` (``meanfield_member``), its result mapped back into the family (None where the
    family has no such member, there is no target, or the run fails).  The full-rank ELBO's
    optimum is at least the mean-field one's, so a certified full-rank optimum below it is a
    local one (ARM's electric: the hierarchical prior's degenerate point, 439 nats below;
    docs/algorithms.md#second-start).  It is the mean-field fit's own run, Hessian switch
    included: the exploratory run's early stops ended it in the climb out of that point."""
    family = setup.family
    inner = family.inner_meanfield() if target is not None else None
    if inner is None:
        return None, k0
    est = estimator_for(target, inner, host=bool(getattr(setup.est, "host", False)))
    sub = setup._replace(family=inner, est=est, info={})
    end = _certified_run(sub, family.meanfield_member(start), k0, Trace(), context,
                         max_iters=setup.o.max_iters)
    status, params, k = end.status, end.params, end.k
    setup.info.update(second_start_meanfield_iterations=k - k0,
                      second_start_meanfield_status=status)
    if status == "failed":
        return None, k
    return family.from_meanfield(params), k


def _explore_options(o: Options) -> Options:
    from dataclasses import replace  # noqa: PLC0415

    return replace(o, fixed_n0=o.second_start_draws, fixed_stage_iters=o.second_start_iters,
                   fixed_hessian="stein")


def _paired_gap(est, family, a: np.ndarray, b: np.ndarray, key,
                ledger: OracleLedger) -> tuple[float, float]:
    """ELBO(a) − ELBO(b) on ``COMPARE_DRAWS`` common fresh draws and its standard error (−inf
    when q_a fails where q_b does not)."""
    eps = standard_normal(purpose_key(key, 0, "check"), COMPARE_DRAWS, family.base_dim)
    diff = est.values(a, eps) - est.values(b, eps)
    ledger.elbo_estimate(2 * COMPARE_DRAWS)
    if not np.all(np.isfinite(diff)):
        return -np.inf, 0.0
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))


def run_from_fallback(first: tuple[str, str, np.ndarray, dict], fallback: tuple,
                      o: Options, est, family, key, ledger: OracleLedger, trace: Trace,
                      alternatives: list, context: RunContext, counts: dict, target=None,
                      basin_centres: list | None = None) -> tuple[str, str, np.ndarray, dict]:
    """After a run from the low-rank family's reverse-KL Laplace start that ended uncertified
    (``first``, :func:`run_fixed`'s result, status 'max_iters'), the same run from its PPCA
    start (``fallback``: λ and its deficit, from
    :func:`stanvi.methods.warm_start.laplace_start`; its start ELBO estimated on the warm
    start's draws, charged here, where it is needed): the reverse-KL start is nearer the
    optimum on near-Gaussian posteriors but can lead the non-concave (ω, B) landscape to a
    stationary point below the one the PPCA start reaches (docs/algorithms.md#lowrank-start).
    The result with the higher ELBO on ``COMPARE_DRAWS`` common draws is kept, the certified
    one when they are within two standard errors; one trace row records the choice."""
    status1, message1, params1, info1 = first
    start, deficit = np.asarray(fallback[0], dtype=float), fallback[1]
    eps = standard_normal(purpose_key(key, 0, "init"), LAPLACE_COMPARE_DRAWS, family.base_dim)
    start_elbo = mean_elbo(est, start, eps)
    ledger.elbo_estimate(LAPLACE_COMPARE_DRAWS)
    k0 = int(trace.rows[-1]["iteration"]) if trace.rows else 0
    status2, message2, params2, info2 = run_fixed(
        o, est, family, key, ledger, trace, start, alternatives,
        context, counts, start_elbo, target, basin_centres=basin_centres,
        start_deficit=deficit or 0.0, k0=k0)
    gap, se = _paired_gap(est, family, params2, params1, key, ledger)
    second = gap > 0.0 or (status2 == "converged" and gap > -2.0 * se)
    trace.record(int(trace.rows[-1]["iteration"]) + 1, params2 if second else params1, ledger,
                 phase="laplace_fallback", accepted=bool(second),
                 fallback_gap=gap if np.isfinite(gap) else None)
    record = {"laplace_fallback_used": bool(second), "laplace_fallback_gap": gap,
              "laplace_fallback_first": message1}
    if second:
        return status2, (f"{message2} (from the PPCA Laplace start, {gap:.3g} ± {se:.2g} nats "
                         f"above the run from the reverse-KL start, which ended: {message1})"
                         ), params2, {**info2, **record}
    return status1, (f"{message1}; a run from the PPCA Laplace start ended {-gap:.3g} ± "
                     f"{se:.2g} nats lower ({message2})"), params1, {**info1, **record}
