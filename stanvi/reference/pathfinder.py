"""Stan's Pathfinder in-process: ``stan::services::pathfinder::pathfinder_lbfgs_single`` and
``pathfinder_lbfgs_multi`` (stan/services/pathfinder/; Zhang, Carpenter, Gelman & Vehtari 2022,
"Pathfinder: Parallel quasi-Newton variational inference", JMLR 23).
"""

from __future__ import annotations

import os
import time

from stanvi.reference.cmdstan_backend import check_backend, pathfinder_cmdstan
from stanvi.reference.result import ReferenceFit, split_columns
from stanvi.reference.services_lib import check_settings, init_to_json, prepare, raise_run_error
from stanvi.stan.compiler import CompiledModel
from stanvi.stan.data import DataLike

# CmdStan's `pathfinder` defaults (CmdStan guide, "Pathfinder Method for Approximate Bayesian
# Inference").
PATHFINDER_DEFAULTS = {"init_alpha": 0.001, "tol_obj": 1e-12, "tol_rel_obj": 1e4,
                       "tol_grad": 1e-8, "tol_rel_grad": 1e7, "tol_param": 1e-8,
                       "history_size": 5, "num_psis_draws": 1000, "num_paths": 4,
                       "psis_resample": True, "calculate_lp": True, "max_lbfgs_iters": 1000,
                       "num_draws": 1000, "num_elbo_draws": 25, "init_radius": 2.0}

_COLUMNS = ("lp_approx__", "lp__", "path__")


def pathfinder(model: str | os.PathLike | CompiledModel, data: DataLike = None, *,
               seed: int = 0, init=None, progress: bool = False, backend: str = "inprocess",
               **kw) -> ReferenceFit:
    """Run Stan's Pathfinder on a Stan model, in-process, with CmdStan's defaults.

    ``num_paths=1`` runs single-path Pathfinder (``pathfinder_lbfgs_single``: ``num_draws``
    draws from the best normal approximation along one L-BFGS path); more paths (default 4) run
    multi-path Pathfinder (``pathfinder_lbfgs_multi``: the paths in parallel (TBB), then
    ``num_psis_draws`` draws importance-resampled with PSIS from all paths' draws, unless
    ``psis_resample=False``, which returns all ``num_paths * num_draws`` draws).

    ``backend="cmdstan"`` runs the same through cmdstanpy and the user's CmdStan (evaluations
    are then not counted).

    Returns:
        :class:`~stanvi.reference.result.ReferenceFit` (``algorithm`` ``"pathfinder"`` or
        ``"pathfinder-multi"``) with ``log_p`` / ``log_q`` (Stan's ``lp__`` and
        ``lp_approx__``) for k̂.  For resampled multi-path draws, k̂ of those ratios describes the
        resampled set, not a proposal: Stan's own PSIS k̂ warning (over all paths' draws, shown
        only above 0.7) is in ``messages``.

    Raises:
        StanDataError for rejected data; ReferenceRunError when every path fails.
    """
    opts = check_settings(kw, PATHFINDER_DEFAULTS, "Pathfinder")
    if opts["num_paths"] < 1:
        raise ValueError("num_paths must be >= 1")
    check_backend(backend)
    if backend == "cmdstan":
        return pathfinder_cmdstan(model, data, seed=seed, init=init, settings=opts)
    compiled, data_json, lib = prepare(model, data, progress)
    multi = opts["num_paths"] > 1
    start = time.perf_counter()
    try:
        raw = lib.call("stanvi_pathfinder", data_json, init_to_json(init), int(seed),
                       opts["init_radius"], opts["history_size"], opts["init_alpha"],
                       opts["tol_obj"], opts["tol_rel_obj"], opts["tol_grad"],
                       opts["tol_rel_grad"], opts["tol_param"], opts["max_lbfgs_iters"],
                       opts["num_elbo_draws"], opts["num_draws"], opts["num_psis_draws"],
                       opts["num_paths"] if multi else 0, int(bool(opts["psis_resample"])),
                       int(bool(opts["calculate_lp"])))
    except RuntimeError as exc:
        raise_run_error(exc, "Pathfinder", compiled.name, data_json)
    wall = time.perf_counter() - start
    draws, stan_columns = split_columns(raw.names, raw.draws, len(_COLUMNS))
    return ReferenceFit(
        algorithm="pathfinder-multi" if multi else "pathfinder", model_name=compiled.name,
        draws=draws, stan_columns=stan_columns, chains=1,
        gradient_evaluations=raw.counts[1], density_evaluations=raw.counts[0], wall_time=wall,
        settings={"seed": seed, **opts}, messages=[raw.messages],
        log_p=stan_columns["lp__"], log_q=stan_columns["lp_approx__"])
