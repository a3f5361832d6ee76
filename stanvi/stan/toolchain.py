"""Finding the Stan toolchain: stanc, the Stan C++ headers and libraries, and a C++ compiler.

stanvi needs no download at install or run time (DESIGN.md, "Decisions"): the `httpstan` wheel on
PyPI ships `stanc` and the Stan, Stan Math, Eigen, Boost, TBB and Sundials headers and libraries.
This module finds them inside the installed package and describes the compile flags that every
model library and the glue object share.
"""

from __future__ import annotations

import functools
import hashlib
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
LINK_LIBRARIES = ("-lsundials_cvodes", "-lsundials_idas", "-lsundials_kinsol",
                  "-lsundials_nvecserial", "-ltbb")


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
        flags = list(BASE_FLAGS) + [f"-I{self.include_dir}"]
        if exact_hvp:
            flags.append(EXACT_HVP_FLAG)
        return flags

    def link_flags(self) -> list[str]:
        # --no-undefined: a symbol missing from the Stan libraries fails the link, not the load.
        return [f"-L{self.lib_dir}", *LINK_LIBRARIES, f"-Wl,-rpath,{self.lib_dir}",
                "-Wl,--no-undefined"]

    @property
    def fingerprint(self) -> str:
        """A short hash of the toolchain and flags (what the precompiled header depends on)."""
        h = hashlib.sha256()
        for part in (self.stanc_version, self.cxx_version, str(self.include_dir), " ".join(BASE_FLAGS)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:16]


def glue_fingerprint() -> str:
    """A short hash of the bridge's C++ source: the glue object and every model library linked
    with it are rebuilt when it changes (the precompiled header is not)."""
    return hashlib.sha256(GLUE_SOURCE.read_bytes()).hexdigest()[:12]


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
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"could not run {' '.join(cmd)}: {exc}") from exc
    return (out.stdout or out.stderr).strip().splitlines()[0]
