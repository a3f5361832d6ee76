"""Regenerate the simulated ``.data.json`` files of the example Stan models.

Run from anywhere:

    python stan_models/generate_data.py

Only numpy is needed. Every model uses its own fixed seed (below), so the
output is deterministic. Floats are rounded to 6 significant digits to keep
the files small. The hand-written data files (bernoulli, eight_schools, and
the empty ``{}`` files for funnel and student_t) are not touched.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

SEEDS = {
    "linear_regression": 1001,
    "logistic_regression": 1002,
    "poisson_glm": 1003,
    "hierarchical_radon": 1004,
    "constrained_params": 1005,
    "tp_gq": 1006,
    "ode": 1007,
    "reject_region": 1008,
    "gaussian": 1009,
    "gaussian_diag": 1010,
    "raw_regression": 1011,
    "raw_regression_interaction": 1012,
    "loglog_heights": 1013,
    "raw_logistic": 1014,
    "hier_multiplicative": 1015,
    "far_posterior": 1016,
    "gaussian_ill": 1017,
    "jointcv_logistic": 1018,
}


def _round(obj):
    """Round floats (recursively) to 6 significant digits; keep ints as ints."""
    if isinstance(obj, dict):
        return {k: _round(v) for k, v in obj.items()}
    if isinstance(obj, np.ndarray):
        return _round(obj.tolist())
    if isinstance(obj, (list, tuple)):
        return [_round(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        raise TypeError("booleans are not valid Stan data")
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(f"{float(obj):.6g}")
        return 0.0 if value == 0 else value  # no "-0.0"
    return obj


def _write(name: str, data: dict, filename: str | None = None) -> Path:
    path = HERE / name / (filename or f"{name}.data.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_round(data), separators=(",", ":"))
    path.write_text(text + "\n")
    return path


def linear_regression() -> dict:
    rng = np.random.default_rng(SEEDS["linear_regression"])
    n, k = 100, 3
    alpha, beta, sigma = 1.0, np.array([0.5, -1.0, 2.0]), 1.0
    x = rng.normal(size=(n, k))
    y = alpha + x @ beta + sigma * rng.normal(size=n)
    return {"N": n, "K": k, "X": x, "y": y}


def logistic_regression() -> dict:
    rng = np.random.default_rng(SEEDS["logistic_regression"])
    n, k = 1000, 5
    alpha, beta = -0.5, np.array([1.0, -0.5, 0.25, 0.0, 2.0])
    x = rng.normal(size=(n, k))
    p = 1.0 / (1.0 + np.exp(-(alpha + x @ beta)))
    y = (rng.uniform(size=n) < p).astype(int)
    return {"N": n, "K": k, "X": x, "y": y}


def poisson_glm() -> dict:
    rng = np.random.default_rng(SEEDS["poisson_glm"])
    n, k = 200, 2
    alpha, beta = 1.0, np.array([0.5, -0.3])
    x = rng.normal(size=(n, k))
    y = rng.poisson(np.exp(alpha + x @ beta))
    return {"N": n, "K": k, "X": x, "y": y}


def hierarchical_radon() -> dict:
    rng = np.random.default_rng(SEEDS["hierarchical_radon"])
    n, j = 900, 48  # unconstrained dimension 2 * 48 + 5 = 101
    mu_a, mu_b = 1.5, -0.7
    sigma_a, sigma_b, sigma_y = 0.35, 0.25, 0.75
    a = mu_a + sigma_a * rng.normal(size=j)
    b = mu_b + sigma_b * rng.normal(size=j)
    # Skewed county sizes like the Minnesota radon data: every county gets at
    # least one house, the rest are spread with log-normal weights.
    weights = rng.lognormal(mean=0.0, sigma=1.0, size=j)
    sizes = 1 + rng.multinomial(n - j, weights / weights.sum())
    county = np.repeat(np.arange(1, j + 1), sizes)  # 1-based for Stan
    x = (rng.uniform(size=n) < 0.2).astype(int)  # 1 = first floor
    y = a[county - 1] + b[county - 1] * x + sigma_y * rng.normal(size=n)
    return {"N": n, "J": j, "county": county, "x": x, "y": y}


def constrained_params() -> dict:
    rng = np.random.default_rng(SEEDS["constrained_params"])
    # 1. ordered logistic regression
    n_ord, p, k_ord = 200, 2, 4
    beta = np.array([1.0, -0.5])
    cut = np.array([-1.0, 0.5, 2.0])
    x = rng.normal(size=(n_ord, p))
    eta = x @ beta
    # P(y <= k) = inv_logit(c_k - eta); y = 1 + #{k : u > P(y <= k)}
    cdf = 1.0 / (1.0 + np.exp(-(cut[None, :] - eta[:, None])))
    u = rng.uniform(size=n_ord)
    y_ord = 1 + (u[:, None] > cdf).sum(axis=1)
    # 2. multinomial counts
    m, k_mult = 10, 4
    pi = np.array([0.1, 0.2, 0.3, 0.4])
    counts = rng.multinomial(50, pi, size=m)
    # 3. multivariate normal with correlation
    n_mvn, d = 100, 3
    mu = np.array([0.0, 1.0, -1.0])
    tau = np.array([1.0, 2.0, 0.5])
    omega = np.array([[1.0, 0.5, -0.3], [0.5, 1.0, 0.2], [-0.3, 0.2, 1.0]])
    cov = np.outer(tau, tau) * omega
    y_mvn = rng.multivariate_normal(mu, cov, size=n_mvn)
    return {
        "N_ord": n_ord, "P": p, "K_ord": k_ord, "X": x, "y_ord": y_ord,
        "M": m, "K_mult": k_mult, "counts": counts,
        "N_mvn": n_mvn, "D": d, "y_mvn": y_mvn,
    }


def tp_gq() -> dict:
    rng = np.random.default_rng(SEEDS["tp_gq"])
    n = 50
    alpha, beta, sigma = 2.0, -1.0, 0.5
    x = rng.uniform(-2.0, 2.0, size=n)
    y = alpha + beta * x + sigma * rng.normal(size=n)
    return {"N": n, "x": x, "y": y}


def ode() -> dict:
    rng = np.random.default_rng(SEEDS["ode"])
    t = 20
    r, k, y0, sigma = 0.8, 10.0, 0.5, 0.3
    ts = 0.5 * np.arange(1, t + 1)  # 0.5, 1.0, ..., 10.0
    y_true = k / (1.0 + (k / y0 - 1.0) * np.exp(-r * ts))  # closed form
    y_obs = y_true + sigma * rng.normal(size=t)
    return {"T": t, "t0": 0.0, "ts": ts, "y0": y0, "y_obs": y_obs}


def reject_region() -> dict:
    rng = np.random.default_rng(SEEDS["reject_region"])
    n = 10
    y = 1.5 + 1.0 * rng.normal(size=n)
    return {"N": n, "y": y}


def gaussian() -> dict:
    rng = np.random.default_rng(SEEDS["gaussian"])
    d, rho = 10, 0.8
    m = rng.normal(0.0, 2.0, size=d)
    scales = np.array([0.5, 1.0, 2.0, 0.8, 1.5, 3.0, 1.0, 0.6, 2.5, 1.2])
    idx = np.arange(d)
    corr = rho ** np.abs(idx[:, None] - idx[None, :])  # AR(1) correlation
    sigma = np.outer(scales, scales) * corr
    # Round, then mirror the upper triangle so the JSON matrix is exactly
    # symmetric (Stan's cov_matrix check requires symmetry).
    sigma = np.vectorize(lambda v: float(f"{v:.6g}"))(sigma)
    sigma = np.triu(sigma) + np.triu(sigma, 1).T
    np.linalg.cholesky(sigma)  # raises if not positive definite
    return {"D": d, "m": m, "Sigma": sigma}


def gaussian_diag() -> dict:
    rng = np.random.default_rng(SEEDS["gaussian_diag"])
    d = 100
    mu = rng.normal(0.0, 3.0, size=d)
    sigma = np.exp(rng.uniform(np.log(0.2), np.log(5.0), size=d))
    return {"D": d, "mu": mu, "sigma": sigma}


# ---- ill-conditioned posteriors of the kind public model collections are full of (issue P2-1)

def _people(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Raw, uncentred predictors: height (cm), weight (kg), age (years)."""
    height = rng.normal(170.0, 10.0, n)
    weight = 0.9 * (height - 170.0) + rng.normal(70.0, 10.0, n)
    age = rng.uniform(18.0, 80.0, n)
    return height, weight, age


