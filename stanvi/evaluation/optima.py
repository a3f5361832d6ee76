"""The independently computed mean-field optima of the stan_models set.

Each model ``<dir>/<stem>.stan`` of ``stan_models/`` has ``<dir>/<stem>.optimum.json``, written
by ``stan_models/compute_optima.py`` without any stanvi method (L-BFGS-B on a fixed 4,096-draw
sample-average ELBO from several starts, the ELBO re-estimated on 100,000 fresh draws; the
closed form for the Gaussian models).  The numerical procedure itself lives here
(:func:`numerical_optimum`, :func:`optimum_record`), so that ``stanvi bench public-stopping``
computes the optima of posteriordb posteriors exactly as compute_optima.py does for stan_models.  :func:`load_optimum` reads one into a
:class:`MeanFieldOptimum`; benchmarks and tests judge methods against it (issue 8).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np

from stanvi.evaluation.models import MODELS_DIR
"""The repository's stan_models directory (where names are looked up)."""

SUFFIX = ".optimum.json"


@dataclass(frozen=True, eq=False)
class MeanFieldOptimum:
    """The mean-field Gaussian optimum q* = N(mu, diag(sigma²)) of one model, in unconstrained
    space, with its ELBO.

    ``elbo`` is None (and ``mu``/``sigma`` may be None) where the model has no finite optimum,
    with the reason in ``reason`` (``reject_region``: every Gaussian q has ELBO −∞).  For the
    Gaussian models ``exact`` is True and ``mu``, ``sigma``, ``elbo`` are the closed form
    (``elbo_se`` 0); ``posterior_sd`` then holds the exact posterior sds.
    """

    model: str
    path: Path
    dim: int
    elbo: float | None
    elbo_se: float | None
    mu: np.ndarray | None
    sigma: np.ndarray | None
    exact: bool
    posterior_sd: np.ndarray | None
    starts: Mapping[str, float]
    starts_agree: bool | None
    best_start: str | None
    n_draws_fit: int | None
    n_draws_eval: int | None
    seed: int | None
    method: str
    versions: Mapping[str, str]
    reason: str | None = None
    raw: Mapping = field(default_factory=dict, repr=False)

    @property
    def available(self) -> bool:
        """True when the model has a finite optimum to compare with."""
        return self.elbo is not None and self.mu is not None and self.sigma is not None

    @property
    def params(self) -> np.ndarray:
        """The family parameters (mu, omega = log sigma), as stanvi's MeanField packs them."""
        if self.mu is None or self.sigma is None:
            raise ValueError(f"{self.model}: no optimum ({self.reason})")
        return np.concatenate([self.mu, np.log(self.sigma)])

    @property
    def start_spread(self) -> float:
        """Largest difference between the starts' final fixed-draw ELBOs (nats)."""
        values = list(self.starts.values())
        return max(values) - min(values) if values else math.nan


def optimum_path(model: str | Path, models_dir: Path = MODELS_DIR) -> Path | None:
    """The ``.optimum.json`` path for a model given as a ``.stan`` file, an ``.optimum.json``
    file, a model directory holding exactly one ``.stan`` file, or a model name (a ``.stan``
    stem, or a directory name holding exactly one ``.stan`` file, under ``models_dir``).
    None when there is no such model.  Raises ValueError for a directory with several models
    (``eight_schools``): name the program instead."""
    path = Path(model)
    if path.name.endswith(SUFFIX):
        return path
    if path.suffix == ".stan":
        return path.with_suffix(SUFFIX)
    if not path.is_dir():
        if path.parent != Path("."):  # a path that is not there
            return None
        stems = sorted(models_dir.glob(f"*/{path.name}.stan"))
        if stems:
            return stems[0].with_suffix(SUFFIX)
        path = models_dir / path.name
        if not path.is_dir():
            return None
    programs = sorted(path.glob("*.stan"))
    if len(programs) > 1:
        raise ValueError(f"{path} holds {len(programs)} models "
                         f"({', '.join(p.stem for p in programs)}): name one of them")
    return programs[0].with_suffix(SUFFIX) if programs else None


def _array(values) -> np.ndarray | None:
    if values is None:
        return None
    out = np.asarray(values, dtype=float)
    out.setflags(write=False)
    return out


