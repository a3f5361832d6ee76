"""Step-size sequences of stochastic-gradient VI methods (docs/algorithms.md)."""

from __future__ import annotations

from stanvi.lazy_jax import jnp


# Hard-coded in Stan's advi.hpp (``stochastic_gradient_ascent``).
TAU = 1.0
PRE_FACTOR = 0.9
POST_FACTOR = 0.1


def stan_step(params, s, g, k, eta):
    """One step of Stan's adaptive step-size sequence (Kucukelbir et al. 2017, JMLR 18(14),
    "Automatic Differentiation Variational Inference", the step-size sequence of its stochastic
    optimization section; Stan's ``advi::stochastic_gradient_ascent``;
    docs/algorithms.md#advi-step-size), elementwise over all parameters.

    ``s_1 = s + g²`` (s is zero at k = 1: Stan's ``history += g²``),
    ``s_k = 0.9 s + 0.1 g²`` for k ≥ 2, ``ρ_k = η k^{-1/2} / (1 + √s_k)`` and
    ``λ ← λ + (η k^{-1/2} · g) / (1 + √s_k)`` (Stan's order of operations).

    Returns (new params, new s, ρ_k).  Pure JAX; works on numpy inputs.
    """
    params, s, g = jnp.asarray(params), jnp.asarray(s), jnp.asarray(g)
    g2 = g * g
    s_new = jnp.where(k == 1, s + g2, PRE_FACTOR * s + POST_FACTOR * g2)
    eta_scaled = eta / jnp.sqrt(jnp.asarray(k, dtype=jnp.float64))
    denom = TAU + jnp.sqrt(s_new)
    return params + (eta_scaled * g) / denom, s_new, eta_scaled / denom
