"""``stanvi bench fullrank``: peak memory, time and accuracy of full-rank fits as D grows
(issue 17 item 6).

The model is ``x ~ normal(1, 2)`` with ``vector[D] x`` (:data:`MODEL_CODE`, D as data): the
posterior is known exactly (every mean 1, every sd 2, independent), and the full-rank family
contains it, so a correct fit has q's means at 1 and q's marginal sds at 2.  Its cost is almost
all in the variational machinery, not the model: P = D + D(D+1)/2 variational parameters
(2,003,000 at D = 2,000), a D×D factor of 32 MB.

Each fit (method × D) runs in a fresh Python process (:mod:`subprocess`), so its peak resident
memory (``ru_maxrss`` of that process) is the fit's own, imports and JAX included.  The parent
also polls the child's resident memory and kills it above ``max_memory_gb`` (default 8 GB, to
keep a shared machine usable), or after ``timeout`` seconds; such a fit is reported as
``killed`` with the memory seen so far.  The Stan model is compiled once, before the first fit
(the compile cache is content-addressed, so later runs reuse it).

Printed per fit: status, peak RSS (GB), the method's wall time (``Fit.wall_time``, JAX
compilation included) and the whole process's time, and accuracy from q's own parameters:
``max |mean − 1|``, ``max |sd/2 − 1|`` over the D coordinates, and the mean of q's means.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

MODEL_CODE = """// x ~ normal(1, 2) in D dimensions (stanvi bench fullrank; issue 17 item 6)
data {
  int<lower=1> D;
}
parameters {
  vector[D] x;
}
model {
  x ~ normal(1, 2);
}
"""
DEFAULT_DIMS: tuple[int, ...] = (500, 1000, 2000)
DEFAULT_METHODS: tuple[str, ...] = ("trustvi", "advi")

# The child process: one full-rank fit, one JSON line.
_CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
import numpy as np
import stanvi
model, dim, method = sys.argv[1], int(sys.argv[2]), sys.argv[3]
fit = stanvi.fit(model, data={"D": dim}, method=method, family="fullrank", seed=int(sys.argv[4]),
                 progress=False)
mean = np.asarray(fit.family.mean(fit.params), dtype=float)
sd = np.asarray(fit.family.marginal_sd(fit.params), dtype=float)
diag = fit.diagnostics()
print("STANVI_FULLRANK " + json.dumps({
    "status": fit.status, "message": fit.message[:300], "wall": fit.wall_time,
    "compile": fit.compile_time, "process": time.perf_counter() - t0,
    "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    "max_mean_err": float(np.max(np.abs(mean - 1.0))), "max_sd_err": float(np.max(np.abs(sd / 2.0 - 1.0))),
    "mean_of_means": float(mean.mean()), "iterations": len(fit.trace) - 1,
    "khat": float(diag.khat), "verdict": diag.verdict}))
"""


def model_file() -> Path:
    """The benchmark's model, written once under the stanvi cache directory."""
    from stanvi.stan.cache import cache_root  # noqa: PLC0415

    path = cache_root() / "bench" / "normal_d.stan"
    if not path.exists() or path.read_text() != MODEL_CODE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(MODEL_CODE)
    return path


def _rss_gb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def run_one(model: Path, dim: int, method: str, *, seed: int = 0, max_memory_gb: float = 8.0,
            timeout: float = 1800.0) -> dict:
    """One fit in a fresh process; returns its figures (``status`` 'killed' when the memory cap
    or the timeout stopped it, 'error' when the process failed)."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(model), str(dim), method, str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    seen, reason = 0.0, ""
    while proc.poll() is None:
        seen = max(seen, _rss_gb(proc.pid))
        elapsed = time.perf_counter() - start
        if seen > max_memory_gb or elapsed > timeout:
            reason = (f"resident memory above {max_memory_gb:g} GB" if seen > max_memory_gb
                      else f"over {timeout:g} s")
            proc.kill()
            break
        time.sleep(0.25)
    out, err = proc.communicate()
    elapsed = time.perf_counter() - start
    base = {"method": method, "dim": dim, "seed": seed}
    if reason:
        return {**base, "status": "killed", "message": f"killed after {elapsed:.0f} s: {reason}",
                "peak_gb": seen, "process": elapsed}
    for line in out.splitlines():
        if line.startswith("STANVI_FULLRANK "):
            return {**base, **json.loads(line.split(" ", 1)[1])}
    return {**base, "status": "error", "message": (err.strip().splitlines() or ["no output"])[-1],
            "peak_gb": seen, "process": elapsed}


def format_table(results: Sequence[dict]) -> str:
    head = (f"{'method':<8} {'D':>5} {'status':<10} {'peak GB':>8} {'wall s':>8} {'process s':>9} "
            f"{'max|mean-1|':>12} {'max|sd/2-1|':>12} {'mean(means)':>11} {'k-hat':>6}")
    lines = [head, "-" * len(head)]
    for r in results:
        def num(key, fmt):
            v = r.get(key)
            return format(v, fmt) if isinstance(v, (int, float)) else "-"
        lines.append(f"{r['method']:<8} {r['dim']:>5} {r['status']:<10} {num('peak_gb', '8.2f')} "
                     f"{num('wall', '8.1f')} {num('process', '9.1f')} {num('max_mean_err', '12.2e')} "
                     f"{num('max_sd_err', '12.2e')} {num('mean_of_means', '11.3f')} "
                     f"{num('khat', '6.2f')}")
    return "\n".join(lines)


def run(dims: Sequence[int] = DEFAULT_DIMS, methods: Sequence[str] = DEFAULT_METHODS, *,
        seed: int = 0, max_memory_gb: float = 8.0, timeout: float = 1800.0,
        output: Path | None = None) -> list[dict]:
    """Run every (method, D) fit in its own process, print the table, optionally write JSON."""
    model = model_file()
    print(f"stanvi bench fullrank: x ~ normal(1, 2), D = {', '.join(map(str, dims))}; "
          f"methods {', '.join(methods)} (default profiles), seed {seed}; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    from stanvi.stan.compiler import compile_model  # noqa: PLC0415

    compile_model(model)  # once, outside the timed processes
    results = []
    for dim in dims:
        for method in methods:
            r = run_one(model, int(dim), method, seed=seed, max_memory_gb=max_memory_gb,
                        timeout=timeout)
            r["load"] = os.getloadavg()[0]
            results.append(r)
            print(f"  {method} D={dim}: {r['status']} peak {r.get('peak_gb', 0):.2f} GB, "
                  f"{r.get('process', 0):.0f} s ({r.get('message', '')[:120]})", flush=True)
            if output is not None:
                output.write_text(json.dumps(results, indent=1))
    print()
    print(format_table(results))
    print(f"\nload average at the end: {os.getloadavg()[0]:.1f}")
    return results
