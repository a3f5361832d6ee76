"""Docs that run (issue 13 item 7): every ```python block in README.md and docs/*.md is executed,
and every ```output block is compared with what the python blocks before it printed, so the docs
cannot drift from the code.

* The blocks of one file run in order in one namespace (a later block may use an earlier one's
  ``fit``), in a scratch directory where ``stan_models/`` points at the repository's (files the
  snippets write land there).
* An ```output block must equal, line by line (trailing spaces ignored), what the python blocks
  since the previous output block wrote to stdout plus the messages of the ``stanvi`` logger
  (``stanvi: ...``, e.g. a fit's verdict line).  Progress displays (stderr) are not part of it.
* A block that cannot run here is listed in :data:`SKIP` with the reason; an entry that matches
  no block fails the test, so the list cannot go stale.  :data:`SETUP` gives a file whose
  snippets continue from a fit shown elsewhere (``fit`` in diagnostics.md) that fit.
* The files are those git tracks (a document still being written is checked once committed).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import subprocess
from pathlib import Path

import matplotlib
import pytest

ROOT = Path(__file__).resolve().parents[1]

matplotlib.use("Agg")

EIGHT_SCHOOLS_FIT = (
    "import stanvi\n"
    "fit = stanvi.fit('stan_models/eight_schools/eight_schools_noncentered.stan',\n"
    "                 data='stan_models/eight_schools/eight_schools.data.json', seed=1,\n"
    "                 progress=False)\n")

# file -> code run before its first block (not shown in the docs)
SETUP = {
    "docs/diagnostics.md": EIGHT_SCHOOLS_FIT,
    "docs/models_and_targets.md": (
        "import numpy as np\n"
        "Z = np.random.default_rng(0).uniform(-2, 2, size=(4, 10))\n"
        "V = np.random.default_rng(1).normal(size=(4, 10))\n"),
}

# (file, text in the block's first lines) -> why the block is not run here
SKIP = {
    ("docs/batch.md", "cases_from_source(\"posteriordb\""):
        "needs a posteriordb checkout and a Dask cluster; tests/batch/test_batch_run.py runs batches",
    ("docs/jointcv.md", "data=my_data"):
        "a template: my_data and the options are the reader's",
    ("docs/jointcv.md", "JaxPerDatumTarget(log_lik"):
        "a template: log_lik, log_prior, X and y are the reader's",
    ("docs/methods.md", "**options)"):
        "the signature of stanvi.fit, not a call",
    ("docs/stan_reference.md", "from stanvi.reference import nuts, stan_advi, pathfinder"):
        "builds Stan's services library and runs NUTS, ADVI and Pathfinder (minutes); "
        "tests/reference/test_reference_stan.py runs the same calls",
}

FENCE = re.compile(r"^```(\w*)\s*$")


def doc_files() -> list[str]:
    """README.md and docs/*.md as git tracks them (all of them when git is unavailable)."""
    try:
        out = subprocess.run(["git", "ls-files", "README.md", "docs/*.md"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        out = ["README.md"] + [str(p.relative_to(ROOT)) for p in sorted(ROOT.glob("docs/*.md"))]
    return [f for f in out if (ROOT / f).is_file()]


def blocks(text: str) -> list[tuple[str, str, int]]:
    """(language, code, line number) of every fenced block."""
    found, lang, start, lines = [], None, 0, []
    for i, line in enumerate(text.splitlines(), start=1):
        m = FENCE.match(line)
        if lang is None and m:
            lang, start, lines = m.group(1), i, []
        elif lang is not None and line.strip() == "```":
            found.append((lang, "\n".join(lines) + "\n", start))
            lang = None
        elif lang is not None:
            lines.append(line)
    return found


def skip_reason(name: str, code: str) -> str | None:
    head = "\n".join(code.splitlines()[:8])
    for (file, marker), reason in SKIP.items():
        if file == name and marker in head:
            return reason
    return None


class _Capture(logging.Handler):
    def __init__(self, buffer: io.StringIO) -> None:
        super().__init__(logging.INFO)
        self.buffer = buffer
        self.setFormatter(logging.Formatter("stanvi: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith("stanvi.stan"):
            return   # compile messages: there only when the compile cache is cold
        self.buffer.write(self.format(record) + "\n")


def _normalized(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.strip("\n").splitlines()]
    return lines


@pytest.fixture
def scratch(tmp_path):
    (tmp_path / "stan_models").symlink_to(ROOT / "stan_models")
    old = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)


def test_skip_entries_match_blocks():
    """Every SKIP entry names a python block that exists (no stale entries)."""
    texts = {f: (ROOT / f).read_text() for f in doc_files()}
    for (file, marker) in SKIP:
        if file not in texts:
            continue
        codes = [c for lang, c, _ in blocks(texts[file]) if lang == "python"]
        assert any(skip_reason(file, c) for c in codes if marker in "\n".join(
            c.splitlines()[:8])), f"SKIP entry {file!r}: {marker!r} matches no python block"


@pytest.mark.slow
@pytest.mark.parametrize("name", doc_files())
def test_doc_snippets_run_and_show_their_real_output(name, scratch):
    import warnings  # noqa: PLC0415

    text = (ROOT / name).read_text()
    namespace: dict = {"__name__": f"docs_check_{Path(name).stem}"}
    if name in SETUP:
        exec(compile(SETUP[name], f"{name}:setup", "exec"), namespace)  # noqa: S102
    shown = io.StringIO()
    handler = _Capture(shown)
    logger = logging.getLogger("stanvi")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        ran = 0
        for lang, code, line in blocks(text):
            if lang == "output":
                actual = _normalized(shown.getvalue())
                assert actual == _normalized(code), (
                    f"{name}, line {line}: the shown output differs from what the code "
                    f"prints, which is:\n" + "\n".join(actual))
                shown.seek(0)
                shown.truncate()
                continue
            if lang != "python" or skip_reason(name, code):
                continue
            with contextlib.redirect_stdout(shown), \
                    contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    exec(compile(code, f"{name}:{line}", "exec"), namespace)  # noqa: S102
                except Exception as exc:  # noqa: BLE001
                    pytest.fail(f"{name}, the python block at line {line} raised "
                                f"{type(exc).__name__}: {exc}")
            ran += 1
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# Shell blocks: every `stanvi fit|info|compile|compare` command shown in a ```sh block or after `$ ` in
# a plain block runs (exit status 0) in the scratch directory; where the block shows the
# command's output (the lines after a `$ stanvi ...` command), those lines must appear in the
# real output in order, a line `...` standing for any number of lines.
RUNNABLE = ("stanvi fit ", "stanvi info ", "stanvi compile ", "stanvi compare ")


def shell_commands(code: str) -> list[tuple[str, list[str]]]:
    """(command, shown output lines) for each runnable stanvi command of a block: continuation
    lines (ending in ``\\``) joined, ``# ...`` comments dropped, the placeholders of generic
    examples (``MODEL.stan``) left out."""
    out: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        prompt = line.startswith("$ ")
        cmd = line[2:] if prompt else line
        if cmd.startswith(RUNNABLE):
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1].rstrip() + " " + lines[i].strip()
            cmd = cmd.split("  #")[0].strip()
            shown: list[str] = []
            if prompt:
                while i + 1 < len(lines) and not lines[i + 1].strip().startswith(
                        ("$ ", *RUNNABLE)):
                    i += 1
                    shown.append(lines[i].rstrip())
            if "MODEL.stan" not in cmd:
                out.append((cmd, shown))
        i += 1
    return out


def _shown_in_order(shown: list[str], actual: list[str]) -> bool:
    """The shown lines appear in ``actual`` in order; ``...`` matches any lines."""
    pos = 0
    gap = False
    for want in shown:
        if want.strip() == "...":
            gap = True
            continue
        while pos < len(actual) and actual[pos] != want:
            if not gap:
                return False
            pos += 1
        if pos == len(actual):
            return False
        pos += 1
        gap = False
    return True


def _all_shell_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for name in doc_files():
        for lang, code, _ in blocks((ROOT / name).read_text()):
            if lang in ("sh", "bash", "") and ("$ stanvi" in code or lang in ("sh", "bash")):
                found += [(name, cmd, shown) for cmd, shown in shell_commands(code)]
    return found


def test_the_shell_command_checker_reads_blocks():
    code = ("$ stanvi info m.stan \\\n      --data d.json\nmodel: m\n...\nx  parameter\n"
            "stanvi fit MODEL.stan --data DATA.json   # generic\n")
    assert shell_commands(code) == [("stanvi info m.stan --data d.json",
                                     ["model: m", "...", "x  parameter"])]
    assert _shown_in_order(["model: m", "...", "x"], ["model: m", "a", "b", "x", "y"])
    assert not _shown_in_order(["model: m", "x"], ["model: m", "a", "x"])
    assert not _shown_in_order(["model: n"], ["model: m"])
    assert len(_all_shell_commands()) >= 3   # the docs' fit and info examples


@pytest.mark.slow
@pytest.mark.parametrize("name,cmd,shown", _all_shell_commands(),
                         ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_doc_shell_commands_run_and_show_their_real_output(name, cmd, shown, scratch):
    import shlex  # noqa: PLC0415
    import sys  # noqa: PLC0415

    argv = shlex.split(cmd)
    stanvi = Path(sys.executable).with_name("stanvi")
    res = subprocess.run([str(stanvi), *argv[1:]], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, f"{name}: `{cmd}` failed:\n{res.stderr[-2000:]}"
    if shown:
        actual = [line.rstrip() for line in res.stdout.splitlines()]
        assert _shown_in_order([s.strip() and s.rstrip() for s in shown], actual), (
            f"{name}: `{cmd}` shows output the command does not print; it prints:\n"
            + res.stdout[-3000:])


# The posteriordb comparison in docs/choosing.md (a ```text block: posteriordb is not part of the
# repository, so the shell check above cannot run it). With a posteriordb checkout in
# STANVI_POSTERIORDB it is run and every line it shows compared, the table's seconds column
# (which changes from run to run) apart.
POSTERIORDB_COMPARE = "$ stanvi compare kidscore_interaction.stan --data kidiq.json"


def _without_seconds(lines: list[str]) -> list[str]:
    """``stanvi compare``'s lines with the table's seconds column blanked (its span read from
    the header: after ``evaluations``, up to the end of ``seconds``)."""
    out, span = [], None
    for line in lines:
        if line.startswith("method") and "seconds" in line:
            span = (line.index("evaluations") + len("evaluations"),
                    line.index("seconds") + len("seconds"))
        elif span and not line.startswith("recommendation"):
            line = line[:span[0]] + " " * (span[1] - span[0]) + line[span[1]:]
        out.append(line.rstrip())
    return out


def test_the_seconds_column_is_blanked_and_nothing_else():
    lines = ["m: 2 methods", "method     elbo evaluations   seconds  khat",
             "A         -1.0          10     0.123  0.50", "recommendation: A 0.123"]
    assert _without_seconds(lines)[2] == "A         -1.0          10            0.50"
    assert _without_seconds(lines)[3] == lines[3] and _without_seconds(lines)[:2] == lines[:2]


@pytest.mark.slow
def test_the_posteriordb_comparison_in_choosing_md_is_real_output(tmp_path):
    import shlex  # noqa: PLC0415
    import sys  # noqa: PLC0415
    import zipfile  # noqa: PLC0415

    checkout = os.environ.get("STANVI_POSTERIORDB")
    if not checkout:
        pytest.skip("set STANVI_POSTERIORDB to a stan-dev/posteriordb checkout to run "
                    "docs/choosing.md's posteriordb comparison")
    db = Path(checkout) / "posterior_database"
    (tmp_path / "kidscore_interaction.stan").write_bytes(
        (db / "models" / "stan" / "kidscore_interaction.stan").read_bytes())
    with zipfile.ZipFile(db / "data" / "data" / "kidiq.json.zip") as z:
        (tmp_path / "kidiq.json").write_bytes(z.read(z.namelist()[0]))
    code = next(c for lang, c, _ in blocks((ROOT / "docs" / "choosing.md").read_text())
                if POSTERIORDB_COMPARE in c)
    command, *shown = code.strip("\n").splitlines()
    res = subprocess.run([str(Path(sys.executable).with_name("stanvi")),
                          *shlex.split(command[2:])[1:]], cwd=tmp_path, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    assert _without_seconds(res.stdout.strip("\n").splitlines()) == _without_seconds(shown)
