"""Stan ADVI's output and the end of its SGD phase (Stan's ``advi::run`` after
``stochastic_gradient_ascent``; docs/algorithms.md#advi-output): the output draws with Stan's
``lp__``/``log_p__``/``log_g__`` columns, Stan's unguarded ``log_prob`` at each output draw (a
failing draw ends Stan's run), and stanvi's improper-posterior checks (issue P2-1c; ADVI's
``improper_check`` option) on the SGD phase's last iterate or on a q that ran away before a
failed gradient."""

from __future__ import annotations

import numpy as np

from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.lazy_jax import jax, jnp
from stanvi.methods.base import OracleLedger, purpose_key
from stanvi.methods.checks import (PROBE_DRAWS, divergence, improper_direction,
                                   runaway_coordinates)


def output_failure(target, family, params, key: jax.Array, n: int,
                   ledger: OracleLedger | None = None) -> tuple[int, str] | None:
    """The first of Stan's n output draws at which the model fails, as (index, message), or None.

    [S] ``advi::run``, after ``stochastic_gradient_ascent``: for each of ``n_posterior_samples``
    draws ``variational.sample_log_g(...)``, ``model_.write_array(...)`` and
    ``model_.template log_prob<false, true>(cont_params_, &msg2)``, none inside a try block, so a
    draw at which the model throws ends ADVI (the service catches it and returns
    ``error_codes::SOFTWARE``).  The draws are the fit's own output draws
    (``purpose_key(key, 0, 'output')``, as ``stanvi.fit`` draws them), evaluated in one batched
    call; a failed row (thrown or non-finite, the Target convention) counts as a throw.  Not an
    oracle call (output; docs/algorithms.md#oracle-calls): charged to ``ledger`` as screening draws.
    """
    eps = standard_normal(purpose_key(key, 0, "output"), n, family.base_dim)
    z = np.asarray(family.sample(jnp.asarray(params, dtype=jnp.float64), eps))
    res = target.log_density(z)
    if ledger is not None:
        ledger.screening(n)
    ok = np.isfinite(res.log_density) if res.ok is None else np.asarray(res.ok, dtype=bool)
    bad = np.flatnonzero(~ok)
    if len(bad) == 0:
        return None
    index = int(bad[0])
    return index, res.messages.get(index, "non-finite log density")


def sgd_end(target, family, params, key: jax.Array, opt, ledger: OracleLedger, info: dict,
            status: str, elbos: tuple[float, ...], *, params0: np.ndarray,
            eta: float) -> tuple[str, str]:
    """(status, message) at the end of a 'converged' or 'max_iters' SGD phase (``opt``: ADVI's
    Options): stanvi's improper-posterior check (``improper_check``; ``elbos``: the last ELBO
    checks) and Stan's unguarded ``log_prob`` at the output draws (``output_check``).  A
    failure keeps Stan's status in ``info['sgd_status']``.

    A q that ran away (:func:`~stanvi.methods.checks.divergence`) is an improper posterior only
    when the widening probe, run from the finite q₀ (``params0``) along the coordinates where q
    ran away, says so (as :func:`runaway_message` decides for a failed gradient); otherwise the
    steps diverged on a proper posterior (η = 100 on a raw-unit regression throws log σ's sd to
    1e39), Stan's status is kept — Stan's ADVI ends the same way there — and the message says
    that q is unusable (issue T3-2 item 1: a failure here made stanvi's ADVI fail where Stan's
    does not)."""
    note = ""
    if opt.improper_check:
        # the probe (5,376 log densities) runs only where q ran away or the ELBO was still
        # climbing at its last three checks, as it does without end on an improper posterior
        runaway = divergence(family, params)
        if runaway is not None:
            improper = _improper_where_it_ran_away(target, family, params, params0, key, ledger)
            if improper is None:   # Stan's status, then Stan's output check as for any q
                note = (f"{_diverged(runaway)}; Stan's ADVI reports '{status}' here too, but q "
                        f"is not a usable approximation: the step size eta = {eta:g} may be too "
                        f"large for this model")
                info["messages"].append(note)
        else:
            climbing = len(elbos) >= 3 and elbos[-3] < elbos[-2] < elbos[-1]
            improper = climbing and improper_direction(
                target, family, params,
                standard_normal(purpose_key(key, 0, "check"), PROBE_DRAWS, family.base_dim), ledger)
        if improper:
            info["sgd_status"] = status
            return "failed", f"{improper} (Stan's ADVI would report '{status}')"
    failure = output_failure(target, family, params, key, opt.output_samples,
                             ledger) if opt.output_check else None
    if failure is None:
        return status, note
    index, why = failure
    info["output_failed_draw"] = index
    info["sgd_status"] = status
    return "failed", (f"{why} (output draw {index + 1} of {opt.output_samples}: Stan's advi::run "
                      f"evaluates log_prob at every output draw outside any try block, so the run "
                      f"ends with an error after the SGD phase ({status}))")


