"""Stan's own algorithms beside stanvi's, on the same compiled model, in-process.

- :func:`nuts`: NUTS with a diagonal or dense metric adapted in warmup (what CmdStan's ``sample``
  runs); the reference posterior.
- :func:`stan_advi`: Stan's C++ ADVI, mean-field or full-rank (CmdStan's ``variational``).
- :func:`pathfinder`: single- and multi-path Pathfinder (CmdStan's ``pathfinder``).

They run on an opt-in *services library* built beside the model library on first use (see
:mod:`stanvi.stan.services_build`; the first build compiles Stan's services once per installation,
a minute or more, and the model once more, ~30 s), so ordinary model libraries are untouched.
Every result is a :class:`ReferenceFit` whose costs are counted in stanvi's units.
"""

from stanvi.reference.advi import ADVI_DEFAULTS, stan_advi
from stanvi.reference.nuts import NUTS_DEFAULTS, SAMPLER_COLUMNS, nuts
from stanvi.reference.pathfinder import PATHFINDER_DEFAULTS, pathfinder
from stanvi.reference.result import ReferenceFit
from stanvi.reference.services_lib import ReferenceRunError

__all__ = ["ADVI_DEFAULTS", "NUTS_DEFAULTS", "PATHFINDER_DEFAULTS", "SAMPLER_COLUMNS",
           "ReferenceFit", "ReferenceRunError", "nuts", "pathfinder", "stan_advi"]
