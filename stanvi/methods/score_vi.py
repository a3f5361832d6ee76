"""What the score-based Gaussian methods share (methods ``bam`` and ``gsm``;
docs/methods.md#bam, #gsm): the batch of draws and their scores, the closed-form Gaussian KL, the
stopping rule, and the loop around a closed-form update (μ, Σ) ↦ (μ', Σ').

Both methods use only ∇log p at draws of q (no log density, no Hessian): each iteration draws
B points z_b ~ q_t = N(μ_t, Σ_t), evaluates g_b = ∇log p(z_b) — B gradient evaluations, charged
to the ledger as one gradient of B draws, in the same units as every other method — and hands
(z, g) to the method's update.  A draw whose log density or gradient is not finite (the model
threw) is dropped and redrawn as Stan's ``calc_grad`` does (:func:`collect_valid`); past
``max_gradient_drops_factor``·B failed draws the run stops with status 'failed'.  An update that
gives a non-finite or non-positive-definite Σ is rejected (q stays as it was, as the authors'
code reverts such updates); ``max_rejects`` rejections in a row end the run as 'failed'.

Stopping rule (the papers run a fixed number of iterations; docs/methods.md#score-stopping),
two tests that cost no model evaluation, both of which must pass:

* q has stopped moving: the KL divergence between consecutive approximations,
  KL(q_{t+1} ‖ q_t), in closed form — a step measured in q's own scale, free of the model's
  units — is at most ``tol_kl``·D nats at each of the last ``window`` iterations;
* q has stopped improving: the ELBO estimates that the batches give for free (the mean of
  log p(z_b) + H(q_t) over the batch) show no significant gain between the last ``n_e``
  iterations and the ``n_e`` before (gain ≤ 2 standard errors, from the spread of the
  per-iteration estimates), with n_e = max(``window``, ⌈``elbo_draws``/B⌉).

The second test keeps the first from stopping a run whose steps are small but steady (GSM
shrinking a too-wide q₀ a little at each step); the first keeps the second from stopping a run
that still jumps about.  Otherwise the run ends at ``max_iters``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from stanvi.estimators.elbo import GradientFailure, collect_valid
from stanvi.lazy_jax import jax
from stanvi.methods.base import (MethodResult, OracleLedger, RunContext, StepOutcome, Trace,
                                 compile_clock, iterate, purpose_key)
from stanvi.methods.warm_start import laplace_start

#: The profiles of both score methods: ``paper`` as the authors' code and experiments run them
#: (a small batch, gsmvi's default B = 2; BaM's λ_t = BD/(t+1); μ₀ = 0, Σ₀ = I; a fixed number
#: of iterations, no stopping rule); ``default``: B = 8, the Laplace warm start when it is better
#: than Σ₀ = I (as TrustVI's default) and the stopping rule (docs/methods.md#score-stopping)
PROFILES: dict[str, dict] = {"paper": {"batch_size": 2, "tol_kl": None, "max_iters": 1000},
                             "default": {"warm_start": "laplace"}}
DEFAULT_PROFILE = "default"
ESTIMATOR = "reparameterization"   # only its values_and_model_grads (scores at draws) is used
HOST_PATH = True   # the loop is Python: the NumPy host estimator serves it on a Stan model
FAMILIES_SUPPORTED = ("fullrank",)   # a dense N(μ, Σ) (batch runs plan only these families)
#: BaM also fits the diagonal-plus-low-rank family (pBaM, :mod:`stanvi.methods.bam_lowrank`)
LOWRANK_METHODS = ("bam",)

#: update(μ, Σ, z (B, D), g (B, D), iteration) -> (μ', Σ', extra trace fields); Σ' None (or
#: not finite, not positive definite) is a rejected update
Update = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int],
                  tuple[np.ndarray, np.ndarray, dict]]


class ScoreState(NamedTuple):
    """The iterate (λ, and its moments μ, Σ), the count of consecutive small steps (the stopping
    rule), of consecutive rejected updates, and of rejected updates in all."""

    params: np.ndarray
    mu: np.ndarray
    cov: np.ndarray
    small: int = 0
    rejects: int = 0
    n_rejected: int = 0
    elbos: tuple = ()


class DenseMoments:
    """The loop's view of the full-rank family: q's covariance as a dense D × D matrix, base
    draws of width D mapped by its Cholesky factor (:class:`stanvi.methods.bam_lowrank.
    LowRankMoments` is the low-rank family's)."""

    def __init__(self, family) -> None:
        self.family = family

    def start(self, mu0: np.ndarray, log_scale0: float) -> tuple[np.ndarray, np.ndarray]:
        """(λ₀, Σ₀) of q₀ = N(μ₀, e^{2·log_scale0} I)."""
        cov0 = math.exp(2.0 * log_scale0) * np.eye(len(mu0))
        return self.family.params_from_moments(mu0, cov0), cov0

    def covariance(self, params: np.ndarray) -> np.ndarray:
        lower = self.family.lower_factor(params)
        return lower @ lower.T

    def draw_map(self, params: np.ndarray, mu: np.ndarray, cov: np.ndarray):
        """(base-draw width, ε ↦ z = μ + L ε)."""
        lower = np.linalg.cholesky(cov)
        return len(mu), lambda eps: mu + eps @ lower.T

    @staticmethod
    def checked(cov: np.ndarray) -> np.ndarray | None:
        return symmetric_pd(cov)

    @staticmethod
    def kl(mu1: np.ndarray, cov1: np.ndarray, mu0: np.ndarray, cov0: np.ndarray) -> float:
        return gaussian_kl(mu1, cov1, mu0, cov0)

    def params(self, mu: np.ndarray, cov: np.ndarray) -> np.ndarray:
        return self.family.params_from_moments(mu, cov)


def check_family(family, method: str):
    """The loop's view of the family (:class:`DenseMoments`, or the low-rank family's for
    BaM); a ValueError for a family the method cannot update in closed form."""
    if hasattr(family, "params_from_moments"):
        return DenseMoments(family)
    # a diagonal-plus-low-rank family: its (μ, d, B) parts (LowRank.parts_np)
    if method in LOWRANK_METHODS and hasattr(family, "parts_np"):
        from stanvi.methods.bam_lowrank import LowRankMoments  # noqa: PLC0415

        return LowRankMoments(family)
    supported = "'fullrank' or 'lowrank'" if method in LOWRANK_METHODS else "'fullrank'"
    raise ValueError(
        f"method {method!r} fits a Gaussian by closed-form updates of its mean and covariance: "
        f"use family={supported} (got {getattr(family, 'name', family)!r})")


@dataclass(frozen=True)
class ScoreOptions:
    """The options BaM and GSM share (docs/methods.md#bam, #gsm; [R] the authors' code
    github.com/modichirag/GSM-VI, [C] stanvi's choice); each method's ``Options`` adds its own."""

    batch_size: int = 8               # B [C]
    max_iters: int = 2000             # [C]
    tol_kl: float | None = 1e-3       # stop: KL(q_t+1‖q_t) ≤ tol_kl·D ... [C]
    window: int = 10                  # ... for this many iterations in a row [C]
    elbo_draws: int = 2048            # ... and no ELBO gain over windows of this many draws [C]
    warm_start: str = "none"          # 'laplace': L-BFGS mode and Hessian (as TrustVI) [C]
    init: str = "zero"                # μ₀ = 0 [R] | 'random' (Stan's uniform(−2, 2))
    log_scale0: float = 0.0           # Σ₀ = exp(2·log_scale0) I; Σ₀ = I [R]
    max_gradient_drops_factor: int = 10  # failed draws allowed per batch, ×B (as Stan) [C]
    max_rejects: int = 10             # rejected updates in a row before 'failed' [C]


def check_options(method: str, options, choices: dict[str, tuple[str, ...]]) -> None:
    """A ValueError naming the option for a value outside its ``choices`` (option name →
    allowed values), or a ``window`` or ``max_iters`` below 1 (the options both methods share)."""
    for name, allowed in choices.items():
        if getattr(options, name) not in allowed:
            raise ValueError(f"{method} option {name}={getattr(options, name)!r} is not one of "
                             f"{list(allowed)}")
    if options.window < 1 or options.max_iters < 1:
        raise ValueError(f"{method} options window and max_iters must be at least 1")


def batch_size(requested: int) -> int:
    """B, checked: at least one draw."""
    if int(requested) < 1:
        raise ValueError(f"batch_size must be at least 1, got {requested}")
    return int(requested)


def elbo_flat(elbos: tuple, n: int) -> tuple[bool, float, float]:
    """The ELBO half of the stopping rule (module docstring): (no significant gain, gain,
    its standard error) from the last 2n per-iteration estimates; False while fewer."""
    if len(elbos) < 2 * n:
        return False, math.nan, math.nan
    prev, last = np.asarray(elbos[-2 * n:-n]), np.asarray(elbos[-n:])
    gain = float(last.mean() - prev.mean())
    se = float(math.sqrt((last.var(ddof=1) + prev.var(ddof=1)) / n)) if n > 1 else math.inf
    return bool(gain <= 2.0 * se), gain, se


def gaussian_kl(mu1: np.ndarray, cov1: np.ndarray, mu0: np.ndarray, cov0: np.ndarray) -> float:
    """KL(N(μ₁, Σ₁) ‖ N(μ₀, Σ₀)) = ½[tr(Σ₀⁻¹Σ₁) − D + (μ₀−μ₁)ᵀΣ₀⁻¹(μ₀−μ₁) + log|Σ₀|/|Σ₁|],
    through Cholesky factors; +inf when either covariance is not positive definite."""
    try:
        L0 = np.linalg.cholesky(cov0)
        L1 = np.linalg.cholesky(cov1)
    except np.linalg.LinAlgError:
        return math.inf
    A = np.linalg.solve(L0, L1)                 # L0⁻¹ L1: tr(Σ₀⁻¹Σ₁) = ‖A‖²_F
    d = np.linalg.solve(L0, mu1 - mu0)
    logdet = 2.0 * (np.sum(np.log(np.diag(L0))) - np.sum(np.log(np.diag(L1))))
    kl = 0.5 * (np.sum(A * A) - len(mu0) + d @ d + logdet)
    return float(max(kl, 0.0)) if np.isfinite(kl) else math.inf


def symmetric_pd(cov: np.ndarray) -> np.ndarray | None:
    """½(Σ + Σᵀ) when it is finite and positive definite (its Cholesky factor exists), else
    None (the caller rejects the update)."""
    cov = 0.5 * (cov + cov.T)
    if not np.all(np.isfinite(cov)):
        return None
    try:
        np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        return None
    return cov


def score_batch(est, params: np.ndarray, draw_map, key: jax.Array, n: int,
                max_drops: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """n draws z of q with finite log density and gradient (``draw_map`` = (width of a base
    draw ε, ε ↦ z)), their scores ∇log p(z) and ELBO integrands ℓ = log p(z) + H(q) (the
    estimator's ``values_and_model_grads``); failed draws are redrawn.  Returns
    (z, g, ℓ, draws evaluated); raises :class:`GradientFailure` after ``max_drops`` failed
    draws."""

    def evaluate(eps):
        values, g = est.values_and_model_grads(params, eps)
        return np.isfinite(values) & np.isfinite(g).all(axis=1), g, values

    width, to_z = draw_map
    (eps, g, values), _, evaluated = collect_valid(evaluate, key, n, width, max_drops,
                                                   "a batch of scores")
    return to_z(eps), g, values, evaluated


def run_score_method(method: str, update: Update, target, family, *, key: jax.Array, options,
                     context: RunContext) -> MethodResult:
    """The loop of a score-based method (module docstring): from μ₀ (the ``init`` rule) and
    Σ₀ = exp(2·``log_scale0``) I, or with ``warm_start='laplace'`` from the Laplace
    approximation at the mode when its ELBO is higher (:func:`laplace_start`), iterations of
    batch → update → stopping rule."""
    o = options
    moments = check_family(family, method)
    est = context.estimator
    dim = family.dim
    B = batch_size(o.batch_size)
    mu0, _ = context.initial_mean(o.init)
    params0, cov0 = moments.start(mu0, o.log_scale0)
    ledger = OracleLedger()
    info: dict = {}
    if o.warm_start == "laplace" and target is not None:
        # the L-BFGS mode and the Hessian there, kept if its ELBO beats q₀'s (warm_start.py)
        params0, info = laplace_start(target, family, est, mu0, params0,
                                      key=purpose_key(key, 0, "init"), ledger=ledger,
                                      log_scale0=o.log_scale0, point=context.laplace_point)
        mu0, cov0 = np.asarray(family.mean(params0), dtype=float), moments.covariance(params0)
    state = ScoreState(params0, np.asarray(mu0, dtype=float), cov0)
    trace = Trace(compile_clock=compile_clock(est))
    trace.record(0, state.params, ledger)
    tol = None if o.tol_kl is None else o.tol_kl * dim
    n_elbo = max(o.window, math.ceil(o.elbo_draws / B))

    def step(s: ScoreState, k: int) -> StepOutcome:
        try:
            z, g, values, evaluated = score_batch(
                est, s.params, moments.draw_map(s.params, s.mu, s.cov),
                purpose_key(key, k, "gradient"), B, o.max_gradient_drops_factor * B)
        except GradientFailure as exc:
            ledger.redrawn(exc.evaluated)
            return StepOutcome(s, None, ("failed", f"the model failed at too many draws of q "
                                                   f"at iteration {k}: {exc}"))
        ledger.gradient(B)
        ledger.redrawn(evaluated - B)
        mu_new, cov_new, extra = update(s.mu, s.cov, z, g, k)
        cov_new = (moments.checked(cov_new) if cov_new is not None and np.all(np.isfinite(mu_new))
                   else None)
        elbo = float(np.mean(values))
        elbos = (s.elbos + (elbo,))[-2 * n_elbo:]
        row = dict(elbo=elbo, **extra)
        if cov_new is None:
            rejects = s.rejects + 1
            row.update(kl_step=math.nan, rejected=1)
            new = s._replace(small=0, rejects=rejects, n_rejected=s.n_rejected + 1,
                             elbos=elbos)
            stop = None
            if rejects >= o.max_rejects:
                stop = ("failed", f"{rejects} updates in a row gave a covariance that is not "
                                  f"positive definite (or not finite), at iteration {k}")
            return StepOutcome(new, row, stop)
        kl = moments.kl(mu_new, cov_new, s.mu, s.cov)
        small = s.small + 1 if tol is not None and kl <= tol else 0
        new = ScoreState(moments.params(mu_new, cov_new), mu_new, cov_new, small,
                         0, s.n_rejected, elbos)
        row.update(kl_step=kl, rejected=0)
        stop = None
        if tol is not None and small >= o.window:
            flat, gain, se = elbo_flat(elbos, n_elbo)
            if flat:
                stop = ("converged", f"KL(q_t+1 ‖ q_t) ≤ tol_kl·D = {tol:.3g} nats for "
                                     f"{o.window} consecutive iterations, and the ELBO gained "
                                     f"{gain:.3g} ± {se:.2g} over the last {n_elbo} iterations")
        return StepOutcome(new, row, stop, {"kl_step": kl})

    state, k, status, message = iterate(step, state, max_iters=o.max_iters, trace=trace,
                                        ledger=ledger, context=context)
    info.update(batch_size=B, rejected_updates=state.n_rejected, iterations=k)
    return MethodResult(params=state.params, trace=trace, ledger=ledger, status=status,
                        message=message, info=info)
