"""The fixed-sample TrustVI run and its check against a second, independent start
(docs/algorithms.md#second-start, issue T3-1 target 5).

A Newton certificate is local: on example-models' mvn_orange the Laplace warm start's basin ends
51 nats below the optimum ADVI finds, on stagnant 12 nats, on posteriordb's hmm_drive_0
(full rank) 60.  When the run certifies an optimum λ₁ whose ELBO is more than
``second_start_trigger`` nats above its start's (the posterior is not the Gaussian its mode
suggests, so the mode's basin need not hold the best q; on 40 of 46 posteriordb posteriors the
Laplace start is within a nat of the optimum and nothing more is done), or whose start's ELBO
is unknown, a cheap *exploratory* run climbs from the other start — the method's own initial q when the
Laplace start was used (the start ADVI and Stan's initialization use), or the Laplace start
when it lost the warm start's comparison, or Stan's random initialization when there was none —
on a small fixed sample (``second_start_draws``), with the Stein model and no certification
(:func:`stanvi.methods.trustvi_fixed.step` with ``explore_floor``).  It stops after
``second_start_iters`` iterations, when its own fixed-sample problem is solved, or as soon as
its quadratic model predicts that it stays below λ₁'s ELBO less 2 nats (ELBO + 2·gain < floor).

Both q's are then compared on ``COMPARE_DRAWS`` common fresh draws.  When the second is higher
by more than 1 nat plus twice the standard error of the paired difference, the fixed-sample run
starts again from it, certifies its own optimum, and the better of the two certified optima
(on the common draws) is the result; the message says so, with the figures.  Otherwise the
comparison is recorded in ``info`` (``second_start_gap``: ELBO₂ − ELBO₁) and the result is λ₁.
Every evaluation is charged to the fit's ledger and its iterations continue the trace
(``phase`` 'second_start').
"""

from __future__ import annotations

from functools import partial

import numpy as np

from stanvi.estimators.elbo import GradientFailure, standard_normal
from stanvi.methods import trustvi_fixed
from stanvi.methods.base import OracleLedger, RunContext, Trace, iterate, purpose_key
from stanvi.methods.trustvi_options import Options

#: Common fresh draws on which the two starts' ELBOs are compared.
COMPARE_DRAWS = 256
#: The second start must be higher by this many nats (plus twice the standard error).
MARGIN = 1.0


def run_fixed(o: Options, est, family, key, ledger: OracleLedger, trace: Trace,
              params: np.ndarray, alternatives: list, context: RunContext,
              counts: dict | None = None, start_elbo: float | None = None
              ) -> tuple[str, str, np.ndarray, dict]:
    """The fixed-sample iterations, their certification and the second-start check, on the
    shared loop; returns (status, message, params, info).  ``counts`` (accepted and rejected
    steps, as :func:`stanvi.methods.checks.honest_outcome` reads them) is updated;
    ``start_elbo``: the warm start's ELBO estimate at ``params`` (None: unknown), which decides
    whether the second start runs (module docstring)."""
    info: dict = {}
    if counts is None:
        counts = {"accepted": 0, "rejected_lambda": 0, "rejected_change": 0,
                  "rejected_failure": 0}
    setup = trustvi_fixed.FixedSetup(o, est, family, key, ledger, info, counts)
    status, message, first, first_elbo, k = _certified_run(setup, params, 0, trace, context)
    if status != "converged" or not o.second_start_iters:
        return status, message, first, info
    climbed = first_elbo - start_elbo if start_elbo is not None else np.inf
    info["second_start_climb"] = climbed
    if climbed <= o.second_start_trigger:
        return status, message, first, info
    if alternatives:
        other, where = alternatives[0], "the start the warm start did not choose"
    else:
        other = family.initial_params(context.random_init_mu, o.log_scale0)
        where = "Stan's random initialization"
    explored, k = _explore(setup, other, first_elbo - 2.0 * MARGIN, k, trace, context)
    if explored is None:
        return status, message, first, info
    gap, se = _paired_gap(est, family, explored, first, key, ledger)
    info.update(second_start_gap=gap, second_start_gap_se=se)
    if not gap > MARGIN + 2.0 * se:
        return status, message, first, info
    status2, message2, second, _, k = _certified_run(setup, explored, k, trace, context)
    final_gap, _ = _paired_gap(est, family, second, first, key, ledger)
    info.update(second_start_final_gap=final_gap, second_start_used=final_gap > 0)
    found = (f"a second start (an exploratory run from {where}) reached an ELBO "
             f"{gap:.3g} ± {se:.2g} nats above the first certified optimum")
    if final_gap <= 0:
        return status, (f"{message}; {found}, but its own run ended {-final_gap:.3g} nats "
                        f"lower ({message2}): the first optimum is kept"), first, info
    return status2, (f"{message2}; {found}: the fit continued from it and ends "
                     f"{final_gap:.3g} nats above the first optimum, a local one "
                     f"({message})"), second, info


def _certified_run(setup, params: np.ndarray, k0: int, trace: Trace, context: RunContext
                   ) -> tuple[str, str, np.ndarray, float, int]:
    """One fixed-sample run with certification from ``params``: (status, message, final
    parameters, the final fixed-sample ELBO, last iteration)."""
    o = setup.o
    try:
        state = trustvi_fixed.start(setup, params)
    except GradientFailure as exc:
        return ("failed", f"failed_gradient: the first fixed sample: {exc}", params, -np.inf,
                k0)
    state, k, status, message = iterate(partial(trustvi_fixed.step, setup), state,
                                        max_iters=max(1, o.max_iters - k0), trace=trace,
                                        ledger=setup.ledger, context=context, start=k0)
    setup.info.update(iterations=k, final_delta=state.delta,
                      fixed_draws=int(state.eps.shape[0]))
    return status, message, state.params, float(np.mean(state.values)), k


def _explore(setup, params: np.ndarray, floor: float, k0: int, trace: Trace,
             context: RunContext) -> tuple[np.ndarray | None, int]:
    """The exploratory run from ``params`` (module docstring); its last iterate, or None when
    its first sample cannot be drawn."""
    o = setup.o
    explore = setup._replace(o=_explore_options(o), explore_floor=floor)
    try:
        state = trustvi_fixed.start(explore, params)
    except GradientFailure:
        return None, k0
    state, k, _, _ = iterate(partial(trustvi_fixed.step, explore), state,
                             max_iters=o.second_start_iters, trace=trace, ledger=setup.ledger,
                             context=context, start=k0)
    for row in trace.rows[len(trace.rows) - (k - k0):]:
        row["phase"] = "second_start"
    setup.info["second_start_iterations"] = k - k0
    return state.params, k


def _explore_options(o: Options) -> Options:
    from dataclasses import replace  # noqa: PLC0415

    return replace(o, fixed_n0=o.second_start_draws, fixed_stage_iters=o.second_start_iters,
                   fixed_hessian="stein")


def _paired_gap(est, family, a: np.ndarray, b: np.ndarray, key,
                ledger: OracleLedger) -> tuple[float, float]:
    """ELBO(a) − ELBO(b) on ``COMPARE_DRAWS`` common fresh draws and its standard error (−inf
    when q_a fails where q_b does not)."""
    eps = standard_normal(purpose_key(key, 0, "check"), COMPARE_DRAWS, family.dim)
    diff = est.values(a, eps) - est.values(b, eps)
    ledger.elbo_estimate(2 * COMPARE_DRAWS)
    if not np.all(np.isfinite(diff)):
        return -np.inf, 0.0
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff)))
