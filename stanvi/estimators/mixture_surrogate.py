"""What the mixture family's two gradients share (docs/discrete.md#mixture-estimator): the
components each evaluates (:func:`columns`) and the Rao-Blackwellized surrogate whose gradient
is the estimate (:func:`surrogate`); used by :mod:`stanvi.estimators.mixture_rb` (ADVI's SGD)
and :mod:`stanvi.estimators.mixture_mlmc` (MLMCVI's levels).
"""

from __future__ import annotations

from stanvi.lazy_jax import jax, jnp

from stanvi.discrete.rao_blackwell import budget_columns, fixed_columns, reinforce


def columns(family, key, log_w):
    """The components a mixture gradient evaluates: all of them when the budget allows, else the
    budget rule's columns (docs/discrete.md#budget-rule)."""
    C, M = family.n_components, family.budget
    if M >= C:
        return fixed_columns(key, log_w, C)
    return budget_columns(key, log_w, M, family.budget_rule, family.mass_tol, family.rb_k)


def surrogate(lam, family, cols, eps, lp, g, ok=None):
    """The RB surrogate of the mixture ELBO at λ = ``lam`` (its gradient is the estimate) for
    the columns ``cols`` (:class:`~stanvi.discrete.rao_blackwell.Columns` over components) and
    the base draws ``eps`` (M, S, D) of each column, given log p (M, S) and its gradient
    (M, S, D) at the draws (log p enters linearized there: value ``lp``, gradient
    ``g·∂z/∂λ``); ``ok`` (M, S) masks failed draws out of F̂ (None: all valid)."""
    M, S, D = eps.shape
    idx = jnp.repeat(cols.idx, S)
    z = family.component_sample(lam, idx, eps.reshape(M * S, D))
    log_p = lp.reshape(-1) + jnp.sum(g.reshape(-1, D) * (z - jax.lax.stop_gradient(z)), axis=1)
    h = log_p - family.log_q(lam, z)
    if ok is not None:
        h = jnp.where(ok.reshape(-1), h, 0.0)
    fv = jnp.mean(h.reshape(M, S), axis=1)           # F̂ per column
    return reinforce("loo").surrogate(family.log_weights(lam), cols, fv, fv[:0], None)
