"""A Laplace warm start for variational methods: the mode of log p found by L-BFGS, and q's
scales from the Hessian there (stanvi's addition, docs/methods.md, "Why `default` changed").

Stan's initialization, uniform(−2, 2) on the unconstrained scale, is far from posteriors in raw
units (a regression on heights in cm: the initial ELBO is −3e9; a mean near 1,500: a hundred
nats short for every method tried).  Pathfinder (Zhang, Carpenter, Gelman & Vehtari 2022, JMLR
23(306), §2) starts from the L-BFGS path of log p for the same reason.  Here:

1. L-BFGS (SciPy's L-BFGS-B, no bounds; :func:`minimize_lbfgsb`) maximizes log p from the initial point, at most
   ``max_iters`` iterations; one batched gradient call per evaluation.
2. The Hessian H at the end point, from D Hessian-vector products in one batched call.
3. q₀ = N(z*, diag(1/Λ_ii)) for mean-field (the mean-field optimum if p were Gaussian with
   precision Λ = −H; Bishop 2006, §10.1.2), N(z*, Λ⁻¹) for full rank.
4. A safeguard, since a mode need not exist or be representative (a funnel's density is
   unbounded at its neck): the ELBO of q₀ and of the method's own initial q are estimated on the
   same ``n_compare`` draws, and the warm start is kept only if it is higher.

Every evaluation is charged to the method's ledger (gradients, HVPs, log densities).
"""

from __future__ import annotations

import math
import sys
from types import SimpleNamespace

import numpy as np
import jax

from stanvi.estimators.elbo import mean_of_valid, standard_normal
from stanvi.methods.base import OracleLedger


# ------------------------------------------------------------------ L-BFGS-B without scipy.optimize
# ``import scipy.optimize`` costs ~0.3 s of CPU in a new process (it imports scipy.linalg,
# scipy.sparse, scipy.special, the linprog and shgo machinery ...), about a sixth of a first
# TrustVI fit (issue 8, part 3).  The L-BFGS-B algorithm itself is one C extension module,
# scipy.optimize._lbfgsb, driven from Python by reverse communication.  So where that module has
# the interface of SciPy ≥ 1.15 (checked by its signature), it is loaded on its own and driven
# by a transcription of SciPy's ``_minimize_lbfgsb`` loop for a function returning (f, g) with
# no bounds and no callback, with ``ScalarFunction``'s caching (f and g are evaluated again only
# at a point that differs from the last one).  ``tests/test_warm_start_lbfgsb.py`` checks that it
# gives ``scipy.optimize.minimize(..., jac=True, method="L-BFGS-B")``'s x, f, iterations and
# evaluation sequence exactly.  Where the module is not available in that form, or
# scipy.optimize is imported already, scipy.optimize.minimize is called.

_SETULB_SIGNATURE = ("setulb(m, x, l, u, nbd, f, g, factr, pgtol, wa, iwa, task, lsave, isave, "
                     "dsave, maxls, ln_task)")


_LBFGSB_EXT = None


def _lbfgsb_extension():
    """scipy.optimize._lbfgsb loaded without importing scipy.optimize, or None when it cannot be
    (another interface, or scipy.optimize is imported anyway: then its minimize is as cheap)."""
    global _LBFGSB_EXT  # noqa: PLW0603
    if "scipy.optimize" in sys.modules:
        return None
    mod = sys.modules.get("scipy.optimize._lbfgsb") or _LBFGSB_EXT
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


def _int_dtype() -> type:
    """SciPy's L-BFGS-B integer type: int64 where its LAPACK is ILP64 (``HAS_ILP64``: a
    ``_flapack_64`` module exists), else int32; found without importing scipy.linalg."""
    import glob  # noqa: PLC0415
    import os  # noqa: PLC0415

    import scipy  # noqa: PLC0415

    ilp64 = glob.glob(os.path.join(os.path.dirname(scipy.__file__), "linalg", "_flapack_64*"))
    return np.int64 if ilp64 else np.int32


