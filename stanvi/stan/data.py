"""Stan data in and out: a dict, a JSON file path, an R dump file path (``.R``, as CmdStan reads
and stan-dev/example-models ships: :mod:`stanvi.stan.rdump`) or a JSON string becomes the JSON
text the model library reads, and Stan's data-validation messages become
:class:`StanDataError` naming the variable (docs/models_and_targets.md#data).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import stanio

from stanvi.errors import StanDataError
from stanvi.stan.rdump import parse_rdump

DataLike = Mapping[str, Any] | str | os.PathLike | None


def data_to_json(data: DataLike) -> str:
    """The Stan JSON text for ``data`` ("" for no data).

    ``data`` may be a mapping (numpy arrays and scalars allowed), a path to a ``.json`` file or
    to an R dump file (``.R``: ``name <- c(...)``; another name whose text is R dump, not JSON,
    is read as one too), or a JSON string.  Raises StanDataError for unreadable files, invalid
    JSON and invalid R dump (naming the line).
    """
    if data is None:
        return ""
    if isinstance(data, Mapping):
        return stanio.dump_stan_json(dict(data))
    if isinstance(data, os.PathLike) or (isinstance(data, str) and not data.lstrip().startswith("{")):
        path = Path(data)
        if not path.is_file():
            raise StanDataError(f"data file not found: {path}")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            zipped = " (a zip archive: unpack it, or read it with stanvi.batch.posteriordb." \
                "read_zipped_json)" if path.read_bytes()[:2] == b"PK" else ""
            raise StanDataError(f"{path} is not a JSON text file: it is not UTF-8{zipped}") \
                from None
        source = str(path)
        if path.suffix in (".R", ".r"):
            return stanio.dump_stan_json(parse_rdump(text, source))
    else:
        text, source = str(data), "the data string"
    try:
        json.loads(text)
    except json.JSONDecodeError as exc:
        if re.match(r"\s*(#.*\n\s*)*[\"`]?[A-Za-z.][\w.]*[\"`]?\s*(<-|=)", text):   # R dump
            return stanio.dump_stan_json(parse_rdump(text, source))
        raise StanDataError(f"{source} is not valid JSON: {exc}") from exc
    return text


def data_to_dict(data: DataLike) -> dict[str, Any]:
    """The data as a dict of numpy arrays and Python scalars (for ArviZ's constant_data)."""
    text = data_to_json(data)
    if not text:
        return {}
    return {k: (np.asarray(v) if isinstance(v, list) else v) for k, v in json.loads(text).items()}


_VARIABLE_PATTERNS = (
    re.compile(r"variable name=([A-Za-z_]\w*)"),
    re.compile(r"_model: ([A-Za-z_]\w*)(?:\[[^\]]*\])* (?:is|has) "),
    re.compile(r"variable ([A-Za-z_]\w*)\b"),
)


def data_error_from_stan(message: str, model_name: str,
                         data_json: str | None = None) -> StanDataError:
    """Turn Stan's model-construction message into a StanDataError naming the variable.  With
    the data as given (``data_json``; empty: none), a variable Stan could not find is said to
    be missing, and no data at all is said to be no data, rather than "rejected"."""
    text = message.replace("Error in model construction: ", "").strip()
    variable = None
    for pattern in _VARIABLE_PATTERNS:
        found = pattern.search(text)
        if found:
            variable = found.group(1)
            break
    if variable and "variable does not exist" in text and data_json is not None:
        given = sorted(json.loads(data_json)) if data_json.strip() else []
        if not given:
            return StanDataError(
                f"model '{model_name}' needs data (it reads '{variable}' first) and none were "
                "given: pass data= a dict, a JSON text or a .json file (on the command line: "
                "--data FILE.json)", variable=variable)
        return StanDataError(
            f"model '{model_name}' needs data variable '{variable}', which the data do not give "
            f"(they give {', '.join(given)}): {text}", variable=variable)
    what = f"data variable '{variable}'" if variable else "the data"
    return StanDataError(f"model '{model_name}' rejected {what}: {text}", variable=variable)
