"""The :class:`Fit` result of ``stanvi.fit`` and its :class:`FitTrace` (issue P1-2; the
orchestration is :mod:`stanvi.fit`, the input checks :mod:`stanvi.fit_inputs`;
docs/architecture.md#layers).

A fit holds the variational parameters, draws from the approximation in constrained space by
Stan variable name (transformed parameters and generated quantities included), the unconstrained
draws with log p and log q (for Pareto k-hat), the iteration trace (oracle calls and wall time at
each iteration), the oracle counts by kind and the stopping reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stanvi.estimators.registry import estimator_for
from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.estimators.keys import fold_in, make_key
from stanvi.methods.base import Trace
from stanvi.output.cmdstanpy_accessors import CmdStanPyAccessors, Draws
from stanvi.targets.base import Target


class FitTrace(Trace):
    """A fit's iteration trace (:class:`~stanvi.methods.base.Trace`, one row per iteration, row
    0 the initial iterate) with a short repr and :meth:`to_pandas`."""

    @classmethod
    def from_trace(cls, trace: Trace) -> "FitTrace":
        """The same trace (rows and kept iterates shared, not copied) as a FitTrace."""
        if isinstance(trace, cls):
            return trace
        new = object.__new__(cls)
        new.__dict__.update(trace.__dict__)
        return new

    def columns(self) -> list[str]:
        """The fields recorded at any iteration, in first-seen order."""
        names: dict[str, None] = {}
        for row in self.rows:
            names.update(dict.fromkeys(row))
        return list(names)

    def to_pandas(self):
        """The trace as a pandas DataFrame, one row per iteration (index ``iteration`` when
        recorded), one column per field (NaN where an iteration did not record it)."""
        import pandas as pd  # noqa: PLC0415

        frame = pd.DataFrame.from_records(self.rows, columns=self.columns())
        if "iteration" in frame.columns and frame["iteration"].notna().all():
            frame = frame.set_index("iteration")
        return frame

    def __repr__(self) -> str:
        n = len(self.rows)
        last = self.rows[-1] if self.rows else {}
        parts = [f"{n} rows ({max(n - 1, 0)} iterations)"]
        for key in ("elbo", "oracle_scaled", "wall_time"):
            value = last.get(key)
            if isinstance(value, (int, float, np.floating, np.integer)):
                parts.append(f"last {key}={float(value):.6g}")
        cols = self.columns()
        shown = ", ".join(cols[:8]) + (f", ... ({len(cols)} in all)" if len(cols) > 8 else "")
        return f"FitTrace({', '.join(parts)}; columns: {shown})"


@dataclass
class Fit(CmdStanPyAccessors):
    """The result of a variational fit.

    Attributes:
        method, family, profile, options, seed: what was run.
        params: the final variational parameters λ (flat; see the family for the layout).
        draws: constrained draws by Stan variable name, each (n_draws, *shape) (a dict;
            ``fit.draws()`` is cmdstanpy's draws × columns array, see
            :mod:`stanvi.output.cmdstanpy_accessors` for the other cmdstanpy accessors).
        unconstrained_draws: (n_draws, D).
        log_p, log_q: log p (Jacobian included, normalized) and log q at each draw.
        trace: the per-iteration :class:`~stanvi.methods.base.Trace`.
        oracle: final oracle counts (scaled and literal paper units, draw-level counts).
        status: 'converged' | 'max_iters' | 'budget' | 'failed'; ``message`` says more.
        wall_time: seconds in the method, JAX compilation included; ``compile_time``: the part
            of it spent compiling JAX functions (``run_time`` is the rest); ``setup_time``:
            seconds to build the target (compiling the Stan model if needed) before the method.
        info: the method's counters (e.g. TrustVI's accepted/rejected steps), plus for Stan
            targets ``model_seconds`` (wall time inside the model's batched C++ calls) and
            ``hvp_method`` (``"exact"`` or ``"finite_difference"``, once HVPs were used).
    """

    method: str
    family_name: str
    profile: str
    options: Any
    seed: int
    params: np.ndarray
    family: Any
    target: Target
    draws: dict[str, np.ndarray]
    unconstrained_draws: np.ndarray
    log_p: np.ndarray
    log_q: np.ndarray
    trace: Trace
    oracle: dict[str, float]
    status: str
    message: str
    wall_time: float
    setup_time: float
    compile_time: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    _estimator: ElboEstimator | None = field(default=None, repr=False)
    _diagnostics: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.draws = Draws(self.draws, table=lambda: self.variational_sample)

    # ---------------------------------------------------------------- accessors
    @property
    def mean(self) -> np.ndarray:
        """Mean of the approximation in unconstrained space (D,)."""
        return np.asarray(self.family.mean(self.params))

    @property
    def covariance(self) -> np.ndarray:
        """Covariance of the approximation in unconstrained space (D, D)."""
        return np.asarray(self.family.covariance(self.params))

    @property
    def run_time(self) -> float:
        """Wall time in the method excluding JAX compilation."""
        return self.wall_time - self.compile_time

    @property
    def converged(self) -> bool:
        return self.status == "converged"

    def stan_variable(self, name: str) -> np.ndarray:
        """Draws of one Stan variable, shape (n_draws, *shape), like cmdstanpy."""
        try:
            return self.draws[name]
        except KeyError:
            raise KeyError(f"no variable {name!r}; variables: {list(self.draws)}") from None

    def stan_variables(self) -> dict[str, np.ndarray]:
        return dict(self.draws)

    def trace_pd(self):
        """``fit.trace.to_pandas()``: the iteration trace as a DataFrame."""
        return FitTrace.from_trace(self.trace).to_pandas()

    def elbo_trace(self) -> np.ndarray:
        """(oracle_scaled, elbo) for the iterations where the method estimated the ELBO."""
        t = self.trace
        return np.column_stack([t.column("oracle_scaled"), t.column("elbo")])

    def elbo(self, n_draws: int = 10_000, seed: int | None = None) -> tuple[float, float]:
        """A fresh Monte Carlo estimate of the ELBO at the final parameters and its standard
        error (draws that fail count as −inf: the ELBO is then −inf, honestly)."""
        est = self._estimator or estimator_for(self.target, self.family)
        key = make_key(self.seed + 1 if seed is None else seed,
                       host=bool(getattr(est, "host", False)))
        vals = []
        # chunks of 1024 draws, the last one padded to a power of two (one compiled program
        # per bucket, whatever n_draws is)
        kwargs = {"bucketed": True} if isinstance(est, ElboEstimator) else {}
        for start in range(0, n_draws, 1024):
            n = min(1024, n_draws - start)
            vals.append(est.values(self.params, standard_normal(fold_in(key, start), n,
                                                                self.family.base_dim), **kwargs))
        v = np.concatenate(vals)
        return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v)))

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95),
                var_names: str | list[str] | None = None):
        """A table (pandas DataFrame) of mean, sd and percentiles per scalar, computed with
        arviz-stats, one row per element named like cmdstanpy (``beta[1]``, ``Sigma[2,1]``;
        the DataTree's 1-based coordinates give ``arviz_stats.summary`` the same numbers);
        ``var_names``: only these variables (ArviZ's argument), in this order; non-finite
        draws are left out; see :func:`stanvi.output.summary.summary_table`."""
        from stanvi.output.summary import summary_table  # noqa: PLC0415

        if var_names is None:
            return summary_table(self.draws, percentiles)
        names = [var_names] if isinstance(var_names, str) else list(var_names)
        return summary_table({name: self.stan_variable(name) for name in names}, percentiles)

    # ---------------------------------------------------------------- output (issue P1-3)
    def diagnostics(self, resample: bool = False, progress: bool = False, **kwargs):
        """Pareto k-hat of the importance ratios, its verdict, importance ESS and warnings
        (:mod:`stanvi.diagnostics.report`); ``resample=True`` adds PSIS-resampled draws.  With
        ``progress``, diagnostic draws that take more than a few seconds show their progress
        (:func:`stanvi.diagnostics.report.diagnose`; ``stanvi.fit`` asks for it when it shows
        its own)."""
        from stanvi.diagnostics.report import diagnose  # noqa: PLC0415

        if resample or kwargs:
            return diagnose(self, resample=resample, progress=progress, **kwargs)
        if self._diagnostics is None:
            self._diagnostics = diagnose(self, progress=progress)
        return self._diagnostics

    def to_arviz(self, **kwargs):
        """The fit as an ArviZ DataTree (:func:`stanvi.output.arviz_io.to_datatree`)."""
        from stanvi.output.arviz_io import to_datatree  # noqa: PLC0415

        return to_datatree(self, **kwargs)

    def save(self, directory, **kwargs):
        """Write the Stan CSV, the NetCDF DataTree, the summary and the diagnostics to
        ``directory`` as ``MODEL-METHOD-FAMILY-seedSEED.*`` (:func:`stanvi.output.writers.save`: an
        existing file is an error unless ``overwrite=True``); returns the paths.
        :func:`stanvi.read` reads the fit back."""
        from stanvi.output.writers import save  # noqa: PLC0415

        return save(self, directory, **kwargs)

    def __repr__(self) -> str:
        return (f"Fit(method={self.method!r}, family={self.family_name!r}, status={self.status!r}, "
                f"iterations={len(self.trace) - 1}, oracle_scaled={self.oracle['oracle_scaled']:.1f}, "
                f"wall_time={self.wall_time:.2f}s, jax_compile={self.compile_time:.2f}s)")


# -------------------------------------------------------------------- building targets
