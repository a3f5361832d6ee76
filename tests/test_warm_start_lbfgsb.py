"""The Laplace warm start's L-BFGS-B without ``import scipy.optimize`` (issue 8, part 3):
:func:`stanvi.methods.warm_start.drive_lbfgsb` drives SciPy's own L-BFGS-B extension and must
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

scipy_optimize = pytest.importorskip("scipy.optimize")

from stanvi.methods import warm_start as ws  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
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


def test_minimize_lbfgsb_uses_scipy_once_scipy_optimize_is_imported():
    # here scipy.optimize is imported (by this test module): SciPy's own minimize is called
    res = ws.minimize_lbfgsb(_rosenbrock, np.array([-1.2, 1.0]))
    ref = scipy_optimize.minimize(_rosenbrock, np.array([-1.2, 1.0]), jac=True,
                                  method="L-BFGS-B")
    np.testing.assert_array_equal(res.x, ref.x)
    assert res.nit == ref.nit


_FRESH = """
import json, sys
import numpy as np
from stanvi.methods import warm_start as ws
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
