"""What the Stan program text says about its variables: the size expressions of declarations
(so ArviZ dims can be named ``J`` rather than ``theta_dim_0``) and which data variables are
observed (left of ``~`` or first argument of an ``_lpdf``/``_lpmf`` in the model block).

This is a small, forgiving reader of declarations, not a Stan parser: anything it does not
understand (tuples, complex types, size expressions that are not a bare name) gives ``None`` for
that axis, and callers fall back to ArviZ's default names.  Programs reaching it have already
compiled, so they are valid Stan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_BLOCK_RE = re.compile(r"\b(functions|transformed\s+data|data|transformed\s+parameters|parameters|"
                       r"model|generated\s+quantities)\s*\{")
_IDENT_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")

# Number of size expressions each type takes -> how they become axes of the value's shape.
_VECTOR_TYPES = {"vector", "row_vector", "simplex", "unit_vector", "ordered", "positive_ordered",
                 "sum_to_zero_vector"}
_MATRIX_TYPES = {"matrix", "sum_to_zero_matrix", "column_stochastic_matrix",
                 "row_stochastic_matrix"}
_SQUARE_TYPES = {"cov_matrix", "corr_matrix", "cholesky_factor_corr"}
_SCALAR_TYPES = {"real", "int"}


@dataclass(frozen=True)
class Declaration:
    """A top-level declaration in a block: its name and one size name per axis of its value
    (``None`` where the size is an expression other than a bare name)."""

    name: str
    block: str
    dims: tuple[str | None, ...]


def strip_comments(code: str) -> str:
    """Stan code without ``//``, ``#`` and ``/* */`` comments (string literals kept)."""
    out, i, n = [], 0, len(code)
    while i < n:
        c = code[i]
        if c == '"':
            j = code.find('"', i + 1)
            j = n if j < 0 else j + 1
            out.append(code[i:j])
            i = j
        elif code.startswith("//", i) or c == "#":
            j = code.find("\n", i)
            i = n if j < 0 else j
        elif code.startswith("/*", i):
            j = code.find("*/", i + 2)
            i = n if j < 0 else j + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _matching(code: str, start: int) -> int:
    """Index just past the bracket closing the one at ``start``."""
    pairs = {"{": "}", "[": "]", "(": ")", "<": ">"}
    stack = [pairs[code[start]]]
    i = start + 1
    while i < len(code) and stack:
        c = code[i]
        if c in "{[(":
            stack.append(pairs[c])
        elif c in "}])":
            while stack and stack[-1] == ">" and c != ">":  # '<' used as less-than inside
                stack.pop()
            if stack:
                stack.pop()
        elif c == "<" and stack[-1] == ">":
            stack.append(">")
        elif c == ">" and stack[-1] == ">":
            stack.pop()
        i += 1
    return i


def blocks(code: str) -> dict[str, str]:
    """The body of each program block, by normalized name ('transformed parameters', ...)."""
    code = strip_comments(code)
    found: dict[str, str] = {}
    pos = 0
    while True:
        m = _BLOCK_RE.search(code, pos)
        if not m:
            break
        # Only blocks at the top level: everything before has balanced braces.
        if code.count("{", 0, m.start()) != code.count("}", 0, m.start()):
            pos = m.end()
            continue
        open_at = m.end() - 1
        end = _matching(code, open_at)
        found[" ".join(m.group(1).split())] = code[open_at + 1:end - 1]
        pos = end
    return found


def _top_level_statements(body: str) -> list[str]:
    """Statements at brace depth 0 of a block body (nested blocks and loops are skipped)."""
    out, depth, cur = [], 0, []
    for c in body:
        if c == "{":
            depth += 1
            if depth == 1:
                cur = []  # a compound statement: what precedes it is its head (for/if), drop it
            continue
        if c == "}":
            depth -= 1
            cur = []
            continue
        if depth:
            continue
        if c == ";":
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    return out