def load_optimum(model_dir_or_name: str | Path,
                 models_dir: Path = MODELS_DIR) -> MeanFieldOptimum | None:
    """The stored mean-field optimum of a model (see :func:`optimum_path` for the ways to name
    it), or None when the model has no ``.optimum.json``."""
    path = optimum_path(model_dir_or_name, models_dir)
    if path is None or not path.exists():
        return None
    rec = json.loads(path.read_text())
    numerical = rec.get("numerical", {})
    starts = rec.get("starts") or numerical.get("starts") or {}
    agree = rec.get("starts_agree", numerical.get("starts_agree"))
    return MeanFieldOptimum(
        model=rec.get("model", path.name[: -len(SUFFIX)]),
        path=path,
        dim=int(rec["dim"]),
        elbo=None if rec.get("elbo") is None else float(rec["elbo"]),
        elbo_se=None if rec.get("elbo_se") is None else float(rec["elbo_se"]),
        mu=_array(rec.get("mu")),
        sigma=_array(rec.get("sigma")),
        exact=bool(rec.get("exact", False)),
        posterior_sd=_array(rec.get("posterior_sd")),
        starts=MappingProxyType({k: float(v) for k, v in starts.items()}),
        starts_agree=None if agree is None else bool(agree),
        best_start=rec.get("best_start"),
        n_draws_fit=rec.get("n_draws_fit"),
        n_draws_eval=rec.get("n_draws_eval"),
        seed=rec.get("seed"),
        method=rec.get("method", ""),
        versions=MappingProxyType({k: str(rec[k]) for k in ("stanvi", "stanc") if k in rec}),
        reason=rec.get("reason"),
        raw=MappingProxyType(rec),
    )


# ---------------------------------------------------------------------------------------------
# Computing an optimum (used by stan_models/compute_optima.py and stanvi bench public-stopping).
# No TrustVI, ADVI, refinement or other stanvi method is used: stanvi's ElboEstimator is only the
# evaluator of the model's batched log density and gradient.
#
# 1. A fixed set of 4,096 standard-normal draws ε_j (JAX key ``SEED``) defines the sample-average
#    mean-field ELBO L̂(μ, ω) = mean_j [log p(μ + e^ω ⊙ ε_j)] + Σω + const (log p with every
#    constant, propto = false).  A draw where the model cannot be evaluated makes L̂ = −∞.
# 2. scipy's L-BFGS-B maximizes L̂ from four starts, all with unit scales (ω = 0): μ = 0 (Stan's
#    zero init); two Stan-style uniform(−2, 2) points; the mode of log p found by L-BFGS-B from
#    0.  A start where L̂ is −∞ is retried with ω = −1, −2, −4, −8 (``start_omega``).  Each run
#    is restarted twice from its end point.  The starts' final values (``starts``) must agree
#    within ``AGREE`` nats; where they differ by more, every end point is re-evaluated on the
#    same fresh draws (``starts_fresh``, common random numbers) and ``starts_agree`` is decided
#    on those.
# 3. The ELBO at the best point is re-estimated on ``N_EVAL`` = 100,000 fresh draws (keys
#    ``SEED + 1 + i``, ``EVAL_CHUNKS`` chunks), with its standard error.
# ---------------------------------------------------------------------------------------------

N_FIT, N_EVAL, SEED = 4096, 100_000, 4096
EVAL_CHUNKS = 10
AGREE = 0.05  # nats: the starts must reach the same optimum within this
INFEASIBLE = 1e300  # the L-BFGS-B objective where the sample-average ELBO is -inf
METHOD = ("L-BFGS-B (scipy) on the 4,096-draw sample-average mean-field ELBO from four starts "
          "with unit scales (mu = 0; two Stan-style uniform(-2, 2) points; the L-BFGS-B mode of "
          "log p), each restarted twice from its end point; best start kept; ELBO re-estimated "
          "on 100,000 fresh draws")


def fresh_values(est, params: np.ndarray, dim: int) -> np.ndarray:
    """ℓ(λ; ε) on the ``N_EVAL`` fresh draws (the same draws for every call)."""
    n = N_EVAL // EVAL_CHUNKS
    return np.concatenate([est.values(params, standard_normal_draws(SEED + 1 + i, n, dim))
                           for i in range(EVAL_CHUNKS)])


def standard_normal_draws(seed: int, n: int, dim: int) -> np.ndarray:
    """(n, dim) standard normal draws from JAX key ``seed``."""
    import jax  # noqa: PLC0415

    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415

    return standard_normal(jax.random.PRNGKey(seed), n, dim)


