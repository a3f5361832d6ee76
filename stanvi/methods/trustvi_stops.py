"""The messages of the fixed-sample TrustVI run's uncertified stops
(:mod:`stanvi.methods.trustvi_fixed`; docs/algorithms.md#trustvi-fixed, step 5).

Which stop a run made is read from its state (``trustvi_fixed.stuck``), never from these texts;
they are for the user, and say what the run saw.  The fresh-sample certification reads "not
concave" when the Newton step on fresh draws ends on the boundary of its radius.  That happens
at a kinked or multimodal optimum, and also when the run is still far from the optimum (its
Newton step is simply long): a sample that ran out of its iterations while still climbing
(``stage_iteration_limit``) was never at an optimum, so the message says so instead
(example-models' ARM/Ch.13/earnings_latin_square_chr, mean-field: three stages of 64 to 256
draws each spent their iterations on a long ridge, docs/algorithms.md#trustvi-fixed).
"""

from __future__ import annotations

#: How the messages of the two uncertified ends where a run is stuck begin: no step improves the
#: fixed-sample ELBO, and a model of it whose Newton step leaves the region at the point reached
COLLAPSED = "the trust region collapsed on the fixed sample"
NOT_CONCAVE = "not certified: the model of the ELBO is not concave"


def collapsed_message(n: int) -> str:
    """The stop where no step improves the ELBO of the fixed sample of ``n`` draws."""
    return f"{COLLAPSED} (no step improves its ELBO; N = {n} draws)"


def not_concave_message(n_first: int, n_last: int, stages: int, at_limit: int) -> str:
    """The stop after ``stages`` samples in a row (``n_first`` to ``n_last`` draws) whose
    certification found the ELBO's model not concave, the last ``at_limit`` of which ran out of
    their iterations before they solved their fixed-sample problem."""
    draws = f"on {n_first} to {n_last} draws"
    if at_limit >= stages:
        return (f"{NOT_CONCAVE} {draws}, and no sample reached its optimum: each ran out of its "
                "iterations still climbing (a long ridge or a flat direction; the fresh "
                "Newton step is long because the run is far from the optimum)")
    return (f"{NOT_CONCAVE} at the fixed-sample optimum {draws} (a kinked or multimodal "
            "objective, or a q at the edge of the model's support)")
