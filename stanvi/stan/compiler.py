"""Compiling a `.stan` file into a model library that the `bridgestan` client and stanvi load.

Pipeline (issue P1-1): ``stanc --name=<name>_model`` → C++ header; ``g++`` compiles it against the
Stan headers of the httpstan wheel, using a precompiled header of ``stan/model/model_header.hpp``;
the result is linked ``-shared`` with the project's glue object (``glue/stanvi_bridge.cpp``).

Exact Hessian-vector products need nested autodiff (``-DSTAN_MODEL_FVAR_VAR`` in both the model
and the glue).  Some models (ODE solvers) cannot be instantiated with ``fvar<var>``: when the exact
build fails to compile, the finite-difference build is tried, and the library records which one it
is (``CompiledModel.hvp_exact``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import Timeout

from stanvi.errors import StanCompileError, ToolchainError
from stanvi.log import get_logger
from stanvi.progress import StageProgress
from stanvi.stan.cache import atomic_write, cache_root, file_sha256, lock_for, model_key
from stanvi.stan.toolchain import (GLUE_SOURCE, Toolchain, find_toolchain, glue_fingerprint,
                                   library_fingerprint)

_BUILD_RECORD = "build.json"
PCH_HEADER = "stanvi_pch.hpp"
# compile messages (start, end, cache hits at DEBUG) go to "stanvi.stan" (stanvi.log)
logger = get_logger("stan")


@dataclass(frozen=True)
class CompiledModel:
    """A compiled model library on disk.

    Attributes:
        library: path of the shared library (BridgeStan C ABI + stanvi batched entry points).
        name: the model's name (stanc ``--name`` without the ``_model`` suffix).
        stan_file: the cached copy of the Stan program it was built from.
        hvp_exact: True for nested-autodiff HVPs, False for the finite-difference build.
        compile_seconds: wall time of the build that produced it (0 when it came from the cache).
        cached: True when no compilation was needed.
    """

    library: Path
    name: str
    stan_file: Path
    hvp_exact: bool
    compile_seconds: float = 0.0
    cached: bool = False


def compile_model(model: str | os.PathLike, *, name: str | None = None, progress: bool = True,
                  force: bool = False, static_runtime: bool = True) -> CompiledModel:
    """Compile a Stan program (a `.stan` path, or Stan code as a string) to a model library.

    Results are cached by content (see :mod:`stanvi.stan.cache`); ``force=True`` rebuilds.
    ``static_runtime=False`` links the shared C++ runtime and unwinder instead of private copies
    (only to measure what the private ones save, see ``toolchain.STATIC_RUNTIME_FLAGS``).
    Raises :class:`StanCompileError` with stanc's message and line for an invalid program, and
    :class:`ToolchainError` when the C++ toolchain is missing.

    A build is announced and timed on the ``stanvi.stan`` logger (INFO; DEBUG with
    ``progress=False``) with a stage display in between (:class:`~stanvi.progress.StageProgress`);
    a cache hit is logged at DEBUG only (it is every fit's normal case).
    """
    code, path = _read_program(model)
    name = _model_name(name or (Path(path).stem if path else "model"))
    toolchain = find_toolchain()
    tc_dir = cache_root() / toolchain.fingerprint
    key = model_key(code + library_fingerprint(static_runtime), name)
    entry = tc_dir / "models" / f"{name}-{key}"
    shown = Path(path).name if path else f"{name}.stan"
    if not force:
        found = _load_record(entry)
        if found is not None:
            logger.debug(f"{shown}: using the cached library {found.library}")
            return found
    with _locked(tc_dir, entry.name, shown, progress):
        if not force:
            found = _load_record(entry)  # another process may have built it while we waited
            if found is not None:
                logger.debug(f"{shown}: using the cached library {found.library} (built by "
                             f"another process while this one waited)")
                return found
        return _build(code, path, name, entry, toolchain, tc_dir, progress, static_runtime)


@contextmanager
def _locked(tc_dir: Path, lock_name: str, shown: str, progress: bool):
    """The cache entry's lock; a wait for another process's build of it is said, not silent."""
    lock = lock_for(tc_dir, lock_name)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        logger.log(logging.INFO if progress else logging.DEBUG,
                   f"{shown}: waiting for another process that is compiling it")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _is_file(text: str) -> bool:
    """``Path(text).is_file()``, False for a string that cannot be a path (one-line Stan code
    longer than a file name may be raised OSError [Errno 36])."""
    try:
        return Path(text).is_file()
    except OSError:
        return False


def _read_program(model: str | os.PathLike) -> tuple[str, str | None]:
    text = os.fspath(model)
    if "\n" not in text and (text.endswith(".stan") or _is_file(text)):
        p = Path(text)
        if not p.is_file():
            raise FileNotFoundError(f"Stan file not found: {p}")
        try:
            return p.read_text(encoding="utf-8"), str(p)
        except UnicodeDecodeError:
            hint = (" (a compiled model library: load it with stanvi.load_model or pass it to "
                    "stanvi.fit, which accept libraries)" if p.suffix in (".so", ".dylib", ".dll")
                    or p.read_bytes()[:4] == b"\x7fELF" else "")
            raise StanCompileError(f"{p} is not a Stan program: it is not UTF-8 text{hint}",
                                   path=str(p)) from None
    if "{" in text:
        return text, None
    raise FileNotFoundError(f"Stan file not found: {text}")


#: The longest model name used in the cache's file names (a 240-character file stem made the
#: entry's lock file name exceed the file system's 255 bytes: a raw OSError [Errno 36], issue
#: T3-2 item 9); the entry's content key still tells models apart.
MAX_NAME = 80


def _model_name(stem: str) -> str:
    """A valid C++ identifier from a file stem (stanc requires one), at most ``MAX_NAME``
    characters (a longer stem is cut, keeping its start)."""
    cleaned = re.sub(r"\W", "_", stem)
    if not cleaned or cleaned[0].isdigit():
        cleaned = "m_" + cleaned
    return cleaned[:MAX_NAME]


def _load_record(entry: Path) -> CompiledModel | None:
    """The cache entry at ``entry`` if it is complete and its library is intact, else None."""
    record_path = entry / _BUILD_RECORD
    try:
        record = json.loads(record_path.read_text())
        library = entry / record["library"]
        if not library.is_file() or file_sha256(library) != record["sha256"]:
            return None
        return CompiledModel(library=library, name=record["name"], stan_file=entry / "model.stan",
                             hvp_exact=bool(record["hvp_exact"]), cached=True)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_tool(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ToolchainError(f"could not run {what} ({cmd[0]}): {exc}") from exc


def _build(code: str, path: str | None, name: str, entry: Path, toolchain: Toolchain,
           tc_dir: Path, progress: bool, static_runtime: bool = True) -> CompiledModel:
    entry.mkdir(parents=True, exist_ok=True)
    (entry / _BUILD_RECORD).unlink(missing_ok=True)
    stan_file = entry / "model.stan"
    stan_file.write_text(code)
    hpp = entry / "model.hpp"
    shown = Path(path).name if path else f"{name}.stan"
    start = time.perf_counter()
    with StageProgress(f"compiling {shown}", enabled=progress, logger=logger,
                       note=" (10-60 s; later runs use the cached library)") as bar:
        bar.stage("stanc")
        run_stanc(toolchain, stan_file, hpp, name, path)
        library = entry / f"lib{name}.so"
        errors = []
        for exact in (True, False) if nested_autodiff_possible(code) else (False,):
            bar.stage("C++ (exact Hessian-vector products)" if exact else
                      "C++ (finite-difference Hessian-vector products)")
            flag_dir = flag_set_dir(toolchain, tc_dir, exact, bar)
            obj = model_object(entry, exact)
            tmp_obj = entry / f".{obj.name}.{os.getpid()}.o"
            result = run_tool([toolchain.cxx, *toolchain.compile_flags(exact), "-Winvalid-pch",
                               "-include", str(flag_dir / PCH_HEADER), "-x", "c++", "-c", str(hpp),
                               "-o", str(tmp_obj)], "the C++ compiler")
            if result.returncode != 0:
                tmp_obj.unlink(missing_ok=True)
                errors.append(result.stderr)
                continue
            os.replace(tmp_obj, obj)   # kept: the services library links it (services_build)
            bar.stage("linking")
            tmp = entry / f".lib{name}.{os.getpid()}.so"
            link = _link(toolchain, tmp, obj, flag_dir, static_runtime)
            if link.returncode != 0 and static_runtime:  # e.g. no libstdc++.a: shared runtime
                static_runtime = False
                link = _link(toolchain, tmp, obj, flag_dir, static_runtime)
            if link.returncode != 0:
                raise StanCompileError(f"linking the model library for {shown} failed:\n"
                                       f"{log_tail(link.stderr)}", path=path)
            os.replace(tmp, library)
            seconds = time.perf_counter() - start
            record = {"library": library.name, "name": name, "hvp_exact": exact,
                      "sha256": file_sha256(library), "compile_seconds": seconds,
                      "stanc_version": toolchain.stanc_version, "cxx": toolchain.cxx_version,
                      "static_runtime": static_runtime, "source": path}
            atomic_write(entry / _BUILD_RECORD, json.dumps(record, indent=1))
            return CompiledModel(library=library, name=name, stan_file=stan_file, hvp_exact=exact,
                                 compile_seconds=seconds, cached=False)
    raise StanCompileError(
        f"the C++ compiler rejected the code stanc generated for {shown} (a stanc or toolchain "
        f"problem, not an error in your model):\n{log_tail(errors[-1])}", path=path)


#: Stan functions whose C++ cannot be instantiated with fvar<var> (Stan Math's ODE solvers
#: take var or double arguments only): a program calling one gets the finite-difference build
#: at once, instead of after a failed exact compile (a minute and a half of g++ on the ODE
#: example).  A program this misses still falls back after the exact compile fails.
NO_NESTED_AUTODIFF = re.compile(r"\b(ode_\w+|integrate_ode\w*)\s*\(")


def nested_autodiff_possible(code: str) -> bool:
    """False when the Stan program calls a function known not to support nested autodiff
    (:data:`NO_NESTED_AUTODIFF`)."""
    return NO_NESTED_AUTODIFF.search(code) is None


def model_object(entry: Path, exact: bool) -> Path:
    """The model's compiled object in its cache entry, kept after the library is linked so that
    the services library (:mod:`stanvi.stan.services_build`) links it instead of compiling the
    model's C++ a second time."""
    return entry / ("model_exact.o" if exact else "model_fd.o")


def _link(toolchain: Toolchain, out: Path, obj: Path, flag_dir: Path,
          static_runtime: bool) -> subprocess.CompletedProcess:
    """Link the model object and the glue into the shared library ``out``; ``static_runtime``:
    with a private C++ runtime and unwinder (see ``toolchain.STATIC_RUNTIME_FLAGS``)."""
    return run_tool([toolchain.cxx, "-shared", "-o", str(out), str(obj), str(glue_object(flag_dir)),
                     *toolchain.link_flags(static_runtime)], "the linker")


def run_stanc(toolchain: Toolchain, stan_file: Path, hpp: Path, name: str, path: str | None) -> None:
    """Run stanc; on error raise StanCompileError carrying its message and location."""
    cmd = [str(toolchain.stanc), f"--name={name}_model", f"--o={hpp}"]
    cmd.append(f"--filename-in-msg={Path(path).name if path else name + '.stan'}")
    result = run_tool(cmd + [str(stan_file)], "stanc")
    if result.returncode == 0:
        return
    message = (result.stderr or result.stdout).strip()
    where = re.search(r"line (\d+), column (\d+)", message)
    line, column = (int(where.group(1)), int(where.group(2))) if where else (None, None)
    location = f"{path or 'model code'}" + (f", line {line}, column {column}" if line else "")
    raise StanCompileError(f"stanc could not compile {location}:\n{message}", path=path, line=line,
                           column=column, stanc_message=message)


def flag_set_dir(toolchain: Toolchain, tc_dir: Path, exact: bool, bar: StageProgress) -> Path:
    """The precompiled header and glue object for one flag set, built once and shared."""
    flag_dir = tc_dir / ("exact" if exact else "fd")
    flag_dir.mkdir(parents=True, exist_ok=True)
    flags = toolchain.compile_flags(exact)
    header = flag_dir / PCH_HEADER
    gch = flag_dir / (PCH_HEADER + ".gch")
    glue = glue_object(flag_dir)
    with lock_for(tc_dir, f"flags-{flag_dir.name}"):
        if not header.exists():
            atomic_write(header, "#include <stan/model/model_header.hpp>\n")
        if not gch.exists():
            bar.stage("precompiling Stan headers (once per installation, ~40 s)")
            tmp = flag_dir / f".pch.{os.getpid()}.gch"
            res = run_tool([toolchain.cxx, *flags, "-x", "c++-header", str(header), "-o", str(tmp)],
                           "the C++ compiler")
            if res.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise ToolchainError(f"precompiling the Stan headers failed:\n{log_tail(res.stderr)}")
            os.replace(tmp, gch)
        if not glue.exists():
            bar.stage("compiling the stanvi bridge (once per installation, ~20 s)")
            tmp = flag_dir / f".glue.{os.getpid()}.o"
            res = run_tool([toolchain.cxx, *flags, "-Winvalid-pch", "-include", str(header), "-c",
                            str(GLUE_SOURCE), "-o", str(tmp)], "the C++ compiler")
            if res.returncode != 0:
                tmp.unlink(missing_ok=True)
                raise ToolchainError(f"compiling the stanvi bridge failed:\n{log_tail(res.stderr)}")
            os.replace(tmp, glue)
    return flag_dir


def glue_object(flag_dir: Path) -> Path:
    return flag_dir / f"stanvi_bridge-{glue_fingerprint()}.o"


def log_tail(text: str, lines: int = 30) -> str:
    """The last lines of a compiler log, where the actual error usually is."""
    kept = [ln for ln in text.strip().splitlines() if ln.strip()]
    return "\n".join(kept[-lines:])
