"""Stan ADVI's two estimators (Kucukelbir et al. 2017, JMLR 18(14); Stan's
``normal_meanfield::calc_grad`` / ``normal_fullrank::calc_grad`` and ``advi::calc_ELBO``;
docs/algorithms.md#advi): the stochastic ELBO gradient as JAX code (:func:`stan_calc_grad`),
which :mod:`stanvi.methods.advi` compiles into its SGD chunks, and the ELBO estimate
(:func:`calc_elbo`).  Stan's own arithmetic (sums in draw order, the ω part scaled after the sum, the
entropy gradient added last) is kept exactly, including what overflows and what is a drop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

from stanvi.errors import VIError
from stanvi.estimators.base import family_estimator
from stanvi.estimators.registry import ESTIMATORS
from stanvi.estimators.elbo import ElboEstimator, GradientFailure, collect_valid, elbo_term
from stanvi.lazy_jax import jax, jnp, lax

GRAD_RETRIES = 10        # calc_grad's n_retries: the 10·grad_samples-th drop raises
GRAD_OK, GRAD_DROP_LIMIT, GRAD_NAN = 0, 1, 2   # why a gradient failed (ADVI's ChunkResult codes)


def stan_gradient_pieces(family):
    """Stan's ``calc_grad`` arithmetic for ``family`` ([S] ``normal_meanfield::calc_grad``,
    ``normal_fullrank::calc_grad``): (per-draw accumuland, finalize).

    Stan sums, over the accepted draws and in draw order, ``g`` (the gradient of log p at ζ) and
    ``g ∘ ε`` (mean-field) or the lower triangle of ``g εᵀ`` (full-rank); divides both sums by
    ``grad_samples``; then mean-field multiplies the ω part by ``exp(ω)`` and adds the entropy
    gradient 1, full-rank adds ``1/L_dd`` to the diagonal.  Overflow is not a drop: an infinite
    product stays in the gradient (and the step-size rule turns it into NaN), as in Stan.
    Returns None for a family Stan does not have (then the autodiff gradient of ℓ is used).
    """
    dim, stan_name = family.dim, getattr(family, "stan_name", None)
    if stan_name == "normal_meanfield":
        def accumuland(g, e):
            return jnp.concatenate([g, g * e])

        def finalize(params, acc, n):
            _, omega = family.split(params)
            mu_grad, omega_grad = acc[:dim] / n, acc[dim:] / n
            return jnp.concatenate([mu_grad, omega_grad * jnp.exp(omega) + 1.0])
        return accumuland, finalize
    if stan_name == "normal_fullrank" and family.diagonal == "stan":
        rows, cols = np.tril_indices(dim)
        diag = np.flatnonzero(rows == cols)

        def accumuland(g, e):
            return jnp.concatenate([g, g[rows] * e[cols]])

        def finalize(params, acc, n):
            mu_grad, l_grad = acc[:dim] / n, acc[dim:] / n
            l_diag = params[dim:][diag]
            return jnp.concatenate([mu_grad, l_grad.at[diag].add(1.0 / l_diag)])
        return accumuland, finalize
    return None


def stan_calc_grad(family, log_density: Callable, n: int) -> Callable:
    """Stan's ``calc_grad`` as a pure JAX function ``gradient(params, key) -> (g, kind, dropped,
    evaluated)`` for use inside compiled loops (ADVI's SGD chunks), with ``n`` =
    ``grad_samples`` draws.  ``kind``: GRAD_OK, GRAD_DROP_LIMIT or GRAD_NAN; ``dropped``: the
    draws dropped (the limit when it was hit); ``evaluated``: the draws evaluated (whole batches).

    The drop-and-redraw rule is :func:`stanvi.estimators.elbo.collect_valid`'s (draws consumed in
    order in batches of n keyed ``fold_in(key, attempt)``, a failed draw replaced, the
    ``10·n``-th drop fails), written with ``lax.while_loop`` so that it runs inside JAX; the
    arithmetic is Stan's (:func:`stan_gradient_pieces`) where Stan has the family, else the mean
    of the autodiff gradients of ℓ (:func:`stanvi.estimators.elbo.elbo_term`).
    """
    own = family_estimator(family)
    if own is not None:   # the family's own first-order gradient (stanvi.families.protocol)
        calc_grad = getattr(ESTIMATORS[own], "calc_grad", None)
        if calc_grad is None:
            raise VIError(f"the {family.name!r} family's estimator {own!r} has no calc_grad: "
                          f"ADVI's SGD cannot take it")
        return calc_grad(family, log_density, n)
    eps_dim, n_params, limit = family.base_dim, family.n_params, GRAD_RETRIES * n
    stan_pieces = stan_gradient_pieces(family)
    index = jnp.arange(n)

    if stan_pieces is not None:
        accumuland, finalize = stan_pieces
        lp_and_grad = jax.vmap(jax.value_and_grad(log_density))

        def evaluate(params, eps):
            """(ok, per-draw accumulands).  Stan drops a draw when the model throws (any
            ``std::exception``) or the gradient of log p at ζ is not finite
            (``check_finite(tmp_mu_grad)``).  A target signals a throw by a non-finite log
            density (the Target convention; a Stan target's bridge returns −inf and a NaN
            gradient for a throwing row), so a non-finite value is a drop too.  Only ∇ log p(ζ)
            is checked, not the ω / L part: its overflow is not a drop in Stan."""
            lp, g = lp_and_grad(family.sample(params, eps))
            ok = jnp.isfinite(lp) & jnp.all(jnp.isfinite(g), axis=1)
            return ok, jax.vmap(accumuland)(g, eps)
    else:
        value_and_grads = jax.vmap(jax.value_and_grad(elbo_term(family, log_density)),
                                   in_axes=(None, 0))

        def evaluate(params, eps):
            values, grads = value_and_grads(params, eps)
            return jnp.isfinite(values) & jnp.all(jnp.isfinite(grads), axis=1), grads

        def finalize(params, acc, n):
            return acc / n

    def gradient(params, key):
        """calc_grad (docs/algorithms.md#advi-gradient): draws in batches of n keyed ``fold_in(key, attempt)``, consumed in
        order; the 10·n-th drop fails the gradient (GRAD_DROP_LIMIT); the accepted draws are
        summed in draw order and finalized as Stan does; a NaN in the result fails it too
        (GRAD_NAN: Stan's ``set_mu``/``set_omega``/``set_L_chol`` throw ``std::domain_error`` on
        NaN, after the draws, with no redraw)."""
        def cond(c):
            return (c[1] < n) & ~c[4]

        def body(c):
            attempt, have, dropped, acc, failed = c
            eps = jax.random.normal(jax.random.fold_in(key, attempt), (n, eps_dim),
                                    dtype=jnp.float64)
            ok, terms = evaluate(params, eps)
            done = jnp.cumsum(ok) >= n - have
            done_at = jnp.where(done.any(), jnp.argmax(done), n)
            hit = dropped + jnp.cumsum(~ok) >= limit
            fail_at = jnp.where(hit.any(), jnp.argmax(hit), n)
            take = ok & (index <= done_at)
            # sequential sum in draw order (Stan's mu_grad += ..., omega_grad += ...)
            acc = lax.fori_loop(0, n, lambda j, a: jnp.where(take[j], a + terms[j], a), acc)
            return (attempt + 1, have + jnp.sum(take, dtype=jnp.int32),
                    dropped + jnp.sum(~ok & (index < done_at), dtype=jnp.int32),
                    acc, failed | (fail_at < done_at))

        zero = jnp.zeros((), jnp.int32)
        init = (zero, zero, zero, jnp.zeros(n_params), jnp.zeros((), bool))
        attempts, _, dropped, acc, failed = lax.while_loop(cond, body, init)
        g = finalize(params, acc, n)
        kind = jnp.where(failed, GRAD_DROP_LIMIT,
                         jnp.where(jnp.any(jnp.isnan(g)), GRAD_NAN, GRAD_OK)).astype(jnp.int32)
        return g, kind, jnp.where(failed, limit, dropped).astype(jnp.int32), attempts * n

    return gradient


class ElboFailure(VIError):
    """``calc_ELBO`` dropped ``elbo_samples`` draws (the model threw or was non-finite)."""


_ELBO_PIECES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _elbo_pieces(estimator: ElboEstimator):
    """Jitted (params, eps) ↦ (the ELBO's per-draw part for each row, its closed-form part):
    (log p(z_j), H(q)) for the Gaussian families; the family's ``elbo_pieces``
    (stanvi.families.protocol); cached weakly per estimator."""
    if estimator not in _ELBO_PIECES:
        family, log_density = estimator.family, estimator.log_density
        _ELBO_PIECES[estimator] = jax.jit(family.elbo_pieces(log_density))
    return _ELBO_PIECES[estimator]


def calc_elbo(estimator: ElboEstimator, params, key: jax.Array, n: int,
              ledger=None) -> float:
    """Stan's ``calc_ELBO`` (docs/algorithms.md#advi-elbo; [S] ``advi::calc_ELBO``).

    Draws come in batches of the static size n (``fold_in(key, attempt)``) and are consumed in
    order; a draw whose log p(ζ) is not finite is dropped (Stan: ``check_finite`` throws
    ``std::domain_error``, caught); the n-th drop raises :class:`ElboFailure`.  The result is
    Stan's arithmetic: ``elbo += log_prob`` over the kept draws in draw order, ``elbo /= n``,
    ``elbo += entropy()``.  So it can be −∞ without a failure (the sum of finite log densities
    overflows), which ``adapt_eta`` then compares as −∞, not as −DBL_MAX.  Draws evaluated beyond
    the n the estimate uses (redraw batches) are charged to ``ledger`` as screening draws.
    """
    pieces = _elbo_pieces(estimator)
    params = jnp.asarray(params, dtype=jnp.float64)
    entropy = 0.0

    def evaluate(eps):
        nonlocal entropy
        log_p, h = jax.device_get(pieces(params, eps))
        entropy = float(h)
        log_p = np.asarray(log_p, dtype=float)
        return np.isfinite(log_p), log_p

    try:
        (_, kept), _, evaluated = collect_valid(evaluate, key, n, estimator.family.base_dim, n,
                                                "the ELBO")
    except GradientFailure as exc:
        if ledger is not None:
            ledger.screening(exc.evaluated - n)
        raise ElboFailure(f"stan::variational::advi::calc_ELBO: The number of dropped evaluations "
                          f"has reached its maximum amount ({n}). Your model may be either "
                          f"severely ill-conditioned or misspecified.") from None
    if ledger is not None:
        ledger.screening(evaluated - n)
    total = 0.0
    for value in kept.tolist():   # Stan's running sum, in draw order
        total += value
    return total / n + entropy
