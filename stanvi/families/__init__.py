"""Variational families (see :mod:`stanvi.families.gaussian`)."""

from stanvi.families.gaussian import FAMILIES, FullRank, MeanField, make_family

Family = MeanField | FullRank

__all__ = ["FAMILIES", "Family", "FullRank", "MeanField", "make_family"]
