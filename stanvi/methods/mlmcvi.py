"""mlmcvi: Multilevel Monte Carlo variational inference (Fujisawa & Sato, *Multilevel Monte
Carlo Variational Inference*, JMLR; docs/mlmcvi.md).

The paper's Algorithm 1 in G-form (docs/mlmcvi.md#update-rule): SGD on F = −ELBO with the
multilevel reparameterized gradient G_t of :mod:`stanvi.estimators.mlmc` (Lemma 1's running
sum), step size α_t = α_0 η_t and level sizes N_t = ⌈η_{t−1} N_0⌉ from the scheduler
(:mod:`stanvi.estimators.mlmc_schedule`; step decay by default, as every experiment of the
paper).  A run to level T (``max_iters``) makes T + 1 updates, t = 0 … T; trace row k holds the
iterate λ_k after update t = k − 1.  Cost: N_0 + 2 Σ_{t=1}^T N_t draw-level gradient evaluations.

Also here, selectable by ``estimator``: the paper's baselines (docs/mlmcvi.md#baselines), plain
reparameterized Monte Carlo (``"mc"``) and randomized QMC with scrambled Sobol' points
(``"rqmc"``), by default at the draws per iteration that make their cost equal to MLMC's over
the same run (:func:`~stanvi.estimators.mlmc_schedule.equal_cost_draws`), with the same
optimizer and schedule; and the [EXT] options of docs/mlmcvi.md#extensions, all off by default:
Adam fed with G (E1), periodic restarts (R1), Algorithm 2's truncation.

**Caveat (docs/mlmcvi.md#persisting-error).**  The faithful estimator never re-draws level 0,
so its error, of mean square ≥ V_0/N_0, persists: the iterates settle at a stationary point of
a randomly perturbed objective, and the excess free energy is about tr(H⁻¹Σ_0)/(2N_0).  The
trace logs V̂_t, V̂_t/N_t and Acc_t (docs/mlmcvi.md#diagnostics); with the log scale a
coordinate whose accumulated error s.d. exceeds 1/3 triggers the collapse-risk warning
(docs/mlmcvi.md#scale-collapse).  ``restart_every`` bounds the error's lifetime (not in the paper).
"""

from __future__ import annotations

import math
import time
import warnings
import dataclasses
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from stanvi.errors import StanviWarning, VIError
from stanvi.estimators.elbo import GradientFailure
from stanvi.estimators.mlmc import (Coordinates, MultilevelGradient, plain_level,
                                    replicate_estimates, variance_and_snr)
from stanvi.estimators.mlmc_schedule import (cost_ratio, equal_cost_draws,
                                             low_cost_ok, mlmc_cost, sample_size)
from stanvi.estimators.qmc import base_draws
from stanvi.lazy_jax import jax
from stanvi.methods.base import (MethodResult, OracleLedger, RunContext, StepOutcome, Trace,
                                 compile_clock, iterate, purpose_key)
from stanvi.methods.checks import divergence
from stanvi.methods.mlmcvi_options import (DEFAULT_PROFILE, ESTIMATORS,  # noqa: F401
                                           PROFILES, Options)
from stanvi.methods.warm_start import laplace_start
from stanvi.optim.first_order import AdamState, adam_update

ESTIMATOR = "reparameterization"   # for the ELBO trace, the output draws and Fit.elbo(); the
                                   # method's gradients come from stanvi.estimators.mlmc
SUPPORTS_MIXTURE = True   # family='mixture': levels of the RB gradient (stanvi.estimators.mixture_mlmc),
                          # from the family's estimator's ``multilevel``


@dataclass
class MLMCLedger(OracleLedger):
    """The ledger of :class:`OracleLedger` (gradient draws priced as the TrustVI paper prices
    them; docs/algorithms.md#oracle-calls), plus the model evaluations made only to monitor the
    run (the ELBO trace, the replicate variance/SNR diagnostic), which are not charged to the
    algorithm: ``monitor_log_density`` and ``monitor_gradient`` draws."""

    monitor_log_density: int = 0
    monitor_gradient: int = 0

    def model_evaluations(self) -> dict[str, int]:
        out = super().model_evaluations()
        out["log_density"] += self.monitor_log_density
        out["gradient"] += self.monitor_gradient
        return out

    def snapshot(self) -> dict[str, float]:
        return {**super().snapshot(), "monitor_log_density": self.monitor_log_density,
                "monitor_gradient": self.monitor_gradient}


