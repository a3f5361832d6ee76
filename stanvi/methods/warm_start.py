"""A Laplace warm start for variational methods: the mode of log p found by L-BFGS, and q's
scales from the Hessian there (stanvi's addition, docs/methods.md, "Why `default` changed").

Stan's initialization, uniform(−2, 2) on the unconstrained scale, is far from posteriors in raw
units (a regression on heights in cm: the initial ELBO is −3e9; a mean near 1,500: a hundred
nats short for every method tried).  Pathfinder (Zhang, Carpenter, Gelman & Vehtari 2022, JMLR
23(306), §2) starts from the L-BFGS path of log p for the same reason.  Here:

1. L-BFGS (SciPy's L-BFGS-B, no bounds; :func:`lbfgs_paths`) maximizes
   log p from the initial point, at most ``max_iters`` iterations; one gradient per evaluation.
2. The Hessian H at the end point, from D Hessian-vector products in one batched call.
3. q₀ = N(z*, diag(1/Λ_ii)) for mean-field (the mean-field optimum if p were Gaussian with
   precision Λ = −H; Bishop 2006, §10.1.2), N(z*, Λ⁻¹) for full rank, a diagonal-plus-rank-k
   fit of Λ⁻¹ for the low-rank family (docs/algorithms.md#lowrank; above its
   ``dense_precision_max_dim`` no Hessian is formed and q₀ is centred at z* with the default
   scales).
4. Two safeguards, since a mode need not exist or be representative (a funnel's density is
   unbounded at its neck).  A *degenerate* mode is refused (:func:`degenerate_coordinate`):
   one where the Laplace Gaussian's conditional sd 1/√Λ_ii in some coordinate is below
   ``DEGENERATE_SD`` = 10⁻⁸ (about √ε) of max(1, |z*_i|), so that q₀'s draws in it equal its
   mean to rounding.  L-BFGS ends there when it runs down the neck of a centred hierarchical
   model (log p → +∞ as the group scale → 0): on example-models' ARM/Ch.21
   radon_vary_intercept_floor, the group scale's unconstrained value −38.9 and the group
   effects' sds e^−34, a q₀ whose ELBO (−2,603) still beat the default start's (−4,771), from
   which TrustVI could not move (its trust region collapsed), ending 10–30 posterior sds off;
   from the default start it converges to −1,079 in 23 iterations.  Then the ELBO of q₀ and of
   the method's own initial q are estimated on the same ``n_compare`` draws, and the warm start
   is kept only if it is higher.

Every evaluation is charged to the method's ledger (gradients, HVPs, log densities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
from stanvi.lazy_jax import jax

from stanvi.estimators.elbo import mean_of_valid, standard_normal
from stanvi.families.lowrank_rank import RankChoice, choose_rank
from stanvi.methods.base import OracleLedger
from stanvi.optim.lbfgsb import minimize_lbfgsb_lockstep

#: Why there is no Laplace start when the Hessian at the mode is not finite.
HESSIAN_NOT_FINITE = "the Hessian at the mode is not finite"
#: Common draws on which the Laplace start's ELBO is compared with the method's own start.
LAPLACE_COMPARE_DRAWS = 64
#: A Laplace Gaussian with a conditional sd below this fraction of max(1, |mode|) in some
#: coordinate is degenerate (:func:`degenerate_coordinate`): about √ε in double precision
DEGENERATE_SD = 1e-8


def mean_elbo(est, params: np.ndarray, eps: np.ndarray) -> float:
    """The ELBO estimate on ``eps``; −inf if more than 10% of the draws fail (the failing ones
    are dropped otherwise, as Stan's calc_ELBO drops them)."""
    return mean_of_valid(est.values(params, eps), math.ceil(0.9 * len(eps)))


def neg_log_p_rows(target, ledger: OracleLedger):
    """−log p and its gradient at the rows of a (k, D) array, in one batched call charged to
    ``ledger``: (f of shape (k,), g of shape (k, D)); a row where the model fails gets f = +inf
    and g = 0 (L-BFGS-B then backtracks)."""
    def rows(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        res = target.log_density_gradient(z)
        ledger.gradient(len(z))
        ok = np.asarray(res.ok, dtype=bool)
        f, g = -np.asarray(res.log_density, dtype=float), -np.asarray(res.gradient, dtype=float)
        if not ok.all():
            f[~ok] = np.inf
            g[~ok] = 0.0
        return f, g
    return rows


def near(centres: np.ndarray, inv_sd: np.ndarray, radius: float):
    """Whether a point lies within ``radius`` (root mean square of its coordinates in units of
    1/``inv_sd``) of a row of ``centres`` (the C++ paths' ``near_a_centre``)."""
    limit = radius ** 2 * centres.shape[1]

    def is_near(z: np.ndarray) -> bool:
        w = (z - centres) * inv_sd
        return bool((w * w).sum(axis=1).min() < limit)
    return is_near


def lbfgs_paths(target, ledger: OracleLedger, inits: list, *, max_iters: int,
                centres: np.ndarray | None = None, inv_sd: np.ndarray | None = None,
                radius: float = 0.0) -> list[SimpleNamespace]:
    """Independent L-BFGS-B paths maximizing log p from ``inits``, each stopped at its first
    iterate within ``radius`` of a row of ``centres`` (:func:`near`; none: no stop), their
    gradients charged to ``ledger``: each path's end (``x``, ``fun`` = −log p, ``nit``,
    ``status``: SciPy's codes or ``STOPPED``, 4 with ``message`` for a failed start).  In C++
    where the target has ``lbfgs_paths`` (a Stan model: the same algorithm, its iterates
    SciPy's to rounding, no Python per iteration; docs/algorithms.md#lbfgsb); else SciPy's
    L-BFGS-B in lockstep, one batched model call per round."""
    if hasattr(target, "lbfgs_paths"):
        paths = target.lbfgs_paths(np.array(inits), max_iters=max_iters, centres=centres,
                                   inv_sd=inv_sd, radius=radius)
        ledger.gradient_paths(paths.evaluations)
        return [SimpleNamespace(x=x, fun=-float(lp), nit=int(nit), status=int(code),
                                message=paths.messages.get(i, ""))
                for i, (x, lp, nit, code) in enumerate(zip(paths.x, paths.log_density,
                                                           paths.iterations, paths.status))]
    stop = None
    if centres is not None and len(centres):
        is_near = near(centres, inv_sd, radius)
        stop = lambda _path, z: is_near(z)  # noqa: E731
    return minimize_lbfgsb_lockstep(neg_log_p_rows(target, ledger), inits, stop=stop,
                                    maxiter=max_iters, maxfun=2 * max_iters)


def mode_precision(target, z_star: np.ndarray, ledger: OracleLedger) -> np.ndarray | None:
    """−H at ``z_star`` from D Hessian-vector products in one batched call, charged to
    ``ledger`` (step 2 of the module docstring); None where it is not finite."""
    dim = len(z_star)
    res = target.log_density_hvp(np.tile(z_star, (dim, 1)), np.eye(dim))
    ledger.hvp(1, dim)
    if res.hvp is None or not np.all(res.ok) or not np.all(np.isfinite(res.hvp)):
        return None
    return -0.5 * (res.hvp + res.hvp.T)


def degenerate_coordinate(z_star: np.ndarray,
                          precision: np.ndarray) -> tuple[int, float] | None:
    """(i, sd) of the coordinate where the Laplace Gaussian at ``z_star`` is most degenerate,
    or None where it is nowhere: the conditional sd 1/√Λ_ii below ``DEGENERATE_SD`` ·
    max(1, |z*_i|), Λ = ``precision`` (step 4 of the module docstring;
    docs/methods.md#degenerate-mode; coordinates with Λ_ii ≤ 0, where the mode is not a
    maximum, are the families' own concern)."""
    diag = np.diag(np.asarray(precision, dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        sd = np.where(diag > 0, 1.0 / np.sqrt(np.where(diag > 0, diag, 1.0)), np.inf)
    ratio = sd / np.maximum(1.0, np.abs(np.asarray(z_star, dtype=float)))
    i = int(np.argmin(ratio))
    return (i, float(sd[i])) if ratio[i] < DEGENERATE_SD else None


def degenerate_reason(target, z_star: np.ndarray, precision: np.ndarray) -> str:
    """Why the mode's Laplace Gaussian cannot start a fit ('' where it can): its degenerate
    coordinate (:func:`degenerate_coordinate`), by the target's name for it."""
    found = degenerate_coordinate(z_star, precision)
    if found is None:
        return ""
    i, sd = found
    names = getattr(target, "unconstrained_names", None)
    name = names[i] if names is not None and i < len(names) else f"coordinate {i}"
    return (f"the mode is degenerate: the Laplace Gaussian's sd in {name} is {sd:.2g} at "
            f"{float(z_star[i]):.3g} (below {DEGENERATE_SD:g} of its size; a funnel's neck, "
            f"where log p grows without bound)")


@dataclass(frozen=True)
class LaplacePoint:
    """Steps 1–2 of the module docstring computed before the method runs: L-BFGS from ``mu0``
    (its end ``opt`` as :func:`lbfgs_paths` gives it, or the ``error`` that stopped it), −H at
    the end (``precision``, None where not finite or not computed; ``error`` then says so when
    it was evaluated) and their cost (``ledger``)."""

    mu0: np.ndarray
    opt: SimpleNamespace | None
    error: str
    precision: np.ndarray | None
    ledger: OracleLedger


def _mode(target, ledger: OracleLedger, mu0: np.ndarray,
          max_iters: int) -> tuple[SimpleNamespace | None, str]:
    """(L-BFGS's end from ``mu0``, '') or (None, why it could not run)."""
    try:
        (opt,) = lbfgs_paths(target, ledger, [np.asarray(mu0, dtype=float)],
                             max_iters=max_iters)
        if getattr(opt, "message", ""):   # the C++ path could not evaluate its start
            raise ValueError(opt.message)
    except (ValueError, FloatingPointError) as exc:  # scipy rejects non-finite starting values
        return None, str(exc)
    return opt, ""


def laplace_point(target, mu0: np.ndarray, max_iters: int = 1000) -> LaplacePoint:
    """The mode from ``mu0`` and the precision there, charged to a ledger of their own
    (:class:`LaplacePoint`): what the low-rank family's rank is chosen from
    (docs/algorithms.md#lowrank-rank) before :func:`laplace_start` uses them."""
    ledger = OracleLedger()
    mu0 = np.asarray(mu0, dtype=float)
    opt, error = _mode(target, ledger, mu0, max_iters)
    precision = None
    if opt is not None and np.isfinite(opt.fun) and np.all(np.isfinite(opt.x)):
        precision = mode_precision(target, np.asarray(opt.x, dtype=float), ledger)
        if precision is None:
            error = HESSIAN_NOT_FINITE
    return LaplacePoint(mu0, opt, error, precision, ledger)


def rank_from_laplace(target, mu0: np.ndarray, max_rank: int
                      ) -> tuple[LaplacePoint, RankChoice | None]:
    """The :class:`LaplacePoint` from ``mu0`` and the low-rank family's rank chosen from its
    Laplace Gaussian (:func:`stanvi.families.lowrank_rank.choose_rank`, at most ``max_rank``;
    None where the mode or its precision is unusable)."""
    point = laplace_point(target, mu0)
    if point.precision is None:
        return point, None
    return point, choose_rank(np.asarray(point.opt.x, dtype=float), point.precision, max_rank)


def laplace_q(target, family, z_star: np.ndarray, ledger: OracleLedger,
              log_scale0: float, info: dict | None = None, fallback: bool = False,
              precision: np.ndarray | None = None) -> tuple[np.ndarray | None, str]:
    """Steps 2–3 of the module docstring at the mode ``z_star``: (q₀'s parameters, '') or
    (None, the reason there is none: among them a degenerate mode, step 4).  A family that
    compresses the Laplace Gaussian (one with ``laplace_deficit``: the low-rank family) records
    in ``info["laplace_deficit"]`` the ELBO q₀ gives up against it
    (docs/algorithms.md#second-start); with ``fallback``, one whose
    ``laplace_starts`` gives a fallback start (the low-rank family's PPCA start behind its
    reverse-KL one) records that start and its deficit in ``info["laplace_fallback"]``
    (docs/algorithms.md#lowrank-start).  ``precision``: −H at ``z_star`` when already
    computed and charged (:func:`laplace_point`)."""
    dim = family.dim
    if not np.all(np.isfinite(z_star)):
        return None, "L-BFGS ended at a non-finite point"
    limit = getattr(family, "dense_precision_max_dim", None)
    if limit is not None and dim > limit:
        # a family that must not hold a D × D matrix (the low-rank family at large D): q₀
        # centred at the mode with the family's default scales, no Hessian evaluated
        return family.params_from_mode(z_star, log_scale0), ""
    if precision is None:
        precision = mode_precision(target, z_star, ledger)
    if precision is None:
        return None, HESSIAN_NOT_FINITE
    degenerate = degenerate_reason(target, z_star, precision)
    if degenerate:
        return None, degenerate
    params, other = family.laplace_starts(z_star, precision, log_scale0)
    deficit = getattr(family, "laplace_deficit", None)
    if info is not None and deficit is not None:
        info["laplace_deficit"] = deficit(params, precision)
    if fallback and info is not None and other is not None:
        info["laplace_fallback"] = (other, deficit(other, precision) if deficit else None)
    return params, ""


def laplace_start(target, family, est, mu0: np.ndarray, default_params: np.ndarray, *,
                  key: jax.Array, ledger: OracleLedger, log_scale0: float,
                  max_iters: int = 1000, n_compare: int = LAPLACE_COMPARE_DRAWS,
                  alternatives: list | None = None, fallbacks: list | None = None,
                  point: LaplacePoint | None = None) -> tuple[np.ndarray, dict]:
    """The initial variational parameters: the Laplace start when its ELBO estimate beats
    ``default_params``' on common draws, else ``default_params`` (module docstring).  Returns
    the parameters and a record (``warm_start``: 'laplace' or 'default', with the reason).
    The candidate not chosen, when there was one, is appended to ``alternatives`` (a second,
    independent start: :mod:`stanvi.methods.trustvi_second_start`).  When the Laplace start is
    chosen and its family has a fallback start (:func:`laplace_q`), (its λ, its deficit) is
    appended to ``fallbacks`` when given (TrustVI's
    :func:`stanvi.methods.trustvi_second_start.run_from_fallback`).  A ``point``
    (:func:`laplace_point`) from the same ``mu0`` stands in for steps 1–2, its cost charged
    to ``ledger``."""
    if alternatives is None:
        alternatives = []
    info: dict = {}
    precision = None
    if point is not None and np.array_equal(point.mu0, np.asarray(mu0, dtype=float)):
        ledger.absorb(point.ledger)
        opt, error, precision = point.opt, point.error, point.precision
    else:
        opt, error = _mode(target, ledger, mu0, max_iters)
    if opt is None:
        return default_params, {"warm_start": "default", "warm_start_reason": error}
    info["laplace_iterations"] = int(opt.nit)
    if not np.isfinite(opt.fun):
        return default_params, {**info, "warm_start": "default",
                                "warm_start_reason": "L-BFGS ended at a non-finite point"}
    if error:   # the point's Hessian was evaluated and is not finite: not evaluated again
        return default_params, {**info, "warm_start": "default", "warm_start_reason": error}
    laplace, reason = laplace_q(target, family, np.asarray(opt.x, dtype=float), ledger,
                                log_scale0, info, fallback=fallbacks is not None,
                                precision=precision)
    if laplace is None:
        return default_params, {**info, "warm_start": "default", "warm_start_reason": reason}
    eps = standard_normal(key, n_compare, family.base_dim)
    elbo_laplace = mean_elbo(est, laplace, eps)
    elbo_default = mean_elbo(est, default_params, eps)
    ledger.elbo_estimate(2 * n_compare)
    info.update(laplace_elbo=elbo_laplace, default_elbo=elbo_default)
    fallback = info.pop("laplace_fallback", None)
    if elbo_laplace > elbo_default:
        alternatives.append(default_params)
        if fallback is not None and fallbacks is not None:
            fallbacks.append(fallback)
        return laplace, {**info, "warm_start": "laplace"}
    alternatives.append(laplace)
    return default_params, {**info, "warm_start": "default",
                            "warm_start_reason": "the Laplace start's ELBO estimate was lower"}
