"""jointcv: doubly-stochastic VI with the joint control variate (Wang, Geffner & Domke,
*Joint control variate for faster black-box variational inference*, AISTATS 2024;
docs/jointcv.md).

Each iteration draws a minibatch B of b distinct terms (data, or blocks of rows for a Stan model,
docs/jointcv.md#block-scheme) by reshuffling every epoch, and one ε (shared by the batch,
docs/jointcv.md#minibatches), forms an estimate of ∇(−ELBO) with the chosen estimator
(``naive``, ``cv``, ``joint`` in SAGA or SVRG form, ``inc``; :mod:`stanvi.estimators.subsampled`)
and takes one optimizer step (SGD without momentum, or Adam).  Table-based estimators
(joint-SAGA, inc) first run ``warmup_epochs`` epochs of the naive estimator that fill the table
(paper Alg. 1, docs/jointcv.md#table); the warm-up iterations count towards ``max_iters``
(docs/jointcv.md#defaults).

The trace has a row per iteration; every ``elbo_every`` iterations (and at the end) it records a
full-data ELBO estimate from ``elbo_draws`` fixed draws (common random numbers along the run)
and the seconds spent on these evaluations (``eval_time``, part of ``wall_time``: subtract it for
the algorithm's own time).  Oracle calls are counted per term: ``term_gradients``,
``term_hvps``, ``full_gradients``; the scaled figure (``oracle_scaled``, used by
``max_oracle_calls``) is the number of full-data passes, an HVP costing two gradients.

The method stops at ``max_iters`` (the paper has no convergence test) or at the budget; a
non-finite estimate or a runaway scale ends it as 'failed' with the last finite iterate.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from stanvi.errors import ModelEvaluationError, VIError
from stanvi.estimators.registry import SUBSAMPLED_ESTIMATORS, make_estimator
from stanvi.lazy_jax import jax
from stanvi.methods.base import (MethodResult, OracleLedger, RunContext, StepOutcome, Trace,
                                 iterate, purpose_key)
from stanvi.methods.checks import divergence
from stanvi.optim.first_order import AdamState, adam_update, heavy_ball


@dataclass(frozen=True)
class Options:
    """jointcv options (docs/jointcv.md#defaults).  Tags: [P] the paper (Wang, Geffner & Domke
    2024), [S] stanvi's resolution of an ambiguity in the paper, docs/jointcv.md#paper-fixes,
    [C] stanvi's choice; a ``#name`` is the anchor of that name in docs/jointcv.md."""

    estimator: str = "joint"            # 'naive' | 'cv' | 'joint' | 'inc' [P §5]
    variant: str = "saga"               # joint's form: 'saga' (table) | 'svrg' (snapshot) [P App. B]
    batch_size: int | None = None       # terms per iteration; None: 5 when there are at most
                                        # 1,000 terms, else 100 [P Table 1 settings]
    optimizer: str = "sgd"              # 'sgd' (Sonar, Australian) | 'adam' (large tasks) [P §5]
    learning_rate: float | None = None  # None: 5e-4 for SGD, 1e-2 for Adam [P Table 1 settings]
    momentum: float = 0.0               # SGD momentum: none [P; the code's 0.9, S #unstated]
    max_iters: int = 5000               # warm-up included [C, #defaults]
    warmup_epochs: int = 1              # naive epochs filling the table [P Alg. 1; 3 for PPCA+SGD]
    hvp_scale: str | None = None        # None: 'table' (mean-field) [P], 'current' [C, #full-rank]
    svrg_period: int | None = None      # snapshot period; None: an epoch [P App. B; S #svrg-period]
    cache_grads: bool = True            # keep ∇k_n(μⁿ) in the table [C, #table]
    per_datum_eps: bool = False         # one ε per term instead of one per batch [C, #minibatches]
    init: str = "paper"                 # 'paper': μ, ω ~ N(0, 1) [P]; 'code': μ ~ N(0, 0.01²),
                                        # ω = 0.001 [official code]; 'zero'; 'random' (Stan's)
    log_scale0: float = 0.0             # ω₀ for init 'zero' / 'random' / a user init [C]
    elbo_every: int = 100               # full-data ELBO every this many iterations [official code]
    elbo_draws: int = 1000              # draws per ELBO estimate [C; the paper used 5000]
    n_blocks: int | None = None         # Stan models: blocks M; None: min(N, 1000) [C:
                                        # a block of ~10-1000 rows, #block-scheme]
    obs_var: str | None = None          # Stan models: the observation-count variable; None:
                                        # inferred (docs/jointcv.md#block-scheme)
    threads: int | None = None          # Stan models: threads for the block calls
    fullrank_diagonal: str = "log"      # full-rank parameterization [C]

    def __post_init__(self) -> None:
        for name, choices in (("estimator", SUBSAMPLED_ESTIMATORS), ("variant", ("saga", "svrg")),
                              ("optimizer", ("sgd", "adam")),
                              ("init", ("paper", "code", "zero", "random")),
                              ("fullrank_diagonal", ("log", "stan"))):
            if getattr(self, name) not in choices:
                raise ValueError(f"jointcv option {name}={getattr(self, name)!r} is not one of "
                                 f"{list(choices)}")
        if self.hvp_scale not in (None, "table", "current"):
            raise ValueError(f"jointcv option hvp_scale={self.hvp_scale!r} is not one of "
                             "[None, 'table', 'current']")
        for name in ("batch_size", "svrg_period", "n_blocks", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"jointcv option {name} must be >= 1, got {value}")
        if self.warmup_epochs < 0 or self.max_iters < 1 or self.elbo_every < 1 \
                or self.elbo_draws < 1:
            raise ValueError("jointcv options warmup_epochs >= 0, max_iters, elbo_every and "
                             "elbo_draws >= 1 are required")

    @property
    def step_size(self) -> float:
        if self.learning_rate is not None:
            return self.learning_rate
        return 5e-4 if self.optimizer == "sgd" else 1e-2


