"""``stanvi.fit`` and the :class:`Fit` result (issue P1-2, "stanvi.fit and the Fit object").

A fit holds the variational parameters, draws from the approximation in constrained space by
Stan variable name (transformed parameters and generated quantities included), the unconstrained
draws with log p and log q (for Pareto k-hat), the iteration trace (oracle calls and wall time at
each iteration), the oracle counts by kind and the stopping reason.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from stanvi.errors import DivergedError, NotConvergedError, NotConvergedWarning, VIError
from stanvi.estimators.base import estimator_for
from stanvi.estimators.elbo import ElboEstimator, standard_normal
from stanvi.estimators.keys import fold_in, make_key
from stanvi.fit_inputs import (ModelLike, _check_arguments, _check_init, _check_memory,
                               _initial_mu, as_target, check_seed, describe_data,
                               single_gaussian_mixture)
from stanvi.families import make_family
from stanvi.methods import GP_METHODS, get_method, make_options
from stanvi.methods.base import MethodResult, RunContext, Trace, purpose_key
from stanvi.methods.blas_threads import blas_limited
from stanvi.progress import IterationProgress
from stanvi.targets.base import Target
from stanvi.targets.jax_target import JaxTarget



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
            from stanvi.arviz_io import log_g  # noqa: PLC0415

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
        from stanvi.arviz_io import mean_row  # noqa: PLC0415
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
        non-finite draws are left out; see :func:`stanvi.summary.summary_table`."""
        from stanvi.summary import summary_table  # noqa: PLC0415

        return summary_table(self.draws, percentiles)

    # ---------------------------------------------------------------- output (issue P1-3)
    def diagnostics(self, resample: bool = False, **kwargs):
        """Pareto k-hat of the importance ratios, its verdict, importance ESS and warnings
        (:mod:`stanvi.diagnostics`); ``resample=True`` adds PSIS-resampled draws."""
        from stanvi.diagnostics import diagnose  # noqa: PLC0415

        if resample or kwargs:
            return diagnose(self, resample=resample, **kwargs)
        if self._diagnostics is None:
            self._diagnostics = diagnose(self)
        return self._diagnostics

    def to_arviz(self, **kwargs):
        """The fit as an ArviZ DataTree (:func:`stanvi.arviz_io.to_datatree`)."""
        from stanvi.arviz_io import to_datatree  # noqa: PLC0415

        return to_datatree(self, **kwargs)

    def save(self, directory, **kwargs):
        """Write the Stan CSV, the NetCDF DataTree, the summary and the diagnostics to
        ``directory`` as ``MODEL-METHOD-FAMILY-seedSEED.*`` (:func:`stanvi.output.save`: an
        existing file is an error unless ``overwrite=True``); returns the paths.
        :func:`stanvi.read` reads the fit back."""
        from stanvi.output import save  # noqa: PLC0415

        return save(self, directory, **kwargs)

    def __repr__(self) -> str:
        return (f"Fit(method={self.method!r}, family={self.family_name!r}, status={self.status!r}, "
                f"iterations={len(self.trace) - 1}, oracle_scaled={self.oracle['oracle_scaled']:.1f}, "
                f"wall_time={self.wall_time:.2f}s, jax_compile={self.compile_time:.2f}s)")


# -------------------------------------------------------------------- building targets



