"""Targets: what a variational method evaluates (see :mod:`stanvi.targets.base`)."""

from stanvi.targets.base import BatchResult, OracleCounter, Target
from stanvi.targets.jax_target import JaxTarget
from stanvi.targets.stan_target import StanTarget

__all__ = ["BatchResult", "JaxTarget", "OracleCounter", "StanTarget", "Target"]
