"""Stan's own ADVI in-process: ``stan::services::experimental::advi::{meanfield,fullrank}``
(stan/services/experimental/advi/, what CmdStan's ``variational`` method runs; Kucukelbir, Tran,
Ranganath, Gelman & Blei 2017, "Automatic Differentiation Variational Inference", JMLR 18).

This is Stan's C++ implementation itself, not stanvi's re-implementation (``method="advi"``,
profile ``stan``, in :mod:`stanvi.methods.advi`); the two are compared in the tests.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from stanvi.reference.cmdstan_backend import advi_cmdstan, check_backend
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
              backend: str = "inprocess", **kw) -> ReferenceFit:
    """Run Stan's C++ ADVI on a Stan model, in-process, with CmdStan's defaults.

    Args:
        model, data: as for :func:`stanvi.fit`.
        algorithm: ``"meanfield"`` (Stan's default) or ``"fullrank"``.
        seed: Stan's random seed (chain id 1, as CmdStan).
        init: initial values (constrained, by name); default uniform(-2, 2) unconstrained.
        backend: ``"inprocess"`` (default) or ``"cmdstan"`` (cmdstanpy and the user's CmdStan;
            evaluations are then not counted).
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
    check_backend(backend)
    if backend == "cmdstan":
        return advi_cmdstan(model, data, algorithm=algorithm, seed=seed, init=init,
                            settings=opts)
    compiled, data_json, lib = prepare(model, data, progress)
    start = time.perf_counter()
    try:
        raw = lib.call("stanvi_advi", data_json, init_to_json(init), int(seed),
                       int(algorithm == "fullrank"), opts["init_radius"], opts["grad_samples"],
                       opts["elbo_samples"], opts["iter"], opts["tol_rel_obj"], opts["eta"],
                       int(bool(opts["adapt_engaged"])), opts["adapt_iter"], opts["eval_elbo"],
                       opts["output_samples"])
    except RuntimeError as exc:
        raise_run_error(exc, f"ADVI ({algorithm})", compiled.name, data_json)
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


def stan_advi_gaussian(fit: ReferenceFit, unconstrained: np.ndarray,
                       mean_unconstrained: np.ndarray) -> np.ndarray:
    """The Cholesky factor L of the Gaussian q = N(μ, L Lᵀ) that Stan's ADVI fitted, recovered
    exactly from its output (Stan does not write ω or L).

    Each output draw is ζᵢ = μ + L ηᵢ with ``log_g__`` = −|ηᵢ|²/2 (Stan's ``calc_log_g``), so
    −2 log gᵢ = (ζᵢ − μ)ᵀ P (ζᵢ − μ) with P = (L Lᵀ)⁻¹: linear in P's entries.  Least squares
    over the draws gives P (diagonal for mean-field: D unknowns; symmetric for full-rank:
    D(D+1)/2 unknowns, so it needs at least that many draws), hence L.

    Args:
        fit: a :func:`stan_advi` result.
        unconstrained: its draws mapped to unconstrained space, (S, D), in draw order.
        mean_unconstrained: μ, the unconstrained image of ``fit.mean``.

    Computed once per fit and set of draws, and kept on the fit, the failure included: the ELBO
    and the verdict both need L, and the full-rank least squares takes tens of seconds near
    D = 90 (docs/diagnostics.md#stan).

    Raises:
        ValueError when there are too few draws or the recovered precision is not positive
        definite (the output is then not what this formula assumes).
    """
    zeta = np.ascontiguousarray(unconstrained, dtype=float)
    mean = np.ascontiguousarray(mean_unconstrained, dtype=float)
    digest = hashlib.sha256(zeta.tobytes() + mean.tobytes()
                            + repr(zeta.shape).encode()).hexdigest()
    kept = fit.__dict__.get("_advi_gaussian")
    if kept is None or kept[0] != digest:
        try:
            kept = (digest, _least_squares_cholesky(fit, zeta, mean))
        except ValueError as exc:
            kept = (digest, exc)
        fit.__dict__["_advi_gaussian"] = kept
    if isinstance(kept[1], ValueError):
        raise ValueError(str(kept[1]))
    return kept[1]


def _least_squares_cholesky(fit: ReferenceFit, unconstrained: np.ndarray,
                            mean_unconstrained: np.ndarray) -> np.ndarray:
    """:func:`stan_advi_gaussian`'s least squares, computed afresh."""
    dev = np.asarray(unconstrained, dtype=float) - np.asarray(mean_unconstrained, dtype=float)
    target = -2.0 * np.asarray(fit.log_q, dtype=float)
    n, d = dev.shape
    if fit.settings.get("algorithm") == "fullrank":
        rows, cols = np.triu_indices(d)
        design = dev[:, rows] * dev[:, cols] * np.where(rows == cols, 1.0, 2.0)
        if n < design.shape[1]:
            raise ValueError(f"{n} draws cannot identify a {d}-dimensional full-rank Gaussian "
                             f"(need {design.shape[1]})")
        coef = np.linalg.lstsq(design, target, rcond=None)[0]
        precision = np.zeros((d, d))
        precision[rows, cols] = coef
        precision[cols, rows] = coef
    else:
        if n < d:
            raise ValueError(f"{n} draws cannot identify a {d}-dimensional Gaussian")
        precision = np.diag(np.linalg.lstsq(dev**2, target, rcond=None)[0])
    try:
        return np.linalg.cholesky(np.linalg.inv(precision))
    except np.linalg.LinAlgError:
        raise ValueError("the precision recovered from Stan's ADVI output is not positive "
                         "definite") from None


def gaussian_elbo(target, mu: np.ndarray, chol: np.ndarray, eps: np.ndarray
                  ) -> tuple[float, float]:
    """(ELBO, its Monte Carlo standard error) of q = N(μ, L Lᵀ) at base draws ε (S, D): the mean
    of log p(μ + L ε) (``target.log_density``, Jacobian included) plus q's entropy
    D/2 (1 + log 2π) + Σ log Lᵢᵢ.  −inf when log p is not finite at some draw."""
    z = np.asarray(mu) + np.asarray(eps) @ np.asarray(chol).T
    lp = np.asarray(target.log_density(z).log_density, dtype=float)
    d = len(mu)
    entropy = 0.5 * d * (1.0 + np.log(2 * np.pi)) + float(np.log(np.diag(chol)).sum())
    if not np.all(np.isfinite(lp)):
        return -np.inf, np.nan
    return float(lp.mean() + entropy), float(lp.std(ddof=1) / np.sqrt(len(lp)))


def stan_advi_elbo(fit: ReferenceFit, target, eps_sets: list[np.ndarray],
                   unconstrained: dict[str, np.ndarray] | None = None
                   ) -> list[tuple[float, float]]:
    """The ELBO of the Gaussian Stan's ADVI fitted (:func:`stan_advi_gaussian`) at each set of
    base draws in ``eps_sets``, computed as stanvi computes its own fits' ELBO.  ``target``: a
    :class:`~stanvi.targets.stan_target.StanTarget` of the same model and data;
    ``unconstrained``: the draws already mapped to unconstrained space, by unconstrained name
    (when not given, :func:`stanvi.targets.labelled.mapped_unconstrained`: mapped once per fit,
    for the verdict too)."""
    from stanvi.targets.labelled import mapped_unconstrained  # noqa: PLC0415

    if unconstrained is None:
        unconstrained, why = mapped_unconstrained(fit, target)
        if unconstrained is None:
            raise ValueError(f"cannot map Stan's ADVI draws to unconstrained space: {why}")
    zeta = np.column_stack([unconstrained[n] for n in target.unconstrained_names])
    mu = target.unconstrain(fit.mean)
    chol = stan_advi_gaussian(fit, zeta, mu)
    return [gaussian_elbo(target, mu, chol, eps) for eps in eps_sets]
