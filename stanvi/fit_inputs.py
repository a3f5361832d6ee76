"""What :func:`stanvi.fit.fit` checks and prepares before a method runs: the model as a target,
the data's description, the seed, the options that are not the method's, the initial point, the
family's memory, a one-component mixture read as the Gaussian it is (docs/quickstart.md) and the
low-rank family's rank where none is given (docs/algorithms.md#lowrank-rank)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.errors import VIError
from stanvi.methods.checks import MAX_ABS_MEAN
from stanvi.stan.compiler import CompiledModel
from stanvi.targets.base import Target
from stanvi.targets.jax_target import JaxTarget

ModelLike = str | os.PathLike | CompiledModel | Target | Callable

def as_target(model: ModelLike, data=None, *, dim: int | None = None, seed: int = 0,
              progress: bool = True, hvp_method: str | None = None) -> Target:
    """A Target from a `.stan` path, a compiled library, a Target, or a JAX log-density function
    (which needs ``dim``).  ``hvp_method`` applies to Stan models loaded here."""
    if hasattr(model, "log_density_gradient") and hasattr(model, "dim"):
        if hvp_method is not None:
            raise ValueError("hvp_method applies when stanvi loads the model; for a loaded "
                             "target pass it to stanvi.load(..., hvp_method=...)")
        return model  # a Target
    if callable(model):
        if dim is None:
            raise ValueError("a JAX log-density function needs dim=<number of parameters>")
        return JaxTarget(model, dim)
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    return StanTarget(model, data, seed=seed, progress=progress,
                      hvp_method=hvp_method or "auto")


def describe_data(data) -> str:
    """How the data were given, for the output files: a data file's absolute path, else
    ``"dict"``, ``"JSON text"`` or ``""`` (no data, or a target loaded before the fit)."""
    if data is None:
        return ""
    if isinstance(data, Mapping):
        return "dict"
    if isinstance(data, (str, os.PathLike)):
        text = os.fspath(data)
        if isinstance(text, str) and text.lstrip().startswith("{"):
            return "JSON text"
        try:
            return str(Path(text).resolve())
        except (OSError, ValueError):
            return str(text)
    return type(data).__name__


MAX_SEED = 2**32 - 1   # CmdStan's range for seeds (an unsigned 32-bit integer)


def check_seed(seed) -> int:
    """The seed as an int, or a ValueError naming the accepted range (an integer from 0 to
    2**32 - 1, as CmdStan takes; None means 0)."""
    if seed is None:
        return 0
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED} (2**32 - 1), "
                         f"got {seed!r}")
    if not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED} (2**32 - 1, CmdStan's "
                         f"range), got {int(seed)}")
    return int(seed)


def check_arguments(draws, max_oracle_calls) -> None:
    """Arguments a fit cannot run with, named, before anything is compiled."""
    if isinstance(draws, bool) or not isinstance(draws, (int, np.integer)) or draws < 1:
        raise ValueError(f"draws must be a positive integer (the number of output draws), "
                         f"got {draws!r}")
    if max_oracle_calls is not None and (
            isinstance(max_oracle_calls, bool) or not isinstance(max_oracle_calls, (int, float))
            or not max_oracle_calls > 0):
        raise ValueError(f"max_oracle_calls must be a positive number or None, "
                         f"got {max_oracle_calls!r}")


def check_init(target: Target, init_mu: np.ndarray | None) -> None:
    """An unusable initial point is the user's input, not the model's failure (issue T3-2 item
    11: ``init=[1e300, 1e300]`` was reported as "the posterior may be improper"): name the
    coordinates that are not finite or beyond 1e15 (no posterior mean of a Stan model is; it is
    where a method's divergence check stops a run), and refuse a point where the model's log
    density is not finite, with the model's message (one evaluation, before the fit's own)."""
    if init_mu is None:
        return
    names = list(getattr(target, "unconstrained_names", []) or [])

    def labels(bad: np.ndarray) -> str:
        named = [names[i] if i < len(names) else f"coordinate {i + 1}" for i in bad[:5]]
        return ", ".join(named) + (" ..." if len(bad) > 5 else "")

    bad = np.flatnonzero(~np.isfinite(init_mu))
    if bad.size:
        raise ValueError(f"init has non-finite unconstrained values at {labels(bad)} (a value "
                         f"on a constraint's boundary, e.g. 0 for <lower=0>, maps to -inf; or "
                         f"NaN given directly)")
    huge = np.flatnonzero(np.abs(init_mu) > MAX_ABS_MEAN)
    if huge.size:
        raise ValueError(f"init is unusable: its unconstrained values at {labels(huge)} exceed "
                         f"{MAX_ABS_MEAN:g} in magnitude (at most {np.max(np.abs(init_mu)):.3g} "
                         f"given); give a point where the posterior has mass, or init=None")
    if hasattr(target, "log_density") and hasattr(target, "counter"):
        # (before the fit's evaluations are counted: fit() snapshots the counter later)
        res = target.log_density(np.asarray(init_mu, dtype=float)[None, :])
        if not (res.ok is None or bool(res.ok[0])) or not np.isfinite(res.log_density[0]):
            why = (res.messages or {}).get(0) or "the log density is not finite there"
            raise ValueError(f"init is unusable: the model's log density at the initial point "
                             f"is not finite ({why})")


def check_memory(family, draws: int) -> None:
    """Refuse a family whose log q at the diagnostic draws would not fit in the memory available
    (the family's ``peak_bytes``; the mixture's grows with components × draws × D), before any
    work, with the figures."""
    if not hasattr(family, "peak_bytes"):
        return
    import psutil  # noqa: PLC0415

    from stanvi.diagnostics.draws import diagnostic_draw_count  # noqa: PLC0415

    n = diagnostic_draw_count(family.dim, draws)
    need, have = family.peak_bytes(n), psutil.virtual_memory().available
    if need > 0.8 * have:
        raise VIError(f"family '{family.name}' with these options needs about {need / 1e9:.1f} GB "
                      f"to evaluate log q at the {n} diagnostic draws, and {have / 1e9:.1f} GB "
                      f"are available: use fewer components (n_components="
                      f"{getattr(family, 'n_components', '?')}) or fewer draws")


def initial_mu(target: Target, init, seed: int) -> tuple[np.ndarray | None, np.ndarray]:
    """(user's initial mean or None, Stan-style random initial mean)."""
    d = target.dim
    if hasattr(target, "initial_point"):
        random_mu = target.initial_point(seed)
    else:
        rng = np.random.default_rng(seed)
        random_mu = rng.uniform(-2.0, 2.0, size=d)
    if init is None:
        return None, random_mu
    if isinstance(init, str):
        if init == "zero":
            return np.zeros(d), random_mu
        if init == "random":
            return random_mu, random_mu
        raise ValueError(f"init must be None, 'zero', 'random', a dict or an array; got {init!r}")
    if isinstance(init, Mapping):
        return np.asarray(target.unconstrain(init), dtype=float), random_mu
    arr = np.asarray(init, dtype=float)
    if arr.shape != (d,):
        raise ValueError(f"init array must have shape ({d},) (unconstrained), got {arr.shape}")
    return arr, random_mu


def single_gaussian_mixture(family: str, family_options: dict[str, Any]
                            ) -> tuple[str, dict[str, Any], str | None]:
    """A one-component mixture is one Gaussian: ``family='mixture'`` with ``n_components=1``
    becomes 'meanfield' (``covariance_type='diag'``) or 'fullrank' (``'full'``), the same q
    with the same parameters less the weight logit, so that every
    method fits it exactly as it fits that Gaussian (issue T3-2 item 4: MLMCVI's SGD on the
    mixture's gradient collapsed q to a point where its mean-field fit is right;
    docs/discrete.md).  Returns (family, its options, a note for ``fit.info`` or None)."""
    if family != "mixture" or family_options.get("n_components") != 1:
        return family, family_options, None
    covariance = family_options.get("covariance_type", "diag")
    if covariance == "diag":
        name, kwargs = "meanfield", {}
    elif covariance == "full":
        name, kwargs = "fullrank", {}
    else:
        return family, family_options, None   # the family's own error names the bad value
    return name, kwargs, (f"family='mixture' with n_components=1 is a single Gaussian: fitted as "
                          f"family={name!r}")


def lowrank_rank(target: Target, family: str, family_options: dict[str, Any], opts: Any,
                 init_mu: np.ndarray | None, random_mu: np.ndarray
                 ) -> tuple[dict[str, Any], Any, dict[str, Any] | None]:
    """The low-rank family's rank when none is given, for a method that starts from the
    Laplace approximation: chosen from the Laplace Gaussian at the mode
    (:func:`stanvi.families.lowrank_rank.choose_rank`, docs/algorithms.md#lowrank-rank), up to
    ``AUTO_RANK_MAX_DIM`` parameters.  Returns (the family's options with the rank, the Laplace
    point the method's warm start then uses, a note for ``fit.info`` or None); the options
    unchanged, None and None where the rule does not apply."""
    from stanvi.families.lowrank import default_rank  # noqa: PLC0415 (low-rank fits only)
    from stanvi.families.lowrank_rank import AUTO_RANK_MAX_DIM  # noqa: PLC0415
    from stanvi.methods.base import initial_mean  # noqa: PLC0415
    from stanvi.methods.warm_start import rank_from_laplace  # noqa: PLC0415

    if (family != "lowrank" or "rank" in family_options or target.dim > AUTO_RANK_MAX_DIM
            or getattr(opts, "warm_start", None) != "laplace"):
        return family_options, None, None
    mu0, _ = initial_mean(init_mu, random_mu, getattr(opts, "init", "zero"))
    point, choice = rank_from_laplace(target, mu0, default_rank(target.dim))
    if choice is None:
        return family_options, point, None
    return ({**family_options, "rank": choice.rank}, point,
            {"rank": choice.rank, "default_rank": default_rank(target.dim),
             "deficits": list(choice.deficits)})
