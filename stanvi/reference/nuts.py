"""Stan's own algorithms beside stanvi's: reference runs on the same compiled model, in-process.

First piece: :func:`nuts`, Stan's No-U-Turn sampler with a diagonal metric adapted during warmup
(``stan::services::sample::hmc_nuts_diag_e_adapt``, stan/services/sample/hmc_nuts_diag_e_adapt.hpp,
the algorithm CmdStan's ``sample`` runs by default; Hoffman & Gelman 2014, "The No-U-Turn
Sampler", JMLR 15; Betancourt 2017, "A Conceptual Introduction to Hamiltonian Monte Carlo",
arXiv:1701.02434, for the multinomial variant and the generalized no-U-turn criterion Stan uses).

It runs on an opt-in *services library* built beside the model library on first use (see
:mod:`stanvi.stan.services_build`; the first build compiles Stan's services once per installation,
~35 s, and the model once more, ~30 s), so ordinary model libraries are untouched.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from stanvi.errors import StanviError
from stanvi.stan.compiler import CompiledModel, compile_model
from stanvi.stan.data import DataLike, data_error_from_stan, data_to_json
from stanvi.stan.names import group_names
from stanvi.stan.services_build import services_library

SAMPLER_COLUMNS = ("lp__", "accept_stat__", "stepsize__", "treedepth__", "n_leapfrog__",
                   "divergent__", "energy__")

# Stan's defaults (CmdStan's `sample` with `adapt engaged=1`, algorithm=hmc engine=nuts
# metric=diag_e); see stan/services/sample/hmc_nuts_diag_e_adapt.hpp for their meaning.
NUTS_DEFAULTS = {"num_thin": 1, "max_depth": 10, "delta": 0.8, "gamma": 0.05, "kappa": 0.75,
                 "t0": 10.0, "init_buffer": 75, "term_buffer": 50, "window": 25,
                 "stepsize": 1.0, "stepsize_jitter": 0.0, "init_radius": 2.0}


class ReferenceRunError(StanviError):
    """Stan's own algorithm failed (no valid initial point, sampler error)."""


@dataclass
class NutsResult:
    """Draws from Stan's NUTS, all chains stacked (chain after chain).

    Attributes:
        draws: by Stan variable name (parameters, transformed parameters, generated quantities),
            arrays of shape ``(chains * num_samples, *shape)``, elements in Stan's column-major
            order as :mod:`stanvi.stan.names` reads them.
        sampler_draws: the sampler's columns (``lp__``, ``accept_stat__``, ``stepsize__``,
            ``treedepth__``, ``n_leapfrog__``, ``divergent__``, ``energy__``), each
            ``(chains * num_samples,)``.
        sampler_diagnostics: ``divergences`` (per chain), ``n_leapfrog`` (per chain, =
            gradient evaluations while sampling), ``total_n_leapfrog``, ``max_treedepth_hits``
            (per chain), ``stepsize`` (per chain, after adaptation), ``mean_accept_stat``.
        wall_time: seconds for all chains (excluding building the services library).
        chains, num_samples: as run.
        column_names: the flat column names Stan wrote.
        messages: per chain, the logger's messages and the sampler's summary lines.
    """

    draws: dict[str, np.ndarray]
    sampler_draws: dict[str, np.ndarray]
    sampler_diagnostics: dict
    wall_time: float
    chains: int
    num_samples: int
    column_names: list[str]
    messages: list[str] = field(default_factory=list)

    def stan_variable(self, name: str) -> np.ndarray:
        """The draws of one Stan variable (or sampler column), as in ``draws``."""
        if name in self.draws:
            return self.draws[name]
        if name in self.sampler_draws:
            return self.sampler_draws[name]
        known = ", ".join([*self.draws, *self.sampler_draws])
        raise KeyError(f"no variable '{name}' in the draws (have: {known})")


class _ServicesLib:
    """ctypes bindings of ``glue/stanvi_services.cpp``."""

    def __init__(self, path: Path) -> None:
        lib = ctypes.CDLL(str(path))
        vp, cp = ctypes.c_void_p, ctypes.c_char_p
        u, i, d = ctypes.c_uint, ctypes.c_int, ctypes.c_double
        f = lib.stanvi_nuts_diag_e_adapt
        f.restype = vp
        f.argtypes = [cp, cp, u, u, d, i, i, i, d, d, i, d, d, d, d, u, u, u,
                      ctypes.POINTER(vp)]
        lib.stanvi_nuts_num_rows.restype = ctypes.c_long
        lib.stanvi_nuts_num_rows.argtypes = [vp]
        lib.stanvi_nuts_num_cols.restype = i
        lib.stanvi_nuts_num_cols.argtypes = [vp]
        lib.stanvi_nuts_names.restype = cp
        lib.stanvi_nuts_names.argtypes = [vp]
        lib.stanvi_nuts_messages.restype = cp
        lib.stanvi_nuts_messages.argtypes = [vp]
        lib.stanvi_nuts_copy_draws.restype = None
        lib.stanvi_nuts_copy_draws.argtypes = [vp, ctypes.POINTER(d)]
        lib.stanvi_nuts_free.restype = None
        lib.stanvi_nuts_free.argtypes = [vp]
        lib.stanvi_services_free_error_msg.restype = None
        lib.stanvi_services_free_error_msg.argtypes = [vp]
        self.lib = lib

    def nuts_chain(self, data_json: str, seed: int, chain: int, num_warmup: int,
                   num_samples: int, opts: dict) -> tuple[list[str], np.ndarray, str]:
        err = ctypes.c_void_p()
        handle = self.lib.stanvi_nuts_diag_e_adapt(
            data_json.encode(), None, seed, chain, opts["init_radius"], num_warmup, num_samples,
            opts["num_thin"], opts["stepsize"], opts["stepsize_jitter"], opts["max_depth"],
            opts["delta"], opts["gamma"], opts["kappa"], opts["t0"], opts["init_buffer"],
            opts["term_buffer"], opts["window"], ctypes.byref(err))
        if not handle:
            message = "unknown error"
            if err.value:
                message = ctypes.string_at(err.value).decode(errors="replace")
                self.lib.stanvi_services_free_error_msg(err)
            raise RuntimeError(message)
        try:
            rows = self.lib.stanvi_nuts_num_rows(handle)
            cols = self.lib.stanvi_nuts_num_cols(handle)
            names = self.lib.stanvi_nuts_names(handle).decode().split(",") if cols else []
            out = np.empty((rows, cols), dtype=np.float64)
            if rows and cols:
                self.lib.stanvi_nuts_copy_draws(
                    handle, out.ctypes.data_as(ctypes.POINTER(ctypes.c_double)))
            messages = self.lib.stanvi_nuts_messages(handle).decode(errors="replace")
        finally:
            self.lib.stanvi_nuts_free(handle)
        return names, out, messages


