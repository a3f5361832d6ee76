"""Dim names and coordinates of a fit's DataTree groups: one rule for every group
(docs/quickstart.md#arviz; issue T3-5 item 4).

A variable's non-sample axes are named after the sizes its Stan declaration names
(``vector[J] theta``, ``array[J] real sigma``: dim ``J``), in ``posterior``, ``observed_data``
and ``constant_data`` alike; where the program says nothing, or the name would clash (twice in
one variable, a sample dim, two lengths), ArviZ's ``{name}_dim_{i}``.  Before this rule a size
given as data (``int J``) sat in ``constant_data`` as a variable, so that group could not use
``J`` as a dim and named the same axis ``sigma_dim_0`` (:func:`split_sizes`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np

SAMPLE_DIMS = ("chain", "draw")


def resolve_dims(values: Mapping[str, np.ndarray], declared: Mapping[str, tuple], n_lead: int,
                  user_dims: Mapping[str, list[str]] | None) -> dict[str, list[str]]:
    """Dim names for each variable's non-sample axes: the user's, else the program's size names
    where they are consistent, else ``{name}_dim_{i}``."""
    out: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    names_in_group = set(values)
    for name, arr in values.items():
        shape = np.shape(arr)[n_lead:]
        if not shape:
            continue
        if user_dims and name in user_dims:
            out[name] = list(user_dims[name])
            continue
        decl = declared.get(name)
        dims = list(decl) if decl is not None and len(decl) == len(shape) else [None] * len(shape)
        chosen: list[str] = []
        for i, (dim, size) in enumerate(zip(dims, shape)):
            default = f"{name}_dim_{i}"
            if (dim is None or dim in chosen or dim in names_in_group or dim in SAMPLE_DIMS
                    or sizes.get(dim, size) != size):
                dim = default
            sizes[dim] = size
            chosen.append(dim)
        out[name] = chosen
    return out


def default_coords(values: Mapping[str, np.ndarray], gdims: Mapping[str, list[str]],
                    n_lead: int, origin: int) -> dict[str, np.ndarray]:
    """``origin, origin + 1, ...`` along each named non-sample dim."""
    out: dict[str, np.ndarray] = {}
    for name, names in gdims.items():
        shape = np.shape(values[name])[n_lead:]
        for dim, size in zip(names, shape):
            out.setdefault(dim, np.arange(origin, origin + size))
    return out



def split_sizes(data: Mapping[str, np.ndarray], declared: Mapping[str, tuple]
                ) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """(data without its sizes, the sizes): a size is an integer scalar data variable whose name
    some declaration uses as a dim; it becomes the length of that dim in every group."""
    dim_names = {d for dims in declared.values() for d in (dims or ()) if d}
    sizes = {k: int(v) for k, v in data.items()
             if k in dim_names and np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.integer)}
    return {k: v for k, v in data.items() if k not in sizes}, sizes


def group_attrs(group: str, sizes: Mapping[str, int]) -> dict[str, Any]:
    """A group's own attributes: ``inference_library``, and on ``constant_data`` the data sizes
    that are dims (:func:`split_sizes`), as JSON; everything else is on the root only."""
    attrs: dict[str, Any] = {"inference_library": "stanvi"}
    if group == "constant_data" and sizes:
        attrs["sizes"] = json.dumps(dict(sizes))
    return attrs
