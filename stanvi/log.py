"""stanvi's messages go through the ``logging`` hierarchy under ``"stanvi"`` (``stanvi.fit``,
``stanvi.compile``, ``stanvi.batch`` ...), as cmdstanpy's go through ``"cmdstanpy"``.

By default the ``"stanvi"`` logger shows INFO and above on stderr as ``stanvi: message`` (the
stream looked up when each message is written, so notebooks and captured streams get them).
Users silence, filter or redirect them as for any library::

    import logging
    logging.getLogger("stanvi").setLevel(logging.WARNING)      # no verdict lines
    logging.getLogger("stanvi").handlers.clear()               # and route them elsewhere:
    logging.getLogger("stanvi").propagate = True               # ... to the root's handlers

Progress bars are not log messages: they are drawn by :mod:`stanvi.progress`.
"""

from __future__ import annotations

import logging
import sys

ROOT = "stanvi"


class StderrHandler(logging.StreamHandler):
    """A StreamHandler writing to whatever ``sys.stderr`` is when a message is emitted."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):  # noqa: D102
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # noqa: ARG002  (always the current sys.stderr)
        pass


def _configure() -> logging.Logger:
    logger = logging.getLogger(ROOT)
    if not any(getattr(h, "_stanvi_default", False) for h in logger.handlers):
        handler = StderrHandler()
        handler.setFormatter(logging.Formatter("stanvi: %(message)s"))
        handler._stanvi_default = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


_configure()


def get_logger(name: str = "") -> logging.Logger:
    """The logger ``stanvi.<name>`` (``"stanvi"`` itself for an empty name)."""
    return logging.getLogger(f"{ROOT}.{name}" if name else ROOT)
