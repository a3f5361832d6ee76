"""What a variational family tells the estimators and methods about itself, so that no method or
estimator tests a family's name (docs/architecture.md#layers: the family owns sampling, log q, entropy,
parameter packing and initialization).

Besides ``dim``, ``base_dim`` (the width of a base draw ε: D for the Gaussian families and the
mixture, D + k for the low-rank family), ``name``, ``n_params``, ``initial_params``, ``sample``, ``log_q`` and the
NumPy moments (``mean``, ``covariance``, ``marginal_sd``), a family answers:

* ``gradient_estimator``: the name (in :data:`stanvi.estimators.registry.ESTIMATORS`) of the ELBO
  estimator the family needs in place of the method's, or None when the method's own
  (the reparameterization gradient) is valid for it.  The estimator so named may carry a
  ``calc_grad(family, log_density, n)`` builder with the signature of
  :func:`stanvi.estimators.stan_advi.stan_calc_grad`, which ADVI's compiled SGD uses.
  A string, not the class, so that this layer imports nothing from the estimators.
* :meth:`draws_per_gradient`: the model-gradient evaluations of one stochastic ELBO gradient
  when the method asks for ``n`` draws (oracle-call accounting).
* :meth:`elbo_pieces`: the ELBO split into a per-draw part and a closed-form part, so that
  ``mean(per_draw) + constant`` estimates it (Stan's ``calc_ELBO`` arithmetic).
* :meth:`log_g_offset`: c with Stan's ``log_g__ = log q + c`` for the output draws.
* :meth:`family_options`: the settings beyond ``dim`` that ``make_family`` needs to rebuild the
  family from a saved fit (those the method's options do not already restore).
* ``stan_name`` (optional): Stan's name of the family (``normal_meanfield``,
  ``normal_fullrank``), where Stan's ADVI has it: ADVI's Stan arithmetic and messages key on it.

:class:`GaussianDefaults` gives the Gaussian families' answers (mean-field and full-rank:
reparameterized, closed-form entropy); a family with different needs overrides them
(:class:`stanvi.families.mixture.GaussianMixture`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from stanvi.lazy_jax import jax


class FamilyProtocol(Protocol):
    """The family interface the estimators and methods rely on (module docstring)."""

    dim: int
    name: str
    gradient_estimator: ClassVar[str | None]

    @property
    def base_dim(self) -> int: ...

    @property
    def n_params(self) -> int: ...

    def sample(self, params: jax.Array, eps: jax.Array) -> jax.Array: ...

    def log_q(self, params: jax.Array, z: jax.Array) -> jax.Array: ...

    def draws_per_gradient(self, n: int) -> int: ...

    def elbo_pieces(self, log_density: Callable) -> Callable: ...

    def log_g_offset(self, params) -> float: ...

    def family_options(self) -> dict[str, Any]: ...


class GaussianDefaults:
    """The protocol's answers for a reparameterized family with a closed-form ``entropy``
    (:class:`~stanvi.families.gaussian.MeanField`, :class:`~stanvi.families.gaussian.FullRank`)."""

    gradient_estimator: ClassVar[str | None] = None   # the method's estimator is valid
    #: TrustVI's fixed-sample loop trades the Stein model of the Hessian for Hessian-vector
    #: products after a few poor model steps (the draws' Hessians vary too much for one Ĥ);
    #: a family whose poor steps come from its own parameterization says False
    #: (docs/algorithms.md#lowrank).
    stein_model_gives_way: ClassVar[bool] = True
    #: q is one Gaussian, so Stein's lemma gives the Newton step of its means from its draws
    #: (the verdict's reading of the means, docs/diagnostics.md#means)
    gaussian: ClassVar[bool] = True

    @property
    def base_dim(self) -> int:
        """The width of a base draw ε: D (z = μ + A ε with A square)."""
        return self.dim

    def draws_per_gradient(self, n: int) -> int:
        """One model gradient per draw: ``n``."""
        return int(n)

    def elbo_pieces(self, log_density: Callable) -> Callable:
        """(params, eps (n, D)) ↦ (log p(z_j) per draw, H(q)): ELBO = mean + H (Stan's
        ``calc_ELBO``: ``elbo += log_prob`` over the draws, ``/= n``, ``+= entropy()``)."""
        def pieces(params, eps):
            return jax.vmap(log_density)(self.sample(params, eps)), self.entropy(params)
        return pieces

    def log_g_offset(self, params) -> float:
        """H(q) − D/2, so that ``log q + c = −½‖ε‖²`` (Stan's ``log_g__``; ``advi::run``,
        docs/algorithms.md#advi-output)."""
        return float(self.entropy(params)) - 0.5 * self.dim

    def laplace_starts(self, mu, precision, log_scale0: float) -> tuple[Any, Any]:
        """(the Laplace start, its fallback): ``params_from_precision`` and no fallback
        (the low-rank family overrides this with its PPCA start behind the reverse-KL one,
        docs/algorithms.md#lowrank-start)."""
        return self.params_from_precision(mu, precision, log_scale0), None

    def inner_meanfield(self) -> Any | None:
        """The mean-field family inside this one (its optimum's ELBO bounds this family's
        optimum from below, TrustVI's second-start check, docs/algorithms.md#second-start), or
        None: this family is mean-field, or has no such member it can start from."""
        return None

    def family_options(self) -> dict[str, Any]:
        """None needed: the full-rank storage (``diagonal``) is restored from the method's
        ``fullrank_diagonal`` option (stanvi.saved)."""
        return {}
