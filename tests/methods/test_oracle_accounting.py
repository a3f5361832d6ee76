"""One source of truth for model evaluations (issue P2-1b item 3): the target counts every
batched model call (docs/architecture.md#data-flow); each method charges every evaluation it makes
to its ledger (paper units for the priced ones, screening and redrawn draws for the rest), so over
a run the ledger's draw counts equal the target counter's growth, kind by kind, on every method
and family — including a model that throws on part of q's mass (drops, redraws, screening)."""

from __future__ import annotations

import pytest

import stanvi

CASES = [("trustvi", "meanfield"), ("trustvi", "fullrank"), ("advi", "meanfield"),
         ("advi", "fullrank"), ("hfsgvi", "meanfield"), ("trustvi", "lowrank")]


def ledger_evaluations(fit) -> dict[str, int]:
    o = fit.oracle
    return {"log_density": o["log_density_draws"] + o["screening_draws"],
            "gradient": o["gradient_draws"] + o["redrawn_draws"], "hvp": o["hvp_draws"]}


@pytest.mark.parametrize("method, family", CASES)
@pytest.mark.parametrize("model", ["eight_schools", "reject_region"])
def test_ledger_equals_the_target_counter(load_target, model, method, family):
    target = load_target(model)
    fit = stanvi.fit(target, method=method, family=family, seed=3, progress=False, draws=10,
                     max_oracle_calls=400)
    counted = fit.info["model_evaluations"]
    assert sum(counted.values()) > 0
    assert ledger_evaluations(fit) == counted, fit.status


def test_redraws_are_counted_where_the_model_throws(load_target):
    """reject_region throws where x > 2: ADVI's gradient drops draws there and redraws them."""
    fit = stanvi.fit(load_target("reject_region"), method="advi", seed=3, progress=False,
                     draws=10, max_oracle_calls=400)
    assert fit.info["grad_draws_dropped"] > 0
    # every dropped draw was evaluated: either redrawn, or one of the n draws a gradient that
    # hit the drop limit was charged for
    failed = fit.info["grad_failures"] * fit.options.grad_samples
    assert fit.oracle["redrawn_draws"] + failed >= fit.info["grad_draws_dropped"] > 0
    assert ledger_evaluations(fit) == fit.info["model_evaluations"]
