"""The compile cache: where model libraries, precompiled headers and the glue object live.

Layout under the cache root (``$STANVI_CACHE_DIR``, else ``$XDG_CACHE_HOME/stanvi``, else
``~/.cache/stanvi``)::

    <root>/<toolchain fingerprint>/
        exact/  fd/               one directory per flag set (exact nested-AD HVP, finite differences)
            stanvi_pch.hpp(.gch)  precompiled stan/model/model_header.hpp (~800 MB, built once)
            stanvi_bridge-<h>.o   the glue (h hashes its source), linked into every model
        models/<name>-<key>/      one model library; <key> hashes the model code, its name, the
                                  glue's hash and the link flags (toolchain.library_fingerprint)
            model.stan, model.hpp, lib<name>.so, build.json (written last: the entry is complete)
        locks/                    file locks, one per artifact

Entries are content-addressed, so an edited `.stan` file gets a new directory and a new library
path (a process never dlopens a stale library).  Every artifact is built under a file lock and
renamed into place, so concurrent compiles of the same model (threads or processes) are safe, and
an entry whose library is missing or does not match the hash recorded in build.json is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from filelock import FileLock

from stanvi.errors import CacheDirError


_HINT = ("set STANVI_CACHE_DIR to a writable directory (compiled models and the JAX "
         "compilation cache live there)")


def cache_root() -> Path:
    """The cache root directory (created if needed).  A root that exists but is read-only is
    returned as it is: the models already built there are found and loaded (a read-only site
    cache on a cluster; issue T3-2 item 8); only a build needs to write
    (:func:`require_writable`, called by :func:`lock_for`)."""
    env = os.environ.get("STANVI_CACHE_DIR")
    if env:
        root = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = Path(base) / "stanvi"
    if not root.is_dir():
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheDirError(f"cannot create the stanvi cache directory {root}: "
                                f"{exc.strerror or exc}; {_HINT}") from None
    return root


def writable(path: Path) -> bool:
    """Whether ``path``, or its nearest existing ancestor where it does not exist yet, can be
    written to (``os.access``: root passes it everywhere)."""
    path = Path(path)
    while not path.exists() and path.parent != path:
        path = path.parent
    return os.access(path, os.W_OK | os.X_OK)


def require_writable(path: Path) -> None:
    """Raise :class:`CacheDirError` naming the cache directory and the remedy when ``path``
    (inside the cache) cannot be written: something must be built there."""
    if not writable(path):
        raise CacheDirError(f"the stanvi cache directory {cache_root()} is not writable, and "
                            f"what is needed is not built there yet; {_HINT}")


def lock_for(toolchain_dir: Path, name: str) -> FileLock:
    """A process- and thread-safe lock for the artifact ``name`` under one toolchain directory
    (a build is about to write there: the directory must be writable)."""
    require_writable(toolchain_dir)
    locks = toolchain_dir / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    return FileLock(str(locks / f"{name}.lock"))


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def model_key(code: str, name: str) -> str:
    """Content address of a model: its code and the name its C++ class gets."""
    return hashlib.sha256(f"{name}\0{code}".encode()).hexdigest()[:20]


def atomic_write(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` by a temporary file in the same directory and a rename, so a
    reader (another process) sees the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)