def _split_commas(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur).strip())
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur).strip())
    return [p for p in parts if p]


def _size_name(expr: str) -> str | None:
    expr = expr.strip()
    return expr if _IDENT_RE.fullmatch(expr) else None


def parse_declaration(statement: str, block: str = "") -> Declaration | None:
    """A Declaration for ``statement`` (without its ``;``), or None if it is not one this reader
    understands."""
    s = statement.strip()
    pos = 0
    array_sizes: list[str] = []

    def skip_ws(p: int) -> int:
        while p < len(s) and s[p].isspace():
            p += 1
        return p

    m = re.match(r"array\s*\[", s)
    if m:
        end = _matching(s, m.end() - 1)
        array_sizes = _split_commas(s[m.end():end - 1])
        pos = skip_ws(end)
    m = _IDENT_RE.match(s, pos)
    if not m:
        return None
    typ = m.group(0)
    pos = skip_ws(m.end())
    if pos < len(s) and s[pos] == "<":  # constraint, offset/multiplier
        pos = skip_ws(_matching(s, pos))
    type_sizes: list[str] = []
    if pos < len(s) and s[pos] == "[":
        end = _matching(s, pos)
        type_sizes = _split_commas(s[pos + 1:end - 1])
        pos = skip_ws(end)
    m = _IDENT_RE.match(s, pos)
    if not m:
        return None
    name = m.group(0)
    pos = skip_ws(m.end())
    old_array: list[str] = []
    if pos < len(s) and s[pos] == "[":  # pre-2.33 array syntax: real y[N]
        end = _matching(s, pos)
        old_array = _split_commas(s[pos + 1:end - 1])
        pos = skip_ws(end)
    if pos < len(s) and s[pos] != "=":
        return None  # not a declaration (an assignment, a sampling statement, a call ...)

    if typ in _SCALAR_TYPES and not type_sizes:
        value_dims: list[str] = []
    elif typ in _VECTOR_TYPES and len(type_sizes) == 1:
        value_dims = type_sizes
    elif typ in _MATRIX_TYPES and len(type_sizes) == 2:
        value_dims = type_sizes
    elif typ in _SQUARE_TYPES and len(type_sizes) == 1:
        value_dims = type_sizes * 2
    elif typ == "cholesky_factor_cov" and len(type_sizes) in (1, 2):
        value_dims = type_sizes * 2 if len(type_sizes) == 1 else type_sizes
    else:
        return None  # tuples, complex types, unknown types
    dims = tuple(_size_name(e) for e in old_array + array_sizes + value_dims)
    return Declaration(name, block, dims)


def declarations(code: str) -> dict[str, Declaration]:
    """Top-level declarations of the data, parameters, transformed parameters and generated
    quantities blocks, by variable name."""
    out: dict[str, Declaration] = {}
    for block, body in blocks(code).items():
        if block not in ("data", "parameters", "transformed parameters", "generated quantities"):
            continue
        for statement in _top_level_statements(body):
            decl = parse_declaration(statement, block)
            if decl is not None:
                out[decl.name] = decl
    return out


_TILDE_RE = re.compile(r"(?<![\w.])([A-Za-z][A-Za-z0-9_]*)\s*(?:\[[^\]]*\]\s*)*~")
_LPDF_RE = re.compile(r"\b\w+_(?:lpdf|lpmf|lupdf|lupmf)\s*\(\s*([A-Za-z][A-Za-z0-9_]*)\s*[|\[]")


def observed_names(code: str, data_names) -> list[str]:
    """Data variables the model block conditions on: those on the left of ``~`` or the first
    argument of a ``*_lpdf``/``*_lpmf`` call (``target += normal_lpdf(y | ...)``)."""
    body = blocks(code).get("model", "")
    data_names = list(data_names)
    used = set(_TILDE_RE.findall(body)) | set(_LPDF_RE.findall(body))
    return [n for n in data_names if n in used]
