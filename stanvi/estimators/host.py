"""The ELBO estimator of the host path: the reparameterization estimator of
:class:`stanvi.estimators.elbo.ElboEstimator`, computed in NumPy around the target's batched
C++ calls instead of in compiled JAX programs (docs/algorithms.md#host-path).

Every piece is one batched model call (log densities, gradients or Hessian-vector products at
the n draws z_j = g(λ, ε_j)) and the family's NumPy pullback
(:mod:`stanvi.families.host_math`): the same values as the JAX estimator up to rounding, the
same model calls, so the same oracle accounting, and no program to trace, lower or load — which
on a Stan model was most of a fit's wall time (issue T3-1: eight schools, 1.1 of 1.8 s).

The JAX estimator remains the path for JAX-native targets (a ``JaxTarget`` runs entirely on an
accelerator), for families without host pieces (the mixture), and for methods whose loop is one
compiled JAX program (ADVI's SGD); :func:`stanvi.estimators.registry.estimator_for` chooses.

A draw whose log density fails has ℓ = −inf and NaN gradient (the target's batched calls never
raise for one bad draw), as in the JAX estimator.
"""

from __future__ import annotations

import numpy as np


class HostElboEstimator:
    """ELBO pieces for one (family, target) pair in NumPy; the method signatures of
    :class:`~stanvi.estimators.elbo.ElboEstimator` (``bucketed`` is accepted and ignored: there
    is nothing to compile, so no batch size needs rounding)."""

    compile_seconds = 0.0   # no JAX program is ever compiled
    host = True

    def __init__(self, family, target) -> None:
        self.family = family
        self.target = target
        self.log_density = None   # no JAX function: callers that need one use the JAX estimator

    # ------------------------------------------------------------------ model calls
    def _log_p(self, z: np.ndarray) -> np.ndarray:
        return np.asarray(self.target.log_density(z).log_density, dtype=float)

    def _log_p_grad(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        res = self.target.log_density_gradient(z)
        return np.asarray(res.log_density, dtype=float), np.asarray(res.gradient, dtype=float)

    # ------------------------------------------------------------------ the estimator interface
    def values(self, params, eps, *, bucketed: bool = False) -> np.ndarray:
        """ℓ(λ; ε_j) per draw (n,)."""
        eps = np.asarray(eps, dtype=float)
        return self._log_p(self.family.sample_np(params, eps)) + self.family.entropy_np(params)

    def values_and_grads(self, params, eps, *, bucketed: bool = False
                         ) -> tuple[np.ndarray, np.ndarray]:
        """ℓ per draw (n,) and the per-draw gradients ∇_λ ℓ (n, P)."""
        eps = np.asarray(eps, dtype=float)
        lp, g = self._log_p_grad(self.family.sample_np(params, eps))
        return lp + self.family.entropy_np(params), self.family.pullback_rows(params, eps, g)

    def values_and_model_grads(self, params, eps, *, bucketed: bool = False
                               ) -> tuple[np.ndarray, np.ndarray]:
        """ℓ per draw (n,) and ∇log p at the draws (n, D) (the factored per-draw gradients)."""
        eps = np.asarray(eps, dtype=float)
        lp, g = self._log_p_grad(self.family.sample_np(params, eps))
        return lp + self.family.entropy_np(params), g

    def entropy_gradient(self, params) -> np.ndarray:
        """∇_λ H(q_λ) (P,)."""
        return self.family.entropy_grad_np(params)

    def hvp(self, params, eps, direction) -> np.ndarray:
        """∇²L̂(λ) v on the fixed draws ``eps``: one batched model HVP in the directions
        u_j = J(ε_j) v, pulled back by the family's ``hvp_pullback``
        (:mod:`stanvi.families.host_math`)."""
        eps = np.asarray(eps, dtype=float)
        direction = np.asarray(direction, dtype=float)
        z = self.family.sample_np(params, eps)
        u = self.family.tangent(params, eps, direction)
        res = self.target.log_density_hvp(z, u)
        g = np.asarray(res.gradient, dtype=float)
        hu = np.asarray(res.hvp, dtype=float)
        return self.family.hvp_pullback(params, eps, g, hu, direction)

    def pair_differences(self, new, old, eps, *, bucketed: bool = False) -> np.ndarray:
        """Matched-pair changes ℓ(λ'; ε_i) − ℓ(λ; ε_i) (TrustVI paper Eq. 8), one batched call
        of 2n log densities; the entropy difference is exact."""
        eps = np.asarray(eps, dtype=float)
        n = eps.shape[0]
        lp = self._log_p(np.concatenate([self.family.sample_np(new, eps),
                                         self.family.sample_np(old, eps)]))
        return lp[:n] - lp[n:] + self.family.entropy_np(new) - self.family.entropy_np(old)

    def log_p_and_q(self, params, eps, *, bucketed: bool = True
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Draws z, log p(z) and log q(z) (output draws, importance ratios)."""
        eps = np.asarray(eps, dtype=float)
        z = self.family.sample_np(params, eps)
        return z, self._log_p(z), self.family.log_q_eps_np(params, eps)
