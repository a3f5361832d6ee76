"""The same reference runs through cmdstanpy and a CmdStan installation (``backend="cmdstan"``).

CmdStan cannot be downloaded on every machine (it is not on PyPI), so this path is used only when
the user has one: cmdstanpy importable (``pip install stanvi[cmdstan]``) and
``cmdstanpy.cmdstan_path()`` finding CmdStan.  The model is compiled by CmdStan from the same
``.stan`` file; results come back as the in-process backend's :class:`ReferenceFit`.

Differences from the in-process backend, by construction: CmdStan writes CSV files (cmdstanpy
reads them back, at CmdStan's default 6 significant figures); evaluations cannot be counted from
outside, so for NUTS ``gradient_evaluations`` is the sum of ``n_leapfrog__`` over the saved
draws (warmup excluded) and for ADVI and Pathfinder it is None; ``wall_time`` includes CmdStan's
process start and CSV I/O.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from stanvi.reference.result import ReferenceFit
from stanvi.stan.compiler import CompiledModel
from stanvi.stan.data import data_to_dict


def unavailable_reason() -> str | None:
    """None when cmdstanpy and CmdStan are both usable, else why not (for skips and errors)."""
    try:
        import cmdstanpy  # noqa: PLC0415
    except ImportError:
        return "cmdstanpy is not installed (pip install 'stanvi[cmdstan]')"
    try:
        cmdstanpy.cmdstan_path()
    except (ValueError, RuntimeError) as exc:
        return f"cmdstanpy finds no CmdStan installation ({exc})"
    return None


def _stan_file(model) -> Path:
    """A .stan file CmdStan can build: the user's file, or the program written to a temporary
    directory under the model's name."""
    if isinstance(model, CompiledModel):
        name, text = model.name, Path(model.stan_file).read_text()
    else:
        text = str(model)
        if text.endswith(".stan") and Path(text).is_file():
            return Path(text)
        name = "model"
    path = Path(tempfile.mkdtemp(prefix="stanvi-cmdstan-")) / f"{name}.stan"
    path.write_text(text)
    return path


def _cmdstan_model(model):
    reason = unavailable_reason()
    if reason is not None:
        raise RuntimeError(f"backend='cmdstan' is not available: {reason}")
    import cmdstanpy  # noqa: PLC0415

    path = _stan_file(model)
    return cmdstanpy.CmdStanModel(stan_file=str(path)), path.stem


def _by_chain_major(values: np.ndarray) -> np.ndarray:
    """cmdstanpy's (draws, chains[, 1]) method variables → chain after chain."""
    values = np.asarray(values)
    values = values.reshape(values.shape[0], -1)
    return values.T.reshape(-1)


def nuts_cmdstan(model, data, *, chains: int, seed: int, num_warmup: int, num_samples: int,
                 metric: str, init, settings: dict) -> ReferenceFit:
    csm, name = _cmdstan_model(model)
    start = time.perf_counter()
    fit = csm.sample(data=data_to_dict(data) if data is not None else None, chains=chains,
                     seed=seed, iter_warmup=num_warmup, iter_sampling=num_samples,
                     metric=metric, max_treedepth=settings["max_depth"],
                     adapt_delta=settings["delta"], thin=settings["num_thin"], inits=init,
                     show_progress=False)
    wall = time.perf_counter() - start
    stan_columns = {k: _by_chain_major(v) for k, v in fit.method_variables().items()}
    per_chain = {k: v.reshape(chains, -1) for k, v in stan_columns.items()}
    diagnostics = {
        "divergences": [int(x.sum()) for x in per_chain["divergent__"]],
        "n_leapfrog": [int(x.sum()) for x in per_chain["n_leapfrog__"]],
        "max_treedepth_hits": [int((x >= settings["max_depth"]).sum())
                               for x in per_chain["treedepth__"]],
        "stepsize": [float(x[0]) for x in per_chain["stepsize__"]],
        "mean_accept_stat": [float(x.mean()) for x in per_chain["accept_stat__"]]}
    diagnostics["total_n_leapfrog"] = int(sum(diagnostics["n_leapfrog"]))
    return ReferenceFit(
        algorithm="nuts-dense" if metric == "dense_e" else "nuts", model_name=name,
        draws={k: np.asarray(v) for k, v in fit.stan_variables().items()},
        stan_columns=stan_columns, chains=chains,
        gradient_evaluations=diagnostics["total_n_leapfrog"], density_evaluations=0,
        wall_time=wall, settings={"backend": "cmdstan", "chains": chains, "seed": seed,
                                  "num_warmup": num_warmup, "num_samples": num_samples,
                                  "metric": metric, **settings},
        messages=[], sampler_diagnostics=diagnostics)


