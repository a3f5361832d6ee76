"""L-BFGS-B without ``import scipy.optimize``, one path or several in lockstep
(docs/algorithms.md#lbfgsb; Byrd, Lu, Nocedal & Zhu 1995, the algorithm SciPy's extension runs).

``import scipy.optimize`` costs ~0.3 s of CPU in a new process (it imports scipy.linalg,
scipy.sparse, scipy.special, the linprog and shgo machinery ...), about a sixth of a first
TrustVI fit (issue 8, part 3).  The L-BFGS-B algorithm itself is one C extension module,
scipy.optimize._lbfgsb, driven from Python by reverse communication.  So where that module has
the interface of SciPy ≥ 1.15 (checked by its signature), it is loaded on its own and driven by a
transcription of SciPy's ``_minimize_lbfgsb`` loop for a function returning (f, g) with no bounds
and no callback, with ``ScalarFunction``'s caching (f and g are evaluated again only at a point
that differs from the last one).  ``tests/optim/test_warm_start_lbfgsb.py`` checks that it gives
``scipy.optimize.minimize(..., jac=True, method="L-BFGS-B")``'s x, f, iterations and evaluation
sequence exactly.  Where the module is not available in that form, scipy.optimize.minimize is
called (one path after the other; a ``stop`` ends a path through its callback).

The transcription is a generator (:func:`lbfgsb_points`): it yields each point where it needs
(f, g) and is sent the pair back.  One path is driven by :func:`minimize_lbfgsb`; several
independent paths by :func:`minimize_lbfgsb_lockstep`, which evaluates the points all of them
ask for in one batched call (one model call for k paths: less per-call overhead, and both cores
when the batch is worth it), each path's iterates exactly those of its own run.  A ``stop``
predicate on the new iterates ends a path early (TrustVI's extra paths stop on entering the
certified optimum's basin, docs/algorithms.md#second-start).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Generator
from types import SimpleNamespace

import numpy as np

_SETULB_SIGNATURE = ("setulb(m, x, l, u, nbd, f, g, factr, pgtol, wa, iwa, task, lsave, isave, "
                     "dsave, maxls, ln_task)")

#: SciPy's options of ``minimize(method="L-BFGS-B")`` used here, with its defaults
DEFAULTS = {"maxiter": 15000, "maxfun": 15000, "maxcor": 10, "ftol": 2.2204460492503131e-09,
            "gtol": 1e-5, "maxls": 20}
#: ``status`` of a path ended by its ``stop`` predicate (SciPy's are 0, 1 and 2)
STOPPED = 3

_LBFGSB_EXT = None


def lbfgsb_extension():
    """SciPy's L-BFGS-B extension: scipy.optimize's own copy when scipy.optimize is imported,
    else loaded on its own without importing scipy.optimize; None when its interface is not the
    one transcribed here (then SciPy's minimize runs, one path after the other)."""
    global _LBFGSB_EXT  # noqa: PLW0603
    mod = sys.modules.get("scipy.optimize._lbfgsb") or _LBFGSB_EXT
    if mod is None and "scipy.optimize" in sys.modules:
        return None
    if mod is None:
        try:
            import glob  # noqa: PLC0415
            import importlib.util  # noqa: PLC0415
            import os  # noqa: PLC0415

            import scipy  # noqa: PLC0415 (the bare package: ~10 ms)

            found = sorted(glob.glob(os.path.join(os.path.dirname(scipy.__file__), "optimize",
                                                  "_lbfgsb.*")))
            found = [f for f in found if not f.endswith((".py", ".pyi"))]
            if len(found) != 1:
                return None
            spec = importlib.util.spec_from_file_location("scipy.optimize._lbfgsb", found[0])
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception:  # noqa: BLE001 (any failure: SciPy's own path)
            return None
        if not str(getattr(getattr(mod, "setulb", None), "__doc__", "") or "").startswith(
                _SETULB_SIGNATURE):
            return None
        # kept here, not in sys.modules: a later `import scipy.optimize` then loads and binds
        # its own copy as usual (scipy.optimize._lbfgsb stays an attribute of the package)
        _LBFGSB_EXT = mod
    if not str(getattr(mod.setulb, "__doc__", "") or "").startswith(_SETULB_SIGNATURE):
        return None
    return mod


@functools.cache
def _int_dtype() -> type:
    """SciPy's L-BFGS-B integer type: int64 where its LAPACK is ILP64 (``HAS_ILP64``: a
    ``_flapack_64`` module exists), else int32; found without importing scipy.linalg."""
    import glob  # noqa: PLC0415
    import os  # noqa: PLC0415

    import scipy  # noqa: PLC0415

    ilp64 = glob.glob(os.path.join(os.path.dirname(scipy.__file__), "linalg", "_flapack_64*"))
    return np.int64 if ilp64 else np.int32


def _as_x0(x0) -> np.ndarray:
    """scipy.optimize.minimize's x0: a float 1-D array."""
    x0 = np.atleast_1d(np.asarray(x0))
    if x0.ndim != 1:
        raise ValueError("'x0' must only have one dimension.")
    if x0.dtype.kind in np.typecodes["AllInteger"]:
        x0 = np.asarray(x0, dtype=float)
    return np.asarray(x0).ravel()


def _scalar(fx):
    """``_ScalarFunctionWrapper``'s check of f."""
    if np.isscalar(fx):
        return fx
    dt = getattr(fx, "dtype", np.dtype(np.float64))
    try:
        return dt.type(np.asarray(fx).item())
    except (TypeError, ValueError) as e:
        raise ValueError("The user-provided objective function "
                         "must return a scalar value.") from e


Points = Generator[np.ndarray, tuple, SimpleNamespace]


def lbfgsb_points(ext, x0, *, maxiter: int, maxfun: int, maxcor: int, ftol: float,
                  gtol: float, maxls: int,
                  stop: Callable[[np.ndarray], bool] | None = None) -> Points:
    """SciPy's ``_minimize_lbfgsb`` loop (SciPy 1.15–1.18) around the extension module ``ext``'s
    ``setulb``, no bounds, no callback, as a generator: it yields each point where (f, g) is
    wanted (a copy), is sent ``(f, g)``, and returns the result (``StopIteration.value``: an
    object with ``x``, ``fun``, ``jac``, ``nit``, ``nfev``, ``status``, ``success``).
    ``stop(x)``, when given, is asked at every new iterate; True ends the path there with
    ``status`` :data:`STOPPED`."""
    x0 = _as_x0(x0)
    n, = x0.shape
    if not maxls > 0:
        raise ValueError("maxls must be positive.")
    dtype = x0.dtype if np.issubdtype(x0.dtype, np.floating) else np.float64
    # ScalarFunction(MemoizeJac(fun), grad=MemoizeJac.derivative), as minimize builds it: f and
    # g at x0 now; later f and g again only at an x that differs from the last one (with NaN
    # in x, ``x == memo`` is False: MemoizeJac then evaluates again for the gradient)
    memo: list = [None, None, None]   # x, f, g of the last evaluation

    def memo_compute(x: np.ndarray):  # MemoizeJac._compute_if_needed
        if memo[1] is None or memo[2] is None or not (x == memo[0]).all():
            memo[0] = x.copy()
            f, g = yield x.copy()
            memo[1], memo[2] = f, g

    cur = np.atleast_1d(x0).astype(dtype)
    nfev = 1
    yield from memo_compute(cur)
    f_cur = _scalar(memo[1])
    yield from memo_compute(cur)
    g_cur = np.atleast_1d(memo[2])

    int_dtype = _int_dtype()
    m = maxcor
    factr = ftol / np.finfo(float).eps
    nbd = np.zeros(n, dtype=int_dtype)
    low_bnd = np.zeros(n, dtype=np.float64)
    upper_bnd = np.zeros(n, dtype=np.float64)
    x = np.array(x0, dtype=np.float64)
    f = np.array(0.0, dtype=np.float64)
    g = np.zeros((n,), dtype=np.float64)
    wa = np.zeros(2 * m * n + 5 * n + 11 * m * m + 8 * m, np.float64)
    iwa = np.zeros(3 * n, dtype=int_dtype)
    task = np.zeros(2, dtype=int_dtype)
    ln_task = np.zeros(2, dtype=int_dtype)
    lsave = np.zeros(4, dtype=int_dtype)
    isave = np.zeros(44, dtype=int_dtype)
    dsave = np.zeros(29, dtype=np.float64)
    n_iterations = 0
    stopped = False
    while True:
        g = g.astype(np.float64)
        ext.setulb(m, x, low_bnd, upper_bnd, nbd, f, g, factr, gtol, wa, iwa, task, lsave,
                   isave, dsave, maxls, ln_task)
        if task[0] == 3:  # f and g wanted at x (ScalarFunction.fun_and_grad)
            if not (x == cur).all():  # np.array_equal: the same shape here
                cur = np.atleast_1d(np.asarray(x)).astype(dtype)
                yield from memo_compute(cur)
                nfev += 1
                f_cur = _scalar(memo[1])
                yield from memo_compute(cur)
                g_cur = np.atleast_1d(memo[2])
            f, g = f_cur, g_cur
        elif task[0] == 1:  # a new iterate
            n_iterations += 1
            if stop is not None and stop(x.copy()):
                stopped = True
                break
            if n_iterations >= maxiter:
                task[0] = 5
                task[1] = 504
            elif nfev > maxfun:
                task[0] = 5
                task[1] = 502
        else:
            break
    if stopped:
        warnflag = STOPPED
    elif task[0] == 4:
        warnflag = 0
    elif nfev > maxfun or n_iterations >= maxiter:
        warnflag = 1
    else:
        warnflag = 2
    return SimpleNamespace(fun=f, jac=g, nfev=nfev, njev=nfev, nit=n_iterations,
                           status=warnflag, success=(warnflag == 0), x=x,
                           task=(int(task[0]), int(task[1])))


def drive_lbfgsb(ext, fun_and_grad, x0: np.ndarray, *, maxiter: int, maxfun: int, maxcor: int,
                 ftol: float, gtol: float, maxls: int,
                 stop: Callable[[np.ndarray], bool] | None = None) -> SimpleNamespace:
    """:func:`lbfgsb_points` driven by ``fun_and_grad`` (returning (f, g)) to its end."""
    points = lbfgsb_points(ext, x0, maxiter=maxiter, maxfun=maxfun, maxcor=maxcor, ftol=ftol,
                           gtol=gtol, maxls=maxls, stop=stop)
    try:
        x = next(points)
        while True:
            x = points.send(fun_and_grad(x))
    except StopIteration as done:
        return done.value


class _Stopped(Exception):
    pass


def _scipy_minimize(fun_and_grad, x0, stop, options: dict):
    """scipy.optimize.minimize's L-BFGS-B, ended at the first new iterate ``stop`` accepts (its
    f and g are those of the last evaluation there: no evaluation is added)."""
    import scipy.optimize  # noqa: PLC0415

    last: dict = {}

    def evaluated(x):
        f, g = fun_and_grad(x)
        last.update(x=np.array(x, copy=True), f=f, g=g)
        return f, g

    def callback(xk):
        if stop(np.array(xk, copy=True)):
            last["stop"] = np.array(xk, copy=True)
            raise _Stopped

    try:
        return scipy.optimize.minimize(evaluated, x0, jac=True, method="L-BFGS-B",
                                       callback=callback if stop is not None else None,
                                       options=options)
    except _Stopped:
        x = last["stop"]
        f, g = ((last["f"], last["g"]) if np.array_equal(x, last.get("x"))
                else fun_and_grad(x))
        return SimpleNamespace(x=x, fun=f, jac=g, nit=-1, nfev=-1, status=STOPPED,
                               success=False)


def minimize_lbfgsb(fun_and_grad, x0: np.ndarray, *,
                    stop: Callable[[np.ndarray], bool] | None = None, **options):
    """``scipy.optimize.minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B",
    options=options)`` (no bounds; ``options`` among :data:`DEFAULTS`): the same iterates and
    result, without importing scipy.optimize where SciPy's L-BFGS-B extension can be driven
    directly (module docstring).  ``stop``: see :func:`lbfgsb_points`."""
    options = {**DEFAULTS, **options}
    ext = lbfgsb_extension()
    if ext is None:
        return _scipy_minimize(fun_and_grad, x0, stop, options)
    return drive_lbfgsb(ext, fun_and_grad, x0, stop=stop, **options)


def minimize_lbfgsb_lockstep(fun_and_grad_rows, x0s: list[np.ndarray], *,
                             stop: Callable[[int, np.ndarray], bool] | None = None,
                             **options) -> list[SimpleNamespace]:
    """Independent L-BFGS-B paths from each of ``x0s``, each exactly :func:`minimize_lbfgsb`'s
    run, their points evaluated together: ``fun_and_grad_rows(X)`` gets the (k, D) points the
    k unfinished paths want and returns (f of shape (k,), g of shape (k, D)).  ``stop(i, x)``
    ends path i at a new iterate x.  Where the extension cannot be driven, the paths run one
    after the other through SciPy."""
    options = {**DEFAULTS, **options}

    def stop_for(i):
        return None if stop is None else (lambda x: stop(i, x))

    ext = lbfgsb_extension()
    if ext is None:
        def one(x):
            f, g = fun_and_grad_rows(np.asarray(x, dtype=float)[None, :])
            return f[0], g[0]
        return [_scipy_minimize(one, x0, stop_for(i), options) for i, x0 in enumerate(x0s)]
    paths = [lbfgsb_points(ext, x0, stop=stop_for(i), **options) for i, x0 in enumerate(x0s)]
    results: list = [None] * len(paths)
    wanted = {}
    for i, path in enumerate(paths):
        try:
            wanted[i] = next(path)
        except StopIteration as done:
            results[i] = done.value
    while wanted:
        rows = list(wanted)
        f, g = fun_and_grad_rows(np.stack([wanted[i] for i in rows]))
        for j, i in enumerate(rows):
            try:
                wanted[i] = paths[i].send((f[j], g[j]))
            except StopIteration as done:
                results[i] = done.value
                del wanted[i]
    return results
