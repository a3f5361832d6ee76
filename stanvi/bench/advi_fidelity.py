"""``stanvi bench advi-fidelity``: does stanvi's ``advi`` (profile ``stan``) fail and choose η as
often as Stan's own C++ ADVI? (issue T3-2 item 1; docs/methods.md#advi-fidelity).

For each model and seed, stanvi's ADVI and ``stanvi.reference.stan_advi`` run on the same
compiled model and data with CmdStan's defaults (random inits, uniform(−2, 2)); the bench prints,
per model, each implementation's failures, its η choices (Stan's read from its log, or from its
failure message when the run failed after the adaptation) and, for each, the two-proportion z
statistic of the difference.  The two draw different random numbers, so only the rates compare.
Default models: the raw-unit regressions with an interaction of ``tests/models``
(``raw_height_weight``, ``kid_iq_interaction``) and ``stan_models/raw_regression_interaction``.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

ETAS = (100.0, 10.0, 1.0, 0.1, 0.01)
_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODELS = {
    "raw_height_weight": _ROOT / "tests" / "models" / "raw_height_weight",
    "kid_iq_interaction": _ROOT / "tests" / "models" / "kid_iq_interaction",
    "raw_regression_interaction": (_ROOT / "stan_models" / "raw_regression_interaction"
                                   / "raw_regression_interaction"),
}


def proportion_z(count_a: int, count_b: int, n: int) -> float:
    """Two-proportion z statistic (pooled variance) of count_a/n against count_b/n; 0 when both
    are 0 or both n."""
    pooled = (count_a + count_b) / (2 * n)
    if pooled in (0.0, 1.0):
        return 0.0
    return (count_a - count_b) / n / math.sqrt(pooled * (1 - pooled) * 2 / n)


def stan_outcome(compiled, data, seed: int) -> tuple[bool, float | None, str]:
    """(failed, η, message) of Stan's ADVI for one seed."""
    from stanvi.reference import stan_advi  # noqa: PLC0415
    from stanvi.reference.services_lib import ReferenceRunError  # noqa: PLC0415

    try:
        fit = stan_advi(compiled, data, seed=seed)
        text, failed, message = "\n".join(fit.messages), False, ""
    except ReferenceRunError as exc:
        text, failed, message = str(exc), True, str(exc).splitlines()[-1]
    found = re.search(r"Found best value \[eta = ([0-9.e+-]+)\]", text)
    return failed, float(found.group(1)) if found else None, message


def stanvi_outcome(target, seed: int) -> tuple[bool, float | None, str]:
    """(failed, η, message) of stanvi's ADVI (profile ``stan``) for one seed."""
    from stanvi.fit import fit  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = fit(target, method="advi", profile="stan", seed=seed, progress=False, draws=10)
    return result.status == "failed", result.info.get("eta"), str(result.message)


def compare(stem: Path, seeds: range) -> dict[str, Any]:
    """Both implementations over ``seeds`` on ``<stem>.stan`` with ``<stem>.data.json``."""
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415
    from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

    compiled = compile_model(stem.with_suffix(".stan"), progress=False)
    data = str(stem.with_suffix(".data.json"))
    target = StanTarget(compiled, data, progress=False)
    runs = {"stanvi": [stanvi_outcome(target, s) for s in seeds],
            "stan": [stan_outcome(compiled, data, s) for s in seeds]}
    n = len(seeds)
    out: dict[str, Any] = {"model": stem.name, "seeds": n, "runs": runs}
    for who, rows in runs.items():
        out[who] = {"failed": sum(r[0] for r in rows),
                    "eta": {str(e): sum(r[1] == e for r in rows) for e in ETAS},
                    "eta_unknown": sum(r[1] is None for r in rows),
                    "failed_by_eta": {str(e): sum(r[0] and r[1] == e for r in rows)
                                      for e in ETAS}}
    out["z_failed"] = proportion_z(out["stanvi"]["failed"], out["stan"]["failed"], n)
    out["z_eta"] = {str(e): proportion_z(out["stanvi"]["eta"][str(e)], out["stan"]["eta"][str(e)],
                                         n) for e in ETAS}
    return out


def print_comparison(res: dict[str, Any]) -> None:
    """One model's table: failures and η choices per implementation, with z."""
    n = res["seeds"]
    print(f"\n{res['model']}: {n} seeds")
    print(f"  {'':8s} {'failed':>7s} " + " ".join(f"{'eta=' + format(e, 'g'):>9s}" for e in ETAS)
          + "   failed at eta 100/10/1")
    for who in ("stanvi", "stan"):
        r = res[who]
        by = r["failed_by_eta"]
        print(f"  {who:8s} {r['failed']:7d} " + " ".join(f"{r['eta'][str(e)]:9d}" for e in ETAS)
              + f"   {by['100.0']}/{by['10.0']}/{by['1.0']}")
    print(f"  {'z':8s} {res['z_failed']:7.2f} "
          + " ".join(f"{res['z_eta'][str(e)]:9.2f}" for e in ETAS))
    messages = Counter(m.split(": ")[0][:70] for f, _, m in res["runs"]["stanvi"] if f)
    print("  stanvi's failures: " + "; ".join(f"{k} ({v})" for k, v in messages.most_common()))


def run(models: list[str] | None = None, *, seeds: int = 100,
        output: Path | None = None) -> list[dict[str, Any]]:
    """Compare on ``models`` (names of :data:`DEFAULT_MODELS`, or paths without suffix) over
    seeds 1..``seeds``; print and (``output``) write the figures."""
    results = []
    for name in models or list(DEFAULT_MODELS):
        stem = DEFAULT_MODELS.get(name) or Path(name)
        res = compare(stem, range(1, seeds + 1))
        print_comparison(res)
        results.append(res)
        if output is not None:
            Path(output).write_text(json.dumps(results, indent=1, default=str))
    return results
