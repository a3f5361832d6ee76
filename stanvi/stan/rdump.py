"""A reader for R dump data files (``<stem>.data.R``, ``<stem>.R``), the data format most of
stan-dev/example-models still ships (issue P2-2, "Discovering work").

The R dump format is what R's ``dump()`` writes and CmdStan's ``rdump`` reader accepts: a
sequence of assignments ``name <- value`` (also ``=``; names may be quoted ``"name"`` or
backquoted), separated by newlines or ``;``, where a value is

* a number: ``3``, ``-2.5``, ``1e-3``, ``3L`` (an integer), ``Inf``, ``-Inf``, ``NaN``;
* a vector: ``c(1, 2, 3)``, an integer sequence ``1:10`` (also inside ``c()``), ``integer(0)``,
  ``double(0)``, ``numeric(0)`` (empty vectors), or ``logical`` ``TRUE``/``FALSE``;
* an array: ``structure(c(...), .Dim = c(2, 3))`` (also ``.Data = c(...)``), whose values are
  in R's column-major order (first index fastest).

Types follow Stan's rdump reader: a value is integer when every number in it is written without
a decimal point or exponent (or with the ``L`` suffix), otherwise real.  ``NA`` has no Stan
value: reading it raises :class:`RDumpNAError` naming the variable, so a batch run can record
the model as skipped with that reason.  Character values (``county_name <- c("AITKIN", ...)``,
as some example-models data files carry for the reader's benefit) have no Stan type either: such
a variable is left out of the result (a model that declares it then gets the data layer's
"missing variable" error).

:func:`read_rdump` returns Stan JSON values: ints and floats for scalars, nested row-major lists
for arrays (``structure(c(1, 2, 3, 4, 5, 6), .Dim = c(2, 3))`` → ``[[1, 3, 5], [2, 4, 6]]``).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from stanvi.errors import StanDataError

__all__ = ["RDumpError", "RDumpNAError", "parse_rdump", "read_rdump"]


class RDumpError(StanDataError):
    """An R dump file that cannot be read (the message names the file, line and variable)."""


class RDumpNAError(RDumpError):
    """The file assigns ``NA`` (a missing value), which a Stan model cannot take."""


_TOKEN = re.compile(r"""
    (?P<space>[ \t\r\f]+|\#[^\n]*)
  | (?P<newline>\n)
  | (?P<semicolon>;)
  | (?P<assign><-|=)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?L?)
  | (?P<name>[A-Za-z.][A-Za-z0-9._]*)
  | (?P<punct>[(),:+-])
