"""Finding the Stan toolchain: stanc, the Stan C++ headers and libraries, and a C++ compiler.

stanvi needs no download at install or run time (docs/architecture.md#decisions): the `httpstan` wheel on
PyPI ships `stanc` and the Stan, Stan Math, Eigen, Boost, TBB and Sundials headers and libraries.
This module finds them inside the installed package and describes the compile flags that every
model library and the glue object share.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from stanvi.errors import ToolchainError

GLUE_SOURCE = Path(__file__).with_name("glue") / "stanvi_bridge.cpp"

# Flags shared by the precompiled header, the glue object and every model (they must match
# exactly for the precompiled header to be used).  _GLIBCXX_USE_CXX11_ABI=0 matches the ABI the
# httpstan wheel's TBB was built with (manylinux2014).
BASE_FLAGS = (
    "-std=c++17", "-fPIC", "-O3", "-D_REENTRANT", "-DBOOST_DISABLE_ASSERTS",
    "-DBOOST_PHOENIX_NO_VARIADIC_EXPRESSION", "-DSTAN_THREADS", "-D_GLIBCXX_USE_CXX11_ABI=0",
    "-Wno-sign-compare", "-Wno-ignored-attributes", "-Wno-deprecated-declarations",
)
EXACT_HVP_FLAG = "-DSTAN_MODEL_FVAR_VAR"

# The optimization level of every build: -O3 unless $STANVI_OPT_LEVEL names another.  The test
# suite (tests/conftest.py) builds at -O1: a fresh clone's `make test` compiles ~45 models, ~20%
# faster at -O1; its models run slower per point (gradients 10-60%), but model evaluations are a
# small part of the suite: with warm caches its CPU time is the same at both levels (figures:
# docs/models_and_targets.md#optimization-level).  Users' builds keep -O3.
# IEEE arithmetic without -ffast-math gives the same results at every level.  The level is part
# of the flags, so of the toolchain fingerprint: each level has its own precompiled header and
# cache entries, and a test build is never served to a user's -O3 fit.
OPT_LEVEL_ENV = "STANVI_OPT_LEVEL"
DEFAULT_OPT_LEVEL = "-O3"
OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Og")
LINK_LIBRARIES = ("-lsundials_cvodes", "-lsundials_idas", "-lsundials_kinsol",
                  "-lsundials_nvecserial", "-ltbb")

# The model library carries its own copy of the C++ runtime and of libgcc's unwinder, hidden from
# every other library (--exclude-libs).  Why: Stan reports a bad draw by throwing, and with the
# shared unwinder (libgcc_s before GCC 13) every frame of every throw first searches, under one
# global mutex, a linear list of the objects registered with __register_frame -- and XLA's CPU JIT
# registers one per compiled executable.  In a process holding 300 jitted functions a throwing
# draw cost ~190 µs instead of ~13 µs (and ~1 ms in the long benchmark process).  The private
# unwinder's registry is empty, so it goes straight to the loader's table (_dl_find_object /
# PT_GNU_EH_FRAME).  -static-libgcc alone is not enough: __cxa_throw lives in libstdc++ and
# would still unwind with libgcc_s.  Exceptions never leave the library (every entry point
# catches), so the two runtimes do not meet.  When the toolchain cannot link statically (no
# libstdc++.a, or a compiler without these flags) the library is linked against the shared
# runtime instead, and its build record says so.
STATIC_RUNTIME_FLAGS = ("-static-libgcc", "-static-libstdc++", "-Wl,--exclude-libs,ALL")


@dataclass(frozen=True)
class Toolchain:
    """Paths and versions of the tools that build a model library."""

    stanc: Path
    include_dir: Path
    lib_dir: Path
    cxx: str
    stanc_version: str
    cxx_version: str

    def compile_flags(self, exact_hvp: bool) -> list[str]:
        """Compiler flags for one of the two builds: exact nested-autodiff HVPs or finite
        differences (the fallback for models, such as ODE models, that fvar<var> cannot compile)."""
        flags = list(base_flags()) + [f"-I{self.include_dir}"]
        if exact_hvp:
            flags.append(EXACT_HVP_FLAG)
        return flags

    def link_flags(self, static_runtime: bool = True) -> list[str]:
        """Linker flags for a model library; ``static_runtime`` adds
        :data:`STATIC_RUNTIME_FLAGS` (a private C++ runtime and unwinder, see there)."""
        # --no-undefined: a symbol missing from the Stan libraries fails the link, not the load.
        flags = [f"-L{self.lib_dir}", *LINK_LIBRARIES, f"-Wl,-rpath,{self.lib_dir}",
                 "-Wl,--no-undefined"]
        return flags + list(STATIC_RUNTIME_FLAGS) if static_runtime else flags

    @property
    def fingerprint(self) -> str:
        """A short hash of the toolchain and flags (what the precompiled header depends on)."""
        h = hashlib.sha256()
        for part in (self.stanc_version, self.cxx_version, str(self.include_dir),
                     " ".join(base_flags())):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]


def opt_level() -> str:
    """The optimization flag of every build: ``$STANVI_OPT_LEVEL`` (one of :data:`OPT_LEVELS`;
    ``O1`` without the dash is accepted too), else :data:`DEFAULT_OPT_LEVEL`."""
    value = os.environ.get(OPT_LEVEL_ENV, "").strip()
    if not value:
        return DEFAULT_OPT_LEVEL
    level = value if value.startswith("-") else f"-{value}"
    if level not in OPT_LEVELS:
        raise ToolchainError(f"${OPT_LEVEL_ENV}={value!r} is not an optimization level stanvi "
                             f"builds with; use one of {', '.join(OPT_LEVELS)} (or unset it: "
                             f"{DEFAULT_OPT_LEVEL})")
    return level


def base_flags() -> tuple[str, ...]:
    """:data:`BASE_FLAGS` with the optimization level of :func:`opt_level`."""
    level = opt_level()
    return tuple(level if flag == DEFAULT_OPT_LEVEL else flag for flag in BASE_FLAGS)


def glue_fingerprint() -> str:
    """A short hash of the bridge's C++ source: the glue object and every model library linked
    with it are rebuilt when it changes (the precompiled header is not)."""
    h = hashlib.sha256(GLUE_SOURCE.read_bytes())
    for header in sorted(GLUE_SOURCE.parent.glob("*.hpp")):   # the headers it includes
        h.update(header.read_bytes())
    return h.hexdigest()[:12]


def library_fingerprint(static_runtime: bool = True) -> str:
    """A short hash of everything besides the model's code that goes into a model library: the
    glue's source and the link flags (a change to either gives every model a new cache entry)."""
    h = hashlib.sha256(glue_fingerprint().encode())
    for part in (*LINK_LIBRARIES, *(STATIC_RUNTIME_FLAGS if static_runtime else ("shared",))):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:12]