def minimize_lbfgsb(fun_and_grad, x0: np.ndarray, *, maxiter: int = 15000, maxfun: int = 15000,
                    maxcor: int = 10, ftol: float = 2.2204460492503131e-09, gtol: float = 1e-5,
                    maxls: int = 20):
    """``scipy.optimize.minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B",
    options={"maxiter": ..., "maxfun": ...})`` (no bounds): the same iterates and result, without
    importing scipy.optimize where SciPy's L-BFGS-B extension can be driven directly (see the
    comment above).  Returns an object with ``x``, ``fun``, ``jac``, ``nit``, ``nfev``,
    ``status``, ``success`` (a SciPy ``OptimizeResult`` on SciPy's own path)."""
    ext = _lbfgsb_extension()
    if ext is None:
        import scipy.optimize  # noqa: PLC0415

        return scipy.optimize.minimize(fun_and_grad, x0, jac=True, method="L-BFGS-B",
                                       options={"maxiter": maxiter, "maxfun": maxfun,
                                                "maxcor": maxcor, "ftol": ftol, "gtol": gtol,
                                                "maxls": maxls})
    return drive_lbfgsb(ext, fun_and_grad, x0, maxiter=maxiter, maxfun=maxfun, maxcor=maxcor,
                        ftol=ftol, gtol=gtol, maxls=maxls)


def drive_lbfgsb(ext, fun_and_grad, x0: np.ndarray, *, maxiter: int, maxfun: int, maxcor: int,
                 ftol: float, gtol: float, maxls: int):
    """SciPy's ``_minimize_lbfgsb`` loop (SciPy 1.15–1.18) around the extension module ``ext``'s
    ``setulb``, for ``fun_and_grad`` returning (f, g), no bounds, no callback."""
    # scipy.optimize.minimize: x0 as a float 1-D array
    x0 = np.atleast_1d(np.asarray(x0))
    if x0.ndim != 1:
        raise ValueError("'x0' must only have one dimension.")
    if x0.dtype.kind in np.typecodes["AllInteger"]:
        x0 = np.asarray(x0, dtype=float)
    x0 = np.asarray(x0).ravel()
    n, = x0.shape
    if not maxls > 0:
        raise ValueError("maxls must be positive.")

    # ScalarFunction(MemoizeJac(fun), grad=MemoizeJac.derivative), as minimize builds it: f and
    # g at x0 now; later f and g again only at an x that differs from the last one
    memo = {"x": None, "value": None, "jac": None}

    def memo_compute(x):  # MemoizeJac._compute_if_needed
        if not np.all(x == memo["x"]) or memo["value"] is None or memo["jac"] is None:
            memo["x"] = np.asarray(x).copy()
            fg = fun_and_grad(x)
            memo["jac"] = fg[1]
            memo["value"] = fg[0]

    dtype = x0.dtype if np.issubdtype(x0.dtype, np.floating) else np.float64
    sf = {"x": np.atleast_1d(np.asarray(x0)).astype(dtype), "nfev": 0}

    def update_fun():  # ScalarFunction._update_fun through _ScalarFunctionWrapper
        memo_compute(np.copy(sf["x"]))
        fx = memo["value"]
        sf["nfev"] += 1
        if not np.isscalar(fx):
            dt = getattr(fx, "dtype", np.dtype(np.float64))
            try:
                fx = dt.type(np.asarray(fx).item())
            except (TypeError, ValueError) as e:
                raise ValueError("The user-provided objective function "
                                 "must return a scalar value.") from e
        sf["f"] = fx

    def update_grad():  # ScalarFunction._update_grad through _ScalarGradWrapper
        memo_compute(np.copy(sf["x"]))
        sf["g"] = np.atleast_1d(memo["jac"])

    update_fun()
    update_grad()

    def func_and_grad(x):  # ScalarFunction.fun_and_grad
        if not np.array_equal(x, sf["x"]):
            sf["x"] = np.atleast_1d(np.asarray(x)).astype(dtype)
            update_fun()
            update_grad()
        return sf["f"], sf["g"]

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
    while True:
        g = g.astype(np.float64)
        ext.setulb(m, x, low_bnd, upper_bnd, nbd, f, g, factr, gtol, wa, iwa, task, lsave,
                   isave, dsave, maxls, ln_task)
        if task[0] == 3:  # f and g wanted at x
            f, g = func_and_grad(x)
        elif task[0] == 1:  # a new iterate
            n_iterations += 1
            if n_iterations >= maxiter:
                task[0] = 5
                task[1] = 504
            elif sf["nfev"] > maxfun:
                task[0] = 5
                task[1] = 502
        else:
            break
    if task[0] == 4:
        warnflag = 0
    elif sf["nfev"] > maxfun or n_iterations >= maxiter:
        warnflag = 1
    else:
        warnflag = 2
    return SimpleNamespace(fun=f, jac=g, nfev=sf["nfev"], njev=sf["nfev"], nit=n_iterations,
                           status=warnflag, success=(warnflag == 0), x=x,
                           task=(int(task[0]), int(task[1])))