def runaway_message(target, family, params, params0, key: jax.Array, opt, ledger: OracleLedger,
                    eta: float, message: str) -> str:
    """The failed SGD gradient's message, explained when q ran away before it (stanvi's addition,
    ``improper_check``).  A runaway alone does not tell an improper posterior from steps that
    diverged (η too large: mesquite from posteriordb ran away at η = 100 with a proper posterior),
    so the improper-direction probe decides, run from the finite q₀ along the coordinates where q
    ran away."""
    runaway = divergence(family, params) if opt.improper_check else None
    if runaway is None:
        return message
    improper = _improper_where_it_ran_away(target, family, params, params0, key, ledger)
    if improper is not None:
        return f"{improper}; {runaway.split(':')[0]} ({message})"
    return (f"{_diverged(runaway)}: the step size eta = {eta:g} may be too large for this model "
            f"({message})")


def _improper_where_it_ran_away(target, family, params, params0, key: jax.Array,
                                ledger: OracleLedger) -> str | None:
    """The widening probe from the finite q₀ (``params0``) along the coordinates where q
    (``params``) ran away: "may be improper" or None (the steps diverged on a proper
    posterior)."""
    return improper_direction(
        target, family, params0,
        standard_normal(purpose_key(key, 0, "check"), PROBE_DRAWS, family.base_dim), ledger,
        coordinates=runaway_coordinates(family, params))


def _diverged(runaway: str) -> str:
    """The opening of a "steps diverged" message for ``divergence``'s text ``runaway``."""
    return (f"ADVI's steps diverged: {runaway.split(':')[0]}, although q's ELBO does not keep "
            f"rising as q widens there (so not an improper posterior)")


# --------------------------------------------------------------------------------- output


def output_draws(estimator: ElboEstimator, params, key: jax.Array, n: int = 1000
                 ) -> dict[str, np.ndarray]:
    """Stan's ADVI output (docs/algorithms.md#advi-output): row 0 is the mean μ with ``lp__ = log_p__ = log_g__ = 0``, then
    n draws z = g(λ, ε) with ``lp__ = 0``, ``log_p__ = log p(z)`` (propto=False, jacobian=True;
    −inf where the model fails) and ``log_g__ = −½‖ε‖²``.

    Returns ``{"z": (1+n, D), "lp__", "log_p__", "log_g__": (1+n,)}`` on the unconstrained scale;
    the caller constrains z.  Use ``purpose_key(run_key, 0, 'output')`` for ``key``.
    """
    family = estimator.family
    eps = standard_normal(key, n, family.base_dim)
    z, log_p, _ = estimator.log_p_and_q(params, eps)
    mean = np.asarray(family.mean(jnp.asarray(params)))
    return {"z": np.vstack([mean[None, :], z]),
            "lp__": np.zeros(n + 1),
            "log_p__": np.concatenate([[0.0], log_p]),
            "log_g__": np.concatenate([[0.0], -0.5 * np.sum(eps * eps, axis=1)])}
