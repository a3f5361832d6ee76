"""Rao-Blackwellized stochastic gradients for discrete distributions (Liu et al. 2019; spec
``rao_blackwellized_discrete.md``): the estimator (:mod:`stanvi.discrete.rao_blackwell`), the
product-of-categoricals helpers (:mod:`stanvi.discrete.product`), the paper's toy problem and
exact moments by enumeration (:mod:`stanvi.discrete.toy`), and the mixture family's ELBO
gradient (:mod:`stanvi.discrete.mixture_elbo`, used by ``stanvi.fit(family="mixture")``)."""

from stanvi.discrete.rao_blackwell import (Columns, RBResult, Reinforce, ema_update,
                                          exact_surrogate, rao_blackwell, rb_terms, reinforce,
                                          score_function)

__all__ = ["Columns", "RBResult", "Reinforce", "ema_update", "exact_surrogate", "rao_blackwell",
           "rb_terms", "reinforce", "score_function"]
