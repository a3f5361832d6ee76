"""The ELBO gradient of the Gaussian-mixture family (:class:`~stanvi.families.mixture.
GaussianMixture`), with the Rao-Blackwellized estimator for the component choice
(docs/discrete.md#mixture-estimator; Liu et al. 2019).

``ELBO(λ) = Σ_c w_c F(c)``, ``F(c) = E_{e~N(0,I)} h(m_c + L_c e)``, ``h(θ) = log p(θ) − log q_λ(θ)``.
The component index is the discrete variable: ``f_λ(c) = F̂_c``, the mean of h over S
reparameterized draws from component c (so f depends on λ through m_c, L_c and log q_λ).  Each
step evaluates the columns :func:`~stanvi.discrete.rao_blackwell.rao_blackwell` picks (every
component when the family is exact; else the budget rule's M columns: the k̂ heaviest
components summed, M − k̂ iid draws from the rest), all M·S log-density gradients in one batched
call, and differentiates the surrogate; the baseline is ``reinforce('loo')`` (independent of the
draw it is applied to: unbiased).  k = C is the usual stratified estimator (C·S calls); RB costs
M·S calls, whatever C is.

A draw where the model fails (non-finite log p or gradient) is replaced by a fresh one for the
same slot, Stan's drop-and-redraw rule (``calc_grad``; at most 10·M·S drops per gradient), so
the estimator runs inside ADVI's compiled SGD chunks with the same failure semantics.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from stanvi.errors import VIError
from stanvi.estimators.elbo import CompiledByShape, PaddedRows
from stanvi.estimators.mixture_mlmc import mixture_multilevel
from stanvi.estimators.mixture_surrogate import columns, surrogate
from stanvi.lazy_jax import jax, jnp, lax

GRAD_RETRIES = 10
GRAD_OK, GRAD_DROP_LIMIT, GRAD_NAN = 0, 1, 2   # as stanvi.estimators.stan_advi

# Why the other methods cannot take the mixture (stanvi.fit raises a VIError with the reason).
UNSUPPORTED = {
    "trustvi": "TrustVI needs Hessian-vector products of the ELBO on fixed draws; the mixture's "
               "ELBO depends on the discrete component choice, whose gradient is a "
               "score-function (Rao-Blackwellized) estimate with no HVP on fixed draws",
    "bam": "BaM updates the mean and covariance of one full-rank Gaussian in closed form "
           "(family='fullrank' only)",
    "gsm": "GSM updates the mean and covariance of one full-rank Gaussian in closed form "
           "(family='fullrank' only)",
    "hfsgvi": "HFSGVI (Hessian-free Newton) needs Hessian-vector products of the ELBO on fixed "
              "draws, which the mixture's discrete component choice does not have",
    "jointcv": "the joint control variate (docs/jointcv.md#joint-estimator) is a "
               "Taylor expansion of each data term k_n around one Gaussian's mean, "
               "z - mu = sigma*eps, whose HVP term has mean zero in eps and whose table mean "
               "G = (1/N) sum_n grad k_n(mu_n) is its closed-form expectation; under a mixture "
               "z - m_c depends on the discrete component c, the weights' gradient is a "
               "score-function term in the per-component values F_n(c), which a Taylor "
               "surrogate of gradients does not control, and the entropy has no closed form, "
               "so neither the CV's expectation nor -grad H (added exactly by jointcv) is "
               "available",
}


def unsupported_message(method: str) -> str:
    why = UNSUPPORTED.get(method, f"method {method!r} does not support it")
    return (f"family='mixture' cannot be used with method={method!r}: {why}. Use method='advi' "
            f"or 'mlmcvi' (they take the mixture's Rao-Blackwellized first-order estimator).")


def draws_per_gradient(family, n: int) -> int:
    """Log-density gradients one mixture gradient evaluates: M components × S draws
    (:meth:`GaussianMixture.draws_per_gradient <stanvi.families.mixture.GaussianMixture.
    draws_per_gradient>`)."""
    return family.draws_per_gradient(n)


def mixture_calc_grad(family, log_density: Callable, n: int) -> Callable:
    """``gradient(params, key) -> (g, kind, dropped, evaluated)``: the ELBO gradient estimate
    (module docstring) with the signature of :func:`stanvi.estimators.stan_advi.stan_calc_grad`,
    for ADVI's compiled chunks; S = ``family.samples_per_component`` or ``n``."""
    S = family.samples_per_component or int(n)
    M, D = family.budget, family.dim
    limit = GRAD_RETRIES * M * S
    lp_and_grad = jax.vmap(jax.value_and_grad(log_density))

    def gradient(params, key):
        key_cols, key_eps = jax.random.split(key)
        cols = columns(family, key_cols, jax.lax.stop_gradient(family.log_weights(params)))
        idx = jnp.repeat(cols.idx, S)                       # (M·S,) the component of each slot

        def cond(c):
            attempt, _, ok, _, _, dropped = c
            return ~jnp.all(ok) & (dropped < limit)

        def body(c):
            attempt, eps, ok, lp, g, dropped = c
            fresh = jax.random.normal(jax.random.fold_in(key_eps, attempt), (M * S, D))
            eps = jnp.where(ok[:, None], eps, fresh)
            z = family.component_sample(params, idx, eps)
            lp_new, g_new = lp_and_grad(z)
            good = jnp.isfinite(lp_new) & jnp.all(jnp.isfinite(g_new), axis=1)
            take = ~ok & good
            return (attempt + 1, eps, ok | good, jnp.where(take, lp_new, lp),
                    jnp.where(take[:, None], g_new, g),
                    dropped + jnp.sum(~ok & ~good, dtype=jnp.int32))

        zero = jnp.zeros((), jnp.int32)
        attempts, eps, ok, lp, g, dropped = lax.while_loop(cond, body, (
            zero, jnp.zeros((M * S, D)), jnp.zeros(M * S, bool), jnp.zeros(M * S),
            jnp.zeros((M * S, D)), zero))
        failed = ~jnp.all(ok)
        grad = jax.grad(surrogate)(params, family, cols, eps.reshape(M, S, D), lp.reshape(M, S),
                                   g.reshape(M, S, D), ok.reshape(M, S))
        kind = jnp.where(failed, GRAD_DROP_LIMIT,
                         jnp.where(jnp.any(jnp.isnan(grad)), GRAD_NAN, GRAD_OK)).astype(jnp.int32)
        return (grad, kind, jnp.where(failed, limit, dropped).astype(jnp.int32),
                attempts * (M * S))

    return gradient


