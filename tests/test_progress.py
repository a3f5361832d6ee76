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
    assert tty.getvalue().startswith("\rtrustvi: iter 3, elbo -1.5, oracle 12")
    bar.close()
    assert tty.getvalue().endswith("\r\033[K")
    log = io.StringIO()
    silent = IterationProgress("trustvi", stream=log)
    silent.update(1, elbo=-1.0)
    silent.close()
    assert log.getvalue() == "" and not silent.enabled
