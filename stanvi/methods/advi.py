"""Stan's ADVI, exactly as Stan implements it (spec trustvi_hfsgvi_advi.md §2, §3, §7.2).

Sources: [S] ``stan-dev/stan`` ``src/stan/variational/advi.hpp`` and the families
``normal_meanfield.hpp`` / ``normal_fullrank.hpp``; [R] the TrustVI authors' fork
(``jeff-regier/stan`` branch ``trustvi``, commit ``fd32b6c``), which changed ω₀ and added one ELBO
before the SGD loop.

The algorithm
-------------
1. ``elbo_init = calc_ELBO(q₀)``; failure ends the run (§2.6 step 1).
2. Eta adaptation (§2.6, :func:`select_eta`): for η in (100, 10, 1, 0.1, 0.01), ``adapt_iter``
   SGD steps from q₀ with a fresh step-size history; a failed gradient is a zero gradient and a
   failed ELBO is −DBL_MAX.  Stan's greedy rule picks η; the state is reset to q₀ after every
   trial, so the SGD phase starts again from q₀.
3. SGD (§2.7): gradient, step size (§2.5, :func:`stan_step`), update; every ``eval_elbo``
   iterations an ELBO and the relative-tolerance test on a circular buffer
   (:class:`RelativeTolerance`).  Here a failed gradient or ELBO ends the run (status
   ``'failed'``, the last iterate kept), as Stan's uncaught exception does.

Design choices
--------------
* **Speed.** The SGD steps run in jitted chunks (:func:`_kernel`): one compiled call does up to
  ``_CHUNK`` steps, with the gradient's drop-and-redraw rule (§2.3) inside JAX
  (``lax.while_loop``), and returns every iterate.  Chunks end at ELBO checks, at the end of an
  adaptation trial, at ``max_iterations`` and where the oracle budget runs out, so the Python
  side only does bookkeeping (ledger, trace rows, ELBO checks).  One compile per
  (estimator, grad_samples); the compiled chunk is cached per estimator (weakly).
* **Drop rules and arithmetic** (issue 8: each checked against [S] line by line, and against
  Stan's own C++ ADVI over 400 seeds on raw-unit regressions; see docs/methods.md).
  Gradient (:func:`_build_kernel`): draws are consumed in order, in batches of ``grad_samples``
  keyed ``fold_in(purpose_key(key, t, 'gradient'), attempt)``.  A draw is dropped when the model
  throws or ∇log p(ζ) is not finite ([S] ``calc_grad``: ``catch (const std::exception&)`` around
  ``stan::model::gradient`` and ``check_finite("Gradient of mu")``); a target signals a throw by
  a non-finite log p (the Target convention), so that is a drop too.  The ``10·grad_samples``-th
  drop fails the gradient (``GRAD_DROP_LIMIT``).  The accepted draws are summed in draw order
  and finalized as Stan does (ω part: ``mean(g∘ε)·exp(ω) + 1``; full-rank: ``+1/L_dd``), so an
  overflow there is not a drop; a NaN in the result fails the gradient without a redraw
  (``GRAD_NAN``: ``set_mu``/``set_omega``/``set_L_chol`` throw ``std::domain_error``).
  ELBO (:func:`calc_elbo`): batches of ``elbo_samples`` keyed
  ``fold_in(purpose_key(key, t, 'elbo'), attempt)``; a non-finite log p is dropped, the
  ``elbo_samples``-th drop fails; the value is Stan's running sum / n + entropy (−∞ possible).
  Eta adaptation (:func:`select_eta`): IEEE comparisons on the returned values, a thrown ELBO
  is −DBL_MAX; an η of 0 fails the SGD phase (``check_positive``).  After the SGD phase,
  :func:`output_failure` is ``advi::run``'s unguarded ``log_prob`` at the output draws.
* **Random keys.** Global iteration t counts every gradient step, adaptation included (trace
  row t is the iterate after step t).  Step t uses ``purpose_key(key, t, 'gradient')``; the ELBO
  belonging to row t uses ``purpose_key(key, t, 'elbo')`` (elbo_init: t = 0); [R]'s pre-loop ELBO
  uses ``purpose_key(key, 2**32 − 1, 'elbo')`` (no row owns it).
* **Oracle accounting** (§3): ``grad_samples/256`` per gradient (a failed SGD gradient is charged
  too: the work was done), ``elbo_samples/128`` per ``calc_ELBO`` (elbo_init, each trial, each
  check, [R]'s pre-loop ELBO).  Dropped and redrawn draws are not charged extra.
* **Trace** (§7.2): row 0 = q₀ (phase ``'init'``, ``elbo`` = elbo_init, charged to row 1 as §7.2
  says); one row per gradient step: ``phase`` ('adapt' | 'sgd'), ``eta``, ``step`` (k within the
  trial or the SGD phase); at ELBO evaluations ``elbo`` (``-inf`` plus ``elbo_failed=True`` for a
  failed trial ELBO), and in SGD ``rel_change``, ``rel_mean``, ``rel_median``; ``grad_failed``
  on adaptation steps that used a zero gradient; ``diverging`` where Stan prints "MAY BE
  DIVERGING".  Trace wall times are taken when a chunk's rows are recorded.
* **Budget.** The oracle budget is checked after every iteration (an iteration includes its ELBO
  check); when spent the run stops with status ``'budget'`` and the last iterate (during
  adaptation: the current trial's iterate).
* **Statuses.** 'converged' (mean or median relative change < tol; takes precedence when the
  check at ``max_iterations`` also converges), 'max_iters', 'budget', 'failed' (elbo_init
  failed — params q₀; all step sizes failed — params q₀; SGD gradient/ELBO failed — last iterate).
* **Warnings.** "MAY BE DIVERGING" issues one :class:`ADVIWarning` per run (``warnings.warn``)
  and flags every such row; Stan's informational messages are collected in ``info['messages']``.
* **Output** (§2.8): :func:`output_draws` gives Stan's 1 + output_samples rows (mean first) with
  ``lp__``, ``log_p__``, ``log_g__``, for the caller to constrain.
* **Speed, measured** (2-core CPU, JaxTarget, D = 5): about 30 µs per iteration with Stan's
  defaults (trace recording included), for both families.
* **[R] profile details.** ``init_log_scale = −1`` applies to both families (for full-rank
  L₀ = e⁻¹ I; [R] only changed the mean-field constructor, the paper only uses mean-field) [C].
"""

