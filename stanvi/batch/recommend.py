"""Which method to use on a model, from a batch's records (issue T3-4, item 3;
docs/batch.md#recommendation).

Per model, the configurations are judged on the runs of every seed against the reference draws
(posteriordb's, or the batch's NUTS reference, :mod:`stanvi.batch.nuts_reference`):

* *reliable*: every seed ran to a normal outcome (``OK_STATUSES``);
* *accurate*: on every seed (the worst seed's figures), the standardized mean error (median
  over marginals, |mean − mean_ref| / sd_ref) at most :data:`MEAN_ERROR_OK` and W1 / sd_ref
  at most :data:`W1_OK` — the means within a tenth of a posterior sd and the marginal
  distributions close (a mean-field fit of a correlated posterior gets the means and not the
  marginals).  A user runs a method once: a configuration right on two seeds of three and
  2 sd off on the third is not one to recommend (the median over seeds hid that);
* the recommendation is the *cheapest* reliable and accurate configuration by median run time
  (then evaluations). Where none is accurate on both, the cheapest with accurate means is named
  with that caveat; where none has accurate means, NUTS. NUTS itself is the yardstick, never
  the recommendation while a VI method qualifies.
"""

from __future__ import annotations

import math
from typing import Any

# the acceptable accuracy (module docstring) and the names of methods and families, as
# stanvi.compare judges and names them
from stanvi.evaluation.compare import FAMILY_NAMES, MEAN_ERROR_OK, METHOD_NAMES, W1_OK


def label(config: str) -> str:
    """A configuration ``method:profile:family`` as a reader names it:
    'TrustVI default (mean-field)', 'Pathfinder (4 paths)', 'NUTS'."""
    method, profile, family = (config.split(":") + ["", ""])[:3]
    if method == "pathfinder":
        return "Pathfinder (1 path)" if profile == "single" else "Pathfinder (4 paths)"
    if method == "nuts":
        return "NUTS" if profile in ("", "diag") else f"NUTS ({profile} metric)"
    name = METHOD_NAMES.get(method, method)
    shown_profile = "" if method == "stan-advi" else f" {profile}"
    fam = FAMILY_NAMES.get(family)
    return f"{name}{shown_profile}" + (f" ({fam})" if fam else "")


def _finite(value) -> bool:
    return value is not None and math.isfinite(float(value))


def _cost(row: dict) -> tuple[float, float]:
    time = row.get("median_run_time")
    evals = row.get("median_draw_evaluations")
    return (float(time) if _finite(time) else math.inf,
            float(evals) if _finite(evals) else math.inf)


def _worst(row: dict, figure: str) -> float:
    """The worst seed's ``figure`` (``worst_<figure>``; a row without it, its median), inf
    where unknown."""
    value = row.get(f"worst_{figure}", row.get(figure))
    return float(value) if _finite(value) else math.inf


def _figures(row: dict) -> str:
    text = (f"mean error {row['mean_error_sd']:.2g} sd, W1 {row['w1_sd']:.2g} sd"
            if _finite(row.get("w1_sd")) else f"mean error {row['mean_error_sd']:.2g} sd")
    worst = [f"{_worst(row, f):.2g}" for f in ("mean_error_sd", "w1_sd")
             if _finite(row.get(f)) and _finite(row.get(f"worst_{f}"))]
    return text + (f" (median over seeds; worst seed {' and '.join(worst)})"
                   if worst and (row.get("runs") or 0) > 1 else "")


def recommend(rows: list[dict[str, Any]], reference_ok: bool | None = None) -> dict[str, Any]:
    """The recommendation for one model from its :func:`stanvi.batch.summary.model_rows`;
    ``reference_ok``: False when its reference failed the trust checks.  Returns ``config``
    (None when nothing can be judged), ``level`` ('marginals', 'means', 'nuts' or 'unjudged')
    and ``why``, one sentence with the deciding figures."""
    judged = [r for r in rows if _finite(r.get("mean_error_sd"))
              and not r["config"].startswith("nuts:")]
    if not judged:
        return {"config": None, "level": "unjudged",
                "why": "no fit has accuracy figures (no reference draws, or every fit failed)"}
    caveat = (" (against a reference that failed its checks: treat with care)"
              if reference_ok is False else "")
    reliable = [r for r in judged if r["runs"] and r["ok"] == r["runs"]]
    means = [r for r in reliable if _worst(r, "mean_error_sd") <= MEAN_ERROR_OK]
    both = [r for r in means if _worst(r, "w1_sd") <= W1_OK]
    for level, pool in (("marginals", both), ("means", means)):
        if not pool:
            continue
        pool = sorted(pool, key=_cost)
        best = pool[0]
        seconds = _cost(best)[0]
        why = (f"{label(best['config'])}: {_figures(best)} (acceptable: ≤ {MEAN_ERROR_OK} and "
               f"≤ {W1_OK} on each of {best['runs']} seeds), {seconds:.3g} s per fit; the "
               f"cheapest of {len(pool)} acceptable")
        if len(pool) > 1:
            why += f" (next: {label(pool[1]['config'])}, {_cost(pool[1])[0]:.3g} s)"
        if level == "means":
            why += ("; only the means are acceptable: no method's marginal distributions came "
                    f"within W1 {W1_OK} sd (a full-rank or NUTS fit for the spreads)")
        return {"config": best["config"], "level": level, "why": why + caveat}
    closest = min(judged, key=lambda r: r["mean_error_sd"])
    return {"config": next((r["config"] for r in rows if r["config"].startswith("nuts:")), None),
            "level": "nuts",
            "why": (f"no variational fit was accurate on every seed (closest: "
                    f"{label(closest['config'])}, {_figures(closest)}, {closest['ok']} of "
                    f"{closest['runs']} seeds ran): use NUTS" + caveat)}


def headline(rec: dict[str, Any]) -> str:
    """A recommendation as the report's one-line summary of a model shows it: the configuration
    (with "means only" where only its means are acceptable), "NUTS" where no variational fit was
    accurate on every seed (also when the batch ran no NUTS configuration of its own: the
    reference is NUTS), and "not judged" only where nothing had accuracy figures."""
    if rec["level"] == "nuts":
        return label(rec["config"]) if rec["config"] else "NUTS"
    if rec["config"] is None:
        return "not judged"
    return label(rec["config"]) + (" (means only)" if rec["level"] == "means" else "")
