"""The independently computed mean-field optima of the stan_models set.

Each model ``<dir>/<stem>.stan`` of ``stan_models/`` has ``<dir>/<stem>.optimum.json``, written
by ``stan_models/compute_optima.py`` without any stanvi method (L-BFGS-B on a fixed 4,096-draw
sample-average ELBO from several starts, the ELBO re-estimated on 100,000 fresh draws; the
closed form for the Gaussian models).  :func:`load_optimum` reads one into a
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

MODELS_DIR = Path(__file__).resolve().parents[2] / "stan_models"
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