def fit(model: ModelLike, data=None, *, method: str = "trustvi", family: str = "meanfield",
        seed: int | None = None, init=None, max_oracle_calls: float | None = None,
        progress: bool = True, draws: int = 1000, profile: str | None = None,
        dim: int | None = None, hvp_method: str | None = None, require_converged: bool = False,
        family_options: Mapping[str, Any] | None = None, **options) -> Fit:
    """Fit a variational approximation.

    Args:
        model: a `.stan` path, a compiled library, a Target, or a JAX log-density function of an
            unconstrained vector (then give ``dim``).
        data: the Stan data (dict, JSON path or JSON string).
        method: 'trustvi' (default), 'advi', 'hfsgvi', 'jointcv' or 'mlmcvi' (see
            ``stanvi.methods.available()``); for a ``stanvi.gp`` model 'qsgp', 'exact' or
            'svi' (docs/gp.md; the result is a ``stanvi.gp.GPFit``).
        family: 'meanfield' (default), 'fullrank', or 'mixture' (a Gaussian mixture whose
            weights' gradient is Rao-Blackwellized, docs/discrete.md; methods 'advi' and 'mlmcvi',
            the others refuse it with the reason).
        family_options: the family's settings, e.g. for 'mixture' ``{"n_components": 3,
            "component_budget": 2}`` (:class:`stanvi.families.GaussianMixture`).
        seed: integer seed from 0 to 2**32 - 1 (default 0); the same seed gives the same
            result.
        init: None (the method's rule), 'zero', 'random' (Stan's uniform(−2, 2)), a dict of
            constrained parameter values, or an unconstrained array (D,).
        max_oracle_calls: budget in scaled oracle units (docs/algorithms.md#oracle-calls); the
            fit stops with status 'budget' when it is spent.
        progress: show progress on a terminal.
        draws: number of output draws from the approximation.
        profile: the method's named option set (e.g. 'paper'); see ``docs/methods.md``.
        hvp_method: for a Stan model loaded here, 'auto' (default: decided once per compiled
            library and data, and stored), 'exact' or 'finite_difference'; the method used is in
            ``fit.info["hvp_method"]``.
        require_converged: raise :class:`~stanvi.errors.NotConvergedError` (carrying the fit
            as ``exc.fit``) when the method stops for another reason than its convergence rule;
            by default a :class:`~stanvi.errors.NotConvergedWarning` is issued instead, whatever
            ``progress`` says.
        **options: the method's options, overriding the profile's.

    Warns:
        NotConvergedWarning: the fit stopped on 'max_iters', 'budget' or 'failed'.
    """
    t0 = time.perf_counter()
    _check_arguments(draws, max_oracle_calls)
    seed = check_seed(seed)
    if method in GP_METHODS or getattr(model, "__stanvi_gp__", False):
        # stanvi.gp models and methods (docs/gp.md); imported only when used
        from stanvi.gp.dispatch import fit_gp  # noqa: PLC0415

        return fit_gp(model, data, method=method, family=family, seed=seed, progress=progress,
                      **options)
    target = as_target(model, data, dim=dim, seed=seed, progress=progress, hvp_method=hvp_method)
    if target.dim == 0:
        raise VIError(f"{target!r} has no parameters: there is nothing to approximate (use "
                      "Stan's fixed_param sampler for its generated quantities)")
    module = get_method(method)
    opts = make_options(module, profile, options)
    fam_kwargs = dict(family_options or {})
    family, fam_kwargs, family_note = single_gaussian_mixture(family, fam_kwargs)
    if family == "fullrank" and hasattr(opts, "fullrank_diagonal"):
        fam_kwargs["diagonal"] = opts.fullrank_diagonal
    if family == "mixture" and not getattr(module, "SUPPORTS_MIXTURE", False):
        from stanvi.discrete.mixture_elbo import unsupported_message  # noqa: PLC0415

        raise VIError(unsupported_message(method))
    fam = make_family(family, target.dim, **fam_kwargs)
    _check_memory(fam, draws)
    init_mu, random_mu = _initial_mu(target, init, seed)
    _check_init(target, init_mu)
    estimator = estimator_for(target, fam, module.ESTIMATOR,
                              host=getattr(module, "HOST_PATH", False))
    bar = IterationProgress(method, enabled=progress)
    context = RunContext(init_mu=init_mu, random_init_mu=random_mu,
                         max_oracle_calls=max_oracle_calls, estimator=estimator, progress=bar)
    key = make_key(seed, host=bool(getattr(estimator, "host", False)))
    setup_time = time.perf_counter() - t0
    t1 = time.perf_counter()
    compile_before = estimator.compile_seconds
    counter = getattr(target, "counter", None)
    model_before = getattr(counter, "seconds", 0.0)
    evaluations_before = counter.snapshot() if counter is not None else None
    try:
        with blas_limited(fam.dim):
            result: MethodResult = module.run(target, fam, key=key, options=opts,
                                              context=context)
    finally:
        bar.close()
    wall = time.perf_counter() - t1
    compile_time = estimator.compile_seconds - compile_before   # within the run, as wall is
    if getattr(counter, "seconds", 0.0) > model_before:  # StanTarget times its batched calls
        result.info["model_seconds"] = counter.seconds - model_before
    if evaluations_before is not None and not isinstance(target, JaxTarget):
        # the target counts every model evaluation (DESIGN.md); the method's ledger must agree
        # (OracleLedger.model_evaluations; tests/test_oracle_accounting.py).  A JaxTarget's
        # log density is traced into the method's JAX programs, so it counts direct calls only.
        result.info["model_evaluations"] = {
            kind: count - evaluations_before[kind] for kind, count in counter.snapshot().items()}
    fit_result = make_fit(target, fam, result, method=method, profile=profile or module.DEFAULT_PROFILE,
                    options=opts, seed=seed, key=key, n_draws=draws, wall_time=wall,
                    setup_time=setup_time, estimator=estimator)
    fit_result.compile_time = compile_time
    fit_result.info["data_source"] = describe_data(data)
    if family_note:
        fit_result.info["family_note"] = family_note
    _report_diagnostics(fit_result, progress)
    if not fit_result.converged:
        text = not_converged_text(fit_result)
        if require_converged:
            raise NotConvergedError(text, fit=fit_result)
        warnings.warn(text, NotConvergedWarning, stacklevel=2)
    return fit_result


