"""stanvi's progress displays, one module for every kind of long work:

* :class:`StageProgress` for work in named stages (compiling a model: stanc, C++, linking):
  on a terminal one status line redrawn with the elapsed time; elsewhere (CI logs, pipes) one
  printed line per stage and a closing ``done in … s`` / ``failed in … s`` line.
* :class:`TaskProgress` for batches of tasks (done, failed, running, ETA), on terminals and in
  notebooks and logs alike.
* :class:`IterationProgress` for iterative methods, through ``tqdm.auto``: a bar redrawn on a
  terminal, a widget in a notebook, and a status line every few seconds in logs and pipes.

The first two draw through :class:`StatusLine`, the one place that knows how a terminal line is
redrawn and cleared.  Messages (the verdict after a fit ...) are not progress: they go through
the ``logging`` hierarchy under ``"stanvi"`` (:mod:`stanvi.log`).
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


class _LineWriter:
    """A stream for tqdm off a terminal: each status it draws becomes one plain line (tqdm's
    ``\r`` redraws would pile up into one unreadable line in a log file)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        for part in text.replace("\n", "\r").split("\r"):
            part = part.rstrip()
            if part:
                self.stream.write(part + "\n")
        return len(text)

    def flush(self) -> None:
        if hasattr(self.stream, "flush"):
            self.stream.flush()


def _in_notebook() -> bool:
    """True inside a Jupyter kernel (where ``tqdm.auto`` draws a widget)."""
    ip = sys.modules.get("IPython")
    shell = getattr(ip, "get_ipython", lambda: None)() if ip is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class IterationProgress:
    """Progress of an iterative method: ``trustvi: 12 it [00:03, 4.1 it/s, elbo=-32.3,
    oracle=412]``, drawn by ``tqdm.auto`` wherever the fit runs: redrawn on a terminal (at most 10
    times a second, cleared at the end: the verdict line follows), a widget in a notebook, and in
    logs, CI and pipes (stderr not a terminal) a status written at most every ``every`` seconds
    (default 5) and once at the end, so a long fit is never silent."""

    def __init__(self, method: str, enabled: bool = True, stream=None, every: float = 5.0) -> None:
        self.method = method
        self._enabled = bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = float(every)
        self._bar = None
        self._start = time.perf_counter()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def _open(self):
        from tqdm.auto import tqdm  # noqa: PLC0415

        notebook = self.stream is sys.stderr and _in_notebook()
        kwargs = dict(desc=self.method, unit="it", dynamic_ncols=True, leave=not self.interactive,
                      mininterval=0.1 if (self.interactive or notebook) else self.every,
                      bar_format="{desc}: {n} it [{elapsed}, {rate_fmt}{postfix}]")
        if notebook:
            return tqdm(**kwargs)
        from tqdm import tqdm as text_tqdm  # noqa: PLC0415  (a plain text bar on this stream)

        stream = self.stream if self.interactive else _LineWriter(self.stream)
        return text_tqdm(file=stream, ascii=not self.interactive, **kwargs)

    def update(self, iteration: int, **fields: float) -> None:
        """Record iteration ``iteration`` with the fields to show (ELBO, oracle calls ...)."""
        if not self._enabled:
            return
        if self._bar is None:
            self._bar = self._open()
        parts = {k: (f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in fields.items()}
        self._bar.set_postfix(parts, refresh=False)
        self._bar.update(max(int(iteration) - self._bar.n, 0))

    def close(self) -> None:
        """End the display: cleared on a terminal; the last status stays in logs."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class TaskProgress:
    """Progress over the tasks of a batch: ``batch: 12/40 done (3 failed), 2 running, ETA 4m10s``.

    On a terminal the line is redrawn at most once a second; elsewhere (notebooks, CI logs,
    pipes) a plain line is printed every ``every`` seconds and at the end, so a notebook shows
    progress without a widget library.  The ETA is the mean wall time per finished task so far
    times the tasks left, counting only the tasks finished by this run (``already_done`` are
    those a resumed batch found finished)."""

    def __init__(self, total: int, *, title: str = "batch", enabled: bool = True, stream=None,
                 every: float = 30.0, already_done: int = 0) -> None:
        self.line = StatusLine(enabled, stream)
        self.total, self.title, self.every = int(total), title, float(every)
        self.done, self.failed, self.running = int(already_done), 0, 0
        self._already = int(already_done)   # finished before this run: not in the ETA's rate
        self._start = self._last = time.perf_counter()

    def text(self) -> str:
        elapsed = time.perf_counter() - self._start
        left = self.total - self.done
        eta = ""
        if self.done > self._already and left:
            seconds = elapsed / (self.done - self._already) * left
            eta = f", ETA {int(seconds // 60)}m{int(seconds % 60):02d}s"
        return (f"{self.title}: {self.done}/{self.total} done ({self.failed} failed), "
                f"{self.running} running{eta} [{elapsed:.0f} s]")

    def update(self, *, done: int = 0, failed: int = 0, running: int | None = None) -> None:
        """Count ``done`` more finished tasks, ``failed`` of them unsuccessful; ``running`` is the
        number in flight now, where known."""
        self.done += done
        self.failed += failed
        if running is not None:
            self.running = running
        now = time.perf_counter()
        if self.line.interactive:
            if now - self._last >= 1.0 or self.done == self.total:
                self._last = now
                self.line.redraw(self.text())
        elif self.line.enabled and now - self._last >= self.every:
            self._last = now
            print(self.text(), file=self.line.stream, flush=True)

    def close(self) -> None:
        self.line.finish(self.text())
