"""Stan's own algorithms through ``stanvi.fit`` and ``stanvi fit --method`` (issue T3-5 item 2,
docs/stan_reference.md#through-fit): ``method="nuts" | "pathfinder" | "stan-advi"`` runs
:func:`~stanvi.reference.nuts`, :func:`~stanvi.reference.pathfinder` or
:func:`~stanvi.reference.stan_advi` on the same compiled model and returns their
:class:`~stanvi.reference.ReferenceFit` (draws by Stan name, ``summary()``, ``diagnostics()``,
``to_arviz()``, ``save()``).

``stanvi.fit``'s own arguments map onto Stan's where they mean the same thing: ``seed``,
``init`` (constrained values by name; ``"random"`` Stan's own, ``"zero"`` CmdStan's
``init=0``), ``progress``; ``family`` is Stan ADVI's ``algorithm``
(``"meanfield"`` or ``"fullrank"``) and has no meaning for NUTS or Pathfinder; every other
setting is the algorithm's own, under Stan's name (``num_samples``, ``num_paths``,
``output_samples``, ...: :data:`~stanvi.reference.NUTS_DEFAULTS` and the others).  The
arguments that belong to stanvi's methods only are refused with a message saying so.

Stan's ADVI and single-path Pathfinder are judged as stanvi's fits are: the model is loaded
(a :class:`~stanvi.targets.stan_target.StanTarget`) and ``fit.diagnostics()`` draws afresh
from the Gaussian recovered from Stan's output, on the draws common to every fit
(:func:`stanvi.reference.diagnostics.fresh_draws_verdict`; docs/diagnostics.md#stan).  Where
Stan's default 1,000 output draws cannot identify that Gaussian (full rank from D = 45,
Pathfinder from D = 44) and the caller did not set them, Stan is asked for enough
(:func:`~stanvi.reference.diagnostics.recovery_options`) and the fit returned is the default
run (:func:`~stanvi.reference.diagnostics.default_run`), the whole run kept for the verdict.
"""

from __future__ import annotations

from typing import Any

from stanvi.reference.advi import stan_advi
from stanvi.reference.nuts import nuts
from stanvi.reference.pathfinder import pathfinder
from stanvi.reference.result import ReferenceFit

#: stanvi.fit's defaults for the arguments Stan's algorithms do not take (a value other than
#: these is refused for them, with the Stan setting to use instead where there is one).
NOT_FOR_STAN = {"draws": (1000, {"nuts": "num_samples (per chain)",
                                 "pathfinder": "num_psis_draws (or num_draws)",
                                 "stan-advi": "output_samples"}),
                "max_oracle_calls": (None, {}), "profile": (None, {}), "dim": (None, {}),
                "family_options": (None, {}), "require_converged": (False, {}),
                "hvp_method": (None, {})}


def run_stan_method(method: str, model, data, *, family: str = "meanfield", seed: int = 0,
                    init: Any = None, progress: bool = True, given: dict | None = None,
                    **settings) -> ReferenceFit:
    """Run Stan's ``method`` (module docstring); ``given``: stanvi.fit's other arguments, by
    name, checked against :data:`NOT_FOR_STAN`."""
    loaded = None
    if getattr(model, "compiled", None) is not None and hasattr(model, "data_json"):
        # a loaded Stan model (stanvi.load_model): its compiled program and its data
        if data is not None:
            raise ValueError("the model was loaded with its data: do not pass data again")
        loaded, model, data = model, model.compiled, (model.data_json or None)
    elif not isinstance(model, str) and not hasattr(model, "library") \
            and not hasattr(model, "__fspath__"):
        raise TypeError(f"Stan's {method} runs a Stan model (a .stan path, Stan code, a "
                        f"compiled or loaded model), not a {type(model).__name__}; for a log "
                        f"density use one of stanvi's methods")
    for name, value in (given or {}).items():
        default, instead = NOT_FOR_STAN[name]
        if value != default:
            use = instead.get(method)
            raise ValueError(f"{name}={value!r} is an argument of stanvi's own methods; Stan's "
                             f"{method} does not take it"
                             + (f" (its setting is {use})" if use else ""))
    if isinstance(init, str) and init in ("random", "zero"):
        # Stan's own initialization, uniform(-2, 2) on the unconstrained scale; 'zero' is
        # CmdStan's init=0 (radius 0)
        if init == "zero":
            settings["init_radius"] = 0.0
        init = None
    if method not in ("nuts", "pathfinder", "stan-advi"):
        raise ValueError(f"{method!r} is not one of Stan's algorithms (nuts, pathfinder, "
                         f"stan-advi)")
    if method == "stan-advi" and family not in ("meanfield", "fullrank"):
        raise ValueError(f"Stan's ADVI has the families 'meanfield' and 'fullrank', not "
                         f"{family!r}")
    if method != "stan-advi" and family != "meanfield":
        raise ValueError(f"family={family!r} has no meaning for Stan's {method} (only Stan's "
                         f"ADVI takes a family)")
    form = _recovered_form(method, family, settings)
    target, extra = None, 0
    if form is not None:   # a Gaussian to judge on fresh draws: the model loaded
        from stanvi.reference.diagnostics import recovery_options  # noqa: PLC0415
        from stanvi.targets.stan_target import StanTarget  # noqa: PLC0415

        target = loaded if loaded is not None else StanTarget(model, data, progress=progress)
        model = target.compiled or model
        settings, extra = recovery_options(form, target.dim, settings)
    common = dict(seed=seed, init=init, progress=progress, **settings)
    if method == "stan-advi":
        run = stan_advi(model, data, algorithm=family, **common)
    elif method == "nuts":
        return nuts(model, data, **common)
    else:
        run = pathfinder(model, data, **common)
    if target is None:
        return run
    from functools import partial  # noqa: PLC0415

    from stanvi.reference.diagnostics import default_run, fresh_draws_verdict  # noqa: PLC0415

    shown = default_run(run, extra)
    shown.recovery_run = run if extra else None
    shown.fresh_verdict = partial(fresh_draws_verdict, run, target)
    return shown


def _recovered_form(method: str, family: str, settings: dict) -> str | None:
    """The form of the Gaussian Stan's ``method`` fits, as
    :func:`~stanvi.reference.diagnostics.recovery_options` names it; None where there is none
    (NUTS, multi-path Pathfinder)."""
    from stanvi.reference.pathfinder import PATHFINDER_DEFAULTS  # noqa: PLC0415

    if method == "stan-advi":
        return family
    paths = int(settings.get("num_paths", PATHFINDER_DEFAULTS["num_paths"]))
    return "quadratic" if method == "pathfinder" and paths == 1 else None
