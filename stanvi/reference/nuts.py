"""Stan's NUTS in-process: ``stan::services::sample::hmc_nuts_{diag,dense}_e_adapt``
(stan/services/sample/, the algorithm CmdStan's ``sample`` runs; Hoffman & Gelman 2014, "The
No-U-Turn Sampler", JMLR 15; Betancourt 2017, arXiv:1701.02434, for the multinomial variant and
the generalized no-U-turn criterion Stan uses), on the same compiled model stanvi fits.
"""

from __future__ import annotations

import functools
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from stanvi.reference.cmdstan_backend import check_backend, nuts_cmdstan
from stanvi.reference.result import ReferenceFit, split_columns
from stanvi.reference.services_lib import (ReferenceRunError, check_settings, init_to_json,
                                           prepare, raise_run_error)
from stanvi.stan.compiler import CompiledModel
from stanvi.stan.data import DataLike

SAMPLER_COLUMNS = ("lp__", "accept_stat__", "stepsize__", "treedepth__", "n_leapfrog__",
                   "divergent__", "energy__")

# Stan's defaults (CmdStan's `sample` with `adapt engaged=1`, algorithm=hmc engine=nuts);
# see stan/services/sample/hmc_nuts_diag_e_adapt.hpp for their meaning.
NUTS_DEFAULTS = {"num_thin": 1, "max_depth": 10, "delta": 0.8, "gamma": 0.05, "kappa": 0.75,
                 "t0": 10.0, "init_buffer": 75, "term_buffer": 50, "window": 25,
                 "stepsize": 1.0, "stepsize_jitter": 0.0, "init_radius": 2.0}


def nuts(model: str | os.PathLike | CompiledModel, data: DataLike = None, *, chains: int = 4,
         seed: int = 0, num_warmup: int = 1000, num_samples: int = 1000, metric: str = "diag_e",
         init=None, parallel: bool = True, progress: bool = False, backend: str = "inprocess",
         **kw) -> ReferenceFit:
    """Run Stan's own NUTS (metric adapted during warmup) on a Stan model, in-process.

    Stan's ``hmc_nuts_diag_e_adapt`` / ``hmc_nuts_dense_e_adapt`` called exactly as CmdStan
    calls them, on the same stanc-generated model code stanvi fits: dual-averaging step-size
    adaptation and windowed metric adaptation, then ``num_samples`` draws per chain.

    Args:
        model: a ``.stan`` path or Stan code (compiled, cached), or a :class:`CompiledModel`.
        data: a dict, a JSON path or a JSON string (as everywhere in stanvi).
        chains: number of chains; chain ``k`` uses seed ``seed`` and chain id ``k + 1``
            (independent streams, as CmdStan does).
        seed: the random seed.
        num_warmup, num_samples: per chain (Stan's defaults, 1000 each).
        metric: ``"diag_e"`` (Stan's default) or ``"dense_e"``.
        init: initial values (constrained, by name; dict or JSON) for every chain; default
            uniform(-2, 2) on the unconstrained scale.
        parallel: run the chains in threads (default) or one after another.
        progress: show the build progress when the services library is built.
        backend: ``"inprocess"`` (default) or ``"cmdstan"``: the same run through cmdstanpy and
            the user's CmdStan (:mod:`stanvi.reference.cmdstan_backend`; it honours
            ``max_depth``, ``delta`` and ``num_thin`` of the settings).
        **kw: any of Stan's other sampler settings, defaults in :data:`NUTS_DEFAULTS`.

    Returns:
        :class:`~stanvi.reference.result.ReferenceFit` with ``sampler_diagnostics``.

    Raises:
        StanDataError for data the model rejects; ReferenceRunError when sampling fails (e.g. no
        valid initial point); TypeError for an unknown setting.
    """
    opts = check_settings(kw, NUTS_DEFAULTS, "NUTS")
    if metric not in ("diag_e", "dense_e"):
        raise ValueError(f"metric must be 'diag_e' or 'dense_e', not {metric!r}")
    if chains < 1 or num_samples < 1 or num_warmup < 0:
        raise ValueError("need chains >= 1, num_samples >= 1, num_warmup >= 0")
    check_backend(backend)
    if backend == "cmdstan":
        return nuts_cmdstan(model, data, chains=chains, seed=seed, num_warmup=num_warmup,
                            num_samples=num_samples, metric=metric, init=init, settings=opts)
    compiled, data_json, lib = prepare(model, data, progress)
    dense = metric == "dense_e"
    algorithm = "nuts-dense" if dense else "nuts"
    run = functools.partial(
        lib.call, "stanvi_nuts", data_json, init_to_json(init), int(seed))
    args = (int(dense), opts["init_radius"], num_warmup, num_samples, opts["num_thin"],
            opts["stepsize"], opts["stepsize_jitter"], opts["max_depth"], opts["delta"],
            opts["gamma"], opts["kappa"], opts["t0"], opts["init_buffer"], opts["term_buffer"],
            opts["window"])
    start = time.perf_counter()
    try:
        if parallel and chains > 1:
            with ThreadPoolExecutor(max_workers=chains) as pool:
                runs = list(pool.map(lambda k: run(k + 1, *args), range(chains)))
        else:
            runs = [run(k + 1, *args) for k in range(chains)]
    except RuntimeError as exc:
        raise_run_error(exc, f"NUTS ({metric})", compiled.name, data_json)
    wall = time.perf_counter() - start
    names = runs[0].names
    if tuple(names[:len(SAMPLER_COLUMNS)]) != SAMPLER_COLUMNS:
        raise ReferenceRunError(f"unexpected sampler columns from Stan: {names[:7]}")
    per_chain = [r.draws for r in runs]
    draws, stan_columns = split_columns(names, np.concatenate(per_chain, axis=0),
                                        len(SAMPLER_COLUMNS))
    col = {c: k for k, c in enumerate(SAMPLER_COLUMNS)}
    diagnostics = {
        "divergences": [int(d[:, col["divergent__"]].sum()) for d in per_chain],
        "n_leapfrog": [int(d[:, col["n_leapfrog__"]].sum()) for d in per_chain],
        "max_treedepth_hits": [int((d[:, col["treedepth__"]] >= opts["max_depth"]).sum())
                               for d in per_chain],
        "stepsize": [float(d[0, col["stepsize__"]]) if len(d) else float("nan")
                     for d in per_chain],
        "mean_accept_stat": [float(d[:, col["accept_stat__"]].mean()) for d in per_chain],
    }
    diagnostics["total_n_leapfrog"] = int(sum(diagnostics["n_leapfrog"]))
    return ReferenceFit(
        algorithm=algorithm, model_name=compiled.name, draws=draws, stan_columns=stan_columns,
        chains=chains, gradient_evaluations=sum(r.counts[1] for r in runs),
        density_evaluations=sum(r.counts[0] for r in runs), wall_time=wall,
        settings={"chains": chains, "seed": seed, "num_warmup": num_warmup,
                  "num_samples": num_samples, "metric": metric, **opts},
        messages=[r.messages for r in runs], sampler_diagnostics=diagnostics)
