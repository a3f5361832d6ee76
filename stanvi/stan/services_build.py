"""Building the opt-in *services library* of a compiled model: Stan's own algorithms in-process.

The ordinary model library (:mod:`stanvi.stan.compiler`) holds the model and the stanvi bridge
only.  Stan's algorithms (``stan::services``, what CmdStan runs) are needed only by callers that
ask for a reference run (:mod:`stanvi.reference`).  Linking them into every model library would
change every library's cache key (every cached model rebuilt) and the library the whole suite
loads, for a feature most fits never use; so they live in a separate, opt-in library.  It links
the model object the model library's build kept in the cache entry (``model_exact.o`` or
``model_fd.o``), so the model's C++ is not compiled again; only an entry built before objects
were kept has its model compiled a second time (~30 s) the first time it is run this way.  On
first use, this module builds beside the model library, in the same cache entry::

    lib<name>_services-<key>.so = model object + services object + bridge glue object
    services.json                its build record (written last: the library is complete)

(<key> hashes the services and glue sources and the link flags, so, like model libraries, a
rebuilt services library gets a new path and a process never dlopens a stale one.)

The services object (``glue/stanvi_services.cpp``) is, like the bridge, model-independent (it uses
only ``stan::model::model_base`` and ``new_model``), so it is compiled once per flag set and kept
next to the glue object as ``stanvi_services-<hash>.o``.  The model object, where the entry has
none, is compiled from the entry's ``model.hpp`` with the flag set the model library was built
with (``hvp_exact``) and the same precompiled header.  Nothing here changes the model library or its cache key.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from stanvi.errors import StanCompileError, ToolchainError
from stanvi.progress import StageProgress
from stanvi.stan.cache import atomic_write, cache_root, file_sha256, lock_for
from stanvi.stan.compiler import (PCH_HEADER, CompiledModel, flag_set_dir, glue_object,
                                  log_tail, model_object, run_stanc, run_tool)
from stanvi.stan.toolchain import Toolchain, find_toolchain, glue_fingerprint, library_fingerprint

SERVICES_SOURCE = Path(__file__).with_name("glue") / "stanvi_services.cpp"
_RECORD = "services.json"


def services_fingerprint() -> str:
    """A short hash of the services source (its object is rebuilt when it changes)."""
    return hashlib.sha256(SERVICES_SOURCE.read_bytes()).hexdigest()[:12]


def _library_key(static_runtime: bool) -> str:
    """Everything besides the model that goes into a services library."""
    return hashlib.sha256(f"{services_fingerprint()}\0{glue_fingerprint()}\0"
                          f"{library_fingerprint(static_runtime)}".encode()).hexdigest()[:12]


def _services_object(flag_dir: Path) -> Path:
    return flag_dir / f"stanvi_services-{services_fingerprint()}.o"


def _ensure_services_object(toolchain: Toolchain, tc_dir: Path, flag_dir: Path, exact: bool,
                            bar: StageProgress) -> Path:
    """The services object for one flag set, compiled once (under a file lock) and shared."""
    obj = _services_object(flag_dir)
    with lock_for(tc_dir, f"services-{flag_dir.name}"):
        if not obj.exists():
            bar.stage("compiling Stan's services (once per installation, a few minutes)")
            tmp = flag_dir / f".services.{os.getpid()}.o"
            res = run_tool([toolchain.cxx, *toolchain.compile_flags(exact), "-Winvalid-pch",
                            "-include", str(flag_dir / PCH_HEADER), "-c", str(SERVICES_SOURCE),
                            "-o", str(tmp)], "the C++ compiler")
            if res.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise ToolchainError(f"compiling Stan's services failed:\n{log_tail(res.stderr)}")
            os.replace(tmp, obj)
    return obj


def build_services_ahead(progress: bool = True) -> tuple[Path, bool]:
    """Build the services object for this installation now (the exact-HVP flag set every model
    uses but those built with finite differences, such as ODE models, which build theirs on
    first use), so that no model's first use of NUTS, ADVI or Pathfinder waits for it
    (``stanvi build-services``); returns its path and whether it was built now."""
    toolchain = find_toolchain()
    tc_dir = cache_root() / toolchain.fingerprint
    with StageProgress("building Stan's services ahead", enabled=progress) as bar:
        flag_dir = flag_set_dir(toolchain, tc_dir, True, bar)
        existed = _services_object(flag_dir).exists()
        return _ensure_services_object(toolchain, tc_dir, flag_dir, True, bar), not existed


def _load(entry: Path, key: str) -> Path | None:
    try:
        record = json.loads((entry / _RECORD).read_text())
        library = entry / record["library"]
        if (record["key"] == key and library.is_file()
                and file_sha256(library) == record["sha256"]):
            return library
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def services_library(model: CompiledModel, *, progress: bool = True) -> Path:
    """The path of ``lib<name>_services-<key>.so`` for ``model``, building it on first use.

    Cached in the model's cache entry; rebuilt only when the services source, the glue or the
    link flags change.  Raises :class:`ToolchainError` / :class:`StanCompileError` on build errors.
    """
    entry = Path(model.library).parent
    tc_dir = entry.parent.parent
    try:
        build = json.loads((entry / "build.json").read_text())
        static_runtime = bool(build.get("static_runtime", True))
    except (OSError, ValueError):
        static_runtime = True
    key = _library_key(static_runtime)
    found = _load(entry, key)
    if found is not None:
        return found
    toolchain = find_toolchain()
    with lock_for(tc_dir, f"{entry.name}-services"):
        found = _load(entry, key)
        if found is not None:
            return found
        return _build(model, entry, tc_dir, toolchain, key, static_runtime, progress)


def _build(model: CompiledModel, entry: Path, tc_dir: Path, toolchain: Toolchain, key: str,
           static_runtime: bool, progress: bool) -> Path:
    exact = model.hvp_exact
    name = model.name
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with StageProgress(f"building Stan's services for {name}", enabled=progress) as bar:
        flag_dir = flag_set_dir(toolchain, tc_dir, exact, bar)
        t0 = time.perf_counter()
        services_obj = _ensure_services_object(toolchain, tc_dir, flag_dir, exact, bar)
        timings["services_object_seconds"] = time.perf_counter() - t0
        hpp = entry / "model.hpp"
        if not hpp.is_file():
            bar.stage("stanc")
            run_stanc(toolchain, entry / "model.stan", hpp, name, None)
        t0 = time.perf_counter()
        kept = model_object(entry, exact)   # the model library's own object, where kept
        obj = kept if kept.is_file() else entry / f".model_services.{os.getpid()}.o"
        if obj != kept:
            bar.stage("C++ (model)")
            res = run_tool([toolchain.cxx, *toolchain.compile_flags(exact), "-Winvalid-pch",
                            "-include", str(flag_dir / PCH_HEADER), "-x", "c++", "-c", str(hpp),
                            "-o", str(obj)], "the C++ compiler")
            if res.returncode != 0:
                obj.unlink(missing_ok=True)
                raise StanCompileError(f"compiling {name} for the services library failed:\n"
                                       f"{log_tail(res.stderr)}")
        timings["model_object_seconds"] = time.perf_counter() - t0
        bar.stage("linking")
        t0 = time.perf_counter()
        library = entry / f"lib{name}_services-{key}.so"
        tmp = entry / f".lib{name}_services.{os.getpid()}.so"

        def link(static: bool):
            return run_tool([toolchain.cxx, "-shared", "-o", str(tmp), str(obj), str(services_obj),
                             str(glue_object(flag_dir)), *toolchain.link_flags(static)], "the linker")

        result = link(static_runtime)
        if result.returncode != 0 and static_runtime:
            static_runtime = False
            result = link(False)
        if obj != kept:
            obj.unlink(missing_ok=True)
        timings["link_seconds"] = time.perf_counter() - t0
        if result.returncode != 0:
            tmp.unlink(missing_ok=True)
            raise StanCompileError(f"linking the services library for {name} failed:\n"
                                   f"{log_tail(result.stderr)}")
        os.replace(tmp, library)
        for old in entry.glob(f"lib{name}_services-*.so"):  # earlier builds (other keys)
            if old != library:
                old.unlink(missing_ok=True)
    record = {"library": library.name, "key": key, "sha256": file_sha256(library),
              "hvp_exact": exact, "static_runtime": static_runtime,
              "services_source": services_fingerprint(),
              "build_seconds": time.perf_counter() - start, **timings}
    atomic_write(entry / _RECORD, json.dumps(record, indent=1))
    return library
