"""The results store of a batch run (issue P2-2, "Running it"): the system of record.

``RUNS_DIR/records/<kind>/<key>.json`` holds one record per finished task (``kind`` is
``compile`` or ``fit``), written by the worker that ran the task: the JSON goes to a temporary
file in the same directory, is flushed and fsync'ed, and is renamed into place
(:func:`os.replace`, atomic on POSIX filesystems, including the shared filesystems a multi-machine
Dask cluster uses).  So a ``kill -9`` of the client or of a worker at any moment leaves every
finished task's record whole and never a partial one (a stray ``.tmp-*`` file at worst, which is
ignored), and re-running the same batch skips every task whose record exists.

``RUNS_DIR/index.sqlite`` (SQLite in WAL mode) indexes the records for the report: one row per
record with the fields reports filter on and the whole record as JSON.  It is derived data:
:meth:`RunStore.sync` adds the records it has not seen (after a client was killed, or records
written by workers on other machines), and deleting it loses nothing.

Why files and not SQLite alone: workers on other machines write their own records, and SQLite's
locking is not safe over network filesystems; one file per task, renamed into place, is.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import tempfile
from contextlib import closing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["RunStore", "KINDS", "record_json"]

KINDS = ("compile", "fit")
_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def _json_default(value):
    """NumPy scalars and arrays in records; non-finite floats become null (strict JSON)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot store a {type(value).__name__} in a batch record")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def record_json(record: dict[str, Any]) -> str:
    """A record as strict JSON: NumPy values as numbers and lists, NaN and ±inf as null."""
    plain = json.loads(json.dumps(record, default=_json_default))
    return json.dumps(_finite(plain), allow_nan=False, sort_keys=True)


class RunStore:
    """The records of one runs directory (created if missing)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).expanduser()
        for kind in KINDS:
            (self.root / "records" / kind).mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ records (the truth)

    def path(self, kind: str, key: str) -> Path:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return self.root / "records" / kind / f"{_SAFE.sub('_', key)}.json"

    def has(self, kind: str, key: str) -> bool:
        """Whether the task's record exists (the task finished, with any status)."""
        return self.path(kind, key).is_file()

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        path = self.path(kind, key)
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            return None

    def put(self, kind: str, key: str, record: dict[str, Any]) -> Path:
        """Write the record atomically (temporary file, fsync, rename); returns its path.  A record
        already there is replaced by the new one, whole."""
        path = self.path(kind, key)
        text = record_json(record)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return path

    def records(self, kind: str) -> Iterator[dict[str, Any]]:
        """Every record of a kind, by file name (unreadable files are skipped)."""
        for path in sorted((self.root / "records" / kind).glob("*.json")):
            try:
                yield json.loads(path.read_text())
            except (OSError, ValueError):
                continue

    # ------------------------------------------------------------------ the index (derived)

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.root / "index.sqlite", timeout=30.0)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("CREATE TABLE IF NOT EXISTS records (kind TEXT, key TEXT, model TEXT, "
                    "method TEXT, status TEXT, record TEXT, PRIMARY KEY (kind, key))")
        return con

    def sync(self) -> int:
        """Add the records the index has not seen; returns how many were added."""
        added = 0
        with closing(self._connect()) as con, con:
            for kind in KINDS:
                known = {row[0] for row in con.execute(
                    "SELECT key FROM records WHERE kind = ?", (kind,))}
                for path in sorted((self.root / "records" / kind).glob("*.json")):
                    key = path.name[:-len(".json")]
                    if key in known:
                        continue
                    try:
                        record = json.loads(path.read_text())
                    except (OSError, ValueError):
                        continue
                    con.execute("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?)",
                                (kind, key, record.get("model"), record.get("method"),
                                 record.get("status"), json.dumps(record)))
                    added += 1
        return added

    def query(self, kind: str, **where: str) -> list[dict[str, Any]]:
        """The indexed records of a kind whose ``model``/``method``/``status`` equal ``where``
        (after :meth:`sync`)."""
        self.sync()
        columns = {"model", "method", "status"}
        if not set(where) <= columns:
            raise ValueError(f"query by {sorted(columns)}, not {sorted(set(where) - columns)}")
        sql = "SELECT record FROM records WHERE kind = ?" + "".join(
            f" AND {col} = ?" for col in where)
        with closing(self._connect()) as con:
            rows = con.execute(sql + " ORDER BY key", (kind, *where.values())).fetchall()
        return [json.loads(r[0]) for r in rows]