from __future__ import annotations

import math
import sys
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from stanvi.errors import VIError
from stanvi.estimators.elbo import ElboEstimator, GradientFailure, collect_valid, standard_normal
from stanvi.estimators.stan_gradient import (GRAD_DROP_LIMIT, GRAD_NAN, GRAD_OK,  # noqa: F401
                                             GRAD_RETRIES, stan_calc_grad)
from stanvi.families import FullRank
from stanvi.methods.base import (MethodResult, OracleLedger, Trace, compile_clock,
                                 purpose_key)
from stanvi.methods.checks import PROBE_DRAWS, divergence, improper_direction
from stanvi.optim.step_size import stan_step

# Hard-coded in [S] advi.hpp / the families.
ETA_GRID: tuple[float, ...] = (100.0, 10.0, 1.0, 0.1, 0.01)   # adapt_eta's eta_sequence
DBL_MAX = sys.float_info.max

_CHUNK = 100                     # gradient steps per compiled call (static buffer length)
_HISTORY_BYTES = 128 * 2**20     # ... at most this much iterate history per call (issue 17)


def _chunk_for(family) -> int:
    """Steps per compiled call: ``_CHUNK``, fewer when the (steps, P) iterate history would
    exceed ``_HISTORY_BYTES`` (full rank, D = 2,000: 8 steps, not 100 × 16 MB).  Chunk
    boundaries do not change results (tests/test_advi.py)."""
    return max(1, min(_CHUNK, _HISTORY_BYTES // (8 * family.n_params)))
_PRELOOP_ITERATION = 2**32 - 1   # key index of [R]'s pre-loop ELBO (owned by no trace row)


class ADVIWarning(UserWarning):
    """Stan ADVI's "MAY BE DIVERGING... INSPECT ELBO" note."""


class ElboFailure(VIError):
    """``calc_ELBO`` dropped ``elbo_samples`` draws (the model threw or was non-finite)."""


# --------------------------------------------------------------------------------- options
@dataclass(frozen=True)
class Options:
    """ADVI settings.  Defaults are Stan's ([S] ``services/experimental/advi/defaults.hpp``,
    CmdStan's ``variational`` method); the ``paper`` profile changes what [R] changed.

    Attributes:
        max_iterations: [S] ``iter`` = 10000, SGD iterations after adaptation.
        grad_samples: [S] 1 draw per gradient ([R]/paper: 256).
        elbo_samples: [S] 100 draws per ``calc_ELBO``.
        eta: [S] 1.0; the step-size scale, used only when ``adapt_engaged`` is False.
        adapt_engaged: [S] True: choose eta by the grid search of ``adapt_eta``.
        adapt_iter: [S] 50 SGD steps per trial eta.
        tol_rel_obj: [S] 0.01 ([R]/paper: 1e-4), relative ELBO tolerance.
        eval_elbo: [S] 100, iterations between ELBO checks.
        output_samples: [S] 1000 approximate-posterior draws (see :func:`output_draws`).
        init: initial mean when the caller gives none: 'random' = Stan's uniform(−2, 2) on the
            unconstrained scale ([S] ``services::util::initialize``, ``init_radius`` 2);
            'zero' = μ₀ = 0 ([R]'s TrustVI, used for all methods in the paper profile, §2.9).
        init_log_scale: [S] 0 (ω₀ = 0 / L₀ = I); [R] −1 (σ₀ = e⁻¹, set in [R]'s
            ``normal_meanfield(cont_params)``; applied to full-rank too as L₀ = e⁻¹ I [C]).
        elbo_before_loop: [S] False; [R] True: one ``calc_ELBO(q)`` before the SGD loop, so the
            first buffered relative change is a real change and a stop at iteration
            ``eval_elbo`` is possible (§2.9).
        output_check: [S] True: after the SGD loop, Stan's ``advi::run`` evaluates
            ``log_prob<false, true>`` at each of the ``output_samples`` output draws outside any
            try block, so one throwing draw ends the run with an error (see :func:`run`).
            False skips this (the draws' failures then only show in the fit's ``log_p__`` and
            diagnostics) [C].
        improper_check: stanvi's addition (issue P2-1c), default True: when the SGD phase ends
            ('converged' or 'max_iters'), or a gradient turns NaN, q is checked for an improper
            posterior (:func:`stanvi.methods.checks.divergence`: non-finite parameters or a
            runaway scale; :func:`stanvi.methods.checks.improper_direction`: the ELBO still rising
            as q is widened along its widest coordinates).  Stan's ADVI reports 'converged' on
            ``parameters { real x; } model { }`` (full-rank: the ELBO grows like log σ, so its
            relative change falls below ``tol_rel_obj``); here that run ends 'failed' with "the
            posterior may be improper" and Stan's status kept in ``info['sgd_status']``.  The
            widening probe runs only when the last three ELBO checks were increasing.
            False gives Stan's status.
    """

    max_iterations: int = 10000
    grad_samples: int = 1
    elbo_samples: int = 100
    eta: float = 1.0
    adapt_engaged: bool = True
    adapt_iter: int = 50
    tol_rel_obj: float = 0.01
    eval_elbo: int = 100
    output_samples: int = 1000
    init: str = "random"
    init_log_scale: float = 0.0
    elbo_before_loop: bool = False
    output_check: bool = True
    improper_check: bool = True

    def __post_init__(self) -> None:
        for name in ("max_iterations", "grad_samples", "elbo_samples", "adapt_iter", "eval_elbo",
                     "output_samples"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"advi option {name} must be a positive integer, got {value!r}")
        for name in ("eta", "tol_rel_obj"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"advi option {name} must be a positive number, got {value!r}")
        if self.init not in ("random", "zero"):
            raise ValueError(f"advi option init must be 'random' or 'zero', got {self.init!r}")
        if not math.isfinite(self.init_log_scale):
            raise ValueError(f"advi option init_log_scale must be finite, "
                             f"got {self.init_log_scale!r}")

    @property
    def cb_size(self) -> int:
        """Circular-buffer capacity ``int(max(0.1·max_iterations/eval_elbo, 2.0))`` [S]."""
        return int(max(0.1 * self.max_iterations / self.eval_elbo, 2.0))


PROFILES: dict[str, dict[str, Any]] = {
    # Stan's defaults (§2.1, §2.2).
    "stan": {},
    # What [R] changed for the TrustVI paper's experiments (§2.9).
    "paper": {"grad_samples": 256, "tol_rel_obj": 1e-4, "init_log_scale": -1.0, "init": "zero",
              "elbo_before_loop": True},
}
DEFAULT_PROFILE = "stan"
ESTIMATOR = "reparameterization"   # stanvi.estimators.base.ESTIMATORS: what run() gets in context.estimator


# --------------------------------------------------------------------------------- pure pieces
def select_eta(elbo_init: float, run_trial: Callable[[float], float],
               etas: Sequence[float] = ETA_GRID) -> float:
    """Stan's ``adapt_eta`` decision rule (§2.6 step 4; [S] ``advi::adapt_eta``), line for line.

    ``run_trial(eta)`` runs one trial from q₀ and returns its ELBO: −DBL_MAX when ``calc_ELBO``
    threw, otherwise ``calc_ELBO``'s value *as it is*, −∞ or NaN included (Stan maps only a
    thrown ``calc_ELBO`` to −DBL_MAX).  The comparisons are IEEE ones, as in C++, so:

    * a NaN trial ELBO never stops the search and becomes ``elbo_best``;
    * with ``elbo_init = −∞``, a first trial at −∞ stops at once with ``eta_best = 0`` (−∞ <
      −DBL_MAX and −DBL_MAX > −∞); the SGD phase then fails Stan's ``check_positive`` on η.

    Returns η (possibly 0, see above).  Raises :class:`VIError` ("All proposed step-sizes
    failed") when the last eta does not beat ``elbo_init``.
    """
    elbo_best, eta_best = -DBL_MAX, 0.0
    last = len(etas) - 1
    for index, eta in enumerate(etas):
        elbo = float(run_trial(eta))
        if elbo < elbo_best and elbo_best > elbo_init:
            return eta_best
        if index < last:
            elbo_best, eta_best = elbo, eta
        elif elbo > elbo_init:
            return eta
        else:
            raise VIError("stan::variational::advi::adapt_eta: All proposed step-sizes failed. "
                          "Your model may be either severely ill-conditioned or misspecified.")
    raise AssertionError("unreachable")  # pragma: no cover


def rel_difference(prev: float, curr: float) -> float:
    """|(curr − prev) / prev| with IEEE semantics (÷0 gives inf or NaN, as in C++) [S]."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.abs((np.float64(curr) - np.float64(prev)) / np.float64(prev)))


def circ_buff_median(values: Sequence[float]) -> float:
    """Stan's buffer "median": the element at index ⌊n/2⌋ after ``nth_element`` (the upper
    median for even n, no averaging) [S]."""
    v = sorted(values)
    return float(v[len(v) // 2])


class Check(NamedTuple):
    elbo: float
    rel_change: float
    rel_mean: float
    rel_median: float
    converged_mean: bool
    converged_median: bool

    @property
    def converged(self) -> bool:
        return self.converged_mean or self.converged_median


class RelativeTolerance:
    """The convergence bookkeeping of ``stochastic_gradient_ascent`` (§2.7).

    ``elbo`` starts at 0.0 ([S]; so the first relative change is exactly 1.0) or at [R]'s
    pre-loop ELBO.  Each :meth:`update` pushes ``rel_difference(elbo, elbo_prev)`` =
    |(elbo_prev − elbo)/elbo| (denominator: the *current* ELBO) into a circular buffer of
    capacity ``cb_size`` and tests its mean and upper median against ``tol``.
    """

    def __init__(self, cb_size: int, tol: float, elbo0: float = 0.0) -> None:
        self.buffer: deque[float] = deque(maxlen=cb_size)
        self.tol = tol
        self.elbo = float(elbo0)
        self.elbo_best = -DBL_MAX

    def update(self, elbo: float) -> Check:
        elbo_prev, self.elbo = self.elbo, float(elbo)
        if self.elbo > self.elbo_best:
            self.elbo_best = self.elbo
        delta = rel_difference(self.elbo, elbo_prev)
        self.buffer.append(delta)
        mean = sum(self.buffer, 0.0) / len(self.buffer)   # std::accumulate, in buffer order
        median = circ_buff_median(self.buffer)
        return Check(self.elbo, delta, mean, median, mean < self.tol, median < self.tol)


# --------------------------------------------------------------------------------- ELBO
def _elbo_pieces(estimator: ElboEstimator):
    """Jitted (params, eps) ↦ (log p(z_j) for each row, H(q)), cached weakly per estimator."""
    per_estimator = _KERNELS.setdefault(estimator, {})
    if "elbo" not in per_estimator:
        family, log_density = estimator.family, estimator.log_density
        per_estimator["elbo"] = jax.jit(lambda params, eps: (
            jax.vmap(log_density)(family.sample(params, eps)), family.entropy(params)))
    return per_estimator["elbo"]


def calc_elbo(estimator: ElboEstimator, params, key: jax.Array, n: int,
              ledger: OracleLedger | None = None) -> float:
    """Stan's ``calc_ELBO`` (§2.4; [S] ``advi::calc_ELBO``).

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
        (_, kept), _, evaluated = collect_valid(evaluate, key, n, estimator.family.dim, n,
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


# --------------------------------------------------------------------------------- SGD kernel


class ChunkResult(NamedTuple):
    params: np.ndarray       # (P,) after the last completed step
    s: np.ndarray            # (P,) step-size history after the last completed step
    history: np.ndarray      # (n_done, P) iterate after each completed step
    grad_failed: np.ndarray  # (n_done,) int: GRAD_OK, or why the step's gradient failed (a zero
    #                          gradient was used): GRAD_DROP_LIMIT or GRAD_NAN
    drops: np.ndarray        # (n_done,) dropped gradient draws per step
    n_done: int
    fatal: bool              # a gradient failed with absorb=False; step n_done + 1 not taken
    fatal_kind: int = GRAD_OK    # why it failed (GRAD_DROP_LIMIT or GRAD_NAN)
    fatal_drops: int = 0         # draws the failed gradient dropped
    evaluated: int = 0           # gradient draws evaluated by the chunk (redraws, the failed one)


def _build_kernel(family, log_density, n: int, chunk: int):
    n_params = family.n_params
    gradient = stan_calc_grad(family, log_density, n)

    def advance(params, s, k0, n_steps, t0, eta, key, absorb):
        def cond(c):
            return (c[0] < n_steps) & ~c[7]

        def body(c):
            i, params, s, hist, gfail, drops, evaluated, _ = c
            g, kind, dropped, n_eval = gradient(params, purpose_key(key, t0 + i + 1, "gradient"))
            failed = kind != GRAD_OK
            fatal = failed & ~absorb
            new_params, new_s, _ = stan_step(params, s, jnp.where(failed, 0.0, g), k0 + i + 1, eta)
            params = jnp.where(fatal, params, new_params)
            s = jnp.where(fatal, s, new_s)
            hist = jnp.where(fatal, hist, hist.at[i].set(params))
            return (jnp.where(fatal, i, i + 1), params, s, hist,
                    gfail.at[i].set(kind), drops.at[i].set(dropped),
                    evaluated.at[i].set(n_eval), fatal)

        init = (jnp.zeros((), jnp.int32), params, s, jnp.zeros((chunk, n_params)),
                jnp.zeros(chunk, jnp.int32), jnp.zeros(chunk, jnp.int32),
                jnp.zeros(chunk, jnp.int32), jnp.zeros((), bool))
        i, params, s, hist, gfail, drops, evaluated, fatal = lax.while_loop(cond, body, init)
        return params, s, hist, gfail, drops, evaluated, i, fatal

    return jax.jit(advance)


_KERNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _kernel(estimator: ElboEstimator, grad_samples: int):
    """The compiled chunk for (estimator, grad_samples), cached weakly on the estimator."""
    per_estimator = _KERNELS.setdefault(estimator, {})
    size = _chunk_for(estimator.family)
    if (grad_samples, size) not in per_estimator:
        per_estimator[grad_samples, size] = _build_kernel(
            estimator.family, estimator.log_density, grad_samples, size)
    return per_estimator[grad_samples, size]


def advance(estimator: ElboEstimator, params, s, *, k0: int, n_steps: int, t0: int, eta: float,
            key: jax.Array, absorb: bool, grad_samples: int) -> ChunkResult:
    """Run gradient steps k = k0+1 … k0+n_steps (global iterations t0+1 …) of §2.5 with
    ``grad_samples`` draws per gradient (at most ``_CHUNK`` steps per call).

    ``absorb=True`` (adaptation): a failed gradient is a zero gradient.  ``absorb=False`` (SGD):
    stop at the first failed gradient (``fatal``) with the iterate before it.
    """
    if not 1 <= n_steps <= _chunk_for(estimator.family):
        raise ValueError(f"n_steps must be in [1, {_chunk_for(estimator.family)}], got {n_steps}")
    out = _kernel(estimator, grad_samples)(
        jnp.asarray(params, dtype=jnp.float64), jnp.asarray(s, dtype=jnp.float64),
        np.int32(k0), np.int32(n_steps), np.int32(t0), np.float64(eta), key, np.bool_(absorb))
    p, s, hist, gfail, drops, evaluated, n_done, fatal = jax.device_get(out)
    n_done, fatal = int(n_done), bool(fatal)
    gfail, drops, evaluated = np.asarray(gfail), np.asarray(drops), np.asarray(evaluated)
    return ChunkResult(np.asarray(p), np.asarray(s), np.asarray(hist)[:n_done], gfail[:n_done],
                       drops[:n_done], n_done, fatal,
                       int(gfail[n_done]) if fatal else GRAD_OK,
                       int(drops[n_done]) if fatal else 0,
                       int(evaluated[:n_done + int(fatal)].sum()))


# --------------------------------------------------------------------------------- run
def gradient_failure_message(family, kind: int, options: Options) -> str:
    """Stan's message for a failed ``calc_grad`` ([S] ``normal_meanfield::calc_grad`` /
    ``normal_fullrank::calc_grad``; ``set_omega`` / ``set_L_chol`` for a NaN gradient)."""
    name = "normal_fullrank" if isinstance(family, FullRank) else "normal_meanfield"
    if kind == GRAD_NAN:
        where = ("stan::variational::set_mu / set_L_chol" if name == "normal_fullrank" else
                 "stan::variational::normal_meanfield::set_mu / set_omega")
        return (f"{where}: the averaged ELBO gradient is nan, but must not be nan! (an "
                f"overflowing gradient: no draw was dropped, the result is NaN)")
    return (f"stan::variational::{name}::calc_grad: The number of dropped evaluations has "
            f"reached its maximum amount ({GRAD_RETRIES * options.grad_samples}). Your model may "
            f"be either severely ill-conditioned or misspecified.")


class _BudgetSpent(Exception):
    """Internal: the oracle budget ran out inside an adaptation trial."""


def _steps_within_budget(context, scaled: float, per_step: float, n: int) -> int:
    """How many of the next n gradient steps run before the budget is spent (the step that
    spends it included), mirroring the ledger's float accumulation."""
    if context.max_oracle_calls is None:
        return n
    for i in range(1, n + 1):
        scaled += per_step
        if context.over_budget(scaled):
            return i
    return n


def run(target, family, *, key: jax.Array, options: Options, context) -> MethodResult:
    """Stan's ADVI on ``target`` with variational ``family`` (MeanField or FullRank('stan')).

    Returns a :class:`MethodResult`; ``info`` holds ``eta`` (used), ``eta_adapted``,
    ``elbo_init``, ``adapt_elbos`` (list of {eta, elbo} per trial run; a failed trial ELBO is
    −DBL_MAX as in Stan), ``adapt_steps``, ``sgd_iterations``, ``elbo`` (last ELBO check),
    ``elbo_best``, ``rel_mean``/``rel_median`` (last check), ``converged_by``, ``cb_size``,
    ``pre_loop_elbo`` ([R] profile), ``grad_draws_dropped`` (dropped gradient draws),
    ``grad_failures`` (gradients that hit the drop limit), ``init`` and ``messages``.
    """
    est: ElboEstimator = context.estimator
    if est.family != family:
        raise ValueError(f"context.estimator was built for {est.family}, not {family}")
    if getattr(target, "dim", family.dim) != family.dim:
        raise ValueError(f"family dimension {family.dim} != target dimension {target.dim}")
    opt = options
    mu0, init_kind = context.initial_mean(opt.init)
    params0 = np.asarray(family.initial_params(mu0, opt.init_log_scale), dtype=float)
    zeros = np.zeros_like(params0)
    per_grad = opt.grad_samples / 256.0  # for budget look-ahead; the ledger charges the same
    ledger, trace = OracleLedger(), Trace(compile_clock=compile_clock(est))
    info: dict[str, Any] = {"init": init_kind, "cb_size": opt.cb_size, "messages": [],
                            "adapt_elbos": [], "adapt_steps": 0, "sgd_iterations": 0,
                            "grad_draws_dropped": 0, "grad_failures": 0,
                            "eta_adapted": bool(opt.adapt_engaged)}
    state = {"t": 0, "params": params0}

    def result(status: str, message: str = "", params=None) -> MethodResult:
        p = state["params"] if params is None else params
        return MethodResult(np.array(p, dtype=float), trace, ledger, status, message, info)

    def elbo_at(params, t: int) -> float:
        ledger.elbo_estimate(opt.elbo_samples)
        return calc_elbo(est, params, purpose_key(key, t, "elbo"), opt.elbo_samples, ledger)

    def run_steps(params, s, k0, n, eta, absorb, fields):
        """Run n steps, record all but the last row; return (chunk, last row's fields)."""
        chunk = advance(est, params, s, k0=k0, n_steps=n, t0=state["t"], eta=eta, key=key,
                        absorb=absorb, grad_samples=opt.grad_samples)
        info["grad_draws_dropped"] += int(chunk.drops.sum())
        info["grad_failures"] += int(np.count_nonzero(chunk.grad_failed))
        if chunk.fatal:   # the failed gradient (its drops are not in chunk.drops)
            info["grad_draws_dropped"] += chunk.fatal_drops
            info["grad_failures"] += 1
        ledger.redrawn(chunk.evaluated - (chunk.n_done + int(chunk.fatal)) * opt.grad_samples)
        rows = []
        for i in range(chunk.n_done):
            ledger.gradient(opt.grad_samples)
            row = dict(fields, step=k0 + i + 1)
            if chunk.grad_failed[i]:
                row["grad_failed"] = True
                if chunk.grad_failed[i] == GRAD_NAN:
                    row["grad_nan"] = True
            rows.append(row)
            if i < chunk.n_done - 1:
                trace.record(state["t"] + i + 1, chunk.history[i], ledger, **row)
        return chunk, (rows[-1] if rows else None)

    def finish_row(chunk, row):
        state["t"] += chunk.n_done
        state["params"] = chunk.history[-1]
        trace.record(state["t"], chunk.history[-1], ledger, **row)

    # ---- row 0 and elbo_init (charged to iteration 1, §7.2)
    trace.record(0, params0, ledger, phase="init")
    if opt.adapt_engaged:
        try:
            elbo_init = elbo_at(params0, 0)
        except ElboFailure as exc:
            info["elbo_init"] = None
            return result("failed", "stan::variational::advi::adapt_eta: Cannot compute ELBO using "
                          "the initial variational distribution. Your model may be either "
                          f"severely ill-conditioned or misspecified. ({exc})")
        info["elbo_init"] = elbo_init
        trace.rows[0]["elbo"] = elbo_init

        # ---- eta adaptation (§2.6)
        def run_trial(eta: float) -> float:
            params, s, k = params0, zeros, 0
            while k < opt.adapt_iter:
                n = min(_chunk_for(family), opt.adapt_iter - k)
                n = _steps_within_budget(context, ledger.scaled, per_grad, n)
                chunk, row = run_steps(params, s, k, n, eta, True, {"phase": "adapt", "eta": eta})
                params, s, k = chunk.params, chunk.s, k + n
                if k == opt.adapt_iter:
                    try:
                        elbo = elbo_at(params, state["t"] + chunk.n_done)
                        row["elbo"] = elbo
                    except ElboFailure:
                        elbo = -DBL_MAX
                        row.update(elbo=-math.inf, elbo_failed=True)
                    info["adapt_elbos"].append({"eta": eta, "elbo": elbo})
                finish_row(chunk, row)
                info["adapt_steps"] = state["t"]
                context.progress.update(state["t"], elbo=row.get("elbo", math.nan),
                                        oracle=ledger.scaled)
                if context.over_budget(ledger.scaled):
                    raise _BudgetSpent
            return elbo

        try:
            eta = select_eta(elbo_init, run_trial)
        except _BudgetSpent:
            info["eta"] = None
            return result("budget", "oracle budget spent during eta adaptation")
        except VIError as exc:
            info["eta"] = None
            return result("failed", str(exc), params=params0)
    else:
        eta = float(opt.eta)
    info["eta"] = eta
    if not eta > 0:
        # [S] stochastic_gradient_ascent: check_positive(function, "Eta stepsize", eta) throws
        # std::domain_error, e.g. for adapt_eta's eta_best = 0 (see select_eta)
        return result("failed", f"stan::variational::advi::stochastic_gradient_ascent: Eta "
                      f"stepsize is {eta:g}, but must be positive!", params=params0)
    sgd_start = state["t"]

    # ---- SGD (§2.7), from q₀ again
    monitor = RelativeTolerance(opt.cb_size, opt.tol_rel_obj)
    if opt.elbo_before_loop:
        try:
            monitor.elbo = elbo_at(params0, _PRELOOP_ITERATION)
        except ElboFailure as exc:
            return result("failed", f"{exc} (ELBO before the SGD loop)", params=params0)
        info["pre_loop_elbo"] = monitor.elbo
    params, s, k = params0, zeros, 0
    sgd_elbos: list[float] = []
    warned = False
    status, message = None, ""
    while status is None:
        next_check = (k // opt.eval_elbo + 1) * opt.eval_elbo
        n = min(_chunk_for(family), next_check - k, opt.max_iterations - k)
        n = _steps_within_budget(context, ledger.scaled, per_grad, n)
        chunk, row = run_steps(params, s, k, n, eta, False, {"phase": "sgd", "eta": eta})
        if chunk.fatal:
            if row is not None:
                finish_row(chunk, row)
            ledger.gradient(opt.grad_samples)   # the failed gradient's work was done
            info["sgd_iterations"] = state["t"] - sgd_start
            message = (f"{gradient_failure_message(family, chunk.fatal_kind, opt)} "
                       f"(SGD iteration {k + chunk.n_done + 1})")
            runaway = divergence(family, state["params"]) if opt.improper_check else None
            return result("failed", f"{runaway} ({message})" if runaway else message)
        params, s, k = chunk.params, chunk.s, k + n
        if k % opt.eval_elbo == 0:
            try:
                check = monitor.update(elbo_at(params, state["t"] + n))
                sgd_elbos.append(check.elbo)
            except ElboFailure as exc:
                row["elbo_failed"] = True
                finish_row(chunk, row)
                info["sgd_iterations"] = k
                return result("failed", f"{exc} (SGD iteration {k})")
            row.update(elbo=check.elbo, rel_change=check.rel_change, rel_mean=check.rel_mean,
                       rel_median=check.rel_median)
            info.update(elbo=check.elbo, elbo_best=monitor.elbo_best, rel_mean=check.rel_mean,
                        rel_median=check.rel_median)
            if k > 10 * opt.eval_elbo and (check.rel_median > 0.5 or check.rel_mean > 0.5):
                row["diverging"] = True
                info["messages"].append(f"iteration {k}: MAY BE DIVERGING... INSPECT ELBO")
                if not warned:
                    warned = True
                    warnings.warn(f"ADVI at iteration {k}: relative ELBO change mean "
                                  f"{check.rel_mean:.3g}, median {check.rel_median:.3g}: MAY BE "
                                  f"DIVERGING... INSPECT ELBO", ADVIWarning, stacklevel=2)
            if check.converged:
                status = "converged"
                info["converged_by"] = "+".join(
                    name for name, hit in (("mean", check.converged_mean),
                                           ("median", check.converged_median)) if hit)
                if rel_difference(check.elbo, monitor.elbo_best) > 0.05:
                    info["messages"].append(
                        "Informational Message: The ELBO at a previous iteration is larger than "
                        "the ELBO upon convergence! This variational approximation may not have "
                        "converged to a good optimum.")
        if status is None and k == opt.max_iterations:
            status = "max_iters"
            info["messages"].append("Informational Message: The maximum number of iterations is "
                                    "reached! The algorithm may not have converged.")
        finish_row(chunk, row)
        info["sgd_iterations"] = k
        context.progress.update(state["t"], elbo=monitor.elbo, oracle=ledger.scaled)
        if status is None and context.over_budget(ledger.scaled):
            status, message = "budget", f"oracle budget spent after {k} SGD iterations"
    if opt.improper_check and status in ("converged", "max_iters"):
        # the probe (5,376 log densities) runs only where the ELBO was still climbing at its
        # last three checks, as it does without end on an improper posterior
        climbing = len(sgd_elbos) >= 3 and sgd_elbos[-3] < sgd_elbos[-2] < sgd_elbos[-1]
        improper = divergence(family, state["params"]) or (climbing and improper_direction(
            target, family, state["params"],
            standard_normal(purpose_key(key, 0, "check"), PROBE_DRAWS, family.dim), ledger))
        improper = improper or None
        if improper is not None:
            info["sgd_status"] = status
            return result("failed", f"{improper} (Stan's ADVI would report '{status}')")
    if opt.output_check and status in ("converged", "max_iters"):
        failure = output_failure(target, family, state["params"], key, opt.output_samples, ledger)
        if failure is not None:
            index, why = failure
            info["output_failed_draw"] = index
            info["sgd_status"] = status
            status, message = "failed", (
                f"{why} (output draw {index + 1} of {opt.output_samples}: Stan's advi::run "
                f"evaluates log_prob at every output draw outside any try block, so the run "
                f"ends with an error after the SGD phase ({status}))")
    return result(status, message)


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
    oracle call (output, as in §3): charged to ``ledger`` as screening draws.
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
    """Stan's ADVI output (§2.8): row 0 is the mean μ with ``lp__ = log_p__ = log_g__ = 0``, then
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
