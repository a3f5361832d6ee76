"""A one-line progress display for iterative methods (on a terminal only; silent otherwise)."""

from __future__ import annotations

import sys
import time


class IterationProgress:
    """Redraws ``method: iter k, ELBO x, oracle calls y`` at most 10 times a second on a tty."""

    def __init__(self, method: str, enabled: bool = True, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.method = method
        self._last = 0.0
        self._start = time.perf_counter()
        self._shown = False

    def update(self, iteration: int, **fields: float) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1:
            return
        self._last = now
        parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items()]
        self.stream.write(f"\r{self.method}: iter {iteration}, " + ", ".join(parts)
                          + f" ({now - self._start:.1f} s)\033[K")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
