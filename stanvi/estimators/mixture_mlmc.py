"""MLMCVI's multilevel gradient for the Gaussian-mixture family (docs/mlmcvi.md#mixture;
docs/mlmcvi.md#levels, docs/mlmcvi.md#update-rule and docs/mlmcvi.md#diagnostics with the
Rao-Blackwellized per-level gradient of docs/discrete.md).

The MLRG of Fujisawa & Sato needs only an unbiased per-draw gradient g_λ(ξ) of the free energy
F = −ELBO whose randomness ξ does not depend on λ, so that a level difference
``g_{λ_t}(ξ) − g_{λ_{t−1}}(ξ)`` can reuse ξ (coupling, R1).  For the mixture, ξ is the key that
picks the evaluated components (the Prop. 2 budget columns: the k̂ heaviest summed, the rest
drawn from the remainder; every component when the family is exact) and the base draws
ε (M, D) of the evaluated components; g_λ(ξ) is minus the gradient of the Rao-Blackwellized
surrogate (:func:`stanvi.estimators.mixture_surrogate.surrogate`) with one draw per component.  It is
unbiased for ∇F(λ) for every λ, so each level's mean is unbiased for its increment and the
telescoping sum G_t is unbiased in total expectation, as for the Gaussian families.  The
coupling is as tight as for a Gaussian while the columns do not change between λ_{t−1} and λ_t
(always, when the family is exact); a step that reorders the weights around the budget's cut
changes the columns and makes that pair's difference O(1) (still unbiased).

The coordinates are the family's own parameters (log scales: ``scale_param='log'`` only).  A
draw whose model value or gradient is not finite is replaced by a fresh one (both members of a
pair), MLMCVI's failed-draw rule (docs/mlmcvi.md#failed-draws), through
:func:`stanvi.estimators.mlmc.collect_rows`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from stanvi.estimators.mixture_surrogate import columns, surrogate
from stanvi.errors import VIError
from stanvi.estimators.mlmc import LevelStats, LevelVarianceSum, collect_rows, level_stats
from stanvi.lazy_jax import jax, jnp


class MixtureCoordinates:
    """θ = the mixture's parameters (identity maps); the scale coordinates are the components'
    log scales (the diagonal of L for ``covariance_type='full'``)."""

    def __init__(self, family) -> None:
        self.family = family
        self.n_params = family.n_params
        C, P, d = family.n_components, family.component_params, family.dim
        if family.covariance_type == "diag":
            local = np.arange(d, 2 * d)
        else:
            rows, cols = np.tril_indices(d)
            local = d + np.flatnonzero(rows == cols)
        self._scale = np.concatenate([C + c * P + local for c in range(C)])

    def scale_index(self) -> np.ndarray:
        return self._scale

    def from_family(self, params: np.ndarray) -> np.ndarray:
        return np.asarray(params, dtype=float).copy()

    def to_family(self, theta: np.ndarray) -> np.ndarray:
        return np.asarray(theta, dtype=float).copy()


def free_energy_rows(family, log_density: Callable) -> Callable:
    """``rows(params, key, eps (n, M, D)) -> (g (n, P), ok (n,))``: for each of the n draw
    slots, minus the RB gradient with one draw per evaluated component (module docstring); the
    columns come from ``key`` and the weights at ``params`` (shared by the n slots)."""
    M, D = family.budget, family.dim
    lp_and_grad = jax.vmap(jax.value_and_grad(log_density))

    def rows(params, key, eps):
        n = eps.shape[0]
        cols = columns(family, key, jax.lax.stop_gradient(family.log_weights(params)))
        e = jnp.swapaxes(eps, 0, 1)                                   # (M, n, D)
        z = family.component_sample(params, jnp.repeat(cols.idx, n), e.reshape(M * n, D))
        lp, g = lp_and_grad(z)
        lp, g = lp.reshape(M, n), g.reshape(M, n, D)
        ok = jnp.all(jnp.isfinite(lp), axis=0) & jnp.all(jnp.isfinite(g), axis=(0, 2))
        lp, g = jnp.where(jnp.isfinite(lp), lp, 0.0), jnp.where(jnp.isfinite(g), g, 0.0)

        def one(e_s, lp_s, g_s):
            return -jax.grad(surrogate)(params, family, cols, e_s[:, None], lp_s[:, None],
                                        g_s[:, None])

        return jax.vmap(one, in_axes=(1, 1, 1))(e, lp, g), ok

    return jax.jit(rows)


@dataclass
class MixtureMultilevel(LevelVarianceSum):
    """:class:`stanvi.estimators.mlmc.MultilevelGradient`'s interface (``start``/``restart``,
    ``add_level``, ``G``, ``acc``, ``acc_coord``) plus ``plain`` (the MC baseline level) and
    ``coords``, for the mixture family; ``seed`` keys the column choices (one key per level,
    shared by both members of a pair)."""

    target: object
    family: object
    seed: int
    max_fail: float = 0.1
    G: np.ndarray | None = None
    acc: float = 0.0
    acc_coord: np.ndarray | None = None
    levels: int = 0
    coords: MixtureCoordinates = field(init=False)

    def __post_init__(self) -> None:
        self.coords = MixtureCoordinates(self.family)
        self._rows = free_energy_rows(self.family, self.target.jax_log_density)
        self._key = jax.random.PRNGKey(int(self.seed))
        self._count = 0

    def _next_key(self) -> jax.Array:
        self._count += 1
        return jax.random.fold_in(self._key, self._count)

    def _draw(self, draw: Callable[[int], np.ndarray]) -> Callable[[int], np.ndarray]:
        M, D = self.family.budget, self.family.dim
        return lambda k: np.asarray(draw(k * M)).reshape(k, M, D)

    def plain(self, theta: np.ndarray, draw: Callable[[int], np.ndarray], n: int) -> LevelStats:
        """mean over n slots of g_θ(ξ) (level 0; the plain MC estimator)."""
        key, M = self._next_key(), self.family.budget
        params = jnp.asarray(theta)

        def evaluate(eps):
            rows, ok = jax.device_get(self._rows(params, key, jnp.asarray(eps)))
            return np.asarray(rows), np.asarray(ok)

        rows, evaluated, redrawn = collect_rows(evaluate, self._draw(draw), n, M, self.max_fail,
                                                "a level-0 mixture gradient")
        return level_stats(rows, evaluated, redrawn)

    def difference(self, theta, theta_prev, draw, n: int) -> LevelStats:
        """mean over n slots of g_{θ_t}(ξ) − g_{θ_{t−1}}(ξ), the same ξ in both."""
        key, M = self._next_key(), self.family.budget
        new, old = jnp.asarray(theta), jnp.asarray(theta_prev)

        def evaluate(eps):
            e = jnp.asarray(eps)
            r1, ok1 = jax.device_get(self._rows(new, key, e))
            r0, ok0 = jax.device_get(self._rows(old, key, e))
            return np.asarray(r1) - np.asarray(r0), np.asarray(ok1) & np.asarray(ok0)

        rows, evaluated, redrawn = collect_rows(evaluate, self._draw(draw), n, 2 * M, self.max_fail,
                                                "a mixture level difference")
        return level_stats(rows, evaluated, redrawn)


    def start(self, theta, draw, n0: int) -> LevelStats:
        stats = self.plain(theta, draw, n0)
        self.G = stats.mean.copy()
        self._accumulate(stats, reset=True)
        self.levels = 1
        return stats

    restart = start

    def add_level(self, theta, theta_prev, draw, n: int) -> LevelStats:
        if self.G is None:
            raise RuntimeError("MixtureMultilevel.start must set level 0 first")
        stats = self.difference(theta, theta_prev, draw, n)
        self.G = self.G + stats.mean
        self._accumulate(stats, reset=False)
        self.levels += 1
        return stats


def mixture_multilevel(target, family, *, seed: int, scale_param: str = "log",
                       truncate: float | None = None, max_fail: float = 0.1,
                       snr_every: int | None = None) -> MixtureMultilevel:
    """The mixture's multilevel gradient for :mod:`stanvi.methods.mlmcvi`, refusing the options
    defined only for the Gaussian families' coordinates."""
    if scale_param != "log":
        raise VIError("mlmcvi with family='mixture' needs scale_param='log' (the mixture stores "
                      "log scales; the paper's direct scale is defined for one Gaussian)")
    if truncate is not None:
        raise VIError("mlmcvi's truncate (Algorithm 2) is defined for one Gaussian's pathwise "
                      "gradient, not for family='mixture'")
    if snr_every is not None:
        raise VIError("mlmcvi's snr_every diagnostic replicates the Gaussian families' "
                      "estimator; it is not available for family='mixture'")
    return MixtureMultilevel(target, family, seed, max_fail)