def numerical_optimum(target) -> dict:
    """Steps 1-3 above: the numerical mean-field optimum of a target (a dict: mu, sigma,
    elbo, elbo_se, best_start, starts, start_omega, start_spread, starts_agree, failed_fraction;
    ``elbo`` None with a ``reason`` where the ELBO is −∞)."""
    import scipy.optimize  # noqa: PLC0415

    from stanvi.estimators.registry import estimator_for  # noqa: PLC0415
    from stanvi.families import MeanField  # noqa: PLC0415

    dim = target.dim
    est = estimator_for(target, MeanField(dim))
    eps = standard_normal_draws(SEED, N_FIT, dim)

    def negative_elbo(p: np.ndarray) -> tuple[float, np.ndarray]:
        values, grads = est.values_and_grads(p, eps)
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(grads))):
            return INFEASIBLE, np.zeros_like(p)
        return -float(values.mean()), -grads.mean(axis=0)

    def negative_log_p(z: np.ndarray) -> tuple[float, np.ndarray]:
        res = target.log_density_gradient(z[None, :])
        if not bool(res.ok[0]):
            return INFEASIBLE, np.zeros(dim)
        return -float(res.log_density[0]), -np.asarray(res.gradient[0])

    rng = np.random.default_rng(1)
    starts = {"zero": np.zeros(dim)}
    for i in range(2):
        starts[f"uniform{i}"] = rng.uniform(-2.0, 2.0, dim)
    mode = scipy.optimize.minimize(negative_log_p, np.zeros(dim), jac=True, method="L-BFGS-B",
                                   options={"maxiter": 5000})
    if np.all(np.isfinite(mode.x)) and mode.fun < INFEASIBLE:
        starts["mode"] = mode.x
    results: dict[str, tuple[float, np.ndarray]] = {}
    start_omega: dict[str, float] = {}
    for name, mu0 in starts.items():
        for omega0 in (0.0, -1.0, -2.0, -4.0, -8.0):
            p = np.concatenate([mu0, np.full(dim, omega0)])
            if negative_elbo(p)[0] < INFEASIBLE:
                break
        else:
            continue
        start_omega[name] = omega0
        for _ in range(3):
            res = scipy.optimize.minimize(negative_elbo, p, jac=True, method="L-BFGS-B",
                                          options={"maxiter": 20_000, "maxfun": 40_000,
                                                   "maxcor": 50, "gtol": 1e-10, "ftol": 1e-15})
            p = res.x
        results[name] = (-float(res.fun), p)
    if not results:
        return {"elbo": None, "reason": "the sample-average ELBO is -inf at every start"}
    best = max(results, key=lambda k: results[k][0])
    p = results[best][1]
    values = fresh_values(est, p, dim)
    finite = np.isfinite(values)
    fixed = {k: v[0] for k, v in results.items()}
    spread = max(fixed.values()) - min(fixed.values())
    out = {"mu": p[:dim].tolist(), "sigma": np.exp(p[dim:]).tolist(), "best_start": best,
           "starts": fixed, "start_omega": start_omega, "start_spread": spread,
           "failed_fraction": float(1.0 - finite.mean())}
    if not finite.all():
        out.update(elbo=None, elbo_se=None, starts_agree=None,
                   reason=f"{int((~finite).sum())} of {len(values)} fresh draws of the best q "
                   "fail (the model rejects them): the ELBO is -inf for every Gaussian q, "
                   "because p is zero on part of the space")
        return out
    out.update(elbo=float(values.mean()), elbo_se=float(values.std() / np.sqrt(len(values))))
    out["starts_agree"] = bool(spread <= AGREE)
    if spread > AGREE:  # common-random-number comparison of the end points on the fresh draws
        fresh = {}
        for k, (_, pk) in results.items():
            vk = values if k == best else fresh_values(est, pk, dim)
            d = vk - values
            fresh[k] = {"elbo": float(vk.mean()),
                        "minus_best": float(d.mean()),
                        "minus_best_se": float(d.std() / np.sqrt(len(d)))}
        out["starts_fresh"] = fresh
        out["starts_agree"] = bool(all(abs(f["minus_best"]) <= AGREE for f in fresh.values()))
    return out


def optimum_header(model: str, target) -> dict:
    """The header of an optimum record: model, dim, draw counts, seed, stanvi and stanc versions,
    method."""
    from importlib import metadata  # noqa: PLC0415

    from stanvi.stan.toolchain import find_toolchain  # noqa: PLC0415

    return {"model": model, "dim": target.dim, "n_draws_fit": N_FIT, "n_draws_eval": N_EVAL,
            "seed": SEED, "stanvi": metadata.version("stanvi"),
            "stanc": find_toolchain().stanc_version, "method": METHOD, "exact": False}


def optimum_record(model: str, target) -> dict:
    """The optimum record of one model, :func:`optimum_header` followed by
    :func:`numerical_optimum`'s result, as written to ``<stem>.optimum.json`` and read by
    :func:`load_optimum`."""
    record = optimum_header(model, target)
    record.update(numerical_optimum(target))
    return record
