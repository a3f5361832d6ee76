"""Variational families (see :mod:`stanvi.families.gaussian`)."""

from stanvi.families.gaussian import FAMILIES, FullRank, MeanField, make_family
from stanvi.families.lowrank import LowRank
from stanvi.families.mixture import GaussianMixture

FAMILIES["mixture"] = GaussianMixture   # make_family("mixture", dim, n_components=..., ...)
FAMILIES["lowrank"] = LowRank           # make_family("lowrank", dim, rank=k)

Family = MeanField | FullRank | GaussianMixture | LowRank

__all__ = ["FAMILIES", "Family", "FullRank", "GaussianMixture", "LowRank", "MeanField",
           "make_family"]
