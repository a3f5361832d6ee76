"""Rao-Blackwellized stochastic gradients for discrete distributions (Liu et al. 2019;
docs/discrete.md#rb-estimator): the estimator (:mod:`stanvi.discrete.rao_blackwell`), the
product-of-categoricals helpers (:mod:`stanvi.discrete.product`), the paper's toy problem and
exact moments by enumeration (:mod:`stanvi.discrete.toy`): a leaf library, importing nothing of
stanvi's (docs/architecture.md#layers).  The mixture family's estimators that use it are in
:mod:`stanvi.estimators` (``mixture_rb``, ``mixture_mlmc``)."""

from stanvi.discrete.rao_blackwell import (Columns, RBResult, Reinforce, ema_update,
                                           exact_surrogate, rao_blackwell, rb_terms, reinforce,
                                           score_function)

__all__ = ["Columns", "RBResult", "Reinforce", "ema_update", "exact_surrogate", "rao_blackwell",
           "rb_terms", "reinforce", "score_function"]
