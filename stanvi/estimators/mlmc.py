"""The multilevel reparameterized gradient (MLRG) of MLMCVI (docs/mlmcvi.md#levels,
docs/mlmcvi.md#update-rule, docs/mlmcvi.md#diagnostics, docs/mlmcvi.md#truncation; Fujisawa &
Sato, *Multilevel Monte Carlo Variational Inference*, JMLR, Eq. 6–8, Lemma 1, Algorithm 1–2).

Everything is for *minimizing* the free energy F(λ) = −ELBO(λ) (paper Eq. 2).  With base draws
ε ~ N(0, I_D) and z = T(ε; λ), the per-draw gradient (Eq. 6, docs/mlmcvi.md#per-draw-gradient) is

    g_λ(ε) = ∇_λ [log q(T(ε;λ)|λ) − log p(T(ε;λ))],

one model gradient γ(z) = ∇ log p(z) per draw:

| coordinates | location | scale block |
|---|---|---|
| mean-field, log scale ω (s = e^ω) | −γ | −1 − s ⊙ ε ⊙ γ |
| mean-field, direct scale v | −γ | −1/v − ε ⊙ γ |
| full-rank L, diagonal ω (L_ii = e^ω_i) | −γ | L_ij (i > j): −γ_i ε_j; ω_i: −1 − L_ii γ_i ε_i |
| full-rank L, direct diagonal | −γ | L_ij (i > j): −γ_i ε_j; L_ii: −1/L_ii − γ_i ε_i |

The MLRG (Eq. 8) is a running telescoping sum over the optimization history (Lemma 1):

    G_0 = mean_n g_{λ_0}(ε_{n,0}),     G_t = G_{t−1} + Δ̂_t,
    Δ̂_t = mean_n [g_{λ_t}(ε_{n,t}) − g_{λ_{t−1}}(ε_{n,t})]   (t ≥ 1),

with the same ε in both terms of a difference (R1, coupling), fresh ε at every level (R2,
freshness), and each level computed once and frozen (R3, recycling).  Each level is ONE batched
call of the target's gradient on 2 N_t points (docs/mlmcvi.md#batched-calls).

Caveat (docs/mlmcvi.md#persisting-error): G_t is unbiased in total expectation only.  Its error
e_t = G_t − ∇F(λ_t) is a martingale with E‖e_t‖² = V_0/N_0 + Σ_s E[V_s/N_s] ≥ V_0/N_0, so the
level-0 error is carried forever and the iterates settle at a stationary point of a randomly
perturbed objective; :class:`LevelStats` carries what is needed to log this (V̂_t, V̂_t/N_t and
the accumulated Acc_t of docs/mlmcvi.md#diagnostics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from stanvi.estimators.elbo import GradientFailure, bucket
from stanvi.families.coordinates import SCALE_PARAMS, Coordinates  # noqa: F401
from stanvi.targets.jax_target import JaxTarget

@dataclass
class LevelStats:
    """One level's estimate and its diagnostics (docs/mlmcvi.md#diagnostics).

    mean: the level's average (K,) (G_0 at level 0, Δ̂_t at t ≥ 1); n: draws (pairs) in it;
    var_coord: the per-coordinate one-sample variances V̂_{t,i} (ddof 1; NaN when n < 2);
    var: V̂_t = Σ_i V̂_{t,i}, the trace form; evaluated: model gradients evaluated (2 per pair at
    t ≥ 1, failed draws included); redrawn: of those, the ones beyond the 2n (or n) used."""

    mean: np.ndarray
    n: int
    var_coord: np.ndarray
    var: float
    evaluated: int
    redrawn: int

    @property
    def cond_var(self) -> float:
        """V̂_t/N_t: the conditional variance of this level's average (the paper's "variance")."""
        return self.var / self.n


def level_stats(rows: np.ndarray, evaluated: int, redrawn: int) -> LevelStats:
    n = rows.shape[0]
    if n >= 2:
        var_coord = rows.var(axis=0, ddof=1)
    else:
        var_coord = np.full(rows.shape[1], np.nan)
    return LevelStats(rows.mean(axis=0), n, var_coord, float(var_coord.sum()), evaluated,
                      redrawn)


def model_gradients(target, z: np.ndarray, truncate: float | None = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(γ (n, D), ok (n,)): one batched gradient call of the target at the rows of ``z``.
    ``truncate=B`` is Algorithm 2's projection (docs/mlmcvi.md#truncation): γ is evaluated at
    clip(z, −B, B) and its pathwise derivative is zero on the clipped coordinates.

    A :class:`~stanvi.targets.jax_target.JaxTarget` compiles its batched gradient once per batch
    size, so its batch is padded to the power-of-two :func:`~stanvi.estimators.elbo.bucket`
    (copies of the first row; docs/mlmcvi.md#batched-calls, docs/architecture.md#conventions) and
    the counter is charged for the n real rows only.  Other targets (Stan's C++ batch) are called
    at exactly n rows: padding would cost real model evaluations."""
    if truncate is not None:
        inside = np.abs(z) < truncate
        z = np.clip(z, -truncate, truncate)
    n = z.shape[0]
    size = bucket(n)
    if isinstance(target, JaxTarget) and size != n:
        res = target.log_density_gradient(np.concatenate([z, np.repeat(z[:1], size - n, 0)]))
        target.counter.add("gradient", n - size)
        g = np.asarray(res.gradient, dtype=float)[:n]
        ok = np.asarray(res.ok, dtype=bool)[:n] & np.isfinite(g).all(axis=1)
    else:
        res = target.log_density_gradient(z)
        g = np.asarray(res.gradient, dtype=float)
        ok = np.asarray(res.ok, dtype=bool) & np.isfinite(g).all(axis=1)
    if truncate is not None:
        g = np.where(inside, g, 0.0)
    return g, ok


