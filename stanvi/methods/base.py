"""What every method shares (docs/architecture.md#conventions; docs/algorithms.md#oracle-calls,
#random-keys, #trustvi-stopping):
oracle accounting (:class:`OracleLedger`), the iteration trace (:class:`Trace`), random-key
purposes (:func:`purpose_key`), the run context a method receives besides its options
(:class:`RunContext`: initial point, budget, progress, the ELBO estimator) and the result a method
returns (:class:`MethodResult`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable, NamedTuple

import numpy as np

from stanvi.estimators.elbo import ElboEstimator
from stanvi.estimators.keys import HostKey
from stanvi.lazy_jax import jax
from stanvi.lazy_jax import jit as lazy_jit
from stanvi.progress import IterationProgress

# Oracle prices of the TrustVI paper (Regier et al. 2017, §5; docs/algorithms.md#oracle-calls):
# a 256-draw gradient = 1, an 85-draw HVP = 2,
# a 128-draw ELBO-change estimate = 1.
GRADIENT_BATCH = 256
HVP_BATCH = 85
CHANGE_BATCH = 128

# Purposes of random draws; each iteration derives one independent key per purpose
# (docs/algorithms.md#random-keys).
PURPOSES = {"gradient": 0, "hessian": 1, "change": 2, "elbo": 3, "output": 4, "init": 5,
            "refine": 6, "check": 7}


@lazy_jit
def _fold_in_twice(key: jax.Array, iteration, purpose) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(key, iteration), purpose)


def purpose_key(key: jax.Array, iteration: int, purpose: str) -> jax.Array:
    """The key for one purpose in one iteration: never shared between roles
    (docs/algorithms.md#random-keys).
    (From Python, one jitted call: two eager ``fold_in`` dispatches cost ~1.5 ms; inside traced
    code, e.g. ADVI's compiled chunk, the plain function.)"""
    if isinstance(key, HostKey):
        return HostKey(key.seed, key.path + (int(iteration), PURPOSES[purpose]))
    if isinstance(iteration, jax.core.Tracer):
        return jax.random.fold_in(jax.random.fold_in(key, iteration), PURPOSES[purpose])
    return _fold_in_twice(key, np.uint32(iteration), np.uint32(PURPOSES[purpose]))


def compile_clock(estimator) -> Callable[[], float] | None:
    """The estimator's cumulative JAX compile seconds as a clock for :class:`Trace`; None for
    stand-in estimators (tests) that do not compile."""
    if not hasattr(estimator, "compile_seconds"):
        return None
    return lambda: estimator.compile_seconds


@dataclass
class OracleLedger:
    """Oracle calls in the paper's units (scaled by draws, and literal per call) and draw-level
    evaluation counts (docs/algorithms.md#oracle-calls).  ``scaled`` is the primary figure."""

    scaled: float = 0.0
    literal: float = 0.0
    gradient_draws: int = 0
    hvp_draws: int = 0
    log_density_draws: int = 0
    screening_draws: int = 0
    redrawn_draws: int = 0

    def gradient(self, n_draws: int) -> None:
        self.scaled += n_draws / GRADIENT_BATCH
        self.literal += 1
        self.gradient_draws += n_draws

    def gradient_paths(self, evaluations) -> None:
        """The gradients of optimizer paths run side by side (``evaluations``: each path's):
        one literal call per round, as many as the longest path has evaluations."""
        evaluations = [int(n) for n in evaluations]
        self.scaled += sum(evaluations) / GRADIENT_BATCH
        self.literal += max(evaluations, default=0)
        self.gradient_draws += sum(evaluations)

    def hvp(self, n_draws: int, applications: int = 1) -> None:
        self.scaled += 2.0 * applications * n_draws / HVP_BATCH
        self.literal += 2 * applications
        self.hvp_draws += n_draws * applications

    def elbo_change(self, n_pairs: int) -> None:
        if n_pairs > 0:
            self.scaled += n_pairs / CHANGE_BATCH
            self.literal += 1
            self.log_density_draws += 2 * n_pairs

    def screening(self, n_draws: int) -> None:
        """Log densities evaluated only to screen out failing draws (not an oracle call in the
        paper's accounting, which charges nothing for redrawn draws,
        docs/algorithms.md#oracle-calls; counted as draws)."""
        self.screening_draws += n_draws

    def redrawn(self, n_draws: int) -> None:
        """Gradient draws evaluated beyond the ones a gradient uses: failed draws and the rest of
        the batch drawn to replace them (Stan's drop-and-redraw).  Not an oracle call in the
        paper's accounting (nothing is charged for redrawn draws,
        docs/algorithms.md#oracle-calls); counted as draws."""
        self.redrawn_draws += int(n_draws)

    def model_evaluations(self) -> dict[str, int]:
        """The draw-level model evaluations charged so far, by the kind of model call the target
        counts (:class:`~stanvi.targets.base.OracleCounter`): log densities (priced and
        screening), gradients (used and redrawn), HVPs.  Every evaluation a method makes is
        charged to its ledger, so over a run this equals the target counter's growth
        (``Fit.info['model_evaluations']``; ``tests/methods/test_oracle_accounting.py``)."""
        return {"log_density": self.log_density_draws + self.screening_draws,
                "gradient": self.gradient_draws + self.redrawn_draws, "hvp": self.hvp_draws}

    def elbo_estimate(self, n_draws: int) -> None:
        """An ELBO estimate that is part of the algorithm (ADVI's checks): priced like an
        ELBO-change estimate of the same size (docs/algorithms.md#oracle-calls)."""
        self.scaled += n_draws / CHANGE_BATCH
        self.literal += 1
        self.log_density_draws += n_draws

    def absorb(self, other: OracleLedger) -> None:
        """Adds ``other``'s charges: work done for the method before its run (the Laplace point
        of :func:`stanvi.methods.warm_start.laplace_point`) joins its ledger when used."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def snapshot(self) -> dict[str, float]:
        return {"oracle_scaled": self.scaled, "oracle_literal": self.literal,
                "gradient_draws": self.gradient_draws, "hvp_draws": self.hvp_draws,
                "log_density_draws": self.log_density_draws,
                "screening_draws": self.screening_draws, "redrawn_draws": self.redrawn_draws}


@dataclass
class Trace:
    """Per-iteration records: method fields plus the ledger and wall time at that point, and the
    iterate after the iteration (needed for evaluation ELBOs,
    docs/algorithms.md#benchmark-protocol).  Row 0 is the initial
    iterate.

    Iterates are kept for every row up to ``keep_all`` rows and then on a geometric schedule
    (each kept iteration at least ``1 + keep_growth`` times the previous one), so a 10,000-
    iteration ADVI run keeps about 1,100 copies, not 10,000 (a full-rank D = 100 iterate is
    40 kB).  ``params[i]`` is None for a row whose iterate was not kept.

    The kept copies are also capped in bytes (``keep_bytes``, default 256 MB; issue 17 item 6:
    a full-rank D = 2,000 iterate is 16 MB, and 1,100 of them were 17.6 GB): when the kept
    iterates would exceed it, only rows at multiples of a stride are kept, the stride doubling
    (and the kept rows thinned to it) each time the cap is reached.  Row 0 and the latest
    iterate are always available.  Below the cap nothing changes.

    ``compile_clock`` (the estimator's cumulative JAX compile seconds) adds a ``compile_time``
    column, the compilation part of ``wall_time`` since the start, so that benchmarks can report
    run time apart from one-off compilation of new batch shapes.
    """

    rows: list[dict[str, Any]] = field(default_factory=list)
    params: list[np.ndarray | None] = field(default_factory=list)
    start: float = field(default_factory=time.perf_counter)
    keep_all: int = 1000
    keep_growth: float = 0.02
    keep_bytes: int = 256 * 2**20
    _next_keep: int = 0
    _stride: int = 1
    _n_kept: int = 0
    _last: np.ndarray | None = None
    compile_clock: Callable[[], float] | None = None
    _compile0: float = 0.0

    def __post_init__(self) -> None:
        self._compile0 = self.compile_clock() if self.compile_clock else 0.0

    def record(self, iteration: int, params: np.ndarray, ledger: OracleLedger, **fields: Any) -> None:
        row = {"iteration": iteration, "wall_time": time.perf_counter() - self.start,
               **ledger.snapshot(), **fields}
        if self.compile_clock is not None:
            row["compile_time"] = self.compile_clock() - self._compile0
        n = len(self.rows)
        self.rows.append(row)
        if (n < self.keep_all or n >= self._next_keep) and n % self._stride == 0:
            self.params.append(np.array(params, dtype=float, copy=True))
            self._n_kept += 1
            self._next_keep = max(n + 1, int(np.ceil(n * (1.0 + self.keep_growth))))
            self._thin(self.params[-1].nbytes)
        else:
            self.params.append(None)
        self._last = np.array(params, dtype=float, copy=True)  # the latest iterate, always

    def _thin(self, nbytes: int) -> None:
        """Keep the copies within ``keep_bytes`` (class docstring): double the stride and drop
        the kept iterates off it until they fit (row 0 and at least one more stay)."""
        cap = max(2, self.keep_bytes // max(nbytes, 1))
        while self._n_kept > cap:
            self._stride *= 2
            for i, p in enumerate(self.params):
                if p is not None and i % self._stride:
                    self.params[i] = None
                    self._n_kept -= 1

    def kept_rows(self) -> np.ndarray:
        """Indices of the rows whose iterate was kept (the last row included)."""
        idx = [i for i, p in enumerate(self.params) if p is not None]
        if self.rows and (not idx or idx[-1] != len(self.rows) - 1):
            idx.append(len(self.rows) - 1)
        return np.array(idx, dtype=int)

    def params_at(self, row: int) -> np.ndarray:
        """The iterate after row ``row`` (raises if it was not kept)."""
        if row == len(self.rows) - 1:
            return self._last
        p = self.params[row]
        if p is None:
            raise KeyError(f"the iterate of trace row {row} was not kept")
        return p

    def column(self, name: str) -> np.ndarray:
        return np.array([r.get(name, np.nan) for r in self.rows], dtype=float)

    def __len__(self) -> int:
        return len(self.rows)


class StepOutcome(NamedTuple):
    """What one iteration of a method returns to :func:`iterate`.

    ``state``: the method's state after the iteration (its own NamedTuple; ``state.params`` is
    the iterate); ``row``: the trace fields of the iteration, or None when the iteration was
    aborted before it produced one (a failed gradient: no row, ``stop`` says why); ``stop``:
    (status, message) ending the run after this iteration; ``display``: extra fields for the
    progress line (an ``elbo`` there replaces the row's)."""

    state: Any
    row: dict[str, Any] | None
    stop: tuple[str, str] | None = None
    display: dict[str, float] | None = None


def iterate(step: Callable[[Any, int], StepOutcome], state: Any, *, max_iters: int,
            trace: Trace, ledger: OracleLedger, context: "RunContext",
            start: int = 0) -> tuple[Any, int, str, str]:
    """The loop every host-side method shares (the ``init``/``step`` shape of BlackJAX, with the
    trust region's Python kept host-side): for k = 1 … ``max_iters``, ``step(state, k)``; the
    loop records the trace row, updates the progress line, and ends the run on the step's
    ``stop``, on an aborted step, or when the oracle budget is spent (checked after every
    iteration).  Returns (state, last k, status, message); status 'max_iters' when the loop ran
    out.  A phase that continues an earlier one's trace numbers its iterations from
    ``start`` + 1 (ADVI's SGD after its eta trials)."""
    status, message = "max_iters", f"reached max_iters={max_iters}"
    k = start
    for k in range(start + 1, start + max_iters + 1):
        outcome = step(state, k)
        state = outcome.state
        if outcome.row is None:
            status, message = outcome.stop
            break
        trace.record(k, state.params, ledger, **outcome.row)
        context.progress.update(k, **{"elbo": outcome.row.get("elbo", float("nan")),
                                      "oracle": ledger.scaled, **(outcome.display or {})})
        if outcome.stop is not None:
            status, message = outcome.stop
            break
        if context.over_budget(ledger.scaled):
            status, message = "budget", f"oracle budget {context.max_oracle_calls} spent"
            break
    return state, k, status, message


@dataclass
class MethodResult:
    """What a method's ``run`` returns; :func:`stanvi.fit.fit` turns it into a :class:`Fit`.

    status: 'converged' (the method's stopping rule fired), 'max_iters', 'budget' (oracle budget
    exhausted) or 'failed' (with ``message``; ``params`` is then the last good iterate).
    """

    params: np.ndarray
    trace: Trace
    ledger: OracleLedger
    status: str
    message: str = ""
    info: dict[str, Any] = field(default_factory=dict)


def initial_mean(init_mu: np.ndarray | None, random_init_mu: np.ndarray,
                 rule: str) -> tuple[np.ndarray, str]:
    """μ₀ and where it came from: the caller's ``init_mu`` ('user') when given, else the
    method's ``init`` option ``rule``: 'random' (Stan's uniform(−2, 2) point,
    ``random_init_mu``) or 'zero' (μ₀ = 0, as the TrustVI authors' code starts every method)."""
    if init_mu is not None:
        return np.asarray(init_mu, dtype=float), "user"
    if rule == "random":
        return np.asarray(random_init_mu, dtype=float), "random"
    if rule == "zero":
        return np.zeros(len(random_init_mu)), "zero"
    raise ValueError(f"init must be 'random' or 'zero', got {rule!r}")


@dataclass
class RunContext:
    """Attributes:
        init_mu: initial mean in unconstrained space (D,), or None for the method's own rule
            (then ``random_init_mu`` gives Stan's uniform(−2, 2) initialization).
        random_init_mu: Stan-style random initial point (uniform(−2, 2), finite density), (D,).
        max_oracle_calls: budget in scaled oracle units (None: unlimited).
        estimator: the compiled ELBO estimator.
        progress: progress display.
        laplace_point: the Laplace warm start's mode and precision when the fit computed them
            before the family was made (the low-rank family's rank,
            :func:`stanvi.methods.warm_start.laplace_point`); the warm start uses them and
            charges their cost to the method's ledger.
    """

    init_mu: np.ndarray | None
    random_init_mu: np.ndarray
    max_oracle_calls: float | None
    estimator: ElboEstimator
    progress: IterationProgress
    laplace_point: Any = None

    def initial_mean(self, rule: str) -> tuple[np.ndarray, str]:
        """μ₀ and where it came from (:func:`initial_mean`)."""
        return initial_mean(self.init_mu, self.random_init_mu, rule)

    def over_budget(self, oracle_scaled: float) -> bool:
        return self.max_oracle_calls is not None and oracle_scaled >= self.max_oracle_calls
