"""The accessors a cmdstanpy user reaches for, on a stanvi fit, with cmdstanpy's shapes and names
(``CmdStanVB``: ``column_names``, ``variational_sample``, ``variational_sample_pd``,
``variational_params_np`` / ``_pd`` / ``_dict``, ``metadata``, ``create_inits``; ``draws()`` as
``CmdStanPathfinder.draws()`` gives it; docs/quickstart.md#cmdstanpy-names).

What the columns are: Stan's ``lp__``, ``log_p__`` and ``log_g__`` (``lp__`` is 0 as in
CmdStan's variational output; ``log_p__`` the model's log density with the Jacobian at the draw,
``log_g__`` = −½‖ε‖²), then every element of every variable in the order of ``fit.draws``,
named ``theta[1]``, ``Sigma[2,1]`` (first index fastest), as cmdstanpy names the columns of the
Stan CSV that :meth:`~stanvi.fit_result.Fit.save` writes — the tests read that file with
cmdstanpy and compare every accessor.

One departure, by choice: ``fit.draws`` stays what it always was in stanvi, a dict of draws by
Stan variable name; calling it, ``fit.draws()``, returns cmdstanpy's ``draws()`` array
(draws × columns), so both habits work (:class:`Draws`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stanvi.stan.names import element_labels

#: Stan's columns before the variables, as in the CSV and in cmdstanpy's ``column_names``
STAN_COLUMNS = ("lp__", "log_p__", "log_g__")


class Draws(dict):
    """The draws by Stan variable name (a ``dict``: ``fit.draws["theta"]`` is (n_draws,
    *shape)); calling it, ``fit.draws()``, gives cmdstanpy's ``draws()``: a (n_draws, n_columns)
    array with the columns of ``fit.column_names``."""

    def __init__(self, by_name: dict[str, np.ndarray], table=None) -> None:
        super().__init__(by_name)
        self._table = table

    def __call__(self, *, concat_chains: bool = True, inc_warmup: bool = False) -> np.ndarray:
        """cmdstanpy's ``draws()`` (one chain; no warmup draws exist, so ``inc_warmup`` changes
        nothing)."""
        if self._table is None:
            raise TypeError("these draws belong to no fit: use them as a dict by variable name")
        return self._table()

    def __reduce__(self):   # pickles as a plain dict of arrays
        return (dict, (dict(self),))


@dataclass(frozen=True)
class FitMetadata:
    """cmdstanpy's ``InferenceMetadata`` shape: ``cmdstan_config`` (the CSV's configuration
    keys, as cmdstanpy reads them from the file :meth:`~stanvi.fit_result.Fit.save` writes),
    ``method_vars`` (Stan's ``lp__``, ``log_p__``, ``log_g__``) and ``stan_vars`` (each
    variable's shape)."""

    cmdstan_config: dict[str, Any] = field(default_factory=dict)
    method_vars: dict[str, tuple[int, ...]] = field(default_factory=dict)
    stan_vars: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _labelled_columns(draws: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
    out = []
    for name, arr in draws.items():
        arr = np.asarray(arr)
        flat = arr.reshape(arr.shape[0], -1, order="F")
        out += [(label, flat[:, j]) for j, label in enumerate(element_labels(name, arr.shape[1:]))]
    return out


class CmdStanPyAccessors:
    """Mixed into :class:`~stanvi.fit_result.Fit`: the cmdstanpy accessors (module docstring).
    The class it is mixed into provides ``draws``, ``log_p``, ``log_q``, ``family``, ``params``,
    ``target``, ``seed``, ``mean`` and ``covariance``."""

    draws: dict[str, np.ndarray]

    @property
    def column_names(self) -> tuple[str, ...]:
        """The columns of :attr:`variational_sample`: Stan's three, then every element."""
        return STAN_COLUMNS + tuple(label for label, _ in _labelled_columns(self.draws))

    def _stan_columns(self) -> dict[str, np.ndarray]:
        from stanvi.output.arviz_io import log_g  # noqa: PLC0415

        n = len(self.log_p)
        return {"lp__": np.zeros(n), "log_p__": np.asarray(self.log_p, dtype=float),
                "log_g__": log_g(self)}

    @property
    def variational_sample(self) -> np.ndarray:
        """The draws as one array (n_draws, len(column_names)), cmdstanpy's
        ``variational_sample`` (the CSV's rows after row 0)."""
        columns = list(self._stan_columns().values())
        columns += [values for _, values in _labelled_columns(self.draws)]
        return np.column_stack([np.asarray(c, dtype=float) for c in columns])

    @property
    def variational_sample_pd(self):
        """:attr:`variational_sample` as a DataFrame with :attr:`column_names`."""
        return self.draws_pd()

    def draws_pd(self, vars: str | list[str] | None = None):  # noqa: A002  (cmdstanpy's name)
        """The draws as a pandas DataFrame, one row per draw, one column per scalar element named
        like cmdstanpy (``theta[1]``); without ``vars``, Stan's ``lp__``, ``log_p__`` and
        ``log_g__`` columns come first, as in cmdstanpy's ``variational_sample_pd``."""
        import pandas as pd  # noqa: PLC0415

        if vars is None:
            columns = self._stan_columns()
            chosen = self.draws
        else:
            names = [vars] if isinstance(vars, str) else list(vars)
            columns, chosen = {}, {name: self.stan_variable(name) for name in names}
        columns.update(_labelled_columns(chosen))
        return pd.DataFrame(columns)

    @property
    def variational_params_dict(self) -> dict[str, float]:
        """The approximation's mean, constrained (the Stan CSV's row 0), by column name, with
        ``lp__ = log_p__ = log_g__ = 0`` first: what cmdstanpy's ``CmdStanVB`` of the same CSV
        gives."""
        from stanvi.output.arviz_io import mean_row  # noqa: PLC0415

        out = dict.fromkeys(STAN_COLUMNS, 0.0)
        row = mean_row(self)
        for name in self.draws:
            value = np.asarray(row[name])[0]
            flat = value.reshape(-1, order="F")
            out.update(zip(element_labels(name, value.shape), (float(v) for v in flat)))
        return out

    @property
    def variational_params_np(self) -> np.ndarray:
        """:attr:`variational_params_dict`'s values as an array, cmdstanpy's
        ``variational_params_np``."""
        return np.array(list(self.variational_params_dict.values()), dtype=float)

    @property
    def variational_params_pd(self):
        """:attr:`variational_params_dict` as a one-row DataFrame with :attr:`column_names`,
        cmdstanpy's ``variational_params_pd`` (stanvi's table of q's mean and sd in both spaces
        is :attr:`approximation_pd`)."""
        import pandas as pd  # noqa: PLC0415

        params = self.variational_params_dict
        return pd.DataFrame([list(params.values())], columns=list(params))

    @property
    def approximation_pd(self):
        """Mean and sd per parameter, in both spaces: a DataFrame indexed by ``(space, name)``.
        ``unconstrained`` rows are q itself (its mean and marginal sd per unconstrained
        coordinate, Stan's names, e.g. ``tau`` for log tau); ``constrained`` rows are q's mean
        pushed through the constraining transform (the Stan CSV's row 0) and the sd of the
        constrained draws, for every element of every variable."""
        import pandas as pd  # noqa: PLC0415

        names = list(getattr(self.target, "unconstrained_names", []) or [])
        mean = self.mean
        if len(names) != mean.size:
            names = [f"z[{i + 1}]" for i in range(mean.size)]
        sd = np.sqrt(np.diag(self.covariance))
        index = [("unconstrained", n) for n in names]
        rows = list(zip(mean.tolist(), sd.tolist()))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            draws_sd = self.draws_pd().std(ddof=1)
        for label, value in self.variational_params_dict.items():
            if label in STAN_COLUMNS:
                continue
            index.append(("constrained", label))
            rows.append((value, float(draws_sd[label])))
        return pd.DataFrame(rows, index=pd.MultiIndex.from_tuples(index, names=["space", "name"]),
                            columns=["mean", "sd"])

    @property
    def metadata(self) -> FitMetadata:
        """cmdstanpy's ``metadata``: the configuration the Stan CSV states (its keys as
        cmdstanpy reads them), Stan's method columns and the variables' shapes."""
        from stanvi.output.writers import header_config  # noqa: PLC0415

        return FitMetadata(
            cmdstan_config=header_config(self),
            method_vars={name: () for name in STAN_COLUMNS},
            stan_vars={name: tuple(np.shape(arr)[1:]) for name, arr in self.draws.items()})

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
