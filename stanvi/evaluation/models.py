"""Where the project's own example models are: ``stan_models/`` of a source checkout, or
``$STANVI_MODELS_DIR`` (docs/architecture.md#layers).  The models directory was written four
times (the demo, two benchmarks and the stored optima); this is its one home.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "STANVI_MODELS_DIR"


def models_dir(*, required: bool = False) -> Path:
    """The example models' directory: ``$STANVI_MODELS_DIR``, else ``stan_models/`` beside the
    package in a source checkout.  ``required``: raise FileNotFoundError, saying how to point to
    one, when it does not exist (an installed wheel has no ``stan_models/``)."""
    env = os.environ.get(ENV_VAR)
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "stan_models"
    if required and not path.is_dir():
        raise FileNotFoundError(
            f"the example models' directory {path} does not exist: the models come with a source "
            f"checkout of stanvi (stan_models/); set {ENV_VAR} to a copy of it")
    return path


#: The directory at import time (``models_dir()``)
MODELS_DIR = models_dir()


def discover_models(directory: Path) -> list[tuple[str, Path, Path | None]]:
    """(name, .stan, data) for every model ``<dir>/<model>/<name>.stan`` of the directory:
    its data ``<name>.data.json``, else the folder's only ``*.data.json``, else None."""
    out = []
    for stan in sorted(Path(directory).glob("*/*.stan")):
        data = stan.with_suffix(".data.json")
        if not data.exists():
            shared = list(stan.parent.glob("*.data.json"))
            data = shared[0] if len(shared) == 1 else None
        out.append((stan.stem, stan, data))
    return out
