"""``stanvi.compare``: several methods on one model, one table and a recommendation with its
reason (issue T3-5 item 3; docs/choosing.md#compare).

Each method is fitted with the same seed on the same compiled model: stanvi's own methods through
:func:`stanvi.fit`, Stan's own (``nuts``, ``pathfinder``, ``stan-advi``) in-process.  Per method
the table gives:

* ``elbo``: the ELBO of the approximation — stanvi's fits and Stan's ADVI on 4,000 fresh draws
  of their Gaussian (the same estimator for both), single-path Pathfinder the mean of
  ``lp__ − lp_approx__`` over its draws; none for multi-path Pathfinder and NUTS (no single
  proposal density).  Higher is closer to the posterior in KL(q‖p);
* ``mean_error_sd`` and ``w1_sd`` with ``reference="nuts"``: medians over marginals of
  |mean − mean_NUTS| / sd_NUTS and of the 1-Wasserstein distance / sd_NUTS
  (:mod:`stanvi.evaluation.accuracy`), NUTS run here with 4 chains × 1,000 draws;
* ``evaluations`` (every log density, gradient and Hessian-vector product the method evaluated
  at one point) and ``seconds`` (the method's wall time);
* ``khat``, ``verdict`` and ``means``: Pareto k̂ of log p − log q at the draws, its band and
  the reading of q's means apart (hold / plausible / doubtful; docs/diagnostics.md#means).

Stan's ADVI and single-path Pathfinder are judged on fresh draws of their Gaussian, recovered
from their output (:mod:`stanvi.reference.diagnostics`); where Stan's default 1,000 output
draws cannot identify it (full rank from D = 45, Pathfinder from D = 44) Stan is asked for
enough, and the row's evaluations, accuracy and Pathfinder's ELBO, and the fit in ``fits``,
are those of the default run (:mod:`stanvi.reference.as_fit`, through :func:`stanvi.fit`).

The recommendation (:func:`recommend`): among the approximations that converged (Stan's ADVI
too: one that stopped at its iteration limit is ``max_iters``, as stanvi's ADVI is) and
whose verdict is not "unreliable" — with a reference, those (multi-path Pathfinder
included, judged by accuracy alone) whose means are within
:data:`MEAN_ERROR_OK` posterior sd of NUTS's and marginals within :data:`W1_OK` sd (the batch
report's rule, :mod:`stanvi.batch.recommend`); without one, those whose ELBO is within
:data:`ELBO_WITHIN` nat of the best — the fastest; those within :data:`AS_FAST` × its time, or
under :data:`QUICK_ENOUGH` seconds, count as equally fast, and of them the closest to the
posterior is named (smallest W1 with a reference, else highest ELBO).  When none qualifies:
NUTS.  Multi-path Pathfinder and NUTS have no single proposal density, so no ELBO or k̂: without
a reference they are shown, not judged.  When none qualifies, the reason also names the
approximation whose means alone read best (*plausible*: q is at its ELBO's optimum in the means
and no check finds them off; with a reference, also within :data:`MEAN_ERROR_OK` sd of NUTS's),
for a user who needs the posterior means only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stanvi.methods import STAN_METHODS
from stanvi.reference.result import trust_reasons

#: Methods compared when none are named.
DEFAULT_METHODS = ("trustvi", "trustvi/fullrank", "advi", "pathfinder")
#: With a reference: acceptable standardized mean error and W1 (the batch report's rule too).
MEAN_ERROR_OK = 0.1
W1_OK = 0.2
#: Without a reference: an approximation qualifies within this many nats of the best ELBO.
ELBO_WITHIN = 1.0
#: Approximations within this factor of the fastest qualifying one's time count as equally
#: fast (timings of millisecond fits vary from run to run; the choice among them should not).
AS_FAST = 2.0
#: ... and so do all that take at most this many seconds: a user waits for none of them, so the
#: closest to the posterior is the better choice.
QUICK_ENOUGH = 1.0
#: Draws of the ELBO estimates.
ELBO_DRAWS = 4000
#: How tables name methods and families (here and in the batch report, stanvi.batch.recommend).
METHOD_NAMES = {"trustvi": "TrustVI", "advi": "ADVI", "hfsgvi": "HFSGVI", "jointcv": "jointcv",
                "mlmcvi": "MLMCVI", "bam": "BaM", "gsm": "GSM", "stan-advi": "Stan's ADVI", "pathfinder": "Pathfinder",
                "nuts": "NUTS"}
FAMILY_NAMES = {"meanfield": "mean-field", "fullrank": "full-rank", "lowrank": "low-rank",
                "mixture": "mixture"}


def parse_method(spec) -> tuple[str, str, dict]:
    """``"method"``, ``"method/family"`` or ``(spec, options)`` → (method, family, options)."""
    options: dict = {}
    if isinstance(spec, tuple):
        spec, options = spec[0], dict(spec[1])
    method, _, family = str(spec).partition("/")
    return method.strip(), (family.strip() or "meanfield"), options


def label(method: str, family: str, options: dict) -> str:
    """How the table names a configuration: 'TrustVI (full-rank)', 'Pathfinder (1 path)'."""
    name = METHOD_NAMES.get(method, method)
    if method == "pathfinder":
        paths = int(options.get("num_paths", 4))
        return f"{name} ({paths} path{'s' if paths > 1 else ''})"
    if method == "nuts":
        return name
    return f"{name} ({FAMILY_NAMES.get(family, family)})"


@dataclass
class Comparison:
    """What :func:`compare` found: one row per method (``table()``), the fits by label, the
    NUTS reference (or None), and the recommendation with its reason."""

    model: str
    rows: list[dict]
    fits: dict[str, Any]
    reference: Any = None
    recommendation: str = ""
    reason: str = ""
    seed: int = 0
    notes: list[str] = field(default_factory=list)

    def table(self):
        """The rows as a pandas DataFrame indexed by label."""
        import pandas as pd  # noqa: PLC0415

        return pd.DataFrame(self.rows).set_index("method")

    def __str__(self) -> str:
        head = (f"{self.model}: {len(self.rows)} methods, seed {self.seed}"
                + (", accuracy against NUTS (4 chains x 1000 draws)" if self.reference is not None
                   else ", no reference (pass reference='nuts' for accuracy)"))
        cols = ["elbo", "mean_error_sd", "w1_sd", "evaluations", "seconds", "khat", "verdict",
                "means"]
        if self.reference is None:
            cols = [c for c in cols if c not in ("mean_error_sd", "w1_sd")]
        lines = [head, f"{'method':24s}" + "".join(f"{c:>14s}" for c in cols)]
        for row in self.rows:
            lines.append(f"{row['method']:24s}" + "".join(f"{_cell(row.get(c), c):>14s}"
                                                          for c in cols))
        lines += [*self.notes, f"recommendation: {self.recommendation}: {self.reason}"]
        return "\n".join(lines)


def _cell(value, column: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, (int, np.integer)):
        return f"{int(value):,}"
    if isinstance(value, float):
        if column == "elbo" and math.isfinite(value):
            return f"{value:,.2f}"   # differences of a tenth of a nat matter, not the size
        return f"{value:.3g}"
    return str(value)


def compare(model, data=None, *, methods=DEFAULT_METHODS, reference: str | None = None,
            seed: int = 0, progress: bool = True) -> Comparison:
    """Fit each of ``methods`` (``"method"``, ``"method/family"``, or ``(spec, options)`` with
    the method's options, e.g. ``("pathfinder", {"num_paths": 1})``) on ``model`` and ``data``
    with ``seed``; with ``reference="nuts"`` also run NUTS and score every approximation against
    it.  Returns a :class:`Comparison`; ``print`` it for the table and the recommendation
    (module docstring)."""
    from stanvi.fit import fit  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    if reference not in (None, "nuts"):
        raise ValueError(f"reference must be None or 'nuts', not {reference!r}")
    specs = [parse_method(m) for m in methods]
    if not specs:
        raise ValueError("name at least one method to compare")
    target = StanTarget(model, data, seed=seed, progress=progress)   # every fit's model
    ref = ref_draws = None
    if reference == "nuts":
        from stanvi.targets.labelled import labelled_draws  # noqa: PLC0415

        ref = fit(target, method="nuts", seed=seed, progress=progress)
        ref_draws = labelled_draws(ref.draws)
    rows, fits = [], {}
    for method, family, options in specs:
        name = label(method, family, options)
        result = fit(target, method=method, family=family, seed=seed, progress=progress,
                     **options)
        fits[name] = result
        rows.append({"method": name, **_figures(method, result, target, ref_draws, seed)})
    recommendation, reason = recommend(rows, reference is not None)
    unjudged = [r["method"] for r in rows if r["verdict"] is None]
    notes = [f"({', '.join(unjudged)}: no single proposal density, so no ELBO or k-hat; judged "
             f"only against a reference)"] if unjudged and reference is None else []
    return Comparison(model=target.name, rows=rows, fits=fits, reference=ref,
                      recommendation=recommendation, reason=reason, seed=seed, notes=notes)


def _figures(method: str, result, target, ref_draws, seed: int) -> dict[str, Any]:
    """One row's figures (module docstring)."""
    from stanvi.evaluation.accuracy import marginal_accuracy  # noqa: PLC0415
    from stanvi.targets.labelled import labelled_draws  # noqa: PLC0415

    row: dict[str, Any] = {"elbo": math.nan, "mean_error_sd": math.nan, "w1_sd": math.nan,
                           "khat": math.nan, "verdict": None, "means": None}
    if method in STAN_METHODS:
        row["status"] = result.status   # Stan's ADVI at its iteration limit: max_iters
        row["evaluations"] = int((result.gradient_evaluations or 0)
                                 + (result.density_evaluations or 0))
        row["seconds"] = float(result.wall_time)
        if result.has_proposal_density:
            diag = result.diagnostics()   # on fresh draws of the recovered Gaussian
            row.update(khat=float(diag.khat), verdict=diag.verdict, means=diag.means)
            if method == "pathfinder":
                ratio = np.asarray(result.log_p) - np.asarray(result.log_q)
                row["elbo"] = float(np.mean(ratio)) if np.all(np.isfinite(ratio)) else -math.inf
            else:
                from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415
                from stanvi.estimators.keys import make_key  # noqa: PLC0415
                from stanvi.reference.advi import stan_advi_elbo  # noqa: PLC0415

                eps = np.asarray(standard_normal(make_key(seed + 1, host=True), ELBO_DRAWS,
                                                 target.dim))
                try:
                    row["elbo"] = float(stan_advi_elbo(result.recovery_run or result, target,
                                                       [eps])[0][0])
                except ValueError:   # q not recoverable from the draws (too few: the verdict
                    pass             # says so) or not a Gaussian: no ELBO, NaN
        elif method == "nuts":
            row["verdict"] = ("check R-hat/ESS" if trust_reasons(result.nuts_figures())
                              else "reference")
    else:
        row["status"] = result.status
        row["evaluations"] = int(sum((result.info.get("model_evaluations") or {}).values()))
        row["seconds"] = float(result.wall_time)
        diag = result.diagnostics()
        row.update(khat=float(diag.khat), verdict=diag.verdict, means=diag.means)
        row["elbo"] = float(result.elbo(n_draws=ELBO_DRAWS, seed=seed + 1)[0])
    if ref_draws is not None and method != "nuts":
        acc = marginal_accuracy(labelled_draws(result.draws), ref_draws)
        row.update(mean_error_sd=float(acc["mean_error_sd_median"]),
                   w1_sd=float(acc["w1_sd_median"]))
    return row


def _means_only(rows: list[dict], with_reference: bool) -> str:
    """The clause naming the approximation whose means alone read plausible (module
    docstring), or ''."""
    plausible = [r for r in rows if r.get("status") == "converged"
                 and r.get("means") == "plausible"
                 and (not with_reference or r["mean_error_sd"] <= MEAN_ERROR_OK)]
    if not plausible:
        return ""
    pick = min(plausible, key=lambda r: (r["seconds"], r["method"]))
    return (f"; for the posterior means alone, {pick['method']}'s read plausible (its sds and "
            f"intervals do not hold)")


def recommend(rows: list[dict], with_reference: bool) -> tuple[str, str]:
    """(label, reason) by the rule of the module docstring."""
    vi = [r for r in rows if r["method"] != "NUTS"]
    # with a reference, multi-path Pathfinder (no k-hat) is judged by its accuracy alone
    sound = [r for r in vi if r.get("status") == "converged"
             and r.get("verdict") != "unreliable"
             and (with_reference or r.get("verdict") is not None)]
    if with_reference:
        good = [r for r in sound if r["mean_error_sd"] <= MEAN_ERROR_OK and r["w1_sd"] <= W1_OK]
        rule = (f"means within {MEAN_ERROR_OK} sd and marginals within W1 {W1_OK} sd of NUTS, "
                f"k-hat not unreliable")
    else:
        finite = [r["elbo"] for r in sound if math.isfinite(r["elbo"])]
        best = max(finite) if finite else -math.inf
        good = [r for r in sound if math.isfinite(r["elbo"]) and r["elbo"] >= best - ELBO_WITHIN]
        rule = (f"ELBO within {ELBO_WITHIN:g} nat of the best ({best:.4g}), k-hat not unreliable"
                if finite else "none converged with an ELBO and a k-hat that is not unreliable")
    if not good:
        return "NUTS", (f"no approximation qualifies ({rule}); sample the posterior with NUTS "
                        f"(method='nuts')" + _means_only(vi, with_reference))
    fastest = min(r["seconds"] for r in good)
    quick = [r for r in good if r["seconds"] <= max(AS_FAST * fastest, QUICK_ENOUGH)]
    # among the equally fast, the closest to the posterior: the smaller W1 with a reference,
    # else the higher ELBO (then the fewer evaluations)
    pick = min(quick, key=lambda r: ((r["w1_sd"] if with_reference else -r["elbo"]),
                                     r["evaluations"]))
    figures = (f"mean error {pick['mean_error_sd']:.2g} sd, W1 {pick['w1_sd']:.2g} sd"
               if with_reference else f"ELBO {pick['elbo']:.4g}")
    head = (f"{figures}, k-hat {pick['khat']:.2f} ({pick['verdict']})"
            if math.isfinite(pick["khat"]) else f"{figures}, no k-hat (draws of several paths)")
    if len(good) == 1:
        return pick["method"], f"{head}: the only one that qualifies ({rule})"
    closest = "the smallest W1" if with_reference else "the highest ELBO"
    return pick["method"], (f"{head}: of the {len(good)} that qualify ({rule}), "
                            + (f"{closest} of the {len(quick)} about as fast (within "
                               f"{AS_FAST:g}x of the fastest's time, or under "
                               f"{QUICK_ENOUGH:g} s)" if len(quick) > 1 else "the fastest"))