def _httpstan_dir() -> Path:
    try:
        import httpstan  # noqa: PLC0415  (imported lazily: only compiling needs it)
    except ImportError as exc:  # pragma: no cover - exercised only on broken installs
        raise ToolchainError(
            "the Stan toolchain comes from the 'httpstan' package, which is not installed; "
            "run: pip install httpstan") from exc
    return Path(httpstan.__file__).parent


@functools.lru_cache(maxsize=1)
def find_toolchain() -> Toolchain:
    """Locate stanc, the Stan headers and libraries (inside httpstan) and a C++ compiler.

    The compiler is ``$CXX`` if set, else ``g++``.  Raises :class:`ToolchainError` saying what to
    install when something is missing.
    """
    root = _httpstan_dir()
    stanc = root / "stanc"
    include_dir = root / "include"
    lib_dir = root / "lib"
    for path, what in ((stanc, "stanc"), (include_dir / "stan" / "model" / "model_header.hpp",
                                          "Stan headers"), (lib_dir, "Stan libraries")):
        if not path.exists():
            raise ToolchainError(f"{what} not found at {path}: the httpstan installation is "
                                 "incomplete; reinstall it with: pip install --force-reinstall httpstan")
    if not os.access(stanc, os.X_OK):
        raise ToolchainError(f"stanc at {stanc} is not executable")
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise ToolchainError(
            f"no C++ compiler found (looked for '{cxx}'): stanvi compiles Stan models with a C++17 "
            "compiler. Install one, e.g. 'apt-get install g++' (Debian/Ubuntu), 'dnf install gcc-c++' "
            "(Fedora) or the Xcode command line tools (macOS), or set $CXX to its path.")
    stanc_version = _first_line([str(stanc), "--version"])
    cxx_version = _first_line([cxx, "--version"])
    return Toolchain(stanc=stanc, include_dir=include_dir, lib_dir=lib_dir, cxx=cxx,
                     stanc_version=stanc_version, cxx_version=cxx_version)


def _first_line(cmd: list[str]) -> str:
    """The first line ``cmd`` prints (a tool's ``--version``), kept in the cache root under the
    executable's resolved path, size and modification time: running ``stanc`` and ``g++`` costs
    a new process ~20 ms that a fit of an already compiled model need not pay (issue T3-1).
    A tool replaced in place changes its size or time and is asked again."""
    from stanvi.stan.cache import atomic_write, cache_root  # noqa: PLC0415

    exe = shutil.which(cmd[0])
    try:
        st = os.stat(exe) if exe else None
    except OSError:
        st = None
    key = (f"{os.path.realpath(exe)}|{st.st_size}|{st.st_mtime_ns}|{' '.join(cmd[1:])}"
           if st else None)
    store = cache_root() / "tool_versions.json"
    known = _read_json(store)
    if key is not None and isinstance(known.get(key), str):
        return known[key]
    line = _run_first_line(cmd)
    if key is not None:
        try:
            atomic_write(store, json.dumps({**known, key: line}))
        except OSError:  # a read-only cache root: ask again next time
            pass
    return line


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _run_first_line(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"could not run {' '.join(cmd)}: {exc}") from exc
    return (out.stdout or out.stderr).strip().splitlines()[0]
