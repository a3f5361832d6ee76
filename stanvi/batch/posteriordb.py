"""Finding the work in a stan-dev/posteriordb checkout (issue P2-2, "Discovering work").

Layout (the repository root, or its ``posterior_database`` directory):

* ``posteriors/<posterior>.json`` names ``model_name``, ``data_name`` and
  ``reference_posterior_name`` (null when the posterior has no reference draws);
* ``models/stan/<model_name>.stan``: the Stan program;
* ``data/data/<data_name>.json.zip``: one Stan JSON file, zipped;
* ``reference_posteriors/draws/draws/<reference_posterior_name>.json.zip``: the reference draws,
  a JSON list of chains, each mapping constrained element names (``theta[1]``, ``mu``) to that
  chain's draws; only some of a model's variables may be there (eight schools non-centred has
  ``theta``, a transformed parameter, and not ``theta_trans``).

Each posterior becomes a :class:`~stanvi.batch.discover.ModelCase` (``source="posteriordb"``,
``data_format="json-zip"``, ``reference`` the draws file or None); a posterior whose program or
data file is missing, or whose program has no parameters, is a skip with the reason, as in
:func:`~stanvi.batch.discover.discover_example_models`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from stanvi.batch.discover import (ModelCase, name_selected, program_blocks,  # noqa: F401
                                   read_zipped_json)

__all__ = ["database_root", "discover_posteriordb", "posterior_files", "read_reference_draws",
           "read_zipped_json"]


def database_root(path: str | Path) -> Path:
    """The ``posterior_database`` directory of a posteriordb checkout (given as the repository
    root or as that directory)."""
    path = Path(path).expanduser()
    for cand in (path, path / "posterior_database"):
        if (cand / "posteriors").is_dir():
            return cand
    raise FileNotFoundError(f"{path} is not a posteriordb checkout (no posteriors/ directory "
                            "in it or in its posterior_database/)")


def posterior_files(root: Path, name: str) -> tuple[dict, Path, Path]:
    """(posterior record, .stan file, zipped data file) of a posterior."""
    info_path = root / "posteriors" / f"{name}.json"
    if not info_path.exists():
        raise FileNotFoundError(f"no posterior {name!r} in {root} ({info_path} is missing)")
    info = json.loads(info_path.read_text())
    stan = root / "models" / "stan" / f"{info['model_name']}.stan"
    data = root / "data" / "data" / f"{info['data_name']}.json.zip"
    return info, stan, data


def read_reference_draws(path: str | Path) -> dict[str, np.ndarray]:
    """Reference draws by constrained element name, the chains concatenated: ``{"theta[1]":
    array (chains × draws,), ...}``.  Raises ValueError when the file is not a list of chains with
    the same names and equal lengths."""
    chains = read_zipped_json(path)
    if not isinstance(chains, list) or not chains or not all(isinstance(c, dict) for c in chains):
        raise ValueError(f"{path}: expected a JSON list of chains (name → draws)")
    names = list(chains[0])
    out: dict[str, np.ndarray] = {}
    for name in names:
        parts = []
        for i, chain in enumerate(chains):
            if name not in chain:
                raise ValueError(f"{path}: chain {i + 1} has no draws of {name!r}")
            parts.append(np.asarray(chain[name], dtype=float).ravel())
        if len({p.size for p in parts}) != 1:
            raise ValueError(f"{path}: the chains have different numbers of draws of {name!r}")
        out[name] = np.concatenate(parts)
    return out


def discover_posteriordb(root: str | Path, *, glob: str | None = None,
                         exclude: str | None = None, names: list[str] | None = None,
                         with_reference: bool = False,
                         max_data_bytes: int | None = None) -> list[ModelCase]:
    """Every posterior of the database (sorted by name) as a :class:`ModelCase`.

    Filters: ``glob``, ``exclude`` and ``names`` on the posterior name
    (:func:`stanvi.batch.discover.name_selected`), ``with_reference`` (only
    posteriors with reference draws present in the checkout), ``max_data_bytes`` (a larger zipped
    data file is a skip with the reason)."""
    db = database_root(root)
    cases = []
    for info_path in sorted((db / "posteriors").glob("*.json")):
        name = info_path.name[:-len(".json")]
        if not name_selected(name, glob, exclude, names):
            continue
        try:
            info, stan, data = posterior_files(db, name)
        except (OSError, ValueError, KeyError) as exc:
            cases.append(ModelCase(name, info_path, None, "none",
                                   f"unreadable posterior record ({exc})", source="posteriordb"))
            continue
        ref_name = info.get("reference_posterior_name")
        ref = (db / "reference_posteriors" / "draws" / "draws" / f"{ref_name}.json.zip"
               if ref_name else None)
        if ref is not None and not ref.is_file():
            ref = None
        if with_reference and ref is None:
            continue
        cases.append(ModelCase(name, stan, data, "json-zip",
                               _skip_reason(stan, data, max_data_bytes), source="posteriordb",
                               reference=ref))
    return cases


def _skip_reason(stan: Path, data: Path, max_data_bytes: int | None) -> str | None:
    if not stan.is_file():
        return f"the program {stan.name} is missing from the checkout"
    if not data.is_file():
        return f"the data file {data.name} is missing from the checkout"
    if not program_blocks(stan.read_text(encoding="utf-8", errors="replace")).get(
            "parameters", "").strip():
        return "no parameters block: nothing to approximate"
    if max_data_bytes is not None and data.stat().st_size > max_data_bytes:
        return f"data file {data.name} is {data.stat().st_size} bytes (max_data_bytes {max_data_bytes})"
    return None