def not_converged_text(fit_result: Fit) -> str:
    """What a fit that did not converge says to its user (the warning's and error's text)."""
    how = {"max_iters": "reached its iteration limit",
           "budget": "spent its oracle budget (max_oracle_calls)",
           "failed": "failed"}.get(fit_result.status, f"stopped with status {fit_result.status!r}")
    advice = ("see fit.message and fit.diagnostics()" if fit_result.status == "failed" else
              "the approximation may be far from the optimum: raise the limit, check "
              "fit.diagnostics(), or pass require_converged=True to make this an error")
    message = " ".join(str(fit_result.message or "").split())
    return (f"{fit_result.method} {how} before converging"
            + (f" ({message})" if message else "") + f"; {advice}")


def _report_diagnostics(fit_result: Fit, progress: bool) -> None:
    """Compute and store the diagnostics; log the one-line verdict (issue P1-3) at INFO on the
    ``stanvi.fit`` logger (:mod:`stanvi.log`: shown on stderr as ``stanvi: ...`` by default)."""
    from stanvi.log import get_logger  # noqa: PLC0415

    diag = fit_result.diagnostics()
    if progress:
        get_logger("fit").info(diag.one_line())


def make_fit(target: Target, family, result: MethodResult, *, method: str, profile: str, options,
             seed: int, key: jax.Array, n_draws: int, wall_time: float, setup_time: float,
             estimator: ElboEstimator) -> Fit:
    """Draw from the final approximation and assemble the :class:`Fit`."""
    if not np.all(np.isfinite(result.params)):
        raise DivergedError(method, result.status, str(result.message or ""))
    eps = standard_normal(purpose_key(key, 0, "output"), n_draws, family.dim)
    z, log_p, log_q = estimator.log_p_and_q(result.params, eps)
    gq_note: dict = {}
    if hasattr(target, "constrain_reporting"):
        constrained, n_gq_failed, gq_message = target.constrain_reporting(
            z, include_tp=True, include_gq=True, seed=seed)
        if n_gq_failed:
            gq_note = {"gq_failed_draws": n_gq_failed, "gq_failure_message": gq_message}
            warnings.warn(f"generated quantities could not be computed at {n_gq_failed} of "
                          f"{n_draws} draws ({gq_message!r}); they are NaN there, and their "
                          f"summaries use the other draws only (parameters and transformed "
                          f"parameters are kept at every draw)", stacklevel=3)
    else:
        constrained = target.constrain(z, include_tp=True, include_gq=True, seed=seed)
    return Fit(method=method, family_name=family.name, profile=profile, options=options, seed=seed,
               params=np.asarray(result.params, dtype=float), family=family, target=target,
               draws=constrained, unconstrained_draws=z, log_p=log_p, log_q=log_q,
               trace=FitTrace.from_trace(result.trace), oracle=result.ledger.snapshot(),
               status=result.status,
               message=result.message, wall_time=wall_time, setup_time=setup_time,
               info={**result.info, **gq_note,
                     **({"hvp_method": target.hvp_method_used}
                        if getattr(target, "hvp_method_used", None) else {})},
               _estimator=estimator)