def exact_log_p(family, log_density: Callable, params, cols, eps):
    """log p and its gradient at the columns' draws (M, S) and (M, S, D), for :func:`surrogate`
    without the drop-and-redraw loop (tests, benchmarks)."""
    M, S, D = eps.shape
    z = family.component_sample(params, jnp.repeat(cols.idx, S), eps.reshape(M * S, D))
    lp, g = jax.vmap(jax.value_and_grad(log_density))(z)
    return lp.reshape(M, S), g.reshape(M, S, D)


def elbo_values(family, log_density: Callable) -> Callable:
    """(params, eps (n, D)) ↦ log p(z_j) − log q(z_j) per draw z_j = sample(params, ε_j): the
    ELBO integrand (its mean is an unbiased ELBO estimate)."""
    pieces = family.elbo_pieces(log_density)
    return lambda params, eps: pieces(params, eps)[0]


class MixtureEstimator:
    """The estimator ``stanvi.fit`` builds for the mixture family (the
    :class:`~stanvi.estimators.base.Estimator` pieces that make sense for it): per-draw ELBO
    values, output draws with log p and log q, matched-pair differences, all row-wise and
    bucketed like :class:`~stanvi.estimators.elbo.ElboEstimator`.  Per-draw gradients and
    HVPs raise :class:`~stanvi.errors.VIError`: the weights' gradient is not a per-draw
    reparameterization gradient (use :func:`mixture_calc_grad`, also :attr:`calc_grad`: the
    family's first-order gradient for ADVI's compiled SGD, stanvi.families.protocol)."""

    calc_grad = staticmethod(mixture_calc_grad)

    def multilevel(self, target, *, seed: int, scale_param: str = "log",
                   truncate: float | None = None, max_fail: float = 0.1,
                   snr_every: int | None = None):
        """MLMCVI's multilevel gradient for this family
        (:func:`stanvi.estimators.mixture_mlmc.mixture_multilevel`)."""
        return mixture_multilevel(target, self.family, seed=seed, scale_param=scale_param,
                                  truncate=truncate, max_fail=max_fail, snr_every=snr_every)

    def __init__(self, family, log_density: Callable, *, counter=None,
                 bucketing: bool = True) -> None:
        self.family = family
        self.log_density = log_density
        values = elbo_values(family, log_density)

        def log_p_and_q(params, eps):
            z = family.sample(params, eps)
            return z, jax.vmap(log_density)(z), family.log_q(params, z)

        def pair_differences(new, old, eps):
            return values(new, eps) - values(old, eps)

        self._values = CompiledByShape(values)
        self._log_p_and_q = CompiledByShape(log_p_and_q)
        self._pair_differences = CompiledByShape(pair_differences)
        self._compiled = (self._values, self._log_p_and_q, self._pair_differences)
        self._rows = {"values": PaddedRows(self._values, 1, counter),
                      "log_p_and_q": PaddedRows(self._log_p_and_q, 1, counter),
                      "pair_differences": PaddedRows(self._pair_differences, 2, counter)}
        self.bucketing = bool(bucketing)

    @property
    def compile_seconds(self) -> float:
        return sum(c.seconds for c in self._compiled)

    def _row_call(self, name: str, args: tuple, bucketed: bool):
        return self._rows[name](*args, bucketed=bucketed and self.bucketing)

    def values(self, params, eps, *, bucketed: bool = False) -> np.ndarray:
        """log p(z_j) − log q(z_j) at z_j = sample(λ, ε_j) (n,)."""
        return np.asarray(self._row_call("values", (params, eps), bucketed))

    def log_p_and_q(self, params, eps, *, bucketed: bool = True):
        z, lp, lq = self._row_call("log_p_and_q", (params, eps), bucketed)
        return np.asarray(z), np.asarray(lp), np.asarray(lq)

    def pair_differences(self, new, old, eps, *, bucketed: bool = False) -> np.ndarray:
        return np.asarray(self._row_call("pair_differences", (new, old, eps), bucketed))

    def values_and_grads(self, params, eps, *, bucketed: bool = False):
        raise VIError("the mixture family has no per-draw reparameterization gradient (the "
                      "component choice is discrete): use its Rao-Blackwellized gradient, "
                      "stanvi.estimators.mixture_rb.mixture_calc_grad (method='advi')")

    def hvp(self, params, eps, direction):
        raise VIError("the mixture family has no Hessian-vector products of the ELBO on fixed "
                      "draws (the component choice is discrete); TrustVI and HFSGVI need them")
