"""Stan's own ADVI in-process: ``stan::services::experimental::advi::{meanfield,fullrank}``
(stan/services/experimental/advi/, what CmdStan's ``variational`` method runs; Kucukelbir, Tran,
Ranganath, Gelman & Blei 2017, "Automatic Differentiation Variational Inference", JMLR 18).

This is Stan's C++ implementation itself, not stanvi's re-implementation (``method="advi"``,
profile ``stan``, in :mod:`stanvi.methods.advi`); the two are compared in the tests.
"""

from __future__ import annotations

import os
import time

import numpy as np

from stanvi.reference.result import ReferenceFit, split_columns
from stanvi.reference.services_lib import check_settings, init_to_json, prepare, raise_run_error
from stanvi.stan.compiler import CompiledModel
from stanvi.stan.data import DataLike

# CmdStan's `variational` defaults (CmdStan guide, "Variational Inference using ADVI").
ADVI_DEFAULTS = {"iter": 10_000, "grad_samples": 1, "elbo_samples": 100, "eta": 1.0,
                 "adapt_engaged": True, "adapt_iter": 50, "tol_rel_obj": 0.01, "eval_elbo": 100,
                 "output_samples": 1000, "init_radius": 2.0}

_ADVI_COLUMNS = ("lp__", "log_p__", "log_g__")


def stan_advi(model: str | os.PathLike | CompiledModel, data: DataLike = None, *,
              algorithm: str = "meanfield", seed: int = 0, init=None, progress: bool = False,
              **kw) -> ReferenceFit:
    """Run Stan's C++ ADVI on a Stan model, in-process, with CmdStan's defaults.

    Args:
        model, data: as for :func:`stanvi.fit`.
        algorithm: ``"meanfield"`` (Stan's default) or ``"fullrank"``.
        seed: Stan's random seed (chain id 1, as CmdStan).
        init: initial values (constrained, by name); default uniform(-2, 2) unconstrained.
        **kw: CmdStan's settings, defaults in :data:`ADVI_DEFAULTS` (``iter``, ``grad_samples``,
            ``elbo_samples``, ``eta``, ``adapt_engaged``, ``adapt_iter``, ``tol_rel_obj``,
            ``eval_elbo``, ``output_samples``, ``init_radius``).

    Returns:
        :class:`~stanvi.reference.result.ReferenceFit`: ``output_samples`` draws from the
        approximation with ``log_p`` / ``log_q`` (Stan's ``log_p__`` and ``log_g__``, the latter
        the approximation's log density up to a constant) for k̂, ``mean`` (Stan's first output
        row), ``elbo_trace`` (iteration, seconds, ELBO) and the counted gradient and density
        evaluations (ELBO evaluations and the output draws' ``log_p__`` included).

    Raises:
        StanDataError for rejected data; ReferenceRunError when Stan's ADVI fails (e.g. "All
        proposed step-sizes failed", no valid initial point).
    """
    opts = check_settings(kw, ADVI_DEFAULTS, "ADVI")
    if algorithm not in ("meanfield", "fullrank"):
        raise ValueError(f"algorithm must be 'meanfield' or 'fullrank', not {algorithm!r}")
    compiled, data_json, lib = prepare(model, data, progress)
    start = time.perf_counter()
    try:
        raw = lib.call("stanvi_advi", data_json, init_to_json(init), int(seed),
                       int(algorithm == "fullrank"), opts["init_radius"], opts["grad_samples"],
                       opts["elbo_samples"], opts["iter"], opts["tol_rel_obj"], opts["eta"],
                       int(bool(opts["adapt_engaged"])), opts["adapt_iter"], opts["eval_elbo"],
                       opts["output_samples"])
    except RuntimeError as exc:
        raise_run_error(exc, f"ADVI ({algorithm})", compiled.name)
    wall = time.perf_counter() - start
    draws, stan_columns = split_columns(raw.names, raw.draws[1:], len(_ADVI_COLUMNS))
    mean, _ = split_columns(raw.names, raw.draws[:1], len(_ADVI_COLUMNS))
    return ReferenceFit(
        algorithm="stan-advi", model_name=compiled.name, draws=draws, stan_columns=stan_columns,
        chains=1, gradient_evaluations=raw.counts[1], density_evaluations=raw.counts[0],
        wall_time=wall, settings={"algorithm": algorithm, "seed": seed, **opts},
        messages=[raw.messages], elbo_trace=raw.diagnostics,
        mean={k: v[0] for k, v in mean.items()},
        log_p=stan_columns["log_p__"], log_q=stan_columns["log_g__"])


def advi_final_elbo(fit: ReferenceFit) -> float:
    """The last ELBO Stan's ADVI evaluated (its convergence check's value), NaN if none."""
    trace = fit.elbo_trace
    return float(trace[-1, 2]) if trace is not None and trace.size else float(np.nan)
