"""StanBlockTarget: a Stan model with data split into row blocks, as a subsampled target
(docs/jointcv.md#block-scheme).

A compiled model cannot swap its data, so the rows of the observation variables are split once
into M near-equal blocks (a fixed random permutation, sizes within 1) and one model instance is
constructed per block (β = 1..M) plus a *prior instance* with N = 0.  With lp_β the log density
of block β's instance and lp_0 the prior instance's (both Jacobian-adjusted, all constants kept)

    k_β(θ) = −M·lp_β(θ) + (M − 1)·lp_0(θ),   (1/M) Σ_β k_β(θ) = −lp_full(θ)

when the model's log density is additive over the row split.  That is validated at
construction: equal parameter dimensions for every instance, then the value and gradient of
``lp_0 + Σ_β (lp_β − lp_0)`` against a full-data instance at three random points, relative to
the summed magnitudes of the added terms (rtol 1e-8; docs/jointcv.md#block-scheme says why not
relative to lp_full).  A model that does not decompose — transformed data computed from all rows,
per-observation parameters, ``int<lower=1> N``, a likelihood coupling rows (a GP) — raises
:class:`BlockDecompositionError` naming the failed check and what to do instead.

Block calls.  The b block evaluations of an iteration go out as one batched, multithreaded C++
call across instances (``stanvi_multi_gradient`` / ``stanvi_multi_hvp``: row i is evaluated by
block idx[i]'s instance, rows in parallel with TBB), and the prior instance's rows as one
batched call.  What this costs against the JAX per-datum target is what ``stanvi bench
jointcv`` reports as the Stan/JAX comparison.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import stanio

from stanvi.errors import ModelEvaluationError, VIError
from stanvi.stan.library import BatchedLibrary, default_threads, load_bridgestan_model
from stanvi.targets.subsampled import SubsampledCounter

_ADVICE = ("Either edit the model so its log density is a sum over rows plus a row-free prior "
           "(move data-wide transformations out of transformed data, allow N = 0), use the "
           "likelihood-weight protocol (declare `real<lower=0> lik_weight;` as data and write "
           "`target += lik_weight * <log likelihood>`, docs/jointcv.md#lik-weight), or use a "
           "full-batch method (method='trustvi' or 'advi').")


class BlockDecompositionError(VIError):
    """The model's log density does not split over blocks of rows (docs/jointcv.md#block-scheme).
    ``check`` names the failed check: 'rows' (no observation variable), 'construction' (an
    instance could not be built, e.g. N = 0 rejected), 'dimension' (parameters depend on N),
    'value additivity', 'gradient additivity', 'evaluation' (an instance throws where the full
    data does not)."""

    def __init__(self, message: str, *, check: str) -> None:
        super().__init__(message)
        self.check = check


def row_variables(data: dict[str, Any], obs_var: str | None = None) -> tuple[str, int, list[str]]:
    """(observation-count variable, N, the data variables with N rows).  Without ``obs_var``
    the count is the integer scalar that the most arrays have as leading dimension (a tie
    between two scalars is an error asking for ``obs_var``)."""
    def leading(value) -> int | None:
        arr = np.asarray(value)
        return int(arr.shape[0]) if arr.ndim >= 1 else None

    scalars = {k: int(v) for k, v in data.items()
               if isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0}
    if obs_var is not None:
        if obs_var not in scalars:
            raise BlockDecompositionError(
                f"obs_var={obs_var!r} is not an integer scalar of the data "
                f"(integer scalars: {sorted(scalars)})", check="rows")
        candidates = {obs_var: scalars[obs_var]}
    else:
        candidates = scalars
    matches = {k: [name for name, v in data.items() if name != k and leading(v) == n]
               for k, n in candidates.items()}
    matches = {k: rows for k, rows in matches.items() if rows and candidates[k] > 0}
    if not matches:
        raise BlockDecompositionError(
            "no data variable has a leading dimension equal to an integer size variable"
            + (f" ({obs_var}={candidates.get(obs_var)})" if obs_var else "")
            + ", so there are no observation rows to split; name them with obs_var=... or use a "
              "full-batch method", check="rows")
    best = max(len(rows) for rows in matches.values())
    top = sorted(k for k, rows in matches.items() if len(rows) == best)
    if len(top) > 1:
        raise BlockDecompositionError(
            f"cannot tell which of {top} counts the observations (each sizes {best} arrays); "
            f"pass obs_var=<name>", check="rows")
    return top[0], candidates[top[0]], matches[top[0]]


def split_data(data: dict[str, Any], obs_var: str, rows: list[str], idx: np.ndarray
               ) -> dict[str, Any]:
    """The data with only the rows ``idx`` of the row variables (N = len(idx))."""
    out = dict(data)
    out[obs_var] = int(len(idx))
    for name in rows:
        out[name] = np.asarray(data[name])[idx]
    return out


class StanBlockTarget:
    """M block instances plus a prior instance of one compiled Stan model (module docstring).

    Args:
        full: the full-data :class:`~stanvi.targets.stan_target.StanTarget` (its library, data,
            seed and HVP method are reused; it also serves the full-data gradient, the ELBO
            evaluations and the output draws).
        n_blocks: M (default min(N, 1000)); at most N.
        obs_var: the observation-count variable (default: inferred, :func:`row_variables`).
        seed: seed of the row permutation.
        threads: threads for the block calls (default: the full target's).
        rtol: tolerance of the additivity validation.
    """

    def __init__(self, full, *, n_blocks: int | None = None, obs_var: str | None = None,
                 seed: int = 0, threads: int | None = None, rtol: float = 1e-8) -> None:
        self.full = full
        self.terms = SubsampledCounter()
        data = full.data_dict()
        self.obs_var, self.n_rows, self.row_vars = row_variables(data, obs_var)
        m = int(n_blocks) if n_blocks is not None else min(self.n_rows, 1000)
        if not 1 <= m <= self.n_rows:
            raise ValueError(f"n_blocks must be between 1 and N={self.n_rows}, got {n_blocks}")
        self.M = m
        perm = np.random.default_rng(seed).permutation(self.n_rows)
        self.blocks = [np.sort(b) for b in np.array_split(perm, m)]
        self.threads = int(threads or getattr(full, "threads", None) or default_threads())
        self._lib = BatchedLibrary(full.library_path)
        fd = getattr(full, "_hvp_fd", None)
        self._hvp_fd = (not self._lib.hvp_exact) if fd is None else bool(fd)
        self._models = []           # bridgestan models: kept alive, their handles used below
        self._handles: list[int] = []
        prior_data = split_data(data, self.obs_var, self.row_vars, np.array([], dtype=int))
        for label, block_data in [("the prior instance (N = 0)", prior_data)] + [
                (f"block {i + 1} of {m} ({len(b)} rows)",
                 split_data(data, self.obs_var, self.row_vars, b)) for i, b in enumerate(self.blocks)]:
            try:
                model = load_bridgestan_model(full.library_path,
                                              stanio.dump_stan_json(block_data), full.seed)
            except RuntimeError as exc:
                raise BlockDecompositionError(
                    f"the model cannot be split into blocks of rows of {self.row_vars} "
                    f"({self.obs_var} = {self.n_rows}): constructing {label} failed: "
                    f"{str(exc).strip()}. Models that declare {self.obs_var} with a lower bound "
                    f"of 1 reject the prior instance. {_ADVICE}", check="construction") from None
            self._models.append(model)
            self._handles.append(int(model.model))
            dim = model.param_unc_num()
            if dim != full.dim:
                raise BlockDecompositionError(
                    f"the number of parameters depends on the rows: {label} has {dim} "
                    f"unconstrained parameters, the full data {full.dim} (per-observation "
                    f"parameters, or sizes tied to {self.obs_var}); the block scheme needs one "
                    f"global parameter vector. {_ADVICE}", check="dimension")
        self._prior, self._block_handles = self._handles[0], self._handles[1:]
        self.validation = self._validate(rtol, seed)

    @classmethod
    def from_target(cls, full, *, n_blocks: int | None = None, obs_var: str | None = None,
                    seed: int = 0, threads: int | None = None) -> "StanBlockTarget":
        return cls(full, n_blocks=n_blocks, obs_var=obs_var, seed=seed, threads=threads)

    # ------------------------------------------------------------------ description
    @property
    def dim(self) -> int:
        return self.full.dim

    @property
    def n_terms(self) -> int:
        return self.M

    def describe(self) -> dict[str, Any]:
        sizes = [len(b) for b in self.blocks]
        return {"obs_var": self.obs_var, "rows": self.n_rows, "row_variables": self.row_vars,
                "n_blocks": self.M, "block_rows": [min(sizes), max(sizes)],
                "hvp": "finite_difference" if self._hvp_fd else "exact",
                "validation": self.validation}

    def __repr__(self) -> str:
        return f"StanBlockTarget({self.full.name!r}, N={self.n_rows}, M={self.M})"

    # ------------------------------------------------------------------ raw instance calls
    def _call(self, kind: str, handle: int, z: np.ndarray, v: np.ndarray | None, threads: int):
        if kind == "gradient":
            lp, g, st = self._lib.gradient(handle, z, propto=False, jacobian=True, threads=threads)
            return lp, g, None, st
        return self._lib.hvp(handle, z, v, propto=False, jacobian=True, threads=threads,
                             finite_difference=self._hvp_fd)

    @staticmethod
    def _check(st, what: str) -> None:
        if not st.ok.all():
            row = int(np.flatnonzero(~st.ok)[0])
            raise ModelEvaluationError(f"{what} failed: {st.messages.get(row, 'non-finite value')}")

    def _blocks(self, kind: str, idx: np.ndarray, z: np.ndarray, v: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray | None]:
        """Gradients (and HVPs) of lp_β at z_i for β = idx[i]: one batched, multithreaded C++
        call in which row i is evaluated by block idx[i]'s model instance."""
        handles = [self._block_handles[int(b)] for b in idx]
        if kind == "gradient":
            _, grads, st = self._lib.multi_gradient(handles, z, propto=False, jacobian=True,
                                                    threads=self.threads)
            hvps = None
        else:
            _, grads, hvps, st = self._lib.multi_hvp(handles, z, v, propto=False, jacobian=True,
                                                     threads=self.threads,
                                                     finite_difference=self._hvp_fd)
        if not st.ok.all():
            row = int(np.flatnonzero(~st.ok)[0])
            raise ModelEvaluationError(f"block {int(idx[row]) + 1}'s {kind} failed: "
                                       f"{st.messages.get(row, 'non-finite value')}")
        return grads, hvps

    # ------------------------------------------------------------------ SubsampledTarget
    def term_gradients(self, idx: np.ndarray, z: np.ndarray) -> np.ndarray:
        """∇k_β(z) = −M∇lp_β(z) + (M − 1)∇lp_0(z) for β in ``idx``."""
        idx = np.asarray(idx, dtype=int)
        z = np.asarray(z, dtype=float)
        rows = np.broadcast_to(z, (len(idx), self.dim)) if z.ndim == 1 else z
        g_blocks, _ = self._blocks("gradient", idx, np.ascontiguousarray(rows), None)
        prior_z = z[None, :] if z.ndim == 1 else rows
        _, g0, _, st = self._call("gradient", self._prior, np.ascontiguousarray(prior_z), None,
                                  self.threads)
        self._check(st, "the prior instance's gradient")
        self.terms.term_gradient += len(idx)
        return -self.M * g_blocks + (self.M - 1) * g0

    def term_hvps(self, idx: np.ndarray, z: np.ndarray, v: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        """(∇k_β(z_i), ∇²k_β(z_i) v_i), the same combination of the block's and the prior's HVPs."""
        idx = np.asarray(idx, dtype=int)
        z = np.asarray(z, dtype=float)
        v = np.ascontiguousarray(v, dtype=float)
        rows = np.ascontiguousarray(np.broadcast_to(z, v.shape))
        g_b, h_b = self._blocks("hvp", idx, rows, v)
        _, g0, h0, st = self._call("hvp", self._prior, rows, v, self.threads)
        self._check(st, "the prior instance's HVP")
        self.terms.term_hvp += len(idx)
        m = self.M
        return -m * g_b + (m - 1) * g0, -m * h_b + (m - 1) * h0

    def full_gradient(self, z: np.ndarray) -> np.ndarray:
        """(1/M) Σ_β ∇k_β(z) = −∇lp_full(z): one call of the full-data instance."""
        r = self.full.log_density_gradient(np.asarray(z, dtype=float)[None, :])
        if not r.ok[0]:
            raise ModelEvaluationError(f"the full-data gradient failed: {r.messages.get(0)}")
        self.terms.full_gradient += 1
        return -r.gradient[0]

    # ------------------------------------------------------------------ validation
    def _validate(self, rtol: float, seed: int) -> dict[str, float]:
        """docs/jointcv.md#block-scheme: value and gradient additivity at three random points."""
        rng = np.random.default_rng(seed + 7)
        worst = {"value": 0.0, "gradient": 0.0}
        checked = 0
        for i in range(12):          # three points where the full-data density is finite
            if checked == 3:
                break
            try:
                theta = np.asarray(self.full.initial_point(seed + 101 + i), dtype=float)
            except Exception:  # noqa: BLE001  (a model without a finite initial point)
                theta = rng.uniform(-2, 2, self.dim)
            full = self.full.log_density_gradient(theta[None, :])
            if not (full.ok[0] and np.all(np.isfinite(full.gradient[0]))):
                continue   # outside the support: no information
            lp_b = np.empty(self.M)
            g_b = np.empty((self.M, self.dim))
            labels = ["the prior instance (N = 0)"] + [f"block {j + 1}" for j in range(self.M)]
            for j, handle in enumerate([self._prior] + self._block_handles):
                lp, g, _, st = self._call("gradient", handle, theta[None, :], None, 1)
                if not st.ok[0]:
                    raise BlockDecompositionError(
                        f"the full-data model evaluates at a point where {labels[j]} throws: "
                        f"{st.messages.get(0, 'non-finite value').strip()}. Its log density is "
                        f"not a sum of per-row terms plus a prior that holds for any rows "
                        f"(a likelihood that couples rows, e.g. a Gaussian process, or one that "
                        f"needs N > 0). {_ADVICE}", check="evaluation")
                if j == 0:
                    lp0, g0 = float(lp[0]), g[0]
                else:
                    lp_b[j - 1], g_b[j - 1] = lp[0], g[0]
            checked += 1
            value = lp0 + np.sum(lp_b - lp0)
            value_scale = abs(lp0) + np.sum(np.abs(lp_b - lp0)) + 1e-300
            grad = g0 + np.sum(g_b - g0, axis=0)
            grad_scale = np.abs(g0) + np.sum(np.abs(g_b - g0), axis=0) + 1e-300
            v_err = abs(value - float(full.log_density[0])) / value_scale
            g_err = float(np.max(np.abs(grad - full.gradient[0]) / grad_scale))
            worst["value"] = max(worst["value"], v_err)
            worst["gradient"] = max(worst["gradient"], g_err)
        if checked == 0:
            raise BlockDecompositionError(
                "could not validate the block split: the full-data log density was not finite "
                "at any of 12 random initial points", check="evaluation")
        for check in ("value", "gradient"):
            if worst[check] > rtol:
                raise BlockDecompositionError(
                    f"the model's log density is not additive over blocks of rows of "
                    f"{self.row_vars} ({self.obs_var} = {self.n_rows}, {self.M} blocks): the "
                    f"prior instance plus the blocks' likelihood terms differ from the full-data "
                    f"{check} by {worst[check]:.2g} relative to their summed magnitudes "
                    f"(tolerance {rtol:g}). Typical causes: transformed data computed from all "
                    f"rows (e.g. standardizing with data means), a prior that depends on "
                    f"{self.obs_var}, or a likelihood that couples rows (Gaussian process, time "
                    f"series). {_ADVICE}", check=f"{check} additivity")
        return {"value_rel_error": worst["value"], "gradient_rel_error": worst["gradient"]}


