"""The results store of a batch run (issue P2-2, "Running it"): the system of record.

``RUNS_DIR/records/<kind>/<key>.json`` holds one record per finished task (``kind`` is
``compile``, ``reference`` (a NUTS reference, :mod:`stanvi.batch.nuts_reference`) or
``fit``), written by the worker that ran the task: the JSON goes to a temporary
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

import hashlib
import json
import math
import os
import re
import sqlite3
import tempfile
from contextlib import closing
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["RunStore", "KINDS", "record_json", "records_of_stores"]

KINDS = ("compile", "reference", "fit")
_SAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def file_stem(key: str) -> str:
    """The record file name of a key (without ``.json``): the key itself where every character
    is safe, else the key made safe plus ``~`` and 10 hex digits of its SHA-256 (``~`` is
    never safe, so the two forms cannot meet: the mapping is injective)."""
    safe = _SAFE.sub("_", key)
    if safe == key:
        return key
    return f"{safe}~{hashlib.sha256(key.encode()).hexdigest()[:10]}"


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
        """The record file of a task: its key where the key is a safe file name, else the key
        with unsafe characters replaced and a hash of the whole key appended, so that two keys
        never share a file (``x/m`` and ``x_m`` did, and ``x_m``'s fit ran ``x/m``'s library;
        issue T3-2 item 6)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return self.root / "records" / kind / f"{file_stem(key)}.json"

    def _legacy_path(self, kind: str, key: str) -> Path:
        """Where stores written before the hash suffix kept the record."""
        return self.root / "records" / kind / f"{_SAFE.sub('_', key)}.json"

    def has(self, kind: str, key: str) -> bool:
        """Whether the task's record exists, is readable and is this task's (the task
        finished, with any status)."""
        return self.get(kind, key) is not None

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        """The task's record, or None: none written, one written by another task (an older
        store's colliding file name), or one that cannot be read — the latter moved aside into
        ``records/<kind>/unreadable/`` (:meth:`unreadable`) so that the task runs again
        (a truncated or empty record used to count as done, issue T3-2 item 5)."""
        for path in (self.path(kind, key), self._legacy_path(kind, key)):
            if not path.is_file():
                continue
            record = self._read(path)
            if record is None:
                continue
            if record.get("key", key) == key:
                return record
        return None

    def _read(self, path: Path) -> dict[str, Any] | None:
        """A record file's content; an unreadable one (not JSON, not an object, no
        ``model``) is moved aside and None returned."""
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            return self._set_aside(path, f"not JSON: {exc}")
        if not isinstance(record, dict) or not record.get("model"):
            return self._set_aside(path, "not a record (no 'model')")
        return record

    def _set_aside(self, path: Path, why: str) -> None:
        aside = path.parent / "unreadable"
        aside.mkdir(exist_ok=True)
        try:
            os.replace(path, aside / path.name)
        except OSError:
            pass
        (aside / (path.name + ".why")).write_text(why + "\n")
        return None

    def unreadable(self) -> list[str]:
        """The record files moved aside as unreadable, with why (``kind/name: why``)."""
        out = []
        for kind in KINDS:
            for why in sorted((self.root / "records" / kind / "unreadable").glob("*.why")):
                out.append(f"{kind}/{why.name[:-len('.why')]}: {why.read_text().strip()}")
        return out

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
        """Every readable record of a kind, by file name (unreadable ones are moved aside:
        :meth:`unreadable`)."""
        for path in sorted((self.root / "records" / kind).glob("*.json")):
            record = self._read(path)
            if record is not None:
                yield record

    # ------------------------------------------------------------------ the index (derived)

    def _connect(self) -> sqlite3.Connection:
        """The index, rebuilt from the records when the file is not an SQLite database (it is
        derived data: a garbage ``index.sqlite`` ended ``stanvi batch`` with a
        ``sqlite3.DatabaseError``, issue T3-2 item 7)."""
        try:
            return self._open_index()
        except sqlite3.DatabaseError:
            for suffix in ("", "-wal", "-shm"):
                (self.root / f"index.sqlite{suffix}").unlink(missing_ok=True)
            return self._open_index()

    def _open_index(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.root / "index.sqlite", timeout=30.0)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute("CREATE TABLE IF NOT EXISTS records (kind TEXT, key TEXT, model TEXT, "
                        "method TEXT, status TEXT, record TEXT, PRIMARY KEY (kind, key))")
            con.execute("SELECT count(*) FROM records").fetchone()
        except sqlite3.DatabaseError:
            con.close()
            raise
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
                    record = self._read(path)
                    if record is None:
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


def records_of_stores(dirs: Iterable[str | os.PathLike], kind: str = "fit") -> list[dict[str, Any]]:
    """Every readable record of a kind in several runs directories, store after store
    (docs/batch.md#the-results-store)."""
    return [r for d in dirs for r in RunStore(d).records(kind)]
