"""The :class:`Fit` result of ``stanvi.fit`` and its :class:`FitTrace` (issue P1-2; the
orchestration is :mod:`stanvi.fit`, the input checks :mod:`stanvi.fit_inputs`;
docs/architecture.md#layers).

A fit holds the variational parameters, draws from the approximation in constrained space by
Stan variable name (transformed parameters and generated quantities included), the unconstrained
draws with log p and log q (for Pareto k-hat), the iteration trace (oracle calls and wall time at
each iteration), the oracle counts by kind and the stopping reason.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stanvi.estimators.registry import estimator_for
from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.estimators.keys import fold_in, make_key
from stanvi.methods.base import Trace
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
class Fit:
    """The result of a variational fit.

    Attributes:
        method, family, profile, options, seed: what was run.
        params: the final variational parameters λ (flat; see the family for the layout).
        draws: constrained draws by Stan variable name, each (n_draws, *shape).
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

    def draws_pd(self, vars: str | list[str] | None = None):  # noqa: A002  (cmdstanpy's name)
        """The draws as a pandas DataFrame, one row per draw, one column per scalar element named
        like cmdstanpy (``theta[1]``); without ``vars``, Stan's ``lp__``, ``log_p__`` and
        ``log_g__`` columns come first, as in the Stan CSV and cmdstanpy's
        ``variational_sample_pd``."""
        import pandas as pd  # noqa: PLC0415

        from stanvi.stan.names import element_labels  # noqa: PLC0415

        names = [vars] if isinstance(vars, str) else list(vars) if vars is not None else list(
            self.draws)
        columns: dict[str, np.ndarray] = {}
        if vars is None:
            from stanvi.output.arviz_io import log_g  # noqa: PLC0415

            n = len(self.log_p)
            columns.update({"lp__": np.zeros(n), "log_p__": np.asarray(self.log_p, dtype=float),
                            "log_g__": log_g(self)})
        for name in names:
            arr = np.asarray(self.stan_variable(name))
            flat = arr.reshape(arr.shape[0], -1, order="F")
            for j, label in enumerate(element_labels(name, arr.shape[1:])):
                columns[label] = flat[:, j]
        return pd.DataFrame(columns)

    @property
    def variational_params_dict(self) -> dict[str, float]:
        """The approximation's mean, constrained (the Stan CSV's row 0), by element name, with
        ``lp__ = log_p__ = log_g__ = 0`` first: what cmdstanpy's ``CmdStanVB`` of the same CSV
        gives."""
        from stanvi.output.arviz_io import mean_row  # noqa: PLC0415
        from stanvi.stan.names import element_labels  # noqa: PLC0415

        out = {"lp__": 0.0, "log_p__": 0.0, "log_g__": 0.0}
        row = mean_row(self)
        for name in self.draws:
            value = np.asarray(row[name])[0]
            flat = value.reshape(-1, order="F")
            out.update(zip(element_labels(name, value.shape), (float(v) for v in flat)))
        return out

    @property
    def variational_params_pd(self):
        """Mean and sd per named parameter, in both spaces: a DataFrame indexed by ``(space,
        name)``.  ``unconstrained`` rows are q itself (its mean and marginal sd per unconstrained
        coordinate, Stan's names, e.g. ``tau`` for log tau); ``constrained`` rows are q's mean
        pushed through the constraining transform (the Stan CSV's row 0) and the sd of the
        constrained draws, for every element of every variable."""
        import pandas as pd  # noqa: PLC0415

        names = list(getattr(self.target, "unconstrained_names", []) or [])
        mean = self.mean
        if len(names) != mean.size:
            names = [f"z.{i + 1}" for i in range(mean.size)]
        sd = np.sqrt(np.diag(self.covariance))
        index = [("unconstrained", n) for n in names]
        rows = list(zip(mean.tolist(), sd.tolist()))
        params = self.variational_params_dict
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            draws_sd = self.draws_pd().std(ddof=1)
        for label, value in params.items():
            if label.endswith("__"):
                continue
            index.append(("constrained", label))
            rows.append((value, float(draws_sd[label])))
        return pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["space", "name"]),
                            columns=["mean", "sd"])

    def create_inits(self, seed: int | None = None, chains: int = 4):
        """Initial values for MCMC (e.g. ``cmdstanpy``'s ``sample(inits=...)``, or
        :func:`stanvi.reference.nuts`) from ``chains`` distinct draws of the approximation,
        chosen at random as cmdstanpy's ``CmdStanVB.create_inits`` does: a dict of parameter
        values by name for ``chains=1``, else a list of dicts.  Only the model's parameters are
        included (not transformed parameters or generated quantities) when the target knows
        which they are."""
        if isinstance(chains, bool) or not isinstance(chains, (int, np.integer)) or chains < 1:
            raise ValueError(f"chains must be a positive integer, got {chains!r}")
        n = len(self.log_p)
        if chains > n:
            raise ValueError(f"chains={chains} needs as many distinct draws; the fit has {n}")
        kinds = self.target.variable_kinds() if hasattr(self.target, "variable_kinds") else {}
        names = [k for k in self.draws if kinds.get(k, "parameter") == "parameter"]
        finite = np.ones(n, dtype=bool)
        for k in names:
            finite &= np.isfinite(np.asarray(self.draws[k], dtype=float).reshape(n, -1)).all(1)
        pool = np.flatnonzero(finite)
        if pool.size < chains:
            raise ValueError(f"only {pool.size} draws have finite parameter values; "
                             f"{chains} inits asked for")
        rng = np.random.default_rng(seed)
        picks = rng.choice(pool, size=chains, replace=False)
        inits = [{k: np.asarray(self.draws[k])[i] for k in names} for i in picks]
        return inits[0] if chains == 1 else inits

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
                                                                self.family.dim), **kwargs))
        v = np.concatenate(vals)
        return float(v.mean()), float(v.std(ddof=1) / np.sqrt(len(v)))

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95)):
        """A table (pandas DataFrame) of mean, sd and percentiles per scalar, computed with
        arviz-stats, one row per element named like cmdstanpy (``beta[1]``, ``Sigma[2,1]``;
        the DataTree's 1-based coordinates give ``arviz_stats.summary`` the same numbers);
        non-finite draws are left out; see :func:`stanvi.output.summary.summary_table`."""
        from stanvi.output.summary import summary_table  # noqa: PLC0415

        return summary_table(self.draws, percentiles)

    # ---------------------------------------------------------------- output (issue P1-3)
    def diagnostics(self, resample: bool = False, **kwargs):
        """Pareto k-hat of the importance ratios, its verdict, importance ESS and warnings
        (:mod:`stanvi.diagnostics.report`); ``resample=True`` adds PSIS-resampled draws."""
        from stanvi.diagnostics.report import diagnose  # noqa: PLC0415

        if resample or kwargs:
            return diagnose(self, resample=resample, **kwargs)
        if self._diagnostics is None:
            self._diagnostics = diagnose(self)
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
