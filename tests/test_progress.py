"""The progress displays (stanvi.progress): a redrawn line on a terminal, plain lines in logs."""

from __future__ import annotations

import io
import os
import logging
import time

import pytest

from stanvi.progress import IterationProgress, StageProgress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True



def test_stage_progress_prints_one_line_per_stage_in_a_log(stanvi_log):
    log = io.StringIO()
    with StageProgress("compiling m", stream=log, note=" (10-60 s)") as bar:
        bar.stage("stanc")
        bar.stage("linking")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines == ["compiling m: stanc [00:00]", "compiling m: linking [00:00]"]
    info = [(r.name, r.getMessage()) for r in stanvi_log.records if r.levelno == logging.INFO]
    assert info[0] == ("stanvi.stan", "compiling m (10-60 s)")
    assert info[1][1].startswith("compiling m: done in ") and len(info) == 2


def test_stage_progress_redraws_on_a_terminal_with_the_elapsed_time():
    """On a terminal the stage line is redrawn in place while a stage lasts (the elapsed time
    moves without any call from the compiler) and cleared at the end."""
    tty = Tty()
    with StageProgress("compiling m", stream=tty) as bar:
        bar.stage("C++")
        time.sleep(1.2)
    text = tty.getvalue()
    assert text.startswith("\rcompiling m: C++ [00:00]") and "\n" not in text
    assert text.count("\rcompiling m: C++ [") >= 2 and "[00:01]" in text
    assert text.endswith("\r")


def test_stage_progress_says_failed_and_is_silent_when_disabled(stanvi_log):
    log = io.StringIO()
    with pytest.raises(RuntimeError):
        with StageProgress("compiling m", stream=log):
            raise RuntimeError("boom")
    assert stanvi_log.records[-1].getMessage().startswith("compiling m: failed after ")
    assert stanvi_log.records[-1].levelno == logging.INFO
    stanvi_log.clear()
    quiet = io.StringIO()
    with StageProgress("compiling m", stream=quiet, enabled=False) as bar:
        bar.stage("stanc")
    assert quiet.getvalue() == ""
    assert stanvi_log.records and all(r.levelno == logging.DEBUG for r in stanvi_log.records)


def test_delayed_stage_progress_draws_only_work_that_lasts(stanvi_log):
    """With ``delay``, work quicker than it draws nothing; work that lasts longer is drawn
    from then on, its clock counting from the start of the work; without ``announce`` the
    start and end messages are DEBUG (a fit's diagnostics: usually a fraction of a second)."""
    quick = io.StringIO()
    with StageProgress("diagnostics of the trustvi fit", stream=quick, delay=0.5,
                       announce=False) as shown:
        shown.stage("k-hat on 4,000 draws from q")
    assert quick.getvalue() == ""
    slow = io.StringIO()
    with StageProgress("diagnostics of the trustvi fit", stream=slow, delay=0.3,
                       announce=False) as shown:
        shown.stage("k-hat on 4,000 draws from q")
        time.sleep(0.6)
        shown.stage("k-hat 0.69 ± 0.05 on 4,000 draws is within 1.645 se of 0.7: 4,000 more draws")
    lines = slow.getvalue().splitlines()
    assert lines == ["diagnostics of the trustvi fit: k-hat on 4,000 draws from q [00:00]",
                     "diagnostics of the trustvi fit: k-hat 0.69 ± 0.05 on 4,000 draws is "
                     "within 1.645 se of 0.7: 4,000 more draws [00:00]"]
    assert stanvi_log.records and all(r.levelno == logging.DEBUG for r in stanvi_log.records)


def test_iteration_progress_redraws_on_a_terminal_and_clears_at_the_end():
    tty = Tty()
    bar = IterationProgress("trustvi", stream=tty)
    bar.update(3, elbo=-1.5, oracle=12.0)
    bar.close()
    text = tty.getvalue()
    assert text.startswith("\rtrustvi: ") and "\n" not in text
    assert text.endswith("\r")                  # cleared: the verdict line takes its place
    quiet = io.StringIO()
    silent = IterationProgress("trustvi", stream=quiet, enabled=False)
    silent.update(1, elbo=-1.0)
    silent.close()
    assert quiet.getvalue() == "" and not silent.enabled