def advi_cmdstan(model, data, *, algorithm: str, seed: int, init, settings: dict
                 ) -> ReferenceFit:
    csm, name = _cmdstan_model(model)
    start = time.perf_counter()
    fit = csm.variational(data=data_to_dict(data) if data is not None else None, seed=seed,
                          algorithm=algorithm, iter=settings["iter"],
                          grad_samples=settings["grad_samples"],
                          elbo_samples=settings["elbo_samples"], eta=settings["eta"],
                          adapt_engaged=bool(settings["adapt_engaged"]),
                          adapt_iter=settings["adapt_iter"], tol_rel_obj=settings["tol_rel_obj"],
                          eval_elbo=settings["eval_elbo"], draws=settings["output_samples"],
                          inits=init, require_converged=False)
    wall = time.perf_counter() - start
    sample = fit.variational_sample_pd
    stan_columns = {c: sample[c].to_numpy() for c in ("lp__", "log_p__", "log_g__")
                    if c in sample}
    return ReferenceFit(
        algorithm="stan-advi", model_name=name,
        draws={k: np.asarray(v) for k, v in fit.stan_variables(mean=False).items()},
        stan_columns=stan_columns, chains=1, gradient_evaluations=None,
        density_evaluations=None, wall_time=wall,
        settings={"backend": "cmdstan", "algorithm": algorithm, "seed": seed, **settings},
        mean={k: np.asarray(v) for k, v in fit.stan_variables(mean=True).items()},
        log_p=stan_columns.get("log_p__"), log_q=stan_columns.get("log_g__"))


def pathfinder_cmdstan(model, data, *, seed: int, init, settings: dict) -> ReferenceFit:
    csm, name = _cmdstan_model(model)
    start = time.perf_counter()
    fit = csm.pathfinder(data=data_to_dict(data) if data is not None else None, seed=seed,
                         init_alpha=settings["init_alpha"], tol_obj=settings["tol_obj"],
                         tol_rel_obj=settings["tol_rel_obj"], tol_grad=settings["tol_grad"],
                         tol_rel_grad=settings["tol_rel_grad"], tol_param=settings["tol_param"],
                         history_size=settings["history_size"], num_paths=settings["num_paths"],
                         max_lbfgs_iters=settings["max_lbfgs_iters"],
                         draws=settings["num_psis_draws"],
                         num_single_draws=settings["num_draws"],
                         num_elbo_draws=settings["num_elbo_draws"],
                         psis_resample=bool(settings["psis_resample"]),
                         calculate_lp=bool(settings["calculate_lp"]), inits=init)
    wall = time.perf_counter() - start
    stan_columns = {k: np.asarray(v).reshape(-1) for k, v in fit.method_variables().items()}
    return ReferenceFit(
        algorithm="pathfinder-multi" if settings["num_paths"] > 1 else "pathfinder",
        model_name=name, draws={k: np.asarray(v) for k, v in fit.stan_variables().items()},
        stan_columns=stan_columns, chains=1, gradient_evaluations=None,
        density_evaluations=None, wall_time=wall,
        settings={"backend": "cmdstan", "seed": seed, **settings},
        log_p=stan_columns.get("lp__"), log_q=stan_columns.get("lp_approx__"))


def check_backend(backend: str) -> None:
    if backend not in ("inprocess", "cmdstan"):
        raise ValueError(f"backend must be 'inprocess' or 'cmdstan', not {backend!r}")