PROFILES: dict[str, dict] = {
    "paper": {},                                     # SGD, lr 5e-4, b 5: Sonar/Australian
    "adam": {"optimizer": "adam"},                   # Adam, lr 1e-2: the large tasks
}
DEFAULT_PROFILE = "paper"
ESTIMATOR = "reparameterization"   # for the output draws and Fit.elbo(); the method's own
                                   # estimators come from stanvi.estimators.subsampled


# ---------------------------------------------------------------------------- pieces
@dataclass
class DataLedger(OracleLedger):
    """Oracle calls of a subsampled run, per term (issue 11): term gradients, term HVPs and
    full-data gradients; ``scaled`` counts full-data passes (a term gradient is 1/N of one, a
    term HVP 2/N, docs/jointcv.md#cost)."""

    n_terms: int = 1
    term_gradients: int = 0
    term_hvps: int = 0
    full_gradients: int = 0

    def charge(self, before: dict[str, int], after: dict[str, int]) -> None:
        dg = after["term_gradient"] - before["term_gradient"]
        dh = after["term_hvp"] - before["term_hvp"]
        df = after["full_gradient"] - before["full_gradient"]
        self.term_gradients += dg
        self.term_hvps += dh
        self.full_gradients += df
        self.scaled += (dg + 2 * dh) / self.n_terms + df
        self.literal += dg + 2 * dh + self.n_terms * df

    def snapshot(self) -> dict[str, float]:
        return {**super().snapshot(), "term_gradients": self.term_gradients,
                "term_hvps": self.term_hvps, "full_gradients": self.full_gradients}


class OptimizerState(NamedTuple):
    """SGD's heavy-ball velocity (None before the first step, or without momentum) and Adam's
    moments (:mod:`stanvi.optim.first_order`)."""

    velocity: np.ndarray | None = None
    adam: AdamState = AdamState()


def optimizer_step(kind: str, lr: float, momentum: float, params: np.ndarray, g: np.ndarray,
                   opt: OptimizerState) -> tuple[np.ndarray, OptimizerState]:
    """One step of SGD (``kind`` 'sgd', optional heavy-ball momentum) or Adam with optax's
    defaults, in NumPy on the host: (new parameters, the optimizer's next state)."""
    if kind == "sgd":
        if momentum:
            g = heavy_ball(g, opt.velocity, momentum)
            opt = opt._replace(velocity=g)
        return params - lr * g, opt
    update, adam = adam_update(g, opt.adam, lr)
    return params + update, opt._replace(adam=adam)


class Epoch(NamedTuple):
    """Where the minibatch schedule stands: the epoch's permutation (None before the first
    batch), the position in it and the number of epochs completed."""

    perm: np.ndarray | None = None
    pos: int = 0
    epoch: int = 0