def test_iteration_progress_writes_plain_lines_off_a_terminal():
    """Notebooks, CI logs and pipes see a long fit's progress: a line every ``every`` seconds
    and the final state, each on its own line (no carriage returns)."""
    log = io.StringIO()
    bar = IterationProgress("trustvi", stream=log, every=0.0)
    for k in (1, 2, 3):
        bar.update(k, elbo=-1.5 * k, oracle=12.0 * k)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) >= 2
    assert all(line.startswith("trustvi: ") for line in lines)
    assert lines[-1].startswith("trustvi: 3 it") and "elbo=-4.5" in lines[-1]
    assert "oracle=36" in lines[-1]


def test_task_progress_prints_off_a_terminal_and_times_this_runs_tasks(monkeypatch):
    """Batch progress shows in logs and notebooks (stderr not a tty): a tqdm line every
    ``every`` seconds and at the end, with failed and running tasks; the ETA uses only the
    tasks this run finished."""
    import tqdm.std

    from stanvi import progress as pg
    from stanvi.progress import TaskProgress

    now = [100.0]
    monkeypatch.setattr(tqdm.std, "time", lambda: now[0])
    monkeypatch.setattr(pg.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    bar = TaskProgress(20, stream=out, every=10.0, already_done=10)
    assert "ETA" not in bar.text()                       # nothing finished by this run yet
    now[0] = 130.0
    bar.update(done=1, failed=1, running=2)              # 30 s for 1 task, 9 left
    now[0] = 135.0
    bar.update(running=1)                                # within `every`: no line
    now[0] = 160.0
    bar.update(done=1)                                   # 60 s for 2 tasks, 8 left
    assert bar.text().startswith("batch: 12/20 done (1 failed), 1 running, ETA 4m00s")
    bar.close()
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert lines[0].startswith("batch:  50%|#####     | 10/20 [00:00<?")
    assert lines[0].endswith("failed=0, running=0]")
    assert lines[1].startswith("batch:  55%|#####5    | 11/20 [00:30<04:30, 30.00s/task")
    assert lines[1].endswith("failed=1, running=2]")
    assert lines[2].startswith("batch:  60%|######    | 12/20 [01:00<04:00, 30.00s/task")
    assert lines[2].endswith("failed=1, running=1]")
    assert lines[-1] == lines[2] and len(lines) == 4     # close: the final state again


def test_task_progress_keeps_printing_while_no_task_finishes():
    """A batch waiting on long tasks still writes a line every ``every`` seconds in a log."""
    from stanvi.progress import TaskProgress

    out = io.StringIO()
    bar = TaskProgress(3, stream=out, every=0.3)
    time.sleep(1.1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) >= 4 and all(line.startswith("batch:   0%") for line in lines)


def test_task_progress_disabled_logs_at_debug(stanvi_log):
    from stanvi.progress import TaskProgress

    out = io.StringIO()
    bar = TaskProgress(2, stream=out, enabled=False, every=0.0)
    bar.update(done=1, failed=1)
    bar.close()
    assert out.getvalue() == ""
    records = [r for r in stanvi_log.records if r.name == "stanvi.batch"]
    assert records and all(r.levelno == logging.DEBUG for r in records)
    assert records[-1].getMessage().startswith("batch: 1/2 done (1 failed), 0 running")


def _read_all(fd: int, wait: float = 2.0) -> str:
    """What the pseudo-terminal has for us: read until it stays quiet for 0.2 s (its data can
    arrive in pieces on a loaded machine), at most ``wait`` seconds."""
    import select  # noqa: PLC0415
    import time  # noqa: PLC0415

    chunks, end = [], time.monotonic() + wait
    while time.monotonic() < end:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if not ready:
            if chunks:
                break
            continue
        chunks.append(os.read(fd, 4096))
    return b"".join(chunks).decode()


def test_a_terminal_of_zero_columns_gets_plain_lines():
    """A pseudo-terminal with no size (some CI runners, ``script``): a tqdm bar there draws
    nothing at all, so each status is a line of its own, as off a terminal."""
    import fcntl  # noqa: PLC0415
    import pty  # noqa: PLC0415
    import struct  # noqa: PLC0415
    import termios  # noqa: PLC0415

    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 0, 0, 0, 0))
    with os.fdopen(side, "w") as stream:
        bar = IterationProgress("trustvi", stream=stream, every=0.0)
        assert not bar.interactive
        for k in (1, 2):
            bar.update(k, elbo=-1.5 * k)
        bar.close()
        stream.flush()
        text = _read_all(main)
    os.close(main)
    assert "trustvi: 2 it" in text and "elbo=-3" in text