def collect_rows(evaluate: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]],
                 draw: Callable[[int], np.ndarray], n: int, per_row: int, max_fail: float,
                 what: str) -> tuple[np.ndarray, int, int]:
    """Rows of ``evaluate(eps) -> (rows, ok)`` for n draws, replacing the failed ones by fresh
    draws (both evaluations of a pair: a difference needs both, docs/mlmcvi.md#failed-draws);
    returns the rows, the model evaluations made and those beyond the n·per_row used.  Raises
    GradientFailure once failures exceed ``max_fail`` of n (at least one)."""
    kept: list[np.ndarray] = []
    have = failed = evaluated = 0
    limit = max(1, int(max_fail * n))
    need = n
    while need > 0:
        eps = draw(need)
        rows, ok = evaluate(eps)
        evaluated += per_row * len(eps)
        good = np.flatnonzero(ok)
        failed += len(eps) - len(good)
        if failed > limit:
            raise GradientFailure(f"{failed} draws of {what} failed (the model threw or returned "
                                  f"a non-finite value); limit {limit}", evaluated)
        kept.append(rows[good])
        have += len(good)
        need = n - have
    return np.concatenate(kept), evaluated, evaluated - per_row * n


def plain_level(target, coords: Coordinates, theta: np.ndarray,
                draw: Callable[[int], np.ndarray], n: int, *, truncate: float | None = None,
                max_fail: float = 0.1) -> LevelStats:
    """Level 0 (and the plain MC / RQMC estimator, docs/mlmcvi.md#baselines): mean_n g_θ(ε_n)
    over n draws from ``draw(k) -> (k, D)``, one batched gradient call of n points."""

    def evaluate(eps):
        gamma, ok = model_gradients(target, coords.sample(theta, eps), truncate)
        return coords.per_draw(theta, eps, np.where(ok[:, None], gamma, 0.0)), ok

    rows, evaluated, redrawn = collect_rows(evaluate, draw, n, 1, max_fail, "a level-0 gradient")
    return level_stats(rows, evaluated, redrawn)


def level_difference(target, coords: Coordinates, theta: np.ndarray, theta_prev: np.ndarray,
                     draw: Callable[[int], np.ndarray], n: int, *, truncate: float | None = None,
                     max_fail: float = 0.1) -> LevelStats:
    """Level t ≥ 1: Δ̂_t = mean_n [g_{θ_t}(ε_n) − g_{θ_{t−1}}(ε_n)] with the same fresh ε_n in
    both terms (R1, R2); one batched gradient call of 2n points
    (docs/mlmcvi.md#batched-calls)."""

    def evaluate(eps):
        k = len(eps)
        z = np.concatenate([coords.sample(theta, eps), coords.sample(theta_prev, eps)])
        gamma, ok = model_gradients(target, z, truncate)
        gamma = np.where(ok[:, None], gamma, 0.0)
        pair_ok = ok[:k] & ok[k:]
        rows = coords.per_draw(theta, eps, gamma[:k]) - coords.per_draw(theta_prev, eps, gamma[k:])
        return rows, pair_ok

    rows, evaluated, redrawn = collect_rows(evaluate, draw, n, 2, max_fail, "a level difference")
    return level_stats(rows, evaluated, redrawn)


class LevelVarianceSum:
    """Acc_t = Σ_s V̂_s/N_s over the levels with N_s ≥ 2 (docs/mlmcvi.md#diagnostics) and its
    per-coordinate version, kept as ``acc`` / ``acc_coord`` by a multilevel gradient whose
    ``coords`` say how many parameters it has (shared by :class:`MultilevelGradient` and the
    mixture family's :class:`stanvi.estimators.mixture_mlmc.MixtureMultilevel`)."""

    def _accumulate(self, stats: LevelStats, reset: bool) -> None:
        if reset or self.acc_coord is None:
            self.acc, self.acc_coord = 0.0, np.zeros(self.coords.n_params)
        if stats.n >= 2:
            self.acc += stats.cond_var
            self.acc_coord = self.acc_coord + stats.var_coord / stats.n


