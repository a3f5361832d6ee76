"""Variational methods, registered by name for ``stanvi.fit(method=...)``.

Every method module defines a frozen ``Options`` dataclass (defaults from its source, named in
the docstring), a ``PROFILES`` dict of named option sets, and
``run(target, family, *, key, options, context) -> MethodResult``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

_MODULES = {
    "trustvi": "stanvi.methods.trustvi",
    "advi": "stanvi.methods.advi",
    "hfsgvi": "stanvi.methods.hfsgvi",
}


def available() -> list[str]:
    return sorted(_MODULES)


def get_method(name: str) -> ModuleType:
    """The module implementing method ``name``."""
    try:
        return importlib.import_module(_MODULES[name])
    except KeyError:
        raise ValueError(f"unknown method {name!r}; choose one of {available()}") from None


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
    return dataclasses.replace(module.Options(**module.PROFILES[profile]), **overrides)
