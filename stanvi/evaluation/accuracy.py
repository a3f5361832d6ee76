"""Accuracy of a fit against reference posterior draws (issue P2-2, "Accuracy against
references").

Per marginal (one scalar element of a Stan variable, ``theta[1]``), with m and s the reference
draws' mean and sd:

* standardized mean error |mean_vi − m| / s;
* sd ratio sd_vi / s;
* the 1-Wasserstein distance between the marginal's VI draws and reference draws
  (:func:`scipy.stats.wasserstein_distance`, as the Pathfinder paper reports it: Zhang, Carpenter,
  Gelman & Vehtari 2022, §4.1), and the same divided by s so that marginals on different scales
  can be pooled.

In constrained space the VI draws are the fit's output draws (parameters and transformed
parameters, by element label) matched by name to the reference's elements; in unconstrained space
both sides are mapped by the model's own transform (the reference draws through BridgeStan's
``param_unconstrain``, which needs every parameter of the model in the reference; otherwise the
unconstrained comparison is left out, with the reason).  Each summary lists the marginals
compared and the reference names the fit has no draws of.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from stanvi.targets.labelled import labelled_draws, reference_unconstrained

__all__ = ["marginal_accuracy", "labelled_draws", "reference_unconstrained", "read_reference_npz"]


def marginal_accuracy(approx: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
                      ) -> dict[str, Any]:
    """Per-marginal figures for every reference element the approximation has draws of, and
    their summaries (median and max over marginals).  Marginals whose reference sd is 0 or not
    finite are left out of the standardized figures (named in ``degenerate``)."""
    from scipy.stats import wasserstein_distance  # noqa: PLC0415  (heavy; batch only)

    per: dict[str, dict[str, float]] = {}
    missing, degenerate = [], []
    for label, ref in reference.items():
        if label not in approx:
            missing.append(label)
            continue
        ref = np.asarray(ref, dtype=float)
        vi = np.asarray(approx[label], dtype=float)
        ref, vi = ref[np.isfinite(ref)], vi[np.isfinite(vi)]
        if ref.size < 2 or vi.size < 2:
            degenerate.append(label)
            continue
        m, s = float(np.mean(ref)), float(np.std(ref, ddof=1))
        w1 = float(wasserstein_distance(vi, ref))
        if not (np.isfinite(s) and s > 0):
            degenerate.append(label)
            continue
        per[label] = {"mean_error_sd": abs(float(np.mean(vi)) - m) / s,
                      "sd_ratio": float(np.std(vi, ddof=1)) / s, "w1": w1, "w1_sd": w1 / s}
    summary: dict[str, Any] = {"n_marginals": len(per), "missing": missing,
                               "degenerate": degenerate, "marginals": per}
    for fig in ("mean_error_sd", "w1_sd"):
        values = np.array([p[fig] for p in per.values()])
        summary[f"{fig}_median"] = float(np.median(values)) if values.size else None
        summary[f"{fig}_max"] = float(np.max(values)) if values.size else None
    ratios = np.array([p["sd_ratio"] for p in per.values()])
    summary["sd_ratio_median"] = float(np.median(ratios)) if ratios.size else None
    summary["sd_ratio_worst"] = (float(ratios[np.argmax(np.abs(np.log(ratios)))])
                                 if ratios.size and np.all(ratios > 0) else None)
    return summary


def read_reference_npz(path) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(constrained, unconstrained) reference draws by label, as the batch's compile task saved
    them (``c:<label>`` and ``u:<label>`` arrays; the unconstrained ones may be absent)."""
    with np.load(path) as npz:
        constrained = {k[2:]: npz[k] for k in npz.files if k.startswith("c:")}
        unconstrained = {k[2:]: npz[k] for k in npz.files if k.startswith("u:")}
    return constrained, unconstrained


def write_reference_npz(path, target, draws: dict[str, np.ndarray]) -> tuple[bool, str]:
    """Writes reference ``draws`` by label to ``path`` (atomically) as
    :func:`read_reference_npz` reads them: constrained, and unconstrained by the model's own
    transform (:func:`reference_unconstrained`) where they name every parameter; returns
    (unconstrained written?, why not)."""
    from pathlib import Path  # noqa: PLC0415

    path = Path(path)
    unc, why = reference_unconstrained(target, draws)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"c:{k}": v for k, v in draws.items()}
    arrays.update({f"u:{k}": v for k, v in (unc or {}).items()})
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)
    return unc is not None, why
