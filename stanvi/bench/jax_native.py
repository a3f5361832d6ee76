"""``python -m stanvi.bench.jax_native``: JAX-native fits end to end on JAX's default device
(docs/benchmarks.md#gpu): a Bayesian logistic regression written in JAX (a
:class:`~stanvi.targets.JaxTarget`, N rows × D coefficients, N(0, 1) priors, simulated data),
fitted by TrustVI (mean-field and full-rank) and stanvi's ADVI. Prints per fit the backend, the
wall time of a first fit (compiles included) and of a second one with another seed, the status,
the ELBO and the model evaluations. Runs without the Stan toolchain, so the device machine can run
it as is.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np

from stanvi.fit import fit
from stanvi.targets import JaxTarget

RUNS = (("trustvi", "meanfield"), ("trustvi", "fullrank"), ("advi", "meanfield"))


def logistic_target(n: int = 20_000, d: int = 100, seed: int = 0) -> JaxTarget:
    """y ~ Bernoulli(logit⁻¹(X β)), β ~ N(0, 1); X standard normal / √d, β drawn from the prior."""
    rng = np.random.default_rng(seed)
    X = jnp.asarray(rng.standard_normal((n, d)) / np.sqrt(d))
    beta = rng.standard_normal(d)
    y = jnp.asarray((rng.uniform(size=n) < 1 / (1 + np.exp(-np.asarray(X) @ beta))).astype(float))

    def log_density(b):
        eta = X @ b
        return jnp.sum(y * eta - jnp.logaddexp(0.0, eta)) - 0.5 * jnp.sum(b * b)

    return JaxTarget(log_density, d, name=f"logistic_{n}x{d}")


def run(n: int = 20_000, d: int = 100, output: str | None = None) -> list[dict]:
    target = logistic_target(n, d)
    print(f"JAX-native fits: {target.name}, backend {jax.default_backend()} "
          f"({jax.devices()[0].device_kind})", flush=True)
    rows = []
    for method, family in RUNS:
        for seed, label in ((0, "first"), (1, "second")):
            t = time.perf_counter()
            result = fit(target, method=method, family=family, seed=seed, progress=False)
            sec = time.perf_counter() - t
            elbo = result.elbo_trace()[:, 1]
            elbo = elbo[np.isfinite(elbo)]
            row = {"method": method, "family": family, "fit": label, "seconds": sec,
                   "compile_seconds": result.compile_time, "status": result.status,
                   "elbo": float(elbo[-1]) if elbo.size else float("nan"),
                   "evaluations": int(result.oracle.get("gradient_draws", 0)
                                      + result.oracle.get("hvp_draws", 0)),
                   "backend": jax.default_backend()}
            rows.append(row)
            print(f"  {method:<8} {family:<9} {label:<6} {sec:7.2f} s  {result.status:<10} "
                  f"ELBO {row['elbo']:.2f}  evaluations {row['evaluations']:,}", flush=True)
    if output:
        with open(output, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--d", type=int, default=100)
    ap.add_argument("--output", default=None)
    a = ap.parse_args()
    run(a.n, a.d, a.output)