def next_batch(n: int, b: int, rng: np.random.Generator, at: Epoch
               ) -> tuple[np.ndarray, bool, Epoch]:
    """The next minibatch by reshuffling every epoch (docs/jointcv.md#minibatches), the last
    batch of an epoch smaller when b does not divide N: (sorted indices, whether the epoch
    ended, the schedule's next position)."""
    perm, pos = at.perm, at.pos
    if perm is None or pos >= n:
        perm, pos = rng.permutation(n), 0
    idx = perm[pos:pos + b]
    pos += b
    end = pos >= n
    return np.sort(idx), end, Epoch(perm, pos, at.epoch + int(end))


class State(NamedTuple):
    """The run's state between iterations (the estimator keeps its own table)."""

    params: np.ndarray
    optimizer: OptimizerState = OptimizerState()
    schedule: Epoch = Epoch()
    warmup: bool = False
    eval_seconds: float = 0.0


def subsampled_target(target, options: Options, seed: int):
    """The per-term view of ``target``: itself for a per-datum JAX target, the block target of
    docs/jointcv.md#block-scheme for a Stan model with data; otherwise a VIError saying what is
    needed."""
    if hasattr(target, "term_gradients") and hasattr(target, "n_terms"):
        return target
    if hasattr(target, "library_path") and hasattr(target, "data_json"):
        from stanvi.targets.stan_blocks import StanBlockTarget  # noqa: PLC0415

        return StanBlockTarget.from_target(target, n_blocks=options.n_blocks,
                                           obs_var=options.obs_var, seed=seed,
                                           threads=options.threads)
    raise VIError(f"jointcv needs data to subsample: a Stan model with data (split into blocks) "
                  f"or a stanvi.targets.subsampled.JaxPerDatumTarget; {target!r} is a plain log "
                  f"density (use method='trustvi' or 'advi')")


def initial_params(family, options: Options, context: RunContext, rng: np.random.Generator
                   ) -> tuple[np.ndarray, str]:
    d = family.dim
    if context.init_mu is None and options.init in ("paper", "code"):
        if options.init == "paper":   # all parameters standard Gaussian [P §5]
            mu, omega = rng.standard_normal(d), rng.standard_normal(d)
        else:                         # the official code
            mu, omega = 0.01 * rng.standard_normal(d), np.full(d, 0.001)
        return family.diagonal_params(mu, omega), options.init
    mu0, source = context.initial_mean(options.init if options.init in ("zero", "random")
                                       else "zero")
    return np.asarray(family.initial_params(mu0, options.log_scale0), dtype=float), source


