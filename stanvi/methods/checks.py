"""Checks that turn a misbehaving model into an honest ``failed`` (issue P2-1c): a variational
approximation running away (an improper posterior), and a model that fails on much of q's mass.

Both are properties of (model, q), not of an algorithm, so every method can call them.
"""

from __future__ import annotations

import numpy as np

from stanvi.estimators.elbo import standard_normal
from stanvi.methods.base import purpose_key

# An unconstrained posterior sd above 1e10 (or a mean beyond 1e15) is no posterior a Stan model
# describes: it is what maximizing an ELBO that is unbounded above looks like (the entropy of q
# grows forever when ∫p is infinite), long before float64 overflows.
MAX_SCALE = 1e10
MAX_ABS_MEAN = 1e15


def divergence(family, params: np.ndarray) -> str | None:
    """A message when q has run away (non-finite parameters, a marginal sd above 1e10 or a mean
    beyond 1e15 in unconstrained space), else None."""
    params = np.asarray(params, dtype=float)
    if not np.all(np.isfinite(params)):
        return ("the variational parameters became non-finite: the ELBO may be unbounded "
                "(the posterior may be improper)")
    with np.errstate(over="ignore", invalid="ignore"):
        sd = np.asarray(family.marginal_sd(params), dtype=float)
    mean = np.asarray(family.mean(params), dtype=float)
    if not np.all(np.isfinite(sd)) or np.max(sd) > MAX_SCALE:
        worst = int(np.nanargmax(np.where(np.isfinite(sd), sd, np.inf)))
        return (f"q's scale grew without bound (sd {sd[worst]:.3g} in unconstrained coordinate "
                f"{worst + 1}): the ELBO rises without limit, so the posterior may be improper "
                f"(check that every parameter has a proper prior or is identified by the data)")
    if np.max(np.abs(mean)) > MAX_ABS_MEAN:
        worst = int(np.argmax(np.abs(mean)))
        return (f"q's mean ran away (|mean| {abs(mean[worst]):.3g} in unconstrained coordinate "
                f"{worst + 1}): the posterior may be improper")
    return None


# The improper-direction probe (:func:`improper_direction`): widen q along one coordinate by
# PROBE_FACTOR per step, PROBE_STEPS times, on PROBE_DRAWS common draws.
PROBE_FACTOR = 100.0
PROBE_STEPS = 6
PROBE_DRAWS = 128   # and their antithetic twins
PROBE_COORDINATES = 3
PROBE_MIN_RISE = 0.5   # nats per step; a flat direction rises by log(100) = 4.6