def _mean_elbo(est, params: np.ndarray, eps: np.ndarray) -> float:
    """The ELBO estimate on ``eps``; −inf if more than 10% of the draws fail (the failing ones
    are dropped otherwise, as Stan's calc_ELBO drops them)."""
    return mean_of_valid(est.values(params, eps), math.ceil(0.9 * len(eps)))


def laplace_start(target, family, est, mu0: np.ndarray, default_params: np.ndarray, *,
                  key: jax.Array, ledger: OracleLedger, log_scale0: float,
                  max_iters: int = 1000, n_compare: int = 64,
                  alternatives: list | None = None) -> tuple[np.ndarray, dict]:
    """The initial variational parameters: the Laplace start when its ELBO estimate beats
    ``default_params``' on common draws, else ``default_params`` (module docstring).  Returns
    the parameters and a record (``warm_start``: 'laplace' or 'default', with the reason).
    The candidate not chosen, when there was one, is appended to ``alternatives`` (a second,
    independent start: :mod:`stanvi.methods.trustvi_second_start`)."""
    if alternatives is None:
        alternatives = []
    dim = family.dim

    def neg_log_p(z: np.ndarray) -> tuple[float, np.ndarray]:
        res = target.log_density_gradient(z[None, :])
        ledger.gradient(1)
        if not bool(res.ok[0]):
            return np.inf, np.zeros(dim)
        return -float(res.log_density[0]), -np.asarray(res.gradient[0], dtype=float)

    info: dict = {}
    try:
        opt = minimize_lbfgsb(neg_log_p, np.asarray(mu0, dtype=float), maxiter=max_iters,
                              maxfun=2 * max_iters)
    except (ValueError, FloatingPointError) as exc:  # scipy rejects non-finite starting values
        return default_params, {"warm_start": "default", "warm_start_reason": str(exc)}
    info["laplace_iterations"] = int(opt.nit)
    z_star = np.asarray(opt.x, dtype=float)
    if not (np.all(np.isfinite(z_star)) and np.isfinite(opt.fun)):
        return default_params, {**info, "warm_start": "default",
                                "warm_start_reason": "L-BFGS ended at a non-finite point"}
    res = target.log_density_hvp(np.tile(z_star, (dim, 1)), np.eye(dim))
    ledger.hvp(1, dim)
    if res.hvp is None or not np.all(res.ok) or not np.all(np.isfinite(res.hvp)):
        return default_params, {**info, "warm_start": "default",
                                "warm_start_reason": "the Hessian at the mode is not finite"}
    precision = -0.5 * (res.hvp + res.hvp.T)
    laplace = family.params_from_precision(z_star, precision, log_scale0)
    eps = standard_normal(key, n_compare, dim)
    elbo_laplace = _mean_elbo(est, laplace, eps)
    elbo_default = _mean_elbo(est, default_params, eps)
    ledger.elbo_estimate(2 * n_compare)
    info.update(laplace_elbo=elbo_laplace, default_elbo=elbo_default)
    if elbo_laplace > elbo_default:
        alternatives.append(default_params)
        return laplace, {**info, "warm_start": "laplace"}
    alternatives.append(laplace)
    return default_params, {**info, "warm_start": "default",
                            "warm_start_reason": "the Laplace start's ELBO estimate was lower"}
