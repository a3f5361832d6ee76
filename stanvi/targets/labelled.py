"""Draws by element label (``theta[1]``, Stan's column-major order) and their image in
unconstrained space through the model's own transform: shared by the batch's accuracy figures,
Stan's reference runs (:mod:`stanvi.reference`) and the benchmarks."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from stanvi.stan.names import element_labels

__all__ = ["labelled_draws", "reference_unconstrained", "mapped_unconstrained"]


def labelled_draws(variables: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Draws by element label (``theta[1]``) from draws by variable name, each (n, *shape), in
    Stan's column-major element order."""
    out: dict[str, np.ndarray] = {}
    for name, draws in variables.items():
        draws = np.asarray(draws, dtype=float)
        n, shape = draws.shape[0], draws.shape[1:]
        flat = draws.reshape(n, -1, order="F") if shape else draws.reshape(n, 1)
        for label, column in zip(element_labels(name, tuple(shape)), flat.T):
            out[label] = column
    return out


def reference_unconstrained(target, reference: Mapping[str, np.ndarray]
                            ) -> tuple[dict[str, np.ndarray] | None, str]:
    """The reference draws mapped to unconstrained space by the model's transform, labelled by
    ``target.unconstrained_names``; (None, why) when the reference lacks a parameter or a draw
    cannot be mapped."""
    params = [v for v in target.variables(include_tp=False, include_gq=False)]
    labels = {v.name: element_labels(v.name, tuple(v.shape)) for v in params}
    absent = [lab for labs in labels.values() for lab in labs if lab not in reference]
    if absent:
        return None, (f"the reference has no draws of parameter element(s) "
                      f"{', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}")
    n = len(next(iter(reference.values())))
    rows = np.empty((n, target.dim))
    for i in range(n):
        values = {}
        for v in params:
            flat = np.array([reference[lab][i] for lab in labels[v.name]])
            values[v.name] = (flat.reshape(tuple(v.shape), order="F") if v.shape
                              else float(flat[0]))
        try:
            rows[i] = target.unconstrain(values)
        except Exception as exc:  # noqa: BLE001 — the model's own error, reported
            return None, f"reference draw {i + 1} cannot be unconstrained: {exc}"
    names = list(target.unconstrained_names)
    return {name: rows[:, j] for j, name in enumerate(names)}, ""


def mapped_unconstrained(run, target) -> tuple[dict[str, np.ndarray] | None, str]:
    """The draws of ``run`` (a fit with ``draws`` by Stan name: Stan's ADVI or Pathfinder)
    mapped to ``target``'s unconstrained space by :func:`reference_unconstrained`, computed
    once per run and target and kept on the run: the map is one Stan call per draw, and the
    ELBO and the verdict of Stan's fits both need it (docs/diagnostics.md#stan)."""
    kept = run.__dict__.get("_mapped_unconstrained")
    if kept is None or kept[0] is not target:
        kept = (target, reference_unconstrained(target, labelled_draws(run.draws)))
        run.__dict__["_mapped_unconstrained"] = kept
    return kept[1]
