"""stanvi's version, read from the installed package's metadata (pyproject.toml is the one
place it is written), so output code below the package root can record it without importing
the root."""

from __future__ import annotations

from importlib import metadata

try:
    __version__ = metadata.version("stanvi")
except metadata.PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"
