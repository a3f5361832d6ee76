"""``stanvi.fit`` for GP models (docs/gp.md#methods): ``stanvi.fit(gp_model, method=...)`` with
method 'qsgp' (this package's method), 'exact' (closed-form conjugate posterior, small m) or
'svi' (the doubly-stochastic O(m) baseline).  Called by :func:`stanvi.fit.fit`, which imports
this module only for a GP model or one of these method names."""

from __future__ import annotations

import os

from stanvi.errors import VIError
from stanvi.methods import GP_METHODS


class MethodNotApplicable(VIError, ValueError):
    """The method cannot be applied to this kind of model (docs/gp.md#stan-models)."""


def is_gp_model(model) -> bool:
    return bool(getattr(model, "__stanvi_gp__", False))


def fit_gp(model, data=None, *, method: str, family="meanfield", seed: int = 0,
           progress: bool = False, **options):
    """Run GP method ``method`` on GP model ``model`` and return a
    :class:`~stanvi.gp.result.GPFit`."""
    if not is_gp_model(model):
        what = (f"the Stan program {os.fspath(model)!r}" if isinstance(model, (str, os.PathLike))
                else f"{type(model).__name__} objects")
        raise MethodNotApplicable(
            f"method {method!r} applies to stanvi.gp models only, not to {what}: QSGP needs "
            "row and column blocks of the feature matrix Φ, blocks of the prior precision S and "
            "the likelihood's site functions, while a Stan model exposes only its full joint "
            "log density and gradient (O(n m) per call for a basis-function GP, with no way to "
            "subsample data rows or basis functions).  Build the model with stanvi.gp (e.g. "
            "stanvi.gp.rff_regression(X, y, m=...)) or use a Stan method ('trustvi', 'advi', ...)")
    if method not in GP_METHODS:
        raise MethodNotApplicable(
            f"method {method!r} needs a log-density target (a Stan model or a JAX function); "
            f"for a stanvi.gp model use one of {list(GP_METHODS)}, or, for small m, pass "
            f"model.as_target() (a JaxTarget over the m weights, O(n m) per evaluation) to "
            f"stanvi.fit")
    if data is not None:
        raise ValueError("a stanvi.gp model carries its data; do not pass data=")
    from stanvi.methods import make_options  # noqa: PLC0415  (name and type checks)

    if method == "qsgp":
        from stanvi.gp import qsgp  # noqa: PLC0415

        return qsgp.run(model, family, seed=seed, options=make_options(qsgp, None, options),
                        progress=progress)
    if method == "exact":
        from stanvi.gp import exact  # noqa: PLC0415

        unknown = sorted(set(options) - {"row_chunk"})
        if unknown:
            raise TypeError(f"unknown option(s) {unknown} for exact; valid options: ['row_chunk']")
        return exact.run(model, seed=seed, options=exact.Options(**options))
    from stanvi.gp import svi  # noqa: PLC0415

    return svi.run(model, family=None if family == "meanfield" else family, seed=seed,
                   options=make_options(svi, None, options))
