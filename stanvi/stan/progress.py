"""A small progress reporter for long steps (compiling takes seconds to a minute).

On a terminal it redraws one status line with the elapsed time; elsewhere (CI logs, pipes) it
prints one line per stage.  Silent when ``enabled`` is False.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType


class StageProgress:
    """Context manager: ``with StageProgress("compiling bernoulli") as p: p.stage("stanc")``."""

    def __init__(self, title: str, *, enabled: bool = True, stream=None) -> None:
        self.title = title
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self._stage = ""
        self._start = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def __enter__(self) -> "StageProgress":
        self._start = time.perf_counter()
        if self.interactive:
            self._thread = threading.Thread(target=self._redraw_loop, daemon=True)
            self._thread.start()
        return self

    def stage(self, name: str) -> None:
        with self._lock:
            self._stage = name
        if self.enabled and not self.interactive:
            print(f"stanvi: {self.title}: {name} ...", file=self.stream, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def _redraw_loop(self) -> None:
        while not self._stop.wait(0.25):
            with self._lock:
                line = f"\rstanvi: {self.title}: {self._stage} ({self.elapsed:4.0f} s)"
            self.stream.write(line + "\033[K")
            self.stream.flush()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.enabled:
            return
        outcome = "failed" if exc_type is not None else "done"
        prefix = "\r" if self.interactive else ""
        suffix = "\033[K" if self.interactive else ""
        print(f"{prefix}stanvi: {self.title}: {outcome} in {self.elapsed:.1f} s{suffix}",
              file=self.stream, flush=True)