_libs: dict[Path, _ServicesLib] = {}
_libs_lock = threading.Lock()


def _load(path: Path) -> _ServicesLib:
    with _libs_lock:
        if path not in _libs:
            _libs[path] = _ServicesLib(path)
        return _libs[path]


def nuts(model: str | os.PathLike | CompiledModel, data: DataLike = None, *, chains: int = 4,
         seed: int = 0, num_warmup: int = 1000, num_samples: int = 1000, parallel: bool = True,
         progress: bool = False, **kw) -> NutsResult:
    """Run Stan's own NUTS (diagonal metric, adapted during warmup) on a Stan model, in-process.

    This is ``stan::services::sample::hmc_nuts_diag_e_adapt`` from Stan's services header
    (stan/services/sample/hmc_nuts_diag_e_adapt.hpp), called exactly as CmdStan calls it, on the
    same stanc-generated model code stanvi fits: the No-U-Turn sampler of Hoffman & Gelman (2014)
    in the multinomial form with the generalized no-U-turn criterion (Betancourt 2017), with
    dual-averaging step-size adaptation and windowed diagonal-metric adaptation.

    Args:
        model: a ``.stan`` path or Stan code (compiled, cached), or a :class:`CompiledModel`.
        data: a dict, a JSON path or a JSON string (as everywhere in stanvi).
        chains: number of chains; chain ``k`` uses seed ``seed`` and chain id ``k + 1``
            (independent streams, as CmdStan does).
        seed: the random seed.
        num_warmup, num_samples: per chain (Stan's defaults, 1000 each).
        parallel: run the chains in threads (default) or one after another.
        progress: show the build progress when the services library is built.
        **kw: any of Stan's other sampler settings, defaults in :data:`NUTS_DEFAULTS`
            (``num_thin``, ``max_depth``, ``delta``, ``gamma``, ``kappa``, ``t0``,
            ``init_buffer``, ``term_buffer``, ``window``, ``stepsize``, ``stepsize_jitter``,
            ``init_radius``).

    Returns:
        :class:`NutsResult`.

    Raises:
        StanDataError for data the model rejects; StanviError when sampling fails (e.g. no
        valid initial point); TypeError for an unknown setting.
    """
    unknown = set(kw) - set(NUTS_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown NUTS setting(s): {', '.join(sorted(unknown))}; "
                        f"known: {', '.join(NUTS_DEFAULTS)}")
    if chains < 1 or num_samples < 1 or num_warmup < 0:
        raise ValueError("need chains >= 1, num_samples >= 1, num_warmup >= 0")
    opts = {**NUTS_DEFAULTS, **kw}
    compiled = model if isinstance(model, CompiledModel) else compile_model(model,
                                                                            progress=progress)
    data_json = data_to_json(data)
    lib = _load(services_library(compiled, progress=progress))
    run = functools.partial(lib.nuts_chain, data_json, int(seed) & 0xFFFFFFFF,
                            num_warmup=num_warmup, num_samples=num_samples, opts=opts)
    start = time.perf_counter()
    try:
        if parallel and chains > 1:
            with ThreadPoolExecutor(max_workers=chains) as pool:
                results = list(pool.map(lambda k: run(chain=k + 1), range(chains)))
        else:
            results = [run(chain=k + 1) for k in range(chains)]
    except RuntimeError as exc:
        message = str(exc)
        if message.startswith("Error in model construction"):
            raise data_error_from_stan(message, compiled.name) from None
        raise ReferenceRunError(
            f"Stan's NUTS failed on model '{compiled.name}': {message}") from None
    wall = time.perf_counter() - start
    names = results[0][0]
    per_chain = [r[1] for r in results]
    flat = np.concatenate(per_chain, axis=0)
    n_sampler = len(SAMPLER_COLUMNS)
    if tuple(names[:n_sampler]) != SAMPLER_COLUMNS:
        raise ReferenceRunError(f"unexpected sampler columns from Stan: {names[:n_sampler]}")
    sampler_draws = {c: flat[:, k] for k, c in enumerate(SAMPLER_COLUMNS)}
    model_flat = flat[:, n_sampler:]
    draws = {v.name: v.extract(model_flat) for v in group_names(names[n_sampler:])}
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
    return NutsResult(draws=draws, sampler_draws=sampler_draws, sampler_diagnostics=diagnostics,
                      wall_time=wall, chains=chains, num_samples=per_chain[0].shape[0],
                      column_names=names, messages=[r[2] for r in results])
