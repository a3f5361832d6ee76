"""Stan's flat parameter names ("beta.2.1", "sigma") grouped into variables with shapes.

Stan writes the elements of a container in column-major order (first index fastest), as
cmdstanpy reads them, so a variable's columns reshape with ``order="F"``.  Complex values appear
as trailing ``real``/``imag`` components and tuples as ``name:k``; both are kept as their own
trailing axis / separate variable, without interpretation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Variable:
    """One Stan variable: its name, shape, and the slice of flat columns holding it."""

    name: str
    shape: tuple[int, ...]
    start: int
    stop: int

    def extract(self, flat: np.ndarray) -> np.ndarray:
        """This variable's values from flat rows (B, K) as an array (B, *shape)."""
        cols = flat[:, self.start:self.stop]
        return cols.reshape((flat.shape[0], *self.shape), order="F")


def _index(token: str) -> int:
    if token == "real":
        return 1
    if token == "imag":
        return 2
    return int(token)


def group_names(flat_names: list[str]) -> list[Variable]:
    """Variables, in order, from the flat names of ``bs_param_names`` (constrained space)."""
    variables: list[Variable] = []
    i = 0
    n = len(flat_names)
    while i < n:
        base = flat_names[i].split(".", 1)[0]
        j = i
        max_idx: list[int] = []
        while j < n and flat_names[j].split(".", 1)[0] == base:
            parts = flat_names[j].split(".")[1:]
            idx = [_index(p) for p in parts]
            if len(idx) > len(max_idx):
                max_idx += [0] * (len(idx) - len(max_idx))
            max_idx = [max(a, b) for a, b in zip(max_idx, idx + [0] * (len(max_idx) - len(idx)))]
            j += 1
        shape = tuple(max_idx)
        if int(np.prod(shape, dtype=int)) != j - i:  # ragged (should not happen): keep flat
            shape = (j - i,)
        variables.append(Variable(base, shape, i, j))
        i = j
    return variables


def element_labels(name: str, shape: tuple[int, ...], style: str = "brackets") -> list[str]:
    """The labels of a variable's elements in Stan's column-major order (first index fastest):
    ``style='brackets'`` as cmdstanpy and ArviZ users read them (``beta[1,2]``), ``'dots'`` as
    Stan's CSV header writes them (``beta.1.2``).  A scalar is just its name."""
    if not shape:
        return [name]
    idx = np.unravel_index(np.arange(int(np.prod(shape))), shape, order="F")
    elements = [[str(int(i[j]) + 1) for i in idx] for j in range(len(idx[0]))]
    if style == "brackets":
        return [f"{name}[{','.join(e)}]" for e in elements]
    if style == "dots":
        return [".".join([name, *e]) for e in elements]
    raise ValueError(f"style must be 'brackets' or 'dots', got {style!r}")