def raw_regression() -> dict:
    rng = np.random.default_rng(SEEDS["raw_regression"])
    n = 200
    height, weight, age = _people(rng, n)
    y = -40.0 + 0.5 * height + 0.3 * weight - 0.1 * age + rng.normal(0.0, 5.0, n)
    return {"N": n, "height": height, "weight": weight, "age": age, "y": y}


def raw_regression_interaction() -> dict:
    rng = np.random.default_rng(SEEDS["raw_regression_interaction"])
    n = 150
    height, weight, _ = _people(rng, n)
    y = -30.0 + 0.3 * height + 0.5 * weight + 0.002 * height * weight + rng.normal(0.0, 5.0, n)
    return {"N": n, "height": height, "weight": weight, "y": y}


def loglog_heights() -> dict:
    rng = np.random.default_rng(SEEDS["loglog_heights"])
    n = 100
    height = rng.normal(170.0, 10.0, n)
    weight = np.exp(-7.5 + 2.3 * np.log(height) + rng.normal(0.0, 0.1, n))
    return {"N": n, "height": height, "weight": weight}


def raw_logistic() -> dict:
    rng = np.random.default_rng(SEEDS["raw_logistic"])
    n = 500
    income = rng.gamma(4.0, 12.5, n)  # thousands, mean 50
    age = rng.uniform(18.0, 80.0, n)
    eta = -4.0 + 0.04 * income + 0.04 * age
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-eta))).astype(int)
    return {"N": n, "income": income, "age": age, "y": y}


