"""Stan's variational results judged by stanvi's verdict: the same rule on the same number of
draws (issue T3-5 item 1; docs/diagnostics.md#stan).

Stan's ADVI and single-path Pathfinder report their draws with log p and their approximation's
log density; Stan computes k̂ on those 1,000 draws against the threshold for 1,000, while a
stanvi fit's verdict uses S_diag ≥ 4,000 draws, grown until k̂'s band is decided, and the PSIS
mean shift (:mod:`stanvi.diagnostics.verdict`).  Both Stan approximations are Gaussians in the
unconstrained space, and both can be recovered exactly from the output:

* ADVI: :func:`stanvi.reference.advi.stan_advi_gaussian` (``log_g__ = −|η|²/2``);
* Pathfinder: ``lp_approx__`` is log N(z; m, Σ) up to a constant, a quadratic in z whose
  D(D+1)/2 + D + 1 coefficients least squares recovers from the draws (:func:`quadratic_gaussian`;
  up to D = 43 with Stan's 1,000 draws).

The recovered Gaussian is then drawn from exactly as a stanvi fit's q
(:func:`stanvi.diagnostics.draws.gaussian_draws`).  Where it cannot be recovered (a larger
Pathfinder model, a precision that is not positive definite), the verdict is computed on Stan's
own draws, with the mean shift, and says so in a warning.  Where the default 1,000 draws cannot
identify q (full-rank ADVI from D = 45, Pathfinder from D = 44), :func:`recovery_options` asks
Stan for enough and :func:`default_run` gives back the run the default would have made.
"""

from __future__ import annotations

import numpy as np

from stanvi.diagnostics.draws import diagnostic_draw_cap, diagnostic_draw_count, gaussian_draws
from stanvi.diagnostics.report import Diagnostics, compute, decided_diagnostics
from stanvi.reference.advi import ADVI_DEFAULTS
from stanvi.reference.pathfinder import PATHFINDER_DEFAULTS

#: Per form of q recovered from Stan's output (:func:`draws_to_recover`): the Stan setting
#: that sets its number of output draws, and Stan's default for it
OUTPUT_DRAWS_SETTING = {"meanfield": ("output_samples", ADVI_DEFAULTS["output_samples"]),
                        "fullrank": ("output_samples", ADVI_DEFAULTS["output_samples"]),
                        "quadratic": ("num_draws", PATHFINDER_DEFAULTS["num_draws"])}


#: The most unknowns of q that :func:`draws_to_recover` asks Stan's output to identify:
#: single-path Pathfinder's quadratic at D = 100, (D+1)(D+2)/2 + 1 = 5,152 (full-rank ADVI's
#: D(D+1)/2 up to D = 101).  The least squares grows as D⁶: about 60 s at D = 90 in the T3-4
#: batch, past its 300 s at D = 175 (22,365 extra draws), gigabytes beyond.  Above it Stan's
#: default draws are kept and the verdict is computed on them, with a warning that says so.
RECOVERY_MAX_UNKNOWNS = 5152