def optimizer_step(kind: str, theta: np.ndarray, g: np.ndarray, lr: float, adam: AdamState,
                   fisher_scale: np.ndarray | None = None) -> tuple[np.ndarray, AdamState]:
    """SGD, θ − α_t G [P], natural-gradient SGD [C], or Adam fed with G at step size α_t
    [EXT E1, docs/mlmcvi.md#extensions; :mod:`stanvi.optim.first_order`]: (θ_{k+1}, Adam's
    next state)."""
    if kind == "sgd":
        return theta - lr * g, adam
    if kind == "natural":   # θ − α F⁻¹G, F = diag(fisher_scale²) (Amari 1998)
        return theta - lr * g / (fisher_scale * fisher_scale), adam
    update, adam = adam_update(g, adam, lr)
    return theta + update, adam


class Watch(NamedTuple):
    """What the stopping rules and the run's record remember between iterations."""

    best: tuple[float, np.ndarray] | None = None   # the best evaluated (ELBO, parameters)
    last_elbo: float = -np.inf
    flat: int = 0                # evaluations in a row with a rise below tol_elbo
    falling: int = 0             # evaluations in a row with a fall
    calm: int = 0                # iterations in a row with a parameter change below tol
    restarts: int = 0
    redrawn: int = 0
    collapse_t: int | None = None   # the iteration of the scale-collapse warning
    eval_seconds: float = 0.0


class State(NamedTuple):
    params: np.ndarray          # the family's parameters of θ (what the trace records)
    theta: np.ndarray           # θ_k in the optimization coordinates
    theta_prev: np.ndarray      # θ_{k−1}
    G: np.ndarray | None        # the last gradient estimate (G_{k−1})
    adam: AdamState = AdamState()
    watch: Watch = Watch()


#: The stop's certificate: a fresh gradient of this many draws, and the gain (nats) it may
#: predict at most (the split-sample natural-gradient gain ½ g_aᵀF⁻¹g_b, F = q's Fisher diagonal:
#: unbiased for ½ ∇ᵀF⁻¹∇, as TrustVI's split gain is for the Newton gain).
CERTIFY_DRAWS = 1000
CERTIFY_GAIN = 0.5


def natural_gain(est, family, params: np.ndarray, eps: np.ndarray) -> float:
    """½ g_aᵀ F⁻¹ g_b for the mean ELBO gradients g_a, g_b of the two halves of ``eps``."""
    from stanvi.estimators.elbo import per_draw_gradients  # noqa: PLC0415

    _, rows = per_draw_gradients(est, params, eps)
    half = len(eps) // 2
    g_a = np.asarray(rows[:half].mean(axis=0), dtype=float)
    g_b = np.asarray(rows[half:2 * half].mean(axis=0), dtype=float)
    scale = family.metric_scale(params)
    gain = 0.5 * float(np.sum(g_a * g_b / (scale * scale)))
    return gain if np.isfinite(gain) else np.inf


def _elbo_rule(o: Options, t: int, elbo: float, params: np.ndarray, watch: Watch,
               certify) -> tuple[tuple[str, str] | None, Watch]:
    """The default profile's stop, on the ELBO of the fixed evaluation draws (no Monte Carlo
    noise between evaluations): the best iterate so far is kept (``watch.best``); once the
    step size has dropped (before, the iterates' SGD noise moves the ELBO more than the
    tolerance either way), ``converged`` when the ELBO rose by less than ``tol_elbo`` but did not
    fall at two evaluations in a row *and* ``certify(params)``, the natural-gradient gain of a
    fresh gradient, is at most ``CERTIFY_GAIN`` (a plateau at the SGD's noise floor is not the
    optimum: on a hierarchical radon model one sat 12 nats below it); ``max_iters`` with the
    reason when the ELBO fell at three in a row (the accumulated multilevel gradient error
    pushes the iterates away: the best iterate is the result)."""
    best = watch.best
    if np.isfinite(elbo) and (best is None or elbo > best[0]):
        best = (elbo, params.copy())
    rise = elbo - watch.last_elbo
    watch = watch._replace(best=best, last_elbo=elbo)
    if t < o.drop_every:
        return None, watch
    falling = not rise > -o.tol_elbo
    watch = watch._replace(flat=watch.flat + 1 if (not falling and rise < o.tol_elbo) else 0,
                           falling=watch.falling + 1 if falling else 0)
    if watch.flat >= 2:
        gain = certify(params)
        if gain <= CERTIFY_GAIN:
            return ("converged", f"the ELBO rose by less than tol_elbo={o.tol_elbo:g} nats at "
                    f"two evaluations {o.elbo_every} levels apart, and a fresh "
                    f"{CERTIFY_DRAWS}-draw gradient predicts {gain:.2g} nats more "
                    f"(natural-gradient gain)"), watch
        watch = watch._replace(flat=0)   # a plateau of the SGD's noise, not the optimum: go on
    if watch.falling >= 3:
        return ("max_iters", f"the ELBO fell at three evaluations in a row (to {elbo:.6g}, "
                f"the best {watch.best[0]:.6g}): the multilevel gradient's "
                f"accumulated error moves the iterates away from the optimum; the "
                f"best iterate is returned (method='trustvi' certifies its optimum)"), watch
    return None, watch


