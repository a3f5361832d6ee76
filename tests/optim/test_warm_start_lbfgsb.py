"""The Laplace warm start's L-BFGS-B without ``import scipy.optimize`` (issue 8, part 3):
:func:`stanvi.optim.lbfgsb.drive_lbfgsb` drives SciPy's own L-BFGS-B extension and must
give exactly what ``scipy.optimize.minimize(f, x0, jac=True, method="L-BFGS-B")`` gives: the
same points evaluated in the same order, the same x, f, iteration and evaluation counts and
status, on smooth, badly scaled, non-convex and partly infinite objectives, and when the
iteration or evaluation limit stops it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.optimize as scipy_optimize   # a dependency of stanvi: never skipped

from stanvi.optim import lbfgsb as ws

ROOT = Path(__file__).resolve().parents[2]
EXT = scipy_optimize._lbfgsb
needs_ext = pytest.mark.skipif(
    not str(getattr(EXT.setulb, "__doc__", "") or "").startswith(ws._SETULB_SIGNATURE),
    reason="this SciPy's L-BFGS-B extension has another interface (SciPy's path is used)")


def _recording(f):
    calls = []

    def wrapped(x):
        calls.append(np.array(x, copy=True))
        return f(x)
    return wrapped, calls


def _quadratic(rng, d, cond):
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    a = q @ np.diag(np.logspace(0, np.log10(cond), d)) @ q.T
    b = rng.standard_normal(d)
    return lambda x: (float(0.5 * x @ a @ x - b @ x), a @ x - b)


def _rosenbrock(x):
    f = float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return f, g


def _barrier(x):
    """Infinite outside the unit ball (as neg_log_p is where the model fails)."""
    r2 = float(x @ x)
    if r2 >= 1.0:
        return np.inf, np.zeros_like(x)
    return -np.log1p(-r2) + float(np.sum(x)), 2 * x / (1 - r2) + 1.0


def _np_scalar(x):  # f as a NumPy scalar / 0-d array, as some objectives return it
    f, g = _rosenbrock(x)
    return np.array(f), g


def _cases():
    rng = np.random.default_rng(8)
    cases = []
    for d in (1, 2, 5, 10, 30):
        for cond in (1.0, 1e3, 1e8):
            cases.append((f"quad{d}-{cond:g}", _quadratic(rng, d, cond),
                          rng.standard_normal(d) * 3, {}))
    for d in (2, 5, 10):
        cases.append((f"rosen{d}", _rosenbrock, rng.uniform(-2, 2, d), {}))
        cases.append((f"rosen{d}-maxiter", _rosenbrock, rng.uniform(-2, 2, d), {"maxiter": 7}))
        cases.append((f"rosen{d}-maxfun", _rosenbrock, rng.uniform(-2, 2, d), {"maxfun": 9}))
        cases.append((f"barrier{d}", _barrier, rng.uniform(-0.3, 0.3, d), {}))
        cases.append((f"np-scalar{d}", _np_scalar, rng.uniform(-2, 2, d), {}))
    cases.append(("barrier-outside", _barrier, np.array([2.0, 0.0]), {}))
    cases.append(("int-x0", _rosenbrock, np.array([3, -1, 2]), {}))
    cases.append(("nan-x0", _rosenbrock, np.array([np.nan, 1.0]), {}))
    return cases


@needs_ext
@pytest.mark.parametrize("name,f,x0,opts", _cases(), ids=[c[0] for c in _cases()])
def test_drive_lbfgsb_equals_scipy_minimize(name, f, x0, opts):
    options = {"maxiter": 15000, "maxfun": 15000, **opts}
    f_ref, ref_calls = _recording(f)
    with np.errstate(all="ignore"):
        ref = scipy_optimize.minimize(f_ref, x0, jac=True, method="L-BFGS-B", options=options)
    f_got, got_calls = _recording(f)
    with np.errstate(all="ignore"):
        got = ws.drive_lbfgsb(EXT, f_got, x0, maxcor=10, ftol=2.2204460492503131e-09,
                              gtol=1e-5, maxls=20, **options)
    assert len(got_calls) == len(ref_calls)
    for a, b in zip(got_calls, ref_calls):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(got.x, ref.x)
    assert (got.fun == ref.fun) or (np.isnan(got.fun) and np.isnan(ref.fun))
    np.testing.assert_array_equal(got.jac, ref.jac)
    assert (got.nit, got.nfev, got.status, got.success) == (ref.nit, ref.nfev, ref.status,
                                                            ref.success)


@needs_ext
def test_once_scipy_optimize_is_imported_its_own_extension_is_driven():
    """Here scipy.optimize is imported (by this test module): its extension module is the one
    driven (so the lockstep paths keep batching), with SciPy's results."""
    assert ws.lbfgsb_extension() is EXT
    res = ws.minimize_lbfgsb(_rosenbrock, np.array([-1.2, 1.0]))
    ref = scipy_optimize.minimize(_rosenbrock, np.array([-1.2, 1.0]), jac=True,
                                  method="L-BFGS-B")
    np.testing.assert_array_equal(res.x, ref.x)
    assert res.nit == ref.nit