""", re.VERBOSE)


class _Num:
    """A parsed number: its value and whether it was written as an integer."""

    __slots__ = ("value", "is_int", "text")

    def __init__(self, value: float, is_int: bool, text: str | None = None) -> None:
        self.value = value
        self.is_int = is_int
        self.text = text          # a character value (a string), which Stan data cannot hold


def _tokenize(text: str, source: str) -> list[tuple[str, str, int]]:
    tokens, pos, line = [], 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise RDumpError(f"{source}:{line}: cannot read {text[pos:pos + 20]!r}")
        kind = m.lastgroup
        if kind == "newline":
            tokens.append(("sep", "\n", line))
            line += 1
        elif kind == "semicolon":
            tokens.append(("sep", ";", line))
        elif kind != "space":
            tokens.append((kind, m.group(), line))
        pos = m.end()
    tokens.append(("end", "", line))
    return tokens


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.tokens = _tokenize(text, source)
        self.i = 0
        self.source = source
        self.variable = ""
        self.skipped: dict[str, str] = {}

    # -- token helpers
    def peek(self, skip_newlines: bool = False) -> tuple[str, str, int]:
        j = self.i
        while skip_newlines and self.tokens[j][0] == "sep" and self.tokens[j][1] == "\n":
            j += 1
        return self.tokens[j]

    def take(self, skip_newlines: bool = True) -> tuple[str, str, int]:
        if skip_newlines:
            self.skip_newlines()
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def skip_newlines(self) -> None:
        while self.tokens[self.i][0] == "sep" and self.tokens[self.i][1] == "\n":
            self.i += 1

    def error(self, message: str, line: int | None = None) -> RDumpError:
        line = self.tokens[self.i][2] if line is None else line
        where = f" (variable {self.variable!r})" if self.variable else ""
        return RDumpError(f"{self.source}:{line}: {message}{where}")

    def expect(self, value: str) -> None:
        kind, text, line = self.take()
        if text != value:
            raise self.error(f"expected {value!r}, found {text or 'end of file'!r}", line)

    # -- grammar
    def assignments(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        while True:
            while self.peek()[0] == "sep":
                self.i += 1
            kind, text, line = self.take()
            if kind == "end":
                return out
            if kind == "string":
                name = text[1:-1]
            elif kind == "name":
                name = text
            else:
                raise self.error(f"expected a variable name, found {text!r}", line)
            self.variable = name
            kind, text, line = self.take()
            if kind != "assign":
                raise self.error(f"expected '<-' after {name!r}, found {text!r}", line)
            value = self.value()
            if _has_text(value):
                self.skipped[name] = "character values (no Stan type): not read"
            else:
                out[name] = _to_stan(value, name, self.source)
            self.variable = ""
            kind, text, line = self.peek()
            if kind not in ("sep", "end"):
                raise self.error(f"unexpected {text!r} after the value of {name!r}", line)

    def value(self):
        """A scalar ``_Num``, a list of ``_Num`` (vector) or (list, dims) (structure)."""
        kind, text, line = self.peek(skip_newlines=True)
        if kind == "name" and text == "structure":
            return self.structure()
        if kind == "name" and text in ("c", "integer", "double", "numeric", "logical"):
            return self.call()
        items, is_sequence = self.sequence_or_number()
        return items if is_sequence else items[0]

    def sequence_or_number(self) -> tuple[list[_Num], bool]:
        """A number, or an integer sequence ``a:b``; and whether it was a sequence (``1:1`` is
        a vector of one, ``1`` a scalar)."""
        first = self.number()
        if self.peek(skip_newlines=False)[1] == ":":
            self.i += 1
            last = self.number()
            if not (first.is_int and last.is_int):
                raise self.error("a sequence a:b needs integer ends")
            a, b = int(first.value), int(last.value)
            step = 1 if b >= a else -1
            return [_Num(float(v), True) for v in range(a, b + step, step)], True
        return [first], False

    def number(self) -> _Num:
        kind, text, line = self.take()
        sign = 1.0
        while text in ("-", "+"):
            sign = -sign if text == "-" else sign
            kind, text, line = self.take()
        if kind == "number":
            is_int = text.endswith("L") or not any(ch in text for ch in ".eE")
            return _Num(sign * float(text.rstrip("L")), is_int)
        if kind == "string":
            return _Num(math.nan, False, text=text[1:-1])
        if kind == "name" and text in ("Inf", "NaN"):
            return _Num(sign * (math.inf if text == "Inf" else math.nan), False)
        if kind == "name" and text in ("TRUE", "FALSE", "T", "F"):
            return _Num(1.0 if text in ("TRUE", "T") else 0.0, True)
        if kind == "name" and text.startswith("NA"):
            raise RDumpNAError(f"{self.source}:{line}: variable {self.variable!r} has a "
                               f"missing value ({text}); a Stan model cannot take NA")
        raise self.error(f"expected a number, found {text or 'end of file'!r}", line)

    def call(self) -> list[_Num]:
        _, fname, line = self.take()
        self.expect("(")
        if fname in ("integer", "double", "numeric", "logical"):
            n = self.number()
            self.expect(")")
            if not n.is_int or n.value != 0:
                # integer(3) etc. are vectors of zeros in R; dump() never writes them
                return [_Num(0.0, fname in ("integer", "logical"))] * int(n.value)
            return []
        items: list[_Num] = []
        if self.peek(skip_newlines=True)[1] == ")":
            self.take()
            return items
        while True:
            items.extend(self.sequence_or_number()[0])
            kind, text, line = self.take()
            if text == ")":
                return items
            if text != ",":
                raise self.error(f"expected ',' or ')' in c(...), found {text!r}", line)

    def structure(self):
        self.take()                   # structure
        self.expect("(")
        data, dims = None, None
        while True:
            kind, text, line = self.peek(skip_newlines=True)
            if kind == "name" and text in (".Data", ".Dim") \
                    and self.tokens[self._next_index()][0] == "assign":
                self.take()
                self.take()           # =
                part = self.value()
                if text == ".Data":
                    data = part
                else:
                    dims = part
            elif data is None:
                data = self.value()
            else:
                raise self.error(f"unexpected {text!r} in structure(...)", line)
            kind, text, line = self.take()
            if text == ")":
                break
            if text != ",":
                raise self.error(f"expected ',' or ')' in structure(...), found {text!r}", line)
        if data is None or dims is None:
            raise self.error("structure(...) needs its data and .Dim")
        data = data if isinstance(data, list) else [data]
        dims = dims if isinstance(dims, list) else [dims]
        if not all(d.is_int and d.value >= 0 for d in dims):
            raise self.error(".Dim must be non-negative integers")
        return data, [int(d.value) for d in dims]

    def _next_index(self) -> int:
        j = self.i
        while self.tokens[j][0] == "sep" and self.tokens[j][1] == "\n":
            j += 1
        return j + 1


def _has_text(value) -> bool:
    items = value if isinstance(value, list) else value[0] if isinstance(value, tuple) else [value]
    return any(v.text is not None for v in items)


def _to_stan(value, name: str, source: str):
    """A parsed value as a Stan JSON value (int/float scalars, nested row-major lists)."""
    if isinstance(value, _Num):
        return int(value.value) if value.is_int else float(value.value)
    if isinstance(value, tuple):
        data, dims = value
        if int(np.prod(dims, dtype=int)) != len(data):
            raise RDumpError(f"{source}: variable {name!r}: .Dim = {dims} needs "
                             f"{int(np.prod(dims, dtype=int))} values, found {len(data)}")
    else:
        data, dims = value, [len(value)]
    is_int = all(v.is_int for v in data)
    arr = np.array([v.value for v in data], dtype=float)
    arr = arr.reshape(dims, order="F")         # R is column-major: first index fastest
    return arr.astype(np.int64).tolist() if is_int else arr.tolist()


def parse_rdump(text: str, source: str = "<rdump>") -> dict[str, Any]:
    """The variables of R dump ``text`` as Stan JSON values (see the module docstring)."""
    return _Parser(text, source).assignments()


def read_rdump(path: str | Path) -> dict[str, Any]:
    """The variables of the R dump file ``path`` as Stan JSON values."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise RDumpError(f"{path}: cannot read the file ({exc.strerror})") from None
    return parse_rdump(text, str(path))
