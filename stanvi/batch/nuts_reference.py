"""A NUTS reference posterior for a model that has none (issue T3-4, item 1;
docs/batch.md#nuts-references): Stan's NUTS in-process (:func:`stanvi.reference.nuts`, 4 chains, Stan's defaults)
on the compiled model, judged by the checks a Stan user makes before trusting draws, and run
once more with four times the warmup when it fails them.

The checks (Vehtari, Gelman, Simpson, Carpenter & Bürkner 2021, "Rank-normalization, folding,
and localization: an improved R-hat", §4–5): the largest rank-normalized split R-hat over all
elements at most :data:`MAX_RHAT` (1.01), the smallest bulk and tail ESS at least
:data:`MIN_ESS` (100 per chain: 400), and no divergent transition after warmup (Betancourt 2017,
§6.2: a divergence means the sampler missed part of the posterior).  A reference that still
fails after the second run is kept, marked untrustworthy with the reasons, so that accuracy
against it is reported with that mark rather than silently.

The draws go to ``<runs>/references/<model>.npz`` in the format the compile task writes for
posteriordb's references (``c:<element>`` constrained, ``u:<element>`` unconstrained where the
draws name every parameter), so the fit tasks compute accuracy against them in the same way.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

# the trust thresholds and rule (module docstring), shared with stanvi.compare's NUTS row
from stanvi.reference.result import MAX_RHAT, MIN_ESS, trust_reasons  # noqa: F401

#: The second run's warmup, as a multiple of the first's
LONGER_WARMUP = 4
#: Chains and draws per chain of a reference (Stan's defaults)
CHAINS = 4
WARMUP = 1000
SAMPLES = 1000


def _run(compiled, data, num_warmup: int) -> tuple[Any, dict[str, Any]]:
    """One NUTS run and its figures (diagnostics, wall time, gradients)."""
    from stanvi.reference import nuts  # noqa: PLC0415

    fit = nuts(compiled, data, chains=CHAINS, seed=0, num_warmup=num_warmup,
               num_samples=SAMPLES)
    diag = fit.nuts_figures()
    figures = {"num_warmup": num_warmup, "wall_time": fit.wall_time,
               "gradient_evaluations": fit.gradient_evaluations, **diag,
               "reasons": trust_reasons(diag)}
    return fit, figures


def nuts_reference(case, data, path: Path) -> dict[str, Any]:
    """The NUTS reference of one model (a :class:`~stanvi.batch.discover.ModelCase` and its
    data), written to ``path``; the record says whether it is trustworthy and why not."""
    from stanvi.evaluation.accuracy import labelled_draws, write_reference_npz  # noqa: PLC0415
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.stan.services_build import services_library  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    compiled = compile_model(case.stan, progress=False)
    t0 = time.perf_counter()
    services_library(compiled, progress=False)
    setup = time.perf_counter() - t0
    fit, figures = _run(compiled, data, WARMUP)
    attempts = [figures]
    if figures["reasons"]:
        fit, figures = _run(compiled, data, LONGER_WARMUP * WARMUP)
        attempts.append(figures)
    target = StanTarget(compiled, data, progress=False)
    unconstrained, why = write_reference_npz(path, target, labelled_draws(fit.stan_variables()))
    reasons = figures["reasons"]
    return {"status": "ok", "trustworthy": not reasons,
            "message": "; ".join(reasons) if reasons else "",
            "reference": str(path), "reference_draws": CHAINS * SAMPLES,
            "reference_unconstrained": unconstrained, "reference_message": why,
            "attempts": attempts, "setup_time": setup,
            "wall_time": setup + sum(a["wall_time"] for a in attempts)}