_FRESH = """
import json, sys
import numpy as np
from stanvi.optim import lbfgsb as ws
def rosen(x):
    f = float(np.sum(100.0 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2))
    g = np.zeros_like(x)
    g[:-1] = -400.0 * x[:-1] * (x[1:] - x[:-1] ** 2) - 2 * (1 - x[:-1])
    g[1:] += 200.0 * (x[1:] - x[:-1] ** 2)
    return f, g
res = ws.minimize_lbfgsb(rosen, np.array([-1.2, 1.0, 0.5]), maxiter=1000, maxfun=2000)
fast = "scipy.optimize" not in sys.modules
import scipy.optimize
ref = scipy.optimize.minimize(rosen, np.array([-1.2, 1.0, 0.5]), jac=True, method="L-BFGS-B",
                              options={"maxiter": 1000, "maxfun": 2000})
print("RESULT " + json.dumps({"fast": fast, "same_x": bool(np.array_equal(res.x, ref.x)),
                              "attr": hasattr(scipy.optimize, "_lbfgsb"),
                              "same": [res.nit == ref.nit, res.nfev == ref.nfev,
                                       float(res.fun) == float(ref.fun)]}))
"""


@needs_ext
def test_fresh_process_minimizes_without_importing_scipy_optimize():
    out = subprocess.run([sys.executable, "-c", _FRESH], capture_output=True, text=True,
                         cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads([ln for ln in out.stdout.splitlines()
                      if ln.startswith("RESULT ")][-1].split(" ", 1)[1])
    # and a later import of scipy.optimize is the usual one (its _lbfgsb bound as an attribute)
    assert got == {"fast": True, "same_x": True, "attr": True, "same": [True, True, True]}


# ------------------------------------------------------------------ several paths in lockstep
def _rows(f, log):
    """A batched objective from a single-point one, logging each call's rows."""
    def rows(z):
        log.append(np.array(z, copy=True))
        out = [f(np.array(x)) for x in z]
        return np.array([o[0] for o in out], dtype=float), np.stack([o[1] for o in out])
    return rows


def _lockstep_objectives():
    rng = np.random.default_rng(3)
    quad = _quadratic(rng, 4, 1e3)
    return [(quad, rng.standard_normal(4) * 3), (_rosenbrock, rng.uniform(-2, 2, 4)),
            (quad, np.zeros(4)), (_rosenbrock, np.array([-1.2, 1.0, 0.5, 0.0]))]


@needs_ext
def test_lockstep_paths_are_each_their_own_run(monkeypatch):
    """Four paths of different lengths run together: each gets exactly its single run's x, f,
    iterations and evaluations, and every batched call holds one row per unfinished path."""
    monkeypatch.setattr(ws, "lbfgsb_extension", lambda: EXT)
    cases = _lockstep_objectives()

    singles = []
    for f, x0 in cases:
        rec, calls = _recording(f)
        singles.append((ws.minimize_lbfgsb(rec, x0), calls))
    log: list = []
    evaluated: list[list] = [[] for _ in cases]

    def rows(z):
        log.append(len(z))
        fs, gs = [], []
        for x in z:
            i = next(j for j, (got, (_, calls)) in enumerate(zip(evaluated, singles))
                     if len(got) < len(calls) and np.array_equal(calls[len(got)], x))
            evaluated[i].append(np.array(x))
            f, g = cases[i][0](x)
            fs.append(f)
            gs.append(g)
        return np.array(fs), np.stack(gs)

    results = ws.minimize_lbfgsb_lockstep(rows, [x0 for _, x0 in cases])
    for res, (single, calls), got in zip(results, singles, evaluated):
        np.testing.assert_array_equal(res.x, single.x)
        assert (res.fun, res.nit, res.nfev, res.status) == (single.fun, single.nit,
                                                            single.nfev, single.status)
        assert len(got) == len(calls)
    lengths = sorted(len(c) for _, c in singles)
    assert len(log) == lengths[-1] and log[0] == len(cases)
    assert log.count(len(cases)) == lengths[0]          # all four until the shortest ends


@needs_ext
@pytest.mark.parametrize("driver", ["extension", "scipy"])
def test_stop_ends_a_path_at_the_first_iterate_it_accepts(monkeypatch, driver):
    """``stop`` is asked at each new iterate; the path ends at the first one it accepts, which
    is the iterate of the unstopped run (the same with SciPy's own minimize)."""
    f, x0 = _rosenbrock, np.array([-1.2, 1.0, 0.5])
    monkeypatch.setattr(ws, "lbfgsb_extension", lambda: EXT)
    iterates: list = []
    full = ws.minimize_lbfgsb(f, x0, stop=lambda x: iterates.append(x) or False)
    assert full.status == 0 and len(iterates) == full.nit
    target = iterates[full.nit // 2]
    if driver == "scipy":
        monkeypatch.setattr(ws, "lbfgsb_extension", lambda: None)
    res = ws.minimize_lbfgsb(f, x0, stop=lambda x: np.array_equal(x, target))
    assert res.status == ws.STOPPED and not res.success
    np.testing.assert_array_equal(res.x, target)
    assert res.fun == f(target)[0]
    [again] = ws.minimize_lbfgsb_lockstep(_rows(f, []), [x0],
                                          stop=lambda i, x: np.array_equal(x, target))
    np.testing.assert_array_equal(again.x, target)
    assert again.status == ws.STOPPED


@needs_ext
def test_a_stop_costs_no_evaluation_on_either_driver(monkeypatch):
    """Stopped at an iterate, the path's evaluations are those of the unstopped run up to it,
    with SciPy's own minimize as with the extension (a fit's evaluation count must not depend
    on whether another module imported scipy.optimize)."""
    f, x0 = _rosenbrock, np.array([-1.2, 1.0, 0.5])
    monkeypatch.setattr(ws, "lbfgsb_extension", lambda: EXT)
    iterates: list = []
    ws.minimize_lbfgsb(f, x0, stop=lambda x: iterates.append(x) or False)
    target = iterates[len(iterates) // 2]
    counts = []
    for driver in (EXT, None):
        monkeypatch.setattr(ws, "lbfgsb_extension", lambda d=driver: d)
        rec, calls = _recording(f)
        res = ws.minimize_lbfgsb(rec, x0, stop=lambda x: np.array_equal(x, target))
        np.testing.assert_array_equal(res.x, target)
        counts.append(len(calls))
    assert counts[0] == counts[1]