def full_data_elbo(target, family, params: np.ndarray, eps: np.ndarray, n_terms: int
                   ) -> tuple[float, float]:
    """(ELBO, its standard error) from the full-data log density at z = T_w(ε) for the fixed
    draws ``eps`` (S, d), in chunks keeping S·N below ~10⁷ values, plus q's entropy."""
    from stanvi.estimators.subsampled import noise  # noqa: PLC0415

    z = params[: family.dim] + noise(family, params, eps)
    chunk = max(1, min(len(z), 10_000_000 // max(n_terms, 1)))
    lp = np.concatenate([np.asarray(target.log_density(z[i:i + chunk]).log_density)
                         for i in range(0, len(z), chunk)])
    entropy = float(family.entropy(params))
    return float(lp.mean() + entropy), float(lp.std(ddof=1) / math.sqrt(len(lp)))


# ---------------------------------------------------------------------------- the method
def run(target, family, *, key: jax.Array, options: Options, context: RunContext) -> MethodResult:
    o = options
    seeds = np.asarray(jax.random.randint(purpose_key(key, 0, "init"), (3,), 0, 2 ** 31 - 1))
    sub = subsampled_target(target, o, int(seeds[0]))
    n = sub.n_terms
    b = min(o.batch_size or (5 if n <= 1000 else 100), n)
    rng = np.random.default_rng(int(seeds[1]))
    eval_rng = np.random.default_rng(int(seeds[2]))
    est_opts: dict[str, Any] = {"hvp_scale": o.hvp_scale, "cache_grads": o.cache_grads,
                                "svrg_period": o.svrg_period or math.ceil(n / b)}
    if o.estimator == "joint":
        est_opts["variant"] = o.variant
    try:
        est = make_estimator(o.estimator, sub, family, **est_opts)
    except ValueError as exc:
        raise VIError(f"jointcv: {exc}") from None
    if o.per_datum_eps and o.estimator == "inc":
        raise VIError("jointcv: the inc estimator needs one ε per batch (per_datum_eps=False)")
    params, init_source = initial_params(family, o, context, rng)
    ledger = DataLedger(n_terms=n)
    trace = Trace()
    eval_eps = eval_rng.standard_normal((o.elbo_draws, family.base_dim))

    def evaluate(p: np.ndarray, seconds: float) -> dict[str, float]:
        """The full-data ELBO row at ``p``; ``eval_time``: the evaluations' seconds so far."""
        t0 = time.perf_counter()
        elbo, se = full_data_elbo(sub.full, family, p, eval_eps, n)
        return {"elbo": elbo, "elbo_se": se, "eval_time": seconds + time.perf_counter() - t0}

    first = evaluate(params, 0.0)
    trace.record(0, params, ledger, phase="init", epoch=0, **first)
    warmup_iters = 0
    if est.uses_table:
        if o.warmup_epochs == 0:
            before = sub.terms.snapshot()
            est.start(params)
            ledger.charge(before, sub.terms.snapshot())
        else:
            warmup_iters = o.warmup_epochs * math.ceil(n / b)

    def step(state: State, k: int) -> StepOutcome:
        idx, epoch_end, schedule = next_batch(n, b, rng, state.schedule)
        eps = rng.standard_normal((len(idx), family.base_dim) if o.per_datum_eps
                                  else family.base_dim)
        before = sub.terms.snapshot()
        try:
            if state.warmup:
                g = est.warmup_gradient(state.params, idx, eps)
            else:
                g = est.gradient(state.params, idx, eps)
        except ModelEvaluationError as exc:
            ledger.charge(before, sub.terms.snapshot())
            return StepOutcome(state, None, ("failed", f"the model failed at iteration {k}: {exc}"))
        ledger.charge(before, sub.terms.snapshot())
        row: dict[str, Any] = {"phase": "warmup" if state.warmup else "main",
                               "epoch": schedule.epoch}
        warmup = state.warmup
        if warmup and k >= warmup_iters:
            est.finish_warmup()
            warmup = False
        elif epoch_end and not warmup:
            est.end_epoch()
        if not np.all(np.isfinite(g)):
            return StepOutcome(state, None, ("failed", f"non-finite gradient estimate at "
                                             f"iteration {k} (step size too large?)"))
        new, optimizer = optimizer_step(o.optimizer, o.step_size, o.momentum, state.params, g,
                                        state.optimizer)
        if not np.all(np.isfinite(new)) or divergence(family, new):
            return StepOutcome(state, None, ("failed", f"the iterate ran away at iteration {k} "
                                             f"(step size {o.step_size:g} too large?)"))
        row["grad_norm"] = float(np.linalg.norm(g))
        seconds = state.eval_seconds
        if k % o.elbo_every == 0 or k == o.max_iters:
            row.update(evaluate(new, seconds))
            seconds = row["eval_time"]
        return StepOutcome(State(new, optimizer, schedule, warmup, seconds), row)

    state0 = State(params, warmup=warmup_iters > 0, eval_seconds=first["eval_time"])
    state, k, status, message = iterate(step, state0, max_iters=o.max_iters, trace=trace,
                                        ledger=ledger, context=context)
    eval_seconds = state.eval_seconds
    if trace.rows[-1]["iteration"] != 0 and "elbo" not in trace.rows[-1]:
        trace.rows[-1].update(evaluate(state.params, eval_seconds))
        eval_seconds = trace.rows[-1]["eval_time"]
    info = {"estimator": est.name, "n_terms": n, "batch_size": b, "step_size": o.step_size,
            "warmup_iterations": warmup_iters, "init": init_source,
            "epochs": state.schedule.epoch, "eval_seconds": eval_seconds,
            "term_gradients": ledger.term_gradients,
            "term_hvps": ledger.term_hvps, "full_gradients": ledger.full_gradients}
    if hasattr(sub, "describe"):
        info["blocks"] = sub.describe()
    return MethodResult(params=state.params, trace=trace, ledger=ledger, status=status,
                        message=message, info=info)