@dataclass
class MultilevelGradient(LevelVarianceSum):
    """The running MLRG G_t of Lemma 1 (docs/mlmcvi.md#update-rule), with its diagnostics
    (docs/mlmcvi.md#diagnostics).

    :meth:`start` sets G_0 from a plain level at θ_0; :meth:`add_level` adds Δ̂_t for (θ_t,
    θ_{t−1}); :meth:`restart` (the [EXT] R1 variant, docs/mlmcvi.md#extensions, not in the
    paper) replaces G by a fresh plain estimate at the current θ — that level's increment is not
    added.  ``acc`` is Acc_t = Σ_s V̂_s/N_s over the levels with N_s ≥ 2 (an unbiased estimate of
    E‖G_t − ∇F(θ_t)‖² since the last restart; docs/mlmcvi.md#persisting-error) and
    ``acc_coord`` its per-coordinate version."""

    target: object
    coords: Coordinates
    truncate: float | None = None
    max_fail: float = 0.1
    G: np.ndarray | None = None
    acc: float = 0.0
    acc_coord: np.ndarray | None = None
    levels: int = 0


    def start(self, theta: np.ndarray, draw: Callable[[int], np.ndarray], n0: int) -> LevelStats:
        stats = plain_level(self.target, self.coords, theta, draw, n0, truncate=self.truncate,
                            max_fail=self.max_fail)
        self.G = stats.mean.copy()
        self._accumulate(stats, reset=True)
        self.levels = 1
        return stats

    restart = start

    def add_level(self, theta: np.ndarray, theta_prev: np.ndarray,
                  draw: Callable[[int], np.ndarray], n: int) -> LevelStats:
        if self.G is None:
            raise RuntimeError("MultilevelGradient.start must set level 0 first")
        stats = level_difference(self.target, self.coords, theta, theta_prev, draw, n,
                                 truncate=self.truncate, max_fail=self.max_fail)
        self.G = self.G + stats.mean
        self._accumulate(stats, reset=False)
        self.levels += 1
        return stats


def replicate_estimates(target, coords: Coordinates, *, theta: np.ndarray,
                        theta_prev: np.ndarray | None, base: np.ndarray | None,
                        draw: Callable[[int], np.ndarray], n: int, reps: int,
                        truncate: float | None = None, chunk_values: int = 20_000_000
                        ) -> tuple[np.ndarray, int]:
    """R independent replicates of this step's gradient estimate with the history held fixed
    (docs/mlmcvi.md#diagnostics; the paper's §5.2 variance and SNR): ``base + Δ̂`` for MLMC
    (``theta_prev`` and ``base`` = G_{t−1} given), or the plain estimate at θ (``theta_prev``
    None, ``base`` None or zero).  Draws come from ``draw(n)`` per replicate; replicates are
    evaluated in batched calls of up to ``chunk_values`` numbers.  Failed draws are dropped from
    their replicate's mean (no redraws: a diagnostic).  Returns (reps, K) and the model
    gradients evaluated."""
    per_rep = n * coords.n_params * (1 if theta_prev is None else 2)
    group = max(1, chunk_values // max(per_rep, 1))
    out = np.empty((reps, coords.n_params))
    evaluated = 0
    for start in range(0, reps, group):
        k = min(group, reps - start)
        eps = np.concatenate([draw(n) for _ in range(k)])
        if theta_prev is None:
            gamma, ok = model_gradients(target, coords.sample(theta, eps), truncate)
            rows = coords.per_draw(theta, eps, np.where(ok[:, None], gamma, 0.0))
            evaluated += len(eps)
        else:
            m = len(eps)
            z = np.concatenate([coords.sample(theta, eps), coords.sample(theta_prev, eps)])
            gamma, ok = model_gradients(target, z, truncate)
            gamma = np.where(ok[:, None], gamma, 0.0)
            rows = (coords.per_draw(theta, eps, gamma[:m])
                    - coords.per_draw(theta_prev, eps, gamma[m:]))
            ok = ok[:m] & ok[m:]
            evaluated += 2 * m
        rows = np.where(ok[:, None], rows, np.nan).reshape(k, n, -1)
        out[start:start + k] = np.nanmean(rows, axis=1)
    if base is not None:
        out = out + base
    return out, evaluated


def variance_and_snr(replicates: np.ndarray) -> dict[str, float]:
    """From replicates (R, K): the trace variance Σ_j Var_r, the paper's SNR
    ‖mean‖₂²/√(Σ_j Var) (docs/mlmcvi.md#resolutions; not scale invariant) and the dimensionless
    ‖mean‖₂/√(Σ_j Var)."""
    var = float(np.sum(np.var(replicates, axis=0, ddof=1)))
    mean_sq = float(np.sum(np.mean(replicates, axis=0) ** 2))
    root = np.sqrt(var) if var > 0 else np.nan
    return {"grad_var": var, "snr_paper": mean_sq / root, "snr": np.sqrt(mean_sq) / root}
