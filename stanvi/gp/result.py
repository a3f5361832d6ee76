"""The result of a GP fit (``stanvi.fit(gp_model, method="qsgp" | "exact" | "svi")``): the
variational posterior of the weights, the hyperparameters, the ELBO trace, prediction, metrics
and ArviZ output (docs/gp.md#gpfit)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

import jax
import numpy as np

from stanvi.gp.families import VParams, sample_weights
from stanvi.gp.predict import Prediction, metrics, predict

MAX_WEIGHT_DRAWS_M = 20_000   # to_arviz includes w draws by default only up to this m


@dataclass
class GPFit:
    """A fitted basis-function GP.

    Attributes:
        model: the :class:`~stanvi.gp.BasisGP`; method: 'qsgp', 'exact' or 'svi'.
        family: the covariance family; params: (μ, log c_rr, dense columns L) as NumPy arrays.
        theta: final hyperparameters (log space); log_s: RVM per-basis log precisions.
        trace: one dict per logged iteration (``iteration``, ``elbo`` = mean of the stochastic
            ELBO (or lower-bound) estimates since the previous row, ``lr``, ``wall_time``,
            ``exact_elbo`` when asked for).
        wall_time, compile_time: seconds (JAX compilation included in wall_time).
    """

    model: Any
    method: str
    family: Any
    params: VParams
    theta: dict
    log_s: np.ndarray | None
    options: Any
    seed: int
    trace: list[dict]
    status: str
    message: str
    wall_time: float
    compile_time: float = 0.0
    info: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        last = self.trace[-1].get("elbo", float("nan")) if self.trace else float("nan")
        return (f"GPFit(method={self.method!r}, family={self.family.name!r}, m={self.model.m}, "
                f"n={self.model.n}, final elbo≈{last:.6g}, wall_time={self.wall_time:.2f}s)")

    @property
    def mean(self) -> np.ndarray:
        """Posterior mean of the weights μ (m,)."""
        return np.asarray(self.params.mu)

    @property
    def elbo_trace(self) -> np.ndarray:
        """(iteration, elbo) rows where the ELBO was estimated."""
        rows = [(r["iteration"], r["elbo"]) for r in self.trace if np.isfinite(r.get("elbo", np.nan))]
        return np.asarray(rows, dtype=float).reshape(-1, 2)

    def exact_elbo(self) -> float:
        """The exact ELBO (or, for non-Gaussian likelihoods, Σ F − KL) at the final
        parameters: O(n m² + m³), small problems only."""
        return self.model.exact_elbo(self.params, self.theta, self.log_s)

    def predict(self, X, *, augment: bool = False) -> Prediction:
        """Predictive mean / variances (and p(y* = 1) for classification) at inputs X."""
        return predict(self.model, self.params, self.theta, X, augment=augment)

    def metrics(self, X, y, *, augment: bool = False) -> dict[str, float]:
        """RMSE, MAE and MNLP (regression) or error rate and MNLP (classification)."""
        return metrics(self.model, self.predict(X, augment=augment), self.theta, y)

    def relevance_vectors(self, threshold: float = 1e4) -> np.ndarray:
        """RVM: indices of the basis functions with precision s_i < ``threshold``
        (docs/gp.md#prediction)."""
        if self.log_s is None:
            raise ValueError("relevance vectors exist for the RVM basis only")
        return np.flatnonzero(np.exp(self.log_s) < threshold)

    def to_arviz(self, X_test=None, *, num_draws: int = 1000, seed: int = 0,
                 weights: bool | None = None):
        """An ArviZ DataTree (docs/gp.md#gpfit): ``posterior`` with draws of the weights ``w``
        (default only when m <= 20,000: they are never materialised for large m unless
        ``weights=True``); with ``X_test``: ``predictions`` (draws of f* from its Gaussian
        marginals), ``posterior_predictive`` (y*), ``constant_data`` (the test inputs);
        ``vi_trace`` (the ELBO estimates and learning rates, one row per logged iteration);
        attrs: m, m~, n~, family and the final θ."""
        from arviz_base import from_dict  # noqa: PLC0415
        from xarray import Dataset, DataTree  # noqa: PLC0415

        key = jax.random.PRNGKey(seed)
        m = self.model.m
        want_w = (m <= MAX_WEIGHT_DRAWS_M) if weights is None else bool(weights)
        groups: dict[str, dict] = {}
        if want_w:
            w = np.asarray(sample_weights(VParams(*(np.asarray(p) for p in self.params)),
                                          jax.random.fold_in(key, 0), int(num_draws)))
            groups["posterior"] = {"w": w[None]}
        if X_test is not None:
            pred = self.predict(X_test)
            rng = np.random.default_rng(seed)
            f = pred.mean + np.sqrt(pred.var_f) * rng.standard_normal((int(num_draws), len(pred.mean)))
            groups["predictions"] = {"f": f[None]}
            th = {k: jax.numpy.asarray(v) for k, v in self.theta.items()}
            ystar = np.asarray(self.model.likelihood.sample(jax.random.fold_in(key, 1),
                                                            jax.numpy.asarray(f), th))
            groups["posterior_predictive"] = {"y": ystar[None]}
            groups["constant_data"] = {"X_test": np.asarray(X_test, dtype=float).reshape(
                -1, self.model.d)}
        attrs = self._attrs()
        dims = {"w": ["basis"], "f": ["test_point"], "y": ["test_point"],
                "X_test": ["test_point", "input_dim"]}
        tree_groups = {}
        if groups:
            tree = from_dict(groups, dims=dims, attrs={g: attrs for g in groups})
            for g in groups:
                tree_groups[g] = tree[g].to_dataset()
        cols = sorted({k for r in self.trace for k in r})
        tree_groups["vi_trace"] = Dataset(
            {c: ("iteration_row", np.asarray([r.get(c, np.nan) for r in self.trace], dtype=float))
             for c in cols})
        out = DataTree.from_dict(tree_groups)
        out.attrs = attrs
        return out

    def _attrs(self) -> dict:
        sizes = self.info.get("sizes", {})
        opts = asdict(self.options) if is_dataclass(self.options) else dict(self.options or {})
        return {"inference_library": "stanvi", "method": self.method,
                "family": self.family.name, "m": int(self.model.m), "n": int(self.model.n),
                "basis": self.model.basis.name, "likelihood": self.model.likelihood.name,
                "m_tilde": int(sizes.get("mt", self.model.m)),
                "n_tilde": int(sizes.get("nt", self.model.n)),
                "theta": json.dumps({k: np.asarray(v).tolist() for k, v in self.theta.items()}),
                "options": json.dumps(opts, default=str), "seed": int(self.seed),
                "status": self.status, "wall_time": float(self.wall_time)}