def noise_source(rng: np.random.Generator, kind: str, dim: int):
    """``draw(n) -> (n, D)`` base draws: i.i.d. normal for MLMC and MC, scrambled Sobol' for
    RQMC (redraws of failed RQMC draws are i.i.d.: a fresh scrambled block each)."""
    return lambda n: base_draws(kind, rng, n, dim)


def run(target, family, *, key: jax.Array, options: Options, context: RunContext) -> MethodResult:
    o = options
    fallback = None
    if o.optimizer == "natural" and not hasattr(family, "metric_scale"):
        # a family without a Fisher diagonal (the mixture): the paper's SGD and steps
        paper = Options()
        o = dataclasses.replace(o, optimizer="sgd", lr0=paper.lr0, drop_every=paper.drop_every,
                                tol_elbo=None, warm_start="none")
        fallback = (f"the {family.name} family has no Fisher diagonal: the paper's SGD steps "
                    f"were used")
    if o.optimizer == "natural" and o.scale_param != "log":
        raise ValueError("mlmcvi option optimizer='natural' needs scale_param='log' (its "
                         "coordinates are then the family's own, whose Fisher diagonal it uses); "
                         "profile='paper' for the paper's SGD")
    sched = o.schedule
    seeds = np.asarray(jax.random.randint(purpose_key(key, 0, "gradient"), (3,), 0, 2 ** 31 - 1))
    # a family whose estimator brings its own multilevel gradient (the mixture's RB gradient);
    # else the Gaussian families' reparameterized MLRG
    own_levels = getattr(context.estimator, "multilevel", None)
    if own_levels is not None:
        mlrg = own_levels(target, seed=int(seeds[0]), scale_param=o.scale_param,
                          truncate=o.truncate, max_fail=o.max_failed, snr_every=o.snr_every)
        coords = mlrg.coords
    else:
        coords = Coordinates(family, o.scale_param)
        mlrg = MultilevelGradient(target, coords, truncate=o.truncate, max_fail=o.max_failed)
    rng = np.random.default_rng(int(seeds[0]))
    snr_rng = np.random.default_rng(int(seeds[1]))
    eval_rng = np.random.default_rng(int(seeds[2]))
    kind = "rqmc" if o.estimator == "rqmc" else "mc"
    draw = noise_source(rng, kind, family.base_dim)
    snr_draw = noise_source(snr_rng, kind, family.base_dim)
    T = o.max_iters
    baseline_n = o.baseline_draws or equal_cost_draws(sched, o.n0, T)
    ratio = cost_ratio(sched, o.n0, T)
    if o.estimator == "mlmc" and o.warn_cost and ratio > 1.0 and o.restart_every is None:
        warnings.warn(f"mlmcvi: this schedule ({o.scheduler}, beta={o.beta:g}, "
                      f"r={o.drop_every}, T={T}) costs {ratio:.2f}x plain MC with N = N_0 = "
                      f"{o.n0} (docs/mlmcvi.md#cost: MLMC is cheaper only when the mean of eta "
                      f"over the run is below about 1/2)", StanviWarning, stacklevel=3)

    mu0, init_source = context.initial_mean(o.init)
    params0 = np.asarray(family.initial_params(mu0, o.log_scale0), dtype=float)
    ledger = MLMCLedger()
    start_info: dict = {}
    if o.warm_start == "laplace" and target is not None and own_levels is None:
        params0, start_info = laplace_start(target, family, context.estimator, mu0, params0,
                                            key=purpose_key(key, 0, "init"), ledger=ledger,
                                            log_scale0=o.log_scale0,
                                            point=context.laplace_point)
    theta0 = coords.from_family(params0)
    trace = Trace(compile_clock=compile_clock(context.estimator))
    eval_eps = eval_rng.standard_normal((o.elbo_draws, family.base_dim))
    est = context.estimator

    def evaluate(params: np.ndarray, seconds: float) -> dict[str, float]:
        """The ELBO row at ``params``; ``eval_time``: the monitoring's seconds so far."""
        t0 = time.perf_counter()
        vals = np.asarray(est.values(params, eval_eps))
        ledger.monitor_log_density += len(vals)
        finite = np.isfinite(vals)
        elbo = float(vals.mean()) if finite.all() else -np.inf
        se = float(vals.std(ddof=1) / math.sqrt(len(vals))) if finite.all() and len(vals) > 1 \
            else np.nan
        return {"elbo": elbo, "elbo_se": se, "eval_time": seconds + time.perf_counter() - t0}

    def certify(params: np.ndarray) -> float:
        eps = eval_rng.standard_normal((CERTIFY_DRAWS, family.base_dim))
        gain = natural_gain(est, family, params, eps)
        ledger.gradient(CERTIFY_DRAWS)
        return gain

    first = evaluate(params0, 0.0)
    trace.record(0, params0, ledger, t=-1, **first)

    def charge(stats) -> int:
        """Charges a level's draws to the ledger; returns the redrawn ones."""
        used = stats.evaluated - stats.redrawn
        ledger.gradient(used)
        if stats.redrawn:
            ledger.redrawn(stats.redrawn)
        return stats.redrawn

    def snr_row(state: State, t: int, n: int, restart: bool) -> dict[str, float]:
        """The replicate variance and SNR row; ``seconds``: the monitoring's so far after it."""
        t0 = time.perf_counter()
        if o.estimator == "mlmc" and t >= 1 and not restart:
            reps, evaluated = replicate_estimates(
                target, coords, theta=state.theta, theta_prev=state.theta_prev, base=state.G,
                draw=snr_draw, n=n, reps=o.snr_reps, truncate=o.truncate)
        else:
            reps, evaluated = replicate_estimates(
                target, coords, theta=state.theta, theta_prev=None, base=None, draw=snr_draw,
                n=n, reps=o.snr_reps, truncate=o.truncate)
        ledger.monitor_gradient += evaluated
        return {**variance_and_snr(reps),
                "seconds": state.watch.eval_seconds + time.perf_counter() - t0}

    def step(state: State, k: int) -> StepOutcome:
        t = k - 1                                   # the paper's iteration / level
        eta = sched.eta(t)
        alpha = o.lr0 * eta
        restart = False
        watch = state.watch
        row: dict[str, Any] = {"t": t, "eta": eta, "alpha": alpha}
        if o.snr_every is not None and t % o.snr_every == 0:
            if o.estimator == "mlmc":
                n_snr = o.n0 if t == 0 or (o.restart_every and t % o.restart_every == 0) \
                    else sample_size(sched, t, o.n0)
            else:
                n_snr = baseline_n
            snr = snr_row(state, t, n_snr,
                          bool(o.restart_every and t >= 1 and t % o.restart_every == 0))
            watch = watch._replace(eval_seconds=snr.pop("seconds"))
            row.update(snr)
        try:
            if o.estimator != "mlmc":
                stats = mlrg.plain(state.theta, draw, baseline_n) if own_levels is not None \
                    else plain_level(target, coords, state.theta, draw, baseline_n,
                                     truncate=o.truncate, max_fail=o.max_failed)
                G = stats.mean
                row.update(N=baseline_n, level_var=stats.var, cond_var=stats.cond_var,
                           acc_var=stats.cond_var)
            else:
                if t == 0 or (o.restart_every is not None and t % o.restart_every == 0):
                    restart = t > 0
                    stats = mlrg.start(state.theta, draw, o.n0)
                    watch = watch._replace(restarts=watch.restarts + int(restart))
                    n_t = o.n0
                else:
                    n_t = sample_size(sched, t, o.n0)
                    stats = mlrg.add_level(state.theta, state.theta_prev, draw, n_t)
                G = mlrg.G
                row.update(N=n_t, level_var=stats.var, cond_var=stats.cond_var,
                           acc_var=mlrg.acc, restart=restart)
        except GradientFailure as exc:
            ledger.gradient(exc.evaluated)
            return StepOutcome(state._replace(watch=watch), None,
                               ("failed", f"mlmcvi: {exc} at iteration {t}"))
        watch = watch._replace(redrawn=watch.redrawn + charge(stats))
        if not np.all(np.isfinite(G)):
            return StepOutcome(state._replace(watch=watch), None, (
                "failed", f"non-finite gradient estimate at iteration {t} (lr0 too large?)"))
        new_theta, adam = optimizer_step(
            o.optimizer, state.theta, G, alpha, state.adam,
            family.metric_scale(state.params) if o.optimizer == "natural" else None)
        new_params = coords.to_family(new_theta)
        if not np.all(np.isfinite(new_params)) or divergence(family, new_params):
            return StepOutcome(state._replace(watch=watch), None, (
                "failed", f"the iterate ran away at iteration {t} (lr0 {o.lr0:g} too large?)"))
        step_norm = float(np.linalg.norm(new_theta - state.theta))
        row.update(grad_norm=float(np.linalg.norm(G)), step_norm=step_norm)
        if o.estimator == "mlmc" and o.scale_param == "log" and mlrg.acc_coord is not None \
                and watch.collapse_t is None:
            sd = np.sqrt(np.nan_to_num(mlrg.acc_coord[coords.scale_index()]))
            if sd.max() > 1.0 / 3.0:
                watch = watch._replace(collapse_t=t)
                warnings.warn(f"mlmcvi: the accumulated gradient error of a log-scale "
                              f"coordinate has s.d. {sd.max():.2f} > 1/3 at iteration {t}: its "
                              f"scale may collapse (docs/mlmcvi.md#scale-collapse); consider "
                              f"restart_every=100, scale_param='direct' or a larger n0",
                              StanviWarning, stacklevel=4)
        stop = None
        if k % o.elbo_every == 0 or k == T + 1:
            row.update(evaluate(new_params, watch.eval_seconds))
            watch = watch._replace(eval_seconds=row["eval_time"])
            if o.tol_elbo is not None:
                stop, watch = _elbo_rule(o, t, row["elbo"], new_params, watch, certify)
        if o.tol is not None and stop is None:
            scale = 1.0 + float(np.max(np.abs(state.theta)))
            watch = watch._replace(calm=watch.calm + 1 if float(np.max(np.abs(
                new_theta - state.theta))) < o.tol * scale else 0)
            if watch.calm >= o.patience:
                stop = ("converged", f"parameter change below tol={o.tol:g} for "
                        f"{o.patience} iterations")
        return StepOutcome(State(new_params, new_theta, state.theta, G.copy(), adam, watch), row,
                           stop)

    state0 = State(params0, theta0, theta0, None, watch=Watch(eval_seconds=first["eval_time"]))
    state, k, status, message = iterate(step, state0, max_iters=T + 1, trace=trace,
                                        ledger=ledger, context=context)
    if status == "max_iters" and k == T + 1 and not message.startswith("the ELBO fell"):
        message = f"reached level T={T} ({T + 1} updates)"
    watch = state.watch
    if len(trace.rows) > 1 and "elbo" not in trace.rows[-1]:
        trace.rows[-1].update(evaluate(state.params, watch.eval_seconds))
        watch = watch._replace(eval_seconds=trace.rows[-1]["eval_time"])
    info = {**start_info, **({"optimizer_fallback": fallback} if fallback else {}),
            "estimator": o.estimator, "scale_param": o.scale_param,
            "init": init_source,
            "n0": o.n0, "scheduler": o.scheduler, "beta": o.beta, "drop_every": o.drop_every,
            "lr0": o.lr0, "optimizer": o.optimizer, "restarts": watch.restarts,
            "eval_seconds": watch.eval_seconds, "redrawn_draws": watch.redrawn,
            "planned_cost": mlmc_cost(sched, o.n0, T) if o.estimator == "mlmc"
            else baseline_n * (T + 1),
            "cost_ratio_vs_mc_n0": ratio, "low_cost_ok": low_cost_ok(sched, o.n0, T),
            "gradient_draws": ledger.gradient_draws}
    if o.estimator != "mlmc":
        info["baseline_draws"] = baseline_n
    else:
        info["accumulated_error_var"] = mlrg.acc
        if watch.collapse_t is not None:
            info["collapse_risk_iteration"] = watch.collapse_t
    if status == "failed" and not np.all(np.isfinite(state.params)):
        raise VIError(f"mlmcvi: {message}")
    params = state.params
    best = watch.best
    if best is not None and best[0] > trace.rows[-1].get("elbo", -np.inf) and status != "failed":
        params = best[1]   # the ELBO rule keeps the best evaluated iterate
        info["best_elbo"] = best[0]
    return MethodResult(params=params, trace=trace, ledger=ledger, status=status,
                        message=message, info=info)
