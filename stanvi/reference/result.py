"""The result of one of Stan's own algorithms, with the surface of :class:`stanvi.Fit` where it
applies: draws by Stan name, ``summary()``, ``to_arviz()``, ``diagnostics()``, ``save()``
(``stanvi.fit(..., method="nuts")`` returns one: :mod:`stanvi.reference.as_fit`).

Costs are in the units stanvi reports for its own fits: ``gradient_evaluations`` counts every
log density evaluated with its gradient (reverse mode), ``density_evaluations`` every log density
evaluated alone, both counted in C++ around every call the algorithm made (warmup included for
NUTS; ``n_leapfrog`` in ``sampler_diagnostics`` is Stan's own count of sampling-phase leapfrog
steps).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.stan.names import group_names

#: The thresholds a NUTS run's draws must meet to serve as a reference (:func:`trust_reasons`;
#: docs/batch.md#nuts-references): the largest rank-normalized split R-hat, the smallest bulk
#: and tail ESS (100 per chain for 4 chains).
MAX_RHAT = 1.01
MIN_ESS = 400.0


def trust_reasons(diagnostics: dict[str, Any]) -> list[str]:
    """Why a NUTS run's draws are not a trustworthy reference (empty: they are), from its
    :meth:`ReferenceFit.nuts_figures` (the batch's NUTS references, ``stanvi.compare``)."""
    reasons = []
    rhat = diagnostics.get("max_r_hat")
    if rhat is None or not np.isfinite(rhat) or rhat > MAX_RHAT:
        reasons.append(f"largest R-hat {rhat:.3g} > {MAX_RHAT}" if rhat is not None
                       and np.isfinite(rhat) else "R-hat could not be computed")
    for key, what in (("min_ess_bulk", "bulk"), ("min_ess_tail", "tail")):
        ess = diagnostics.get(key)
        if ess is None or not np.isfinite(ess) or ess < MIN_ESS:
            reasons.append(f"smallest {what} ESS {ess:.0f} < {MIN_ESS:.0f}" if ess is not None
                           and np.isfinite(ess) else f"{what} ESS could not be computed")
    divergences = int(diagnostics.get("divergences", 0))
    if divergences:
        reasons.append(f"{divergences} divergent transition(s) after warmup")
    return reasons


@dataclass
class ReferenceFit:
    """Draws and costs of one run of a Stan algorithm (all chains / paths together).

    Attributes:
        algorithm: ``"nuts"``, ``"nuts-dense"``, ``"stan-advi"`` (family in ``settings``),
            ``"pathfinder"`` or ``"pathfinder-multi"``.
        model_name: the Stan model's name.
        draws: by Stan variable name (parameters, transformed parameters, generated quantities),
            arrays of shape ``(chains * draws_per_chain, *shape)``, chain after chain.
        stan_columns: Stan's other output columns (``lp__``, ``accept_stat__`` … for NUTS,
            ``log_p__`` / ``log_g__`` for ADVI, ``lp__`` / ``lp_approx__`` / ``path__`` for
            Pathfinder), same leading length.
        chains: number of chains (1 for the variational algorithms).
        gradient_evaluations, density_evaluations: model evaluations (see the module docstring;
            None where they cannot be counted: ADVI and Pathfinder through CmdStan).
        wall_time: seconds of the algorithm itself (building the services library excluded).
        settings: every setting the algorithm ran with (Stan's defaults unless given).
        messages: Stan's logger and writer messages, per chain for NUTS.
        sampler_diagnostics: NUTS only: divergences, n_leapfrog, max_treedepth_hits, stepsize,
            mean_accept_stat (per chain) and total_n_leapfrog.
        elbo_trace: ADVI only: rows of (iteration, seconds, ELBO) as Stan evaluated them.
        mean: ADVI only: the approximation's mean in constrained space, by name.
        log_p, log_q: the variational algorithms only: log density of the model (Jacobian
            included) and of the approximation at each draw, for Pareto k̂.
        fresh_verdict: Stan's ADVI or single-path Pathfinder run through ``stanvi.fit``: the
            verdict on fresh draws of q from the loaded model, by seed of those draws
            (:func:`stanvi.reference.diagnostics.fresh_draws_verdict`), for :meth:`diagnostics`;
            None for a run read back from disk or run by :func:`~stanvi.reference.stan_advi`
            directly.
        recovery_run: the whole run where Stan was asked for more output draws than this
            fit's, to recover q (:func:`stanvi.reference.diagnostics.recovery_options`); None
            when this fit is the whole run.
        saved_diagnostics: a run read back from disk: the verdict on fresh draws it was saved
            with (the model is not loaded to draw them again).
    """

    algorithm: str
    model_name: str
    draws: dict[str, np.ndarray]
    stan_columns: dict[str, np.ndarray]
    chains: int
    gradient_evaluations: int | None
    density_evaluations: int | None
    wall_time: float
    settings: dict
    messages: list[str] = field(default_factory=list)
    sampler_diagnostics: dict | None = None
    elbo_trace: np.ndarray | None = None
    mean: dict[str, np.ndarray] | None = None
    log_p: np.ndarray | None = None
    log_q: np.ndarray | None = None
    fresh_verdict: Any = field(default=None, repr=False, compare=False)
    recovery_run: Any = field(default=None, repr=False, compare=False)
    saved_diagnostics: Any = field(default=None, repr=False, compare=False)

    @property
    def num_draws(self) -> int:
        return next(iter(self.stan_columns.values())).shape[0] if self.stan_columns else 0

    @property
    def method(self) -> str:
        """The ``stanvi.fit`` method that runs this algorithm: 'nuts', 'pathfinder' or
        'stan-advi' (``fit.method``, as on stanvi's own fits)."""
        return {"nuts-dense": "nuts", "pathfinder-multi": "pathfinder"}.get(self.algorithm,
                                                                            self.algorithm)

    @property
    def status(self) -> str:
        """The run's outcome under the names of stanvi's fits (docs/stan_reference.md#outcome):
        Stan's ADVI 'converged' when Stan says its relative ELBO change converged, else
        'max_iters'; Pathfinder 'converged' (it returns only when its L-BFGS stopped by its own
        rule; a failure raises); NUTS 'sampled' (whether its draws can be trusted is
        :meth:`diagnostics`: R-hat, ESS, divergences)."""
        if self.algorithm == "stan-advi":
            return "converged" if "CONVERGED" in "".join(self.messages[:1]) else "max_iters"
        return "sampled" if self.algorithm.startswith("nuts") else "converged"

    @property
    def converged(self) -> bool:
        """``status == 'converged'``, as ``Fit.converged``."""
        return self.status == "converged"

    @property
    def message(self) -> str:
        """Why the run ended, where Stan says more than the status: Stan's ADVI's line that
        says it converged or reached its iteration limit; '' otherwise."""
        if self.algorithm != "stan-advi":
            return ""
        lines = "".join(self.messages[:1]).splitlines()
        said = [ln.strip() for ln in lines if "CONVERGED" in ln or "maximum number" in ln]
        return said[-1] if said else ""

    @property
    def seed(self) -> int | None:
        """The seed the run was given (``settings['seed']``)."""
        return self.settings.get("seed")

    @property
    def run_time(self) -> float:
        """Seconds of the algorithm itself (``wall_time``), as ``Fit.run_time``."""
        return self.wall_time

    def stan_variable(self, name: str) -> np.ndarray:
        """The draws of one Stan variable (or one of Stan's own columns)."""
        if name in self.draws:
            return self.draws[name]
        if name in self.stan_columns:
            return self.stan_columns[name]
        known = ", ".join([*self.draws, *self.stan_columns])
        raise KeyError(f"no variable '{name}' in the {self.algorithm} draws (have: {known})")

    def stan_variables(self) -> dict[str, np.ndarray]:
        return dict(self.draws)

    def _by_chain(self, arr: np.ndarray) -> np.ndarray:
        return arr.reshape(self.chains, arr.shape[0] // self.chains, *arr.shape[1:])

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95),
                var_names: str | list[str] | None = None):
        """Mean, sd and percentiles per element (as ``Fit.summary``, ``var_names`` too); for
        NUTS also R-hat (rank-normalized split R-hat) and bulk / tail ESS from arviz-stats, per
        element."""
        from stanvi.output.summary import summary_table  # noqa: PLC0415

        draws = self.draws
        if var_names is not None:
            names = [var_names] if isinstance(var_names, str) else list(var_names)
            draws = {name: self.stan_variable(name) for name in names}
        table = summary_table(draws, percentiles)
        if self.algorithm.startswith("nuts") and self.chains > 1:
            import arviz_stats  # noqa: PLC0415

            flat = [self._by_chain(a).reshape(self.chains, -1, int(np.prod(a.shape[1:])),
                                              order="F") for a in draws.values()]
            x = np.concatenate(flat, axis=2)
            table["r_hat"] = arviz_stats.rhat(x, chain_axis=0, draw_axis=1)
            table["ess_bulk"] = arviz_stats.ess(x, chain_axis=0, draw_axis=1, method="bulk")
            table["ess_tail"] = arviz_stats.ess(x, chain_axis=0, draw_axis=1, method="tail",
                                                prob=(0.05, 0.95))
        return table

    def diagnostics(self, seed: int | None = None):
        """NUTS: a dict with divergences, max_treedepth_hits, the largest R-hat and smallest
        bulk/tail ESS over elements (arviz-stats).  ADVI / Pathfinder: stanvi's
        :class:`~stanvi.diagnostics.report.Diagnostics`: with the model loaded (a fit from
        ``stanvi.fit``: ``fresh_verdict``), the verdict of stanvi's fits on fresh draws of the Gaussian
        recovered from Stan's output (``seed``: of those draws, None the draws common to every
        fit; docs/diagnostics.md#stan); read back from disk, that verdict as saved; otherwise
        Pareto k̂ of log p − log q at Stan's own draws."""
        if self.algorithm.startswith("nuts"):
            out = dict(self.sampler_diagnostics or {})
            if self.chains > 1 and self.draws:
                table = self.summary()
                out.update(max_r_hat=float(table["r_hat"].max()),
                           min_ess_bulk=float(table["ess_bulk"].min()),
                           min_ess_tail=float(table["ess_tail"].min()))
            return out
        if not self.has_proposal_density:
            raise ValueError("multi-path Pathfinder's draws come from several paths' "
                             "approximations (PSIS-resampled by default): they have no single "
                             "proposal density, so no k-hat (Stan's own PSIS k-hat warning over "
                             "all paths' draws, if any, is in `messages`)")
        if self.fresh_verdict is not None:
            verdicts = self.__dict__.setdefault("_verdicts", {})
            if seed not in verdicts:
                verdicts[seed] = self.fresh_verdict(seed)
            return verdicts[seed]
        if self.saved_diagnostics is not None and seed is None:
            return self.saved_diagnostics
        from stanvi.diagnostics.report import compute  # noqa: PLC0415

        return compute(self.log_p, self.log_q, method=self.algorithm)

    def nuts_figures(self) -> dict:
        """NUTS's :meth:`diagnostics` as numbers only: the scalar figures, and ``divergences``
        summed over chains (what :func:`trust_reasons` reads)."""
        figures = {k: v for k, v in self.diagnostics().items() if isinstance(v, (int, float))}
        figures["divergences"] = int(sum(self.sampler_diagnostics["divergences"]))
        return figures

    def diagnostics_text(self) -> str:
        """:meth:`diagnostics` for a person: NUTS's as ``name: value`` lines, the variational
        algorithms' k̂ report, or why multi-path Pathfinder has none."""
        try:
            diagnostics = self.diagnostics()
        except ValueError as exc:   # multi-path Pathfinder: no single proposal density
            return f"no k-hat: {exc}"
        if isinstance(diagnostics, dict):
            return "\n".join(f"{key}: {value}" for key, value in diagnostics.items())
        return str(diagnostics)

    @property
    def has_proposal_density(self) -> bool:
        """True when log_p − log_q at the draws are importance ratios of one proposal (not for
        NUTS, nor for multi-path Pathfinder, whose draws come from several paths)."""
        return (self.log_p is not None and self.log_q is not None
                and self.algorithm != "pathfinder-multi")

    def to_arviz(self):
        """An ArviZ DataTree: ``posterior`` (chains × draws, variable dims with Stan's 1-based
        coordinates) with Stan's columns in ``sample_stats`` (``lp__`` → ``lp``, NUTS's
        ``divergent__`` → ``diverging`` …), and the run's settings and counts on the root, so
        that ``stanvi.read`` gives this fit back (:mod:`stanvi.reference.result_io`)."""
        from stanvi.reference.result_io import to_datatree  # noqa: PLC0415

        return to_datatree(self)

    @classmethod
    def from_datatree(cls, tree) -> "ReferenceFit":
        """The run that :meth:`to_arviz` wrote (``stanvi.read`` of a saved run)."""
        from stanvi.reference.result_io import fields_from_datatree  # noqa: PLC0415

        return cls(**fields_from_datatree(tree))

    def save(self, directory, *, basename: str | None = None,
             overwrite: bool = False) -> dict[str, Path]:
        """Write the run to ``directory`` as ``<name>.csv`` (one row per draw, chain after
        chain: ``chain__``, Stan's columns, then every element under CmdStan's dotted names),
        ``<name>.nc`` (:meth:`to_arviz`), ``<name>_summary.csv`` and
        ``<name>_diagnostics.txt``; ``<name>`` defaults to ``MODEL-ALGORITHM-seedSEED``.  An
        existing file is an error (before anything is written) unless ``overwrite``; so is a
        missing netCDF4 (the ``netcdf`` extra).  Returns the paths by kind."""
        import pandas as pd  # noqa: PLC0415

        from stanvi.output.arviz_io import save_netcdf  # noqa: PLC0415
        from stanvi.output.writers import check_writable, csv_columns, output_paths  # noqa: PLC0415

        directory = Path(directory)
        base = basename or f"{self.model_name}-{self.algorithm}-seed{self.settings.get('seed', 0)}"
        check_writable(directory, base, overwrite=overwrite)
        directory.mkdir(parents=True, exist_ok=True)
        paths = output_paths(directory, base)
        n = self.num_draws
        table = {"chain__": np.repeat(np.arange(1, self.chains + 1), n // max(self.chains, 1))}
        table.update({k: np.asarray(v) for k, v in self.stan_columns.items()})
        for name, arr in self.draws.items():
            flat = np.asarray(arr, dtype=float).reshape(n, -1, order="F")
            table.update(zip(csv_columns({name: arr}), flat.T))
        with paths["csv"].open("w") as fh:
            for key, value in {"stanvi_reference": self.algorithm, "model": self.model_name,
                               **self.settings}.items():
                fh.write(f"# {key} = {value}\n")
            pd.DataFrame(table).to_csv(fh, index=False)
        save_netcdf(self.to_arviz(), paths["netcdf"])
        self.summary().to_csv(paths["summary"])
        paths["diagnostics"].write_text(self.diagnostics_text() + "\n")
        return paths

    def __repr__(self) -> str:
        names = ", ".join(self.draws)
        return (f"ReferenceFit({self.algorithm}, model={self.model_name!r}, "
                f"status={self.status!r}, chains={self.chains}, "
                f"draws={self.num_draws}, gradient_evaluations={self.gradient_evaluations}, "
                f"wall_time={self.wall_time:.2f}s, variables=[{names}])")


def split_columns(names: list[str], values: np.ndarray,
                  n_stan: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(model draws by Stan name, Stan's leading ``n_stan`` columns by name)."""
    stan_columns = {c: values[:, k] for k, c in enumerate(names[:n_stan])}
    model = values[:, n_stan:]
    draws = {v.name: v.extract(model) for v in group_names(names[n_stan:])}
    return draws, stan_columns
