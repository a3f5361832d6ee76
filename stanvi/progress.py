"""stanvi's progress displays, one module for both kinds of long work:

* :class:`StageProgress` for work in named stages (compiling a model: stanc, C++, linking):
  on a terminal one status line redrawn with the elapsed time; elsewhere (CI logs, pipes) one
  printed line per stage and a closing ``done in … s`` / ``failed in … s`` line.
* :class:`IterationProgress` for iterative methods: ``method: iter k, ELBO x, oracle calls y``
  redrawn at most 10 times a second, on a terminal only (silent in logs: a fit's outcome line is
  printed by ``stanvi.fit`` itself).

Both draw through :class:`StatusLine`, the one place that knows how a terminal line is redrawn
and cleared.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType


class StatusLine:
    """One redrawable line on ``stream`` (default stderr); ``interactive`` when it is a tty."""

    def __init__(self, enabled: bool = True, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.interactive = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.shown = False

    def redraw(self, text: str) -> None:
        """Replace the line with ``text`` (terminals only)."""
        if self.interactive:
            self.stream.write(f"\r{text}\033[K")
            self.stream.flush()
            self.shown = True

    def finish(self, text: str | None = None) -> None:
        """End the line: print ``text`` in its place (or as a plain line off a terminal), or
        clear it when ``text`` is None."""
        if text is not None and self.enabled:
            prefix, suffix = ("\r", "\033[K") if self.interactive else ("", "")
            print(f"{prefix}{text}{suffix}", file=self.stream, flush=True)
        elif self.shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self.shown = False


class StageProgress:
    """Context manager: ``with StageProgress("compiling bernoulli") as p: p.stage("stanc")``."""

    def __init__(self, title: str, *, enabled: bool = True, stream=None) -> None:
        self.title = title
        self.line = StatusLine(enabled, stream)
        self._stage = ""
        self._start = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.line.enabled

    def __enter__(self) -> "StageProgress":
        self._start = time.perf_counter()
        if self.line.interactive:
            self._thread = threading.Thread(target=self._redraw_loop, daemon=True)
            self._thread.start()
        return self

    def stage(self, name: str) -> None:
        with self._lock:
            self._stage = name
        if self.line.enabled and not self.line.interactive:
            print(f"stanvi: {self.title}: {name} ...", file=self.line.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _redraw_loop(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                text = f"stanvi: {self.title}: {self._stage} ({self.elapsed:4.0f} s)"
            self.line.redraw(text)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        outcome = "failed" if exc_type is not None else "done"
        self.line.finish(f"stanvi: {self.title}: {outcome} in {self.elapsed:.1f} s")


class IterationProgress:
    """Redraws ``method: iter k, ELBO x, oracle calls y`` at most 10 times a second on a tty."""

    def __init__(self, method: str, enabled: bool = True, stream=None) -> None:
        self.line = StatusLine(enabled, stream)
        self.method = method
        self._last = 0.0
        self._start = time.perf_counter()

    @property
    def enabled(self) -> bool:
        return self.line.interactive

    def update(self, iteration: int, **fields: float) -> None:
        if not self.line.interactive:
            return
        now = time.perf_counter()
        if now - self._last < 0.1:
            return
        self._last = now
        parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        self.line.redraw(f"{self.method}: iter {iteration}, " + ", ".join(parts)
                         + f" ({now - self._start:.1f} s)")

    def close(self) -> None:
        self.line.finish()