def draws_to_recover(dim: int, form: str) -> int:
    """Output draws enough to recover a fit's Gaussian from Stan's output: Stan's default
    (1,000; :data:`OUTPUT_DRAWS_SETTING`) where they identify its unknowns, else one and a half
    times the unknowns.  The unknowns: D for
    mean-field ADVI and D(D+1)/2 for full rank (``form`` 'meanfield' / 'fullrank',
    :func:`~stanvi.reference.advi.stan_advi_gaussian`: full rank from D = 45), and
    (D+1)(D+2)/2 + 1 for single-path Pathfinder's quadratic ('quadratic',
    :func:`quadratic_gaussian`: from D = 44).  The batch asks this many (``output_samples``,
    ``num_draws``) so that Stan's fits get their ELBO and verdict by the rule of stanvi's
    (docs/diagnostics.md#stan); Stan draws them after its optimization, one log density each,
    so the fit and its first 1,000 draws are those of the default run.  Above
    :data:`RECOVERY_MAX_UNKNOWNS` unknowns, Stan's default: q is not recovered."""
    unknowns = {"meanfield": dim, "fullrank": dim * (dim + 1) // 2,
                "quadratic": (dim + 1) * (dim + 2) // 2 + 1}[form]
    default = int(OUTPUT_DRAWS_SETTING[form][1])
    if unknowns <= default or unknowns > RECOVERY_MAX_UNKNOWNS:
        return default
    return (3 * unknowns) // 2


def recovery_options(form: str | None, dim: int, options: dict) -> tuple[dict, int]:
    """``options`` for a Stan run whose q of ``form`` (:data:`OUTPUT_DRAWS_SETTING`'s keys; None:
    no q to recover, unchanged) is to be recovered: its output-draw setting at
    :func:`draws_to_recover` unless the caller set it; and how many draws that adds to Stan's
    default (0 where the default identifies q), which :func:`default_run` takes off again."""
    setting, default = OUTPUT_DRAWS_SETTING.get(form, (None, 0))
    if setting is None or setting in options:
        return dict(options), 0
    count = draws_to_recover(dim, form)
    return {**options, setting: count}, count - int(default)


def default_run(fit, extra: int):
    """``fit`` (Stan's ADVI or single-path Pathfinder, a
    :class:`~stanvi.reference.result.ReferenceFit`) as the run with Stan's default output draws:
    without its last ``extra`` draws (those :func:`recovery_options` added) and their log
    densities, one each, out of its ``density_evaluations``.  Stan draws its output after its
    optimization, in order, so these are the default run's draws; its ``wall_time`` still
    includes the extra draws' densities, a small part of it."""
    from dataclasses import replace  # noqa: PLC0415

    if not extra:
        return fit
    form = fit.settings.get("algorithm") if fit.algorithm == "stan-advi" else "quadratic"
    setting = OUTPUT_DRAWS_SETTING[form][0]
    kept = fit.num_draws - extra

    def first(arrays: dict | None) -> dict | None:
        return None if arrays is None else {k: v[:kept] for k, v in arrays.items()}

    return replace(fit, draws=first(fit.draws), stan_columns=first(fit.stan_columns),
                   log_p=None if fit.log_p is None else fit.log_p[:kept],
                   log_q=None if fit.log_q is None else fit.log_q[:kept],
                   density_evaluations=(None if fit.density_evaluations is None
                                        else fit.density_evaluations - extra),
                   settings={**fit.settings, setting: kept})


def quadratic_gaussian(z: np.ndarray, log_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(m, L) of the Gaussian whose log density, up to a constant, is ``log_q`` at the rows of
    z: −2 log q = zᵀPz − 2 (Pm)ᵀz + c is linear in P's entries, b = Pm and c (least squares).
    Raises ValueError when the draws are too few or P is not positive definite."""
    z = np.asarray(z, dtype=float)
    n, d = z.shape
    unknowns = d * (d + 1) // 2 + d + 1
    if n < unknowns + 1:   # before the design matrix, n × unknowns numbers (4 GB at D = 1,000)
        raise ValueError(f"{n} draws cannot identify a {d}-dimensional Gaussian "
                         f"(need {unknowns + 1})")
    rows, cols = np.triu_indices(d)
    design = np.column_stack([z[:, rows] * z[:, cols] * np.where(rows == cols, 1.0, 2.0),
                              -2.0 * z, np.ones(n)])
    coef = np.linalg.lstsq(design, -2.0 * np.asarray(log_q, dtype=float), rcond=None)[0]
    precision = np.zeros((d, d))
    precision[rows, cols] = coef[: rows.size]
    precision[cols, rows] = coef[: rows.size]
    try:
        cov = np.linalg.inv(precision)
        chol = np.linalg.cholesky(0.5 * (cov + cov.T))
    except np.linalg.LinAlgError:
        raise ValueError("the precision recovered from the draws is not positive definite") \
            from None
    return cov @ coef[rows.size: rows.size + d], chol


def stan_diagnostics(fit, target, unconstrained: dict[str, np.ndarray],
                     seed: int | None = None) -> Diagnostics:
    """The verdict of Stan's ADVI or single-path Pathfinder (``fit``: a
    :class:`~stanvi.reference.result.ReferenceFit`) by stanvi's rule (module docstring);
    ``unconstrained``: its draws in unconstrained space by ``target``'s unconstrained names
    (:func:`stanvi.targets.labelled.reference_unconstrained`), in draw order; ``seed``: of the
    fresh draws (None: those of every fit, :data:`stanvi.diagnostics.draws.DIAGNOSTIC_SEED`)."""
    from stanvi.reference.advi import stan_advi_gaussian  # noqa: PLC0415

    zeta = np.column_stack([np.asarray(unconstrained[n], dtype=float)
                            for n in target.unconstrained_names])
    method = fit.algorithm
    try:
        if method == "stan-advi":
            mean = np.asarray(target.unconstrain(fit.mean), dtype=float)
            chol = stan_advi_gaussian(fit, zeta, mean)   # kept on the fit: once for the ELBO too
        else:
            mean, chol = quadratic_gaussian(zeta, fit.log_q)
    except ValueError as exc:
        d = compute(fit.log_p, fit.log_q, method=method, z=zeta)
        d.warnings.append(f"k-hat on Stan's own {len(zeta)} draws: its Gaussian could not be "
                          f"recovered for fresh draws ({exc})")
        return d
    first = diagnostic_draw_count(zeta.shape[1], len(zeta))
    return decided_diagnostics(gaussian_draws(target, mean, chol, seed), first,
                               diagnostic_draw_cap(zeta.shape[1], first), method=method)


def fresh_draws_verdict(run, target, seed: int | None = None) -> Diagnostics:
    """:func:`stan_diagnostics` of ``run`` (Stan's ADVI or single-path Pathfinder) on
    ``target``, its draws mapped to the unconstrained space here; where they cannot be, k̂ on
    Stan's own draws, with a warning that says why."""
    from stanvi.targets.labelled import mapped_unconstrained  # noqa: PLC0415

    unconstrained, why = mapped_unconstrained(run, target)
    if unconstrained is None:
        d = compute(run.log_p, run.log_q, method=run.algorithm)
        d.warnings.append(f"k-hat on Stan's own {run.num_draws} draws: they cannot be mapped "
                          f"to the unconstrained space for fresh draws of q ({why})")
        return d
    return stan_diagnostics(run, target, unconstrained, seed)
