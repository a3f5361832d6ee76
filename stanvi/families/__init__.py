"""Variational families (see :mod:`stanvi.families.gaussian`)."""

from stanvi.families.gaussian import FAMILIES, FullRank, MeanField, make_family
from stanvi.families.mixture import GaussianMixture

FAMILIES["mixture"] = GaussianMixture   # make_family("mixture", dim, n_components=..., ...)

Family = MeanField | FullRank | GaussianMixture

__all__ = ["FAMILIES", "Family", "FullRank", "GaussianMixture", "MeanField", "make_family"]
