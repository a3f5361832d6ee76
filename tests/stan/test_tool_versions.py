"""The tools' ``--version`` lines are kept in the cache root (stanvi/stan/toolchain.py,
``_first_line``; docs/models_and_targets.md#toolchain): a second new process asks no tool, a
tool replaced in place is asked again."""

from __future__ import annotations

import os

import pytest

from stanvi.errors import ToolchainError
from stanvi.stan import toolchain


@pytest.fixture
def tool(tmp_path, monkeypatch):
    monkeypatch.setenv("STANVI_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "bin" / "fakecc"
    path.parent.mkdir()
    path.write_text("#!/bin/sh\necho 'fakecc 1.0'\necho second line\n")
    path.chmod(0o755)
    return path


def test_version_line_is_kept_and_asked_again_when_the_tool_changes(tool, monkeypatch):
    runs = []
    real = toolchain._run_first_line
    monkeypatch.setattr(toolchain, "_run_first_line", lambda cmd: runs.append(cmd) or real(cmd))
    assert toolchain._first_line([str(tool), "--version"]) == "fakecc 1.0"
    assert toolchain._first_line([str(tool), "--version"]) == "fakecc 1.0"
    assert len(runs) == 1                       # the second answer came from the cache root
    tool.write_text("#!/bin/sh\necho 'fakecc 2.0 (new build)'\n")
    os.utime(tool, ns=(tool.stat().st_atime_ns, tool.stat().st_mtime_ns + 10**9))
    assert toolchain._first_line([str(tool), "--version"]) == "fakecc 2.0 (new build)"
    assert len(runs) == 2


def test_a_missing_tool_is_a_toolchain_error(tmp_path, monkeypatch):
    monkeypatch.setenv("STANVI_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ToolchainError, match="could not run"):
        toolchain._first_line([str(tmp_path / "no-such-compiler"), "--version"])


def test_an_unreadable_store_is_asked_again(tool):
    from stanvi.stan.cache import cache_root  # noqa: PLC0415

    (cache_root() / "tool_versions.json").write_text("not json")
    assert toolchain._first_line([str(tool), "--version"]) == "fakecc 1.0"