def improper_direction(target, family, params: np.ndarray, eps: np.ndarray,
                       ledger=None, coordinates: np.ndarray | None = None) -> str | None:
    """A message when q's ELBO keeps rising as q is widened along one coordinate, else None.

    Why this decides propriety: widening q along unconstrained coordinate i by a factor c (the
    draws' deviations from the mean in coordinate i multiplied by c) adds log c to the entropy and
    changes E_q[log p] by how fast p decays in that direction.  If p's marginal tails decay faster
    than 1/|x| (any proper posterior), the ELBO eventually falls by about (tail exponent − 1)·log c
    per step; if they decay slower (an improper posterior, e.g. a parameter with a flat prior and
    no likelihood term), it rises by up to log c per step without end.  So the ELBO rising by more
    than ``PROBE_MIN_RISE`` nats at each of ``PROBE_STEPS`` successive widenings by
    ``PROBE_FACTOR`` (up to ×10¹² beyond q) marks a direction along which ∫p diverges.

    Only the ``PROBE_COORDINATES`` coordinates with the largest marginal sd are probed (an
    improper direction is where a VI method's q has grown widest; or the ``coordinates``
    given, e.g. where a q that overflowed had grown widest, probed from a finite q), on ``eps`` and its antithetic
    twin ``−eps`` (so a log p linear in z, as a positive parameter's Jacobian with no prior gives,
    averages out exactly), common to all widenings: 3 × 7 × 2·``len(eps)`` log densities in one
    batched call, charged to ``ledger`` (when given) as screening draws.  A q up to 10⁹ times narrower than a proper posterior still sees its ELBO fall
    within the widenings; a widening at which the model fails or log p is not finite counts as a
    fall, so a failure here errs towards Stan's status, never towards a false alarm.
    """
    if target is None:
        return None
    params = np.asarray(params, dtype=float)
    eps = np.concatenate([eps, -np.asarray(eps)])   # antithetic: a log p linear in z averages out
    z = np.asarray(family.sample(params, eps), dtype=float)
    mean = np.asarray(family.mean(params), dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        sd = np.asarray(family.marginal_sd(params), dtype=float)
    if not (np.all(np.isfinite(z)) and np.all(np.isfinite(sd))):
        return None
    coords = (np.argsort(-sd, kind="stable")[:min(PROBE_COORDINATES, len(sd))]
              if coordinates is None else np.asarray(coordinates, dtype=int))
    factors = PROBE_FACTOR ** np.arange(PROBE_STEPS + 1)
    batch = []
    for i in coords:
        for c in factors:
            w = z.copy()
            w[:, i] = mean[i] + c * (z[:, i] - mean[i])
            batch.append(w)
    res = target.log_density(np.concatenate(batch))
    if ledger is not None:
        ledger.screening(sum(len(b) for b in batch))
    lp = np.where(np.asarray(res.ok, dtype=bool), np.asarray(res.log_density, dtype=float),
                  -np.inf).reshape(len(coords), len(factors), len(eps))
    with np.errstate(invalid="ignore"):
        elbo = lp.mean(axis=2) + np.log(factors)[None, :]   # ELBO(c) − H(q), up to a constant
        rises = np.diff(elbo, axis=1)
    for row, i in enumerate(coords):
        if np.all(np.isfinite(elbo[row])) and np.all(rises[row] > PROBE_MIN_RISE):
            return (f"q's ELBO keeps rising as q is widened along unconstrained coordinate "
                    f"{int(i) + 1} (by {', '.join(f'{r:.1f}' for r in rises[row])} nats per "
                    f"x{PROBE_FACTOR:g} widening; a proper posterior's ELBO falls): the "
                    f"posterior may be improper (check that every parameter has a proper prior or "
                    f"is identified by the data)")
    return None


def runaway_coordinates(family, params: np.ndarray) -> np.ndarray:
    """The ``PROBE_COORDINATES`` unconstrained coordinates along which q is widest (a
    non-finite sd counts as widest), for probing a q that ran away from a finite one."""
    with np.errstate(over="ignore", invalid="ignore"):
        sd = np.asarray(family.marginal_sd(np.asarray(params, dtype=float)), dtype=float)
    sd = np.where(np.isfinite(sd), sd, np.inf)
    return np.argsort(-sd, kind="stable")[:min(PROBE_COORDINATES, len(sd))]


def support_failures(target, family, params: np.ndarray, eps: np.ndarray,
                     ledger=None) -> tuple[float, str]:
    """The fraction of the draws z = g(λ, ε) at which the model fails (throws, or log p is not
    finite), and the model's first message ('' when none fails or no target can say).  One
    batched log-density call, charged to ``ledger`` (when given) as screening draws."""
    if target is None:
        return 0.0, ""
    z = np.asarray(family.sample(np.asarray(params, dtype=float), eps))
    res = target.log_density(z)
    if ledger is not None:
        ledger.screening(len(z))
    ok = np.asarray(res.ok, dtype=bool) & np.isfinite(res.log_density)
    fraction = float(1.0 - ok.mean())
    message = ""
    if fraction > 0:
        messages = getattr(res, "messages", None) or {}
        first = next((messages[i] for i in sorted(messages)), "")
        message = first.strip().splitlines()[0] if first else "log density not finite"
    return fraction, message


def support_failure_message(fraction: float, message: str, *, accepted: int | None = None) -> str:
    """The ``failed`` message for a model that fails on ``fraction`` of q's draws."""
    moved = "" if accepted is None else (
        "no step was ever accepted; " if accepted == 0 else f"{accepted} steps were accepted; ")
    return (f"the model fails at {100 * fraction:.0f}% of q's draws ({message!r}): {moved}a "
            f"Gaussian approximation cannot cover this posterior's support, and its ELBO is -inf "
            f"(constrain the parameter, e.g. with <upper=...>, instead of reject())")


def honest_outcome(target, family, params, key, status: str, message: str, counts: dict,
                   info: dict, ledger) -> tuple[str, str]:
    """A trust-region method's final (status, message), made honest (issue P2-1c):
    ``failed`` with the reason when q ran away (an improper posterior), when a run that
    did not converge — or never accepted a step — ended with the model failing on ≥ 1% of q's
    draws (1,024 draws, one batched call; the fraction goes to ``info``), or when no step was
    ever accepted and every rejection was a failure (non-finite Hessian-vector products, step or
    ELBO change: q never left its start); ``max_iters`` when no step was accepted otherwise."""
    if status == "failed" and message.startswith("diverged"):
        return status, message
    runaway = divergence(family, params)
    if runaway:
        return "failed", runaway
    never_moved = counts["accepted"] == 0 and counts["rejected_failure"] > 0
    if status in ("converged", "budget") and not never_moved:
        return status, message
    eps = standard_normal(purpose_key(key, 0, "elbo"), 1024, family.base_dim)
    fraction, model_message = support_failures(target, family, params, eps, ledger)
    info["failing_fraction"] = fraction
    if fraction >= 0.01:
        return "failed", (support_failure_message(fraction, model_message,
                                                  accepted=counts["accepted"])
                          + f" [TrustVI: {message}]")
    if never_moved and counts["rejected_lambda"] == 0 and counts["rejected_change"] == 0:
        # every rejection was a failure: more iterations would not help ('max_iters' would say
        # "raise the limit"); roaches and salm from example-models under the paper profile
        remedy = ("another init may avoid it" if "warm_start" in info else
                  "another init, or the default profile's Laplace warm start, may avoid it")
        return "failed", (f"no step was ever accepted: every proposed step was rejected because "
                          f"a Hessian-vector product, the step or its ELBO change was not finite, "
                          f"so q is still its starting point (the model's curvature is not "
                          f"finite there; {remedy}) [TrustVI: {message}]")
    if (never_moved and status == "converged" and "refined:" not in message
            and "certified on" not in message):
        # (a stop the refinement or the fresh-sample test certified stands: the warm start may
        # already sit at the optimum)
        return "max_iters", f"no step was ever accepted ({message})"
    return status, message