def hier_multiplicative() -> dict:
    rng = np.random.default_rng(SEEDS["hier_multiplicative"])
    groups, per_group = 60, 5
    g = np.repeat(np.arange(1, groups + 1), per_group)
    theta = rng.normal(3.0, 2.0, groups)
    y = theta[g - 1] + rng.normal(0.0, 1.0, groups * per_group)
    return {"J": groups, "N": groups * per_group, "g": g, "y": y}


def far_posterior() -> dict:
    rng = np.random.default_rng(SEEDS["far_posterior"])
    n = 50
    return {"N": n, "y": rng.normal(1500.0, 20.0, n)}


def gaussian_ill() -> dict:
    """N(m, Σ), D = 50, Σ = Q diag(λ) Qᵀ with a random rotation Q and eigenvalues λ log-spaced
    over [1e-3, 1e3] (condition number 1e6).  The data hold Q and λ (rounded), not Σ: rounding
    Σ itself to 6 digits would perturb it by ~1e-3, its smallest eigenvalue."""
    rng = np.random.default_rng(SEEDS["gaussian_ill"])
    d = 50
    q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return {"D": d, "m": rng.normal(size=d), "Q": q, "lambda": np.geomspace(1e-3, 1e3, d)}


def jointcv_logistic() -> dict:
    """N = 10,000 rows, K = 5 standardized covariates, no intercept; true beta ~ N(0, 6/K)
    (the recipe of docs/jointcv.md#simulated-data): a large-N model for method='jointcv' against
    full-batch methods."""
    rng = np.random.default_rng(SEEDS["jointcv_logistic"])
    n, k = 10_000, 5
    x = rng.normal(size=(n, k))
    x = (x - x.mean(0)) / x.std(0)
    beta = rng.normal(0.0, np.sqrt(6.0 / k), size=k)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-x @ beta))).astype(int)
    return {"N": n, "K": k, "X": x, "y": y}


GENERATORS = {
    "linear_regression": linear_regression,
    "logistic_regression": logistic_regression,
    "poisson_glm": poisson_glm,
    "hierarchical_radon": hierarchical_radon,
    "constrained_params": constrained_params,
    "tp_gq": tp_gq,
    "ode": ode,
    "reject_region": reject_region,
    "gaussian": gaussian,
    "gaussian_diag": gaussian_diag,
    "raw_regression": raw_regression,
    "raw_regression_interaction": raw_regression_interaction,
    "loglog_heights": loglog_heights,
    "raw_logistic": raw_logistic,
    "hier_multiplicative": hier_multiplicative,
    "far_posterior": far_posterior,
    "gaussian_ill": gaussian_ill,
    "jointcv_logistic": jointcv_logistic,
}


def main() -> None:
    for name, generate in GENERATORS.items():
        path = _write(name, generate())
        print(f"wrote {path.relative_to(HERE.parent)} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
