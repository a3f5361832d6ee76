"""Compute each example model's mean-field optimum independently of every stanvi method, and
write it to ``<model dir>/<stem>.optimum.json`` (read by ``stanvi.bench.optima.load_optimum``,
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
from importlib import metadata
from pathlib import Path

import jax
import numpy as np
import scipy.optimize

HERE = Path(__file__).resolve().parent
N_FIT, N_EVAL, SEED = 4096, 100_000, 4096
EVAL_CHUNKS = 10
AGREE = 0.05  # nats: the starts must reach the same optimum within this
INFEASIBLE = 1e300
METHOD = ("L-BFGS-B (scipy) on the 4,096-draw sample-average mean-field ELBO from four starts "
          "with unit scales (mu = 0; two Stan-style uniform(-2, 2) points; the L-BFGS-B mode of "
          "log p), each restarted twice from its end point; best start kept; ELBO re-estimated "
          "on 100,000 fresh draws")


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


def fresh_values(est, params: np.ndarray, dim: int) -> np.ndarray:
    """ℓ(λ; ε) on the ``N_EVAL`` fresh draws (the same draws for every call)."""
    n = N_EVAL // EVAL_CHUNKS
    return np.concatenate([est.values(params, standard_normal_draws(SEED + 1 + i, n, dim))
                           for i in range(EVAL_CHUNKS)])


def standard_normal_draws(seed: int, n: int, dim: int) -> np.ndarray:
    """(n, dim) standard normal draws from JAX key ``seed``."""
    from stanvi.estimators.elbo import standard_normal  # noqa: PLC0415

    return standard_normal(jax.random.PRNGKey(seed), n, dim)


def numerical_optimum(target) -> dict:
    """Steps 1-3 of the module docstring."""
    from stanvi.estimators.elbo import estimator_for  # noqa: PLC0415
    from stanvi.families import MeanField  # noqa: PLC0415

    dim = target.dim
    est = estimator_for(target, MeanField(dim))
    eps = standard_normal_draws(SEED, N_FIT, dim)

    def negative_elbo(p: np.ndarray) -> tuple[float, np.ndarray]:
        values, grads = est.values_and_grads(p, eps)
        if not (np.all(np.isfinite(values)) and np.all(np.isfinite(grads))):
            return INFEASIBLE, np.zeros_like(p)
        return -float(values.mean()), -grads.mean(axis=0)

    def negative_log_p(z: np.ndarray) -> tuple[float, np.ndarray]:
        res = target.log_density_gradient(z[None, :])
        if not bool(res.ok[0]):
            return INFEASIBLE, np.zeros(dim)
        return -float(res.log_density[0]), -np.asarray(res.gradient[0])

    rng = np.random.default_rng(1)
    starts = {"zero": np.zeros(dim)}
    for i in range(2):
        starts[f"uniform{i}"] = rng.uniform(-2.0, 2.0, dim)
    mode = scipy.optimize.minimize(negative_log_p, np.zeros(dim), jac=True, method="L-BFGS-B",
                                   options={"maxiter": 5000})
    if np.all(np.isfinite(mode.x)) and mode.fun < INFEASIBLE:
        starts["mode"] = mode.x
    results: dict[str, tuple[float, np.ndarray]] = {}
    start_omega: dict[str, float] = {}
    for name, mu0 in starts.items():
        for omega0 in (0.0, -1.0, -2.0, -4.0, -8.0):
            p = np.concatenate([mu0, np.full(dim, omega0)])
            if negative_elbo(p)[0] < INFEASIBLE:
                break
        else:
            continue
        start_omega[name] = omega0
        for _ in range(3):
            res = scipy.optimize.minimize(negative_elbo, p, jac=True, method="L-BFGS-B",
                                          options={"maxiter": 20_000, "maxfun": 40_000,
                                                   "maxcor": 50, "gtol": 1e-10, "ftol": 1e-15})
            p = res.x
        results[name] = (-float(res.fun), p)
    if not results:
        return {"elbo": None, "reason": "the sample-average ELBO is -inf at every start"}
    best = max(results, key=lambda k: results[k][0])
    p = results[best][1]
    values = fresh_values(est, p, dim)
    finite = np.isfinite(values)
    fixed = {k: v[0] for k, v in results.items()}
    spread = max(fixed.values()) - min(fixed.values())
    out = {"mu": p[:dim].tolist(), "sigma": np.exp(p[dim:]).tolist(), "best_start": best,
           "starts": fixed, "start_omega": start_omega, "start_spread": spread,
           "failed_fraction": float(1.0 - finite.mean())}
    if not finite.all():
        out.update(elbo=None, elbo_se=None, starts_agree=None,
                   reason=f"{int((~finite).sum())} of {len(values)} fresh draws of the best q "
                   "fail (the model rejects them): the ELBO is -inf for every Gaussian q, "
                   "because p is zero on part of the space")
        return out
    out.update(elbo=float(values.mean()), elbo_se=float(values.std() / np.sqrt(len(values))))
    out["starts_agree"] = bool(spread <= AGREE)
    if spread > AGREE:  # common-random-number comparison of the end points on the fresh draws
        fresh = {}
        for k, (_, pk) in results.items():
            vk = values if k == best else fresh_values(est, pk, dim)
            d = vk - values
            fresh[k] = {"elbo": float(vk.mean()),
                        "minus_best": float(d.mean()),
                        "minus_best_se": float(d.std() / np.sqrt(len(d)))}
        out["starts_fresh"] = fresh
        out["starts_agree"] = bool(all(abs(f["minus_best"]) <= AGREE for f in fresh.values()))
    return out


def compute(stem: str, stan: Path, data_path: Path | None) -> dict:
    """The optimum record of one model (module docstring)."""
    import stanvi  # noqa: PLC0415
    from stanvi.stan.toolchain import find_toolchain  # noqa: PLC0415

    target = stanvi.load(str(stan), data=str(data_path) if data_path else None, progress=False)
    record = {"model": stem, "dim": target.dim, "n_draws_fit": N_FIT, "n_draws_eval": N_EVAL,
              "seed": SEED, "stanvi": metadata.version("stanvi"),
              "stanc": find_toolchain().stanc_version, "method": METHOD, "exact": False}
    numeric = numerical_optimum(target)
    data = json.loads(data_path.read_text()) if data_path else {}
    gauss = exact_gaussian(stem, data)
    if gauss is None:
        record.update(numeric)
        return record
    from stanvi.estimators.elbo import estimator_for  # noqa: PLC0415
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
    sys.path.insert(0, str(HERE.parent))
    from stanvi.bench.methods_bench import discover_models  # noqa: PLC0415

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
