"""Finding the work in a stan-dev/example-models checkout (issue P2-2, "Discovering work"): every
``.stan`` file with its data, found by the repository's conventions, or the reason it is skipped.

Conventions, for ``<dir>/<stem>.stan``: the data are ``<stem>.data.json`` (Stan JSON) if it
exists, else ``<stem>.data.R``, else ``<stem>.R`` (R dump, read by
:func:`stanvi.stan.rdump.read_rdump`).  A model is skipped, with the reason recorded, when

* its program has no ``parameters`` block (nothing to approximate), or
* it declares data (a non-empty ``data`` block) and no data file is found, or
* its data file is larger than ``max_data_bytes``.

Data that cannot be read (``NA`` in an R dump, a syntax error) are found when the case's data
are loaded (:func:`load_data`), and recorded then by the batch run.  Blocks are found by a
lexical scan of the program with comments and strings removed, not by compiling it; whether a
program compiles, and its dimension (for ``max_dim``), are known only after the compile task.
"""

from __future__ import annotations

import fnmatch
import io
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stanvi.stan.rdump import read_rdump

__all__ = ["ModelCase", "discover_example_models", "load_data", "name_selected", "program_blocks"]


@dataclass(frozen=True)
class ModelCase:
    """One model of a collection: ``name`` is its path below the root without ``.stan``
    (``ARM/Ch.3/kidiq``); ``data`` its data file (None for a model without data) and
    ``data_format`` 'json', 'rdump', 'json-zip' (posteriordb) or 'none'; ``skip`` the reason it is
    not run, or None; ``source`` the collection ('example-models' or 'posteriordb');
    ``reference`` the file of reference posterior draws, where the collection has one."""

    name: str
    stan: Path
    data: Path | None
    data_format: str
    skip: str | None = None
    source: str = "example-models"
    reference: Path | None = None


_COMMENTS = re.compile(r"//[^\n]*|#[^\n]*|/\*.*?\*/|\"(?:[^\"\\]|\\.)*\"", re.DOTALL)
_BLOCK = re.compile(r"\b(functions|transformed\s+data|data|transformed\s+parameters|parameters|"
                    r"model|generated\s+quantities)\s*\{")


def program_blocks(source: str) -> dict[str, str]:
    """The top-level blocks of a Stan program and their bodies (comments and strings removed):
    ``{"data": "...", "parameters": "...", ...}``, block names with single spaces."""
    text = _COMMENTS.sub(" ", source)
    blocks: dict[str, str] = {}
    pos = 0
    while True:
        m = _BLOCK.search(text, pos)
        if m is None:
            return blocks
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        blocks[" ".join(m.group(1).split())] = text[m.end():i - 1]
        pos = i


def _data_file(stan: Path) -> tuple[Path | None, str]:
    stem = stan.name[:-len(".stan")]
    for name, fmt in ((f"{stem}.data.json", "json"), (f"{stem}.data.R", "rdump"),
                      (f"{stem}.R", "rdump")):
        path = stan.with_name(name)
        if path.is_file():
            return path, fmt
    return None, "none"


def name_selected(name: str, glob: str | None = None, exclude: str | None = None,
                  names: list[str] | None = None) -> bool:
    """Whether a model passes the name filters: ``glob`` and ``exclude`` are comma-separated
    ``fnmatch`` patterns (``*`` also matches ``/``), the name must match one of ``glob``'s (when
    given) and none of ``exclude``'s; ``names`` are exact names."""
    def any_match(patterns: str) -> bool:
        return any(fnmatch.fnmatch(name, p.strip()) for p in patterns.split(",") if p.strip())

    return ((glob is None or any_match(glob)) and (exclude is None or not any_match(exclude))
            and (names is None or name in names))


def discover_example_models(root: str | Path, *, glob: str | None = None,
                            exclude: str | None = None, names: list[str] | None = None,
                            max_data_bytes: int | None = None) -> list[ModelCase]:
    """Every ``.stan`` file below ``root`` (sorted by name) as a :class:`ModelCase`.

    Filters (:func:`name_selected`): ``glob`` on the name (``"ARM/*"``, or several:
    ``"knitr/*,misc/*"``), ``exclude`` (the same, for names to leave out), ``names`` (exact
    names); ``max_data_bytes`` (a larger data file is a skip with the reason)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory (an example-models checkout)")
    cases = []
    for stan in sorted(root.rglob("*.stan")):
        name = stan.relative_to(root).as_posix()[:-len(".stan")]
        if not name_selected(name, glob, exclude, names):
            continue
        data, fmt = _data_file(stan)
        cases.append(ModelCase(name, stan, data, fmt,
                               _skip_reason(stan, data, max_data_bytes)))
    return cases


def _skip_reason(stan: Path, data: Path | None, max_data_bytes: int | None) -> str | None:
    try:
        blocks = program_blocks(stan.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        return f"cannot read the program ({exc.strerror})"
    if not blocks.get("parameters", "").strip():
        return "no parameters block: nothing to approximate"
    if data is None and blocks.get("data", "").strip():
        stem = stan.name[:-len(".stan")]
        return (f"no data file ({stem}.data.json, {stem}.data.R or {stem}.R) for a program that "
                f"declares data")
    if data is not None and max_data_bytes is not None and data.stat().st_size > max_data_bytes:
        return f"data file {data.name} is {data.stat().st_size} bytes (max_data_bytes {max_data_bytes})"
    return None


def read_zipped_json(zipped: str | Path):
    """The content of a posteriordb ``<name>.json.zip`` (one JSON file inside)."""
    with zipfile.ZipFile(zipped) as z:
        names = [n for n in z.namelist() if n.endswith(".json")]
        if len(names) != 1:
            raise ValueError(f"{zipped}: expected one .json file inside, found {names}")
        return json.load(io.TextIOWrapper(z.open(names[0]), encoding="utf-8"))


def load_data(case: ModelCase) -> dict[str, Any] | None:
    """The case's data as Stan JSON values (None for a model without data).  Raises
    :class:`stanvi.stan.rdump.RDumpError` (incl. ``RDumpNAError``) or ``ValueError`` for data
    that cannot be read."""
    if case.data is None:
        return None
    if case.data_format == "json-zip":
        return read_zipped_json(case.data)
    if case.data_format == "json":
        try:
            return json.loads(case.data.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{case.data}: not valid JSON ({exc})") from None
    return read_rdump(case.data)
