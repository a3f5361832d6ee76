"""Variational methods, registered by name for ``stanvi.fit(method=...)``.

Every method module defines a frozen ``Options`` dataclass (defaults from its source, named in
the docstring), a ``PROFILES`` dict of named option sets with a ``DEFAULT_PROFILE``, the name of
the ELBO estimator it needs (``ESTIMATOR``, a key of :data:`stanvi.estimators.registry.ESTIMATORS`:
``stanvi.fit`` builds that estimator and passes it as ``context.estimator``), and
``run(target, family, *, key, options, context) -> MethodResult``.
"""

from __future__ import annotations

from types import ModuleType

from stanvi.methods import advi, bam, gsm, hfsgvi, jointcv, mlmcvi, trustvi

METHODS: dict[str, ModuleType] = {"trustvi": trustvi, "advi": advi, "hfsgvi": hfsgvi,
                                  "jointcv": jointcv, "mlmcvi": mlmcvi, "bam": bam, "gsm": gsm}
"""``stanvi.fit(method=name)`` → the module that implements it."""

GP_METHODS = ("qsgp", "exact", "svi")
"""The methods of :mod:`stanvi.gp` models (dispatched by :func:`stanvi.gp.dispatch.fit_gp`)."""

STAN_METHODS = ("stan-advi", "pathfinder", "nuts")
"""Stan's own algorithms, run in-process by :mod:`stanvi.reference` (``stan_advi``,
``pathfinder``, ``nuts``), by the names batch runs and benchmarks give them."""

#: Every method name stanvi knows, and where it runs: one table for ``stanvi.fit``, the batch
#: planner and the error messages (the registries above are its parts)
METHOD_KINDS: dict[str, str] = {**{m: "variational" for m in METHODS},
                                **{m: "gp" for m in GP_METHODS},
                                **{m: "stan" for m in STAN_METHODS}}


def available() -> list[str]:
    return sorted(METHODS)


def method_kind(name: str) -> str:
    """'variational' (``stanvi.fit`` on a log density), 'gp' (a :mod:`stanvi.gp` model) or
    'stan' (Stan's own algorithm, :mod:`stanvi.reference`); a ValueError naming every method
    for a name stanvi does not know."""
    try:
        return METHOD_KINDS[name]
    except KeyError:
        raise ValueError(
            f"unknown method {name!r}; stanvi.fit's methods are {available()}, those of "
            f"stanvi.gp models {list(GP_METHODS)}, and Stan's own algorithms (stanvi.reference; "
            f"in batch runs and benchmarks) {list(STAN_METHODS)}") from None


def get_method(name: str) -> ModuleType:
    """The module implementing the variational method ``name``; for a GP or Stan method name,
    a ValueError that says where that method runs."""
    kind = method_kind(name)
    if kind == "stan":
        function = name.replace("-", "_")
        raise ValueError(f"method {name!r} is Stan's own algorithm: run it with "
                         f"stanvi.reference.{function}(model, data) (or --methods {name} in "
                         f"`stanvi batch`); stanvi.fit's methods are {available()}")
    if kind == "gp":
        raise ValueError(f"method {name!r} fits stanvi.gp models (stanvi.fit(model, "
                         f"method={name!r}) with a model built by stanvi.gp); for a log density "
                         f"use one of {available()}")
    return METHODS[name]


def make_options(module: ModuleType, profile: str | None, overrides: dict):
    """The method's Options for ``profile`` (default: the module's DEFAULT_PROFILE) with
    ``overrides`` applied; unknown option names raise TypeError naming them."""
    import dataclasses  # noqa: PLC0415

    profile = profile or module.DEFAULT_PROFILE
    if profile not in module.PROFILES:
        raise ValueError(f"unknown profile {profile!r} for {module.__name__.rsplit('.', 1)[-1]}; "
                         f"choose one of {sorted(module.PROFILES)}")
    fields = {f.name for f in dataclasses.fields(module.Options)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise TypeError(f"unknown option(s) {unknown} for {module.__name__.rsplit('.', 1)[-1]}; "
                        f"valid options: {sorted(fields)}")
    method = module.__name__.rsplit('.', 1)[-1]
    types = {f.name: f.type for f in dataclasses.fields(module.Options)}
    checked = {name: _checked_value(method, name, types[name], value)
               for name, value in overrides.items()}
    return dataclasses.replace(module.Options(**module.PROFILES[profile]), **checked)


def _checked_value(method: str, name: str, annotation, value):
    """``value`` if it fits the option's annotation (``float``, ``int``, ``str``, ``bool``,
    each optionally ``| None``); an int is accepted for a float (and returned as float).
    Otherwise a TypeError that names the option, the expected type and the value given —
    instead of an arithmetic error deep inside the method."""
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__",
                                                                  str(annotation))
    allowed = [t.strip() for t in text.split("|")]
    if value is None and "None" in allowed:
        return None
    if "bool" in allowed and isinstance(value, bool):
        return value
    if not isinstance(value, bool):
        if "int" in allowed and isinstance(value, int):
            return value
        if "float" in allowed and isinstance(value, (int, float)):
            return float(value)
    if "str" in allowed and isinstance(value, str):
        return value
    expected = " or ".join(a for a in allowed)
    raise TypeError(f"{method} option {name} must be {expected}, got {value!r} "
                    f"({type(value).__name__})")
