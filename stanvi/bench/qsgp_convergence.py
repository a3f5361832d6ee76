"""``stanvi bench qsgp --models convergence``: issue T3-8's table (docs/gp.md#convergence).

QSGP's and svi's predictive mean against the closed-form posterior's (``method="exact"``) on a
regression with n = 4000, d = 3, m = 400 RFF, θ fixed, noise variance 0.04.
"""

from __future__ import annotations

import time

import numpy as np

from stanvi.bench.qsgp_bench import simulate
from stanvi.gp.model import rff_regression


CONVERGENCE_RUNS = (("svi", 20_000, {}),
                    ("qsgp", 20_000, {}),
                    ("qsgp", 20_000, {"basis_batch_size": 100}),
                    ("qsgp", 6_000, {}),
                    ("qsgp", 20_000, {"lr": 0.5}),
                    ("qsgp", 20_000, {"full_basis_pass": False}))
"""(method, steps, options) of the convergence table (docs/gp.md#convergence): issue T3-8's
four rows with the current defaults, a larger AdaGrad rate, then the old behaviour
(m iid basis draws instead of a full pass)."""


def bench_convergence(runs=CONVERGENCE_RUNS, n: int = 4000, m: int = 400, d: int = 3,
                      noise: float = 0.04, nt: int = 200, cv_rank: int = 200) -> dict:
    """Issue T3-8's table (docs/gp.md#convergence): regression with n = 4000, d = 3, m = 400
    RFF, θ fixed, noise variance 0.04; relative error of the predictive mean at 500 test inputs
    against ``method="exact"``, for svi (batch 200) and QSGP (n~ = 200, n̄ = 200, otherwise the
    defaults: m~ = 10⁴ >= m, so a full pass over the m bases, AdaGrad lr 0.1 decaying to 0.01)."""
    from stanvi.gp.dispatch import fit_gp  # noqa: PLC0415

    X, y, _ = simulate(n + 500, "gaussian", seed=0, d=d)
    model = rff_regression(X[:n], y[:n], m=m, lengthscale=0.5, noise=noise)
    exact_mean = np.asarray(fit_gp(model, method="exact").predict(X[n:]).mean)
    out = {}
    for method, steps, extra in runs:
        kw = dict(batch_size=nt, num_steps=steps, chunk=1000)
        if method == "qsgp":
            kw.update(cv_rank=cv_rank, learn_hyperparameters=False, **extra)
        t = time.perf_counter()
        res = fit_gp(model, method=method, **kw)
        sec = time.perf_counter() - t
        mean = np.asarray(res.predict(X[n:]).mean)
        rel = float(np.linalg.norm(mean - exact_mean) / np.linalg.norm(exact_mean))
        label = f"{method} {extra}" if extra else method
        out[f"{label}, {steps}"] = {"rel_err_vs_exact": rel, "seconds": sec}
        print(f"  {label:<48} {steps:>6} steps  relative error {rel:.3f}  {sec:.0f} s",
              flush=True)
    return out
