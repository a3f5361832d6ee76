"""The progress displays (stanvi.progress): a redrawn line on a terminal, plain lines in logs."""

from __future__ import annotations

import io

import pytest

from stanvi.progress import IterationProgress, StageProgress


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stage_progress_prints_one_line_per_stage_in_a_log():
    log = io.StringIO()
    with StageProgress("compiling m", stream=log) as bar:
        bar.stage("stanc")
        bar.stage("linking")
    lines = log.getvalue().splitlines()
    assert lines[:2] == ["stanvi: compiling m: stanc ...", "stanvi: compiling m: linking ..."]
    assert lines[2].startswith("stanvi: compiling m: done in ") and len(lines) == 3


def test_stage_progress_says_failed_and_is_silent_when_disabled():
    log = io.StringIO()
    with pytest.raises(RuntimeError):
        with StageProgress("compiling m", stream=log):
            raise RuntimeError("boom")
    assert "compiling m: failed in " in log.getvalue()
    quiet = io.StringIO()
    with StageProgress("compiling m", stream=quiet, enabled=False) as bar:
        bar.stage("stanc")
    assert quiet.getvalue() == ""


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
    """Batch progress shows in logs and notebooks (stderr not a tty): a plain line every
    ``every`` seconds and at the end; the ETA uses only the tasks this run finished."""
    import io

    from stanvi import progress as pg
    from stanvi.progress import TaskProgress

    now = [100.0]
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
    bar.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("batch: 11/20 done (1 failed), 2 running, ETA 4m30s")
    assert lines[1].startswith("batch: 12/20 done (1 failed), 1 running, ETA 4m00s")
    assert lines[-1].startswith("batch: 12/20 done") and len(lines) == 3
