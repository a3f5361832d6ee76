"""Checks that turn a misbehaving model into an honest ``failed`` (issue P2-1c): a variational
approximation running away (an improper posterior), and a model that fails on much of q's mass.

Both are properties of (model, q), not of an algorithm, so every method can call them.
"""

from __future__ import annotations

import numpy as np

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


def support_failures(target, family, params: np.ndarray, eps: np.ndarray) -> tuple[float, str]:
    """The fraction of the draws z = g(λ, ε) at which the model fails (throws, or log p is not
    finite), and the model's first message ('' when none fails or no target can say).  One
    batched log-density call."""
    if target is None:
        return 0.0, ""
    z = np.asarray(family.sample(np.asarray(params, dtype=float), eps))
    res = target.log_density(z)
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
