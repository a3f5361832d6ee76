"""Stan ADVI's output (Stan's ``advi::run`` after the SGD phase; docs/algorithms.md#advi-output):
the output draws with Stan's ``lp__``/``log_p__``/``log_g__`` columns, and Stan's unguarded
``log_prob`` at each output draw (a failing draw ends Stan's run)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.methods.base import OracleLedger, purpose_key


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
    eps = standard_normal(purpose_key(key, 0, "output"), n, family.dim)
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
    eps = standard_normal(key, n, family.dim)
    z, log_p, _ = estimator.log_p_and_q(params, eps)
    mean = np.asarray(family.mean(jnp.asarray(params)))
    return {"z": np.vstack([mean[None, :], z]),
            "lp__": np.zeros(n + 1),
            "log_p__": np.concatenate([[0.0], log_p]),
            "log_g__": np.concatenate([[0.0], -0.5 * np.sum(eps * eps, axis=1)])}
