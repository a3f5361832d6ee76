"""stanvi's progress displays, one module for every kind of long work, all drawn by ``tqdm``
(issue 13 item 2): a bar redrawn on a terminal, a widget in a notebook (``tqdm.auto``), and in
logs, CI and pipes (stderr not a terminal) a plain status line every few seconds, so that long
fits, compiles and batches are never silent.

* :class:`StageProgress` for work in named stages (compiling a model: stanc, C++, linking): the
  current stage and the elapsed time.
* :class:`TaskProgress` for batches of tasks: done/total, ETA, failed and running tasks.
* :class:`IterationProgress` for iterative methods: iterations, ELBO, oracle calls; what it is
  given also goes to the observers of :func:`observe_iterations`, shown or not (the batch's
  child process reports a fit's last iteration that way, docs/batch.md#progress-at-stop).

Messages (a compile's start and end, the verdict after a fit ...) are not progress: they go
through the ``logging`` hierarchy under ``"stanvi"`` (:mod:`stanvi.log`), so that
``logging.getLogger("stanvi").setLevel(logging.WARNING)`` silences them while the displays stay,
and ``progress=False`` (``--quiet``) turns the displays off and demotes those messages to DEBUG.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType

from stanvi.log import get_logger


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


def _is_tty(stream) -> bool:
    """A terminal a bar can be redrawn on: a tty whose width is not 0 (a pseudo-terminal with
    no size, as some CI runners and ``script`` give, shows a tqdm bar as nothing at all: there
    each status is a line of its own instead)."""
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return False
    try:
        return os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return True


def _live(stream) -> bool:
    """True where a display is redrawn in place (a terminal, a notebook widget), False where
    each draw is a new line (logs, CI, pipes)."""
    return _is_tty(stream) or (stream is sys.stderr and _in_notebook())


def _open_bar(stream, every: float, **kwargs):
    """A tqdm bar on ``stream``: ``tqdm.auto``'s widget in a notebook (when ``stream`` is
    stderr), a bar redrawn at most 10 times a second on a terminal, and elsewhere a plain line
    at most every ``every`` seconds (:class:`_LineWriter`)."""
    if stream is sys.stderr and _in_notebook():
        from tqdm.auto import tqdm  # noqa: PLC0415

        return tqdm(mininterval=0.1, **kwargs)
    from tqdm import tqdm as text_tqdm  # noqa: PLC0415  (a plain text bar on this stream)

    interactive = _is_tty(stream)
    return text_tqdm(file=stream if interactive else _LineWriter(stream), ascii=not interactive,
                     mininterval=0.1 if interactive else every, **kwargs)


class _Ticker:
    """Calls ``tick()`` every ``period`` seconds on a daemon thread until :meth:`stop`: tqdm
    draws only when its count changes, and a compile stage or a batch waiting on a long task
    must still show its elapsed time (and, off a terminal, a line every ``period`` seconds).
    The first call comes after ``first`` seconds (default ``period``)."""

    def __init__(self, period: float, tick, first: float | None = None) -> None:
        self._stop = threading.Event()
        wait = float(period if first is None else first)
        self._thread = threading.Thread(target=self._loop, args=(float(period), tick, wait),
                                        daemon=True)
        self._thread.start()

    def _loop(self, period: float, tick, wait: float) -> None:
        while not self._stop.wait(wait):
            tick()
            wait = period

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class StageProgress:
    """Context manager for work in named stages::

        with StageProgress("compiling bernoulli.stan") as p:
            p.stage("stanc"); ...; p.stage("linking"); ...

    Logs ``title + note`` when it starts and ``title: done in … s`` (or ``failed after … s``)
    when it ends, at INFO on ``logger`` (default ``stanvi.stan``; DEBUG when disabled or without
    ``announce``), and in between shows ``title: stage [elapsed]``: redrawn every half second on
    a terminal (cleared at the end: the log line follows), a widget in a notebook, and off a
    terminal one line per stage and one every ``every`` seconds while a stage lasts.  With
    ``delay``, nothing is shown until the work has lasted that many seconds (work that is
    usually quick, such as a fit's diagnostics, then draws nothing when it is)."""

    def __init__(self, title: str, *, enabled: bool = True, stream=None, every: float = 10.0,
                 note: str = "", logger: logging.Logger | None = None, delay: float = 0.0,
                 announce: bool = True) -> None:
        self.title, self.note = title, note
        self._enabled = bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.every = float(every)
        self.delay = float(delay)
        self.logger = logger if logger is not None else get_logger("stan")
        self._level = logging.INFO if self._enabled and announce else logging.DEBUG
        self._bar = None
        self._ticker: _Ticker | None = None
        self._text = ""
        self._lock = threading.Lock()
        self._start = time.perf_counter()

    @property
    def enabled(self) -> bool:
        return self._enabled

    def __enter__(self) -> "StageProgress":
        self._start = time.perf_counter()
        self.logger.log(self._level, f"{self.title}{self.note}")
        return self

    def stage(self, name: str) -> None:
        """Start stage ``name`` (shown at once, or once ``delay`` has passed)."""
        self.logger.debug(f"{self.title}: {name}")
        if not self._enabled:
            return
        with self._lock:
            self._text = f"{self.title}: {name}"
            if self._bar is not None:
                self._bar.set_description_str(self._text, refresh=True)
            elif self.elapsed >= self.delay:
                self._open()
            elif self._ticker is None:   # the ticker's first call, at ``delay``, draws it
                self._ticker = _Ticker(self._period, self._tick, first=self.delay - self.elapsed)

    @property
    def _period(self) -> float:
        """Seconds between redraws: half a second where redrawn in place, else ``every``."""
        return 0.5 if _live(self.stream) else self.every

    def _open(self) -> None:
        """Draw the display with the current stage (the caller holds the lock)."""
        self._bar = _open_bar(self.stream, self.every, desc=self._text, total=None, leave=False,
                              bar_format="{desc} [{elapsed}]", dynamic_ncols=True,
                              delay=self.delay)   # tqdm's delay: no draw when it is made
        if self.delay:   # the display's clock is the work's, not the display's
            self._bar.start_t -= self.elapsed
            self._bar.refresh()
        if self._ticker is None:
            self._ticker = _Ticker(self._period, self._tick)

    def _tick(self) -> None:
        """The ticker's call: draw the display once ``delay`` has passed, then redraw it."""
        with self._lock:
            if self._bar is None:
                self._open()
            else:
                self._bar.refresh()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._ticker is not None:
            self._ticker.stop()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        outcome = "failed after" if exc_type is not None else "done in"
        self.logger.log(self._level, f"{self.title}: {outcome} {self.elapsed:.1f} s")


IterationObserver = Callable[[str, int, dict], None]
_ITERATION_OBSERVERS: list[IterationObserver] = []


@contextmanager
def observe_iterations(observer: IterationObserver) -> Iterator[None]:
    """Within the block, every iteration an iterative method reports (:class:`IterationProgress`
    ``update``, whether its display is on or off) is also given to ``observer(method, iteration,
    fields)``: the method's name, the iteration's number and its fields (ELBO, oracle calls, a
    phase ...).  The batch's child process uses it to say how far a fit had got when its
    timeout stopped it (docs/batch.md#progress-at-stop)."""
    _ITERATION_OBSERVERS.append(observer)
    try:
        yield
    finally:
        _ITERATION_OBSERVERS.remove(observer)


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
        self.interactive = _is_tty(self.stream)
        self.every = float(every)
        self._bar = None

    @property
    def enabled(self) -> bool:
        return self._enabled

    def update(self, iteration: int, **fields: float) -> None:
        """Record iteration ``iteration`` with the fields to show (ELBO, oracle calls, a phase
        such as TrustVI's ``refine`` ...), and give them to the observers of
        :func:`observe_iterations`."""
        for observer in _ITERATION_OBSERVERS:
            observer(self.method, int(iteration), fields)
        if not self._enabled:
            return
        if self._bar is None:
            self._bar = _open_bar(self.stream, self.every, desc=self.method, unit="it",
                                  dynamic_ncols=True, leave=not self.interactive,
                                  bar_format="{desc}: {n} it [{elapsed}, {rate_fmt}{postfix}]")
        parts = {k: (f"{v:.4g}" if isinstance(v, float) else str(v)) for k, v in fields.items()}
        self._bar.set_postfix(parts, refresh=False)
        self._bar.update(max(int(iteration) - self._bar.n, 0))

    def close(self) -> None:
        """End the display: cleared on a terminal; the last status stays in logs."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class TaskProgress:
    """Progress over the tasks of a batch, a tqdm bar: ``batch:  55%|#####5    | 11/20
    [05:30<04:30, 30.00s/task, failed=1, running=2]`` (done/total, elapsed<ETA, failed and
    running tasks), redrawn every second on a terminal, a widget in a notebook, and in logs and
    pipes a line every ``every`` seconds (also while no task finishes) and at the end.  The ETA is
    the mean wall time per task finished by this run times the tasks left (``already_done``: those
    a resumed batch found finished, not in the rate).  Disabled (``progress=False``,
    ``--quiet``), the same status goes to the ``stanvi.batch`` logger at DEBUG every ``every``
    seconds and at the end."""

    def __init__(self, total: int, *, title: str = "batch", enabled: bool = True, stream=None,
                 every: float = 30.0, already_done: int = 0,
                 logger: logging.Logger | None = None) -> None:
        self.total, self.title, self.every = int(total), title, float(every)
        self.done, self.failed, self.running = int(already_done), 0, 0
        self._already = int(already_done)   # finished before this run: not in the ETA's rate
        self.enabled = bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.logger = logger if logger is not None else get_logger("batch")
        self._start = self._last = time.perf_counter()
        self._bar = None
        self._ticker: _Ticker | None = None
        if self.enabled:
            self._bar = _open_bar(self.stream, self.every, desc=title, total=self.total,
                                  initial=self._already, unit="task", smoothing=0, miniters=1,
                                  dynamic_ncols=True, leave=True,
                                  postfix={"failed": 0, "running": 0})
            self._ticker = _Ticker(1.0 if _live(self.stream) else self.every, self._bar.refresh)

    def text(self) -> str:
        """The status as one line: ``batch: 12/40 done (3 failed), 2 running, ETA 4m10s [60 s]``."""
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
        if self._bar is not None:
            self._bar.set_postfix(failed=self.failed, running=self.running, refresh=False)
            self._bar.update(done)
            return
        now = time.perf_counter()
        if now - self._last >= self.every:
            self._last = now
            self.logger.debug(self.text())

    def close(self) -> None:
        """The final status: the bar's last line (kept), or a DEBUG message when disabled."""
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        else:
            self.logger.debug(self.text())
