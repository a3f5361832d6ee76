"""TrustVI's second-start checks after a run that stopped stuck, uncertified
(docs/algorithms.md#second-start): on a paired design with group means scaled by 100 (ARM's
electric), the full-rank run from the default start stopped with its model of the ELBO not
concave at an ELBO of -1,574.6, while mean-field converges at -691.3; the mean-field run inside
the full-rank family finds the way out."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import stanvi

MODEL = Path(__file__).resolve().parents[1] / "models" / "paired_design.stan"


def _paired_data(seed: int = 7) -> dict:
    """96 pairs, means N(90, 15²), a treatment effect of 5, noise sd 4."""
    rng = np.random.default_rng(seed)
    pairs = 96
    means = 90 + 15 * rng.standard_normal(pairs)
    pair = np.repeat(np.arange(1, pairs + 1), 2)
    treatment = np.tile([0.0, 1.0], pairs)
    y = means[pair - 1] + 5 * treatment + 4 * rng.standard_normal(2 * pairs)
    return {"N": 2 * pairs, "n_pair": pairs, "pair": pair.tolist(),
            "treatment": treatment.tolist(), "y": y.tolist()}


def test_a_stuck_full_rank_run_continues_from_the_mean_field_optimum():
    data = _paired_data()
    full = stanvi.fit(str(MODEL), data=data, method="trustvi", family="fullrank", seed=0,
                      progress=False)
    mean_field = stanvi.fit(str(MODEL), data=data, method="trustvi", seed=0, progress=False)
    assert mean_field.status == "converged"
    # before: max_iters, "not certified: the model of the ELBO is not concave ...", -1,574.6
    assert full.status == "converged", full.message
    assert "stopped, uncertified" in full.message and "mean-field run" in full.message
    (elbo_full, se_full), (elbo_mf, se_mf) = full.elbo(4000), mean_field.elbo(4000)
    # full rank holds mean-field: its optimum is at least mean-field's, up to the noise
    assert elbo_full > elbo_mf - 4 * np.hypot(se_full, se_mf) - 0.5


def test_stuck_is_read_from_the_state_where_each_stuck_stop_leaves_it():
    """``trustvi_fixed.stuck`` reads a collapsed radius, or ``NOT_CONCAVE_STAGES`` samples in a
    row not concave, as stuck, and nothing short of them; the stop that leaves the second state
    is exercised by the fit above."""
    from stanvi.methods import trustvi_fixed as tf

    zeros = np.zeros(2)
    state = tf.FixedState(params=zeros, delta=1.0, eps=np.zeros((4, 2)), values=np.zeros(4),
                          model_grads=np.zeros((4, 2)), grad=zeros, hessian="hvp", n_hess=4)
    assert not tf.stuck(state)
    assert not tf.stuck(state._replace(not_concave=tf.NOT_CONCAVE_STAGES - 1))
    assert tf.stuck(state._replace(not_concave=tf.NOT_CONCAVE_STAGES))
    assert not tf.stuck(state._replace(delta=tf.COLLAPSED_DELTA))
    assert tf.stuck(state._replace(delta=tf.COLLAPSED_DELTA / 2))
