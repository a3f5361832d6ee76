"""Compute each example model's mean-field optimum independently of every stanvi method, and
write it to ``<model dir>/<stem>.optimum.json`` (read by ``stanvi.evaluation.optima.load_optimum``,
``stanvi bench stopping`` and the tests).

    .venv/bin/python stan_models/compute_optima.py [name ...]     (also: name,name,...)

How (no TrustVI, ADVI, refinement or other stanvi method is used; stanvi's ElboEstimator is
only the evaluator of the model's batched log density and gradient):

1. A fixed set of 4,096 standard-normal draws ε_j (JAX key ``SEED``) defines the sample-average
   mean-field ELBO L̂(μ, ω) = mean_j [log p(μ + e^ω ⊙ ε_j)] + Σω + const (log p with every
   constant, propto = false).  A draw where the model cannot be evaluated makes L̂ = −∞.
2. scipy's L-BFGS-B maximizes L̂ from four starts, all with unit scales (ω = 0): μ = 0 (Stan's
   zero init); two Stan-style uniform(−2, 2) points; the mode of log p found by L-BFGS-B from
   0.  A start where L̂ is −∞ is retried with ω = −1, −2, … (recorded as ``start_omega``).  Each
   run is restarted twice from its end point (fresh curvature memory helps on ill-conditioned
   problems).  The starts' final values are recorded (``starts``) and must agree within
   ``AGREE`` = 0.05 nats.  Where their fixed-draw values differ by more, every start's end point
   is re-evaluated on the same fresh draws (``starts_fresh``): two mirror-image modes (as in
   ``hier_multiplicative``) have the same true ELBO but different fixed-draw values, and the
   fresh-draw values, with common random numbers, tell that apart from a real local optimum.
   ``starts_agree`` records the verdict.
3. The ELBO at the best point is re-estimated on ``N_EVAL`` = 100,000 fresh draws (keys
   ``SEED + 1 + i``, 10 chunks), with its standard error (``elbo``, ``elbo_se``).
4. Gaussian models (``gaussian``, ``gaussian_diag``, ``gaussian_ill``) have the exact optimum
   μ* = m, σ*_i = 1/√Λ_ii (Λ = Σ⁻¹), ELBO* = −½(log|Σ| + Σ_i log Λ_ii) (log Z = 0: the density
   is normalized).  For them the file holds the closed form (``"exact": true``, ``elbo_se``
   0, the posterior sds √Σ_ii in ``posterior_sd``) and, under ``numerical``, the numerical
   optimum's values and a fresh-draw estimate of the ELBO at the exact optimum, which checks
   the normalizing constant.

A model whose ELBO is −∞ for every Gaussian q (``reject_region``: p is zero where x > 2, and
every Gaussian puts mass there) gets ``"elbo": null`` and the reason.  ``ode`` is computed like
the others (its log density solves the ODE per draw: about a minute in all).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# The numerical procedure (steps 1-3) is stanvi.evaluation.optima's, shared with
# ``stanvi bench public-stopping``.
from stanvi.evaluation.optima import (  # noqa: E402
    METHOD,
    fresh_values,
    numerical_optimum,
    optimum_header,
)


def exact_gaussian(stem: str, data: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(m, Σ) of the Gaussian models, from their data files; None for other models."""
    if stem == "gaussian":
        return np.array(data["m"]), np.array(data["Sigma"])
    if stem == "gaussian_diag":
        return np.array(data["mu"]), np.diag(np.array(data["sigma"]) ** 2)
    if stem == "gaussian_ill":
        q = np.array(data["Q"])
        sigma = q @ np.diag(data["lambda"]) @ q.T
        return np.array(data["m"]), 0.5 * (sigma + sigma.T)
    return None


def closed_form(m: np.ndarray, cov: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(μ*, σ*, ELBO*) of the mean-field Gaussian closest to the normalized N(m, Σ)."""
    precision = np.linalg.inv(cov)
    sigma = 1.0 / np.sqrt(np.diag(precision))
    elbo = -0.5 * (np.linalg.slogdet(cov)[1] + np.sum(np.log(np.diag(precision))))
    return m, sigma, float(elbo)


def compute(stem: str, stan: Path, data_path: Path | None) -> dict:
    """The optimum record of one model (module docstring)."""
    import stanvi  # noqa: PLC0415

    target = stanvi.load_model(str(stan), data=str(data_path) if data_path else None,
                               progress=False)
    record = optimum_header(stem, target)
    numeric = numerical_optimum(target)
    data = json.loads(data_path.read_text()) if data_path else {}
    gauss = exact_gaussian(stem, data)
    if gauss is None:
        record.update(numeric)
        return record
    from stanvi.estimators.registry import estimator_for  # noqa: PLC0415
    from stanvi.families import MeanField  # noqa: PLC0415

    m, sigma, elbo = closed_form(*gauss)
    at_exact = fresh_values(estimator_for(target, MeanField(target.dim)),
                            np.concatenate([m, np.log(sigma)]), target.dim)
    numerical = {k: numeric[k] for k in ("elbo", "elbo_se", "starts", "start_omega",
                                         "start_spread", "starts_agree")}
    numerical["max_abs_mu_error"] = float(np.max(np.abs(np.array(numeric["mu"]) - m)))
    numerical["max_rel_sigma_error"] = float(np.max(np.abs(np.array(numeric["sigma"]) / sigma - 1)))
    numerical["elbo_fresh_at_exact"] = float(at_exact.mean())
    numerical["elbo_fresh_at_exact_se"] = float(at_exact.std() / np.sqrt(len(at_exact)))
    record.update(exact=True, elbo=elbo, elbo_se=0.0, mu=m.tolist(), sigma=sigma.tolist(),
                  posterior_sd=np.sqrt(np.diag(gauss[1])).tolist(),
                  method=METHOD + "; closed form stored, numerical optimum under 'numerical'",
                  numerical=numerical)
    return record


def main(names: list[str] | None = None) -> None:
    """Compute and write the optima of the named models (all with a data file if none)."""
    from stanvi.evaluation.models import discover_models  # noqa: PLC0415

    known = {stem for stem, _, _ in discover_models(HERE)}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        raise SystemExit(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    for stem, stan, data in discover_models(HERE):
        if names and stem not in names:
            continue
        t0 = time.perf_counter()
        record = compute(stem, stan, data)
        stan.with_suffix(".optimum.json").write_text(json.dumps(record, indent=1) + "\n")
        info = record.get("numerical", record)
        starts = {k: round(v, 3) for k, v in info.get("starts", {}).items()}
        print(f"{stem:28s} D={record['dim']:3d} ELBO*={record['elbo']} se={record.get('elbo_se')} "
              f"agree={info.get('starts_agree')} starts={starts} "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    args = [n for a in sys.argv[1:] for n in a.split(",") if n]
    main(args or None)
