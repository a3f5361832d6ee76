"""The low-rank family's rank chosen from the Laplace Gaussian (stanvi/families/lowrank_rank.py;
docs/algorithms.md#lowrank-rank): the rank of a Gaussian the family contains, the cap, no
choice without a positive definite precision, and in a fit the Laplace point computed once."""

from __future__ import annotations

import numpy as np
import pytest

import stanvi
from stanvi.families.lowrank import LowRank, default_rank
from stanvi.families.lowrank_rank import MIN_GAIN, choose_rank
from stanvi.families.lowrank_start import gaussian_deficit


def _diag_plus_low_rank_precision(dim: int, rank: int, seed: int) -> np.ndarray:
    """H = (diag(a²) + CCᵀ)⁻¹ with columns of C large beside a (each worth many nats)."""
    rng = np.random.default_rng(seed)
    a = np.exp(rng.uniform(-0.5, 0.5, dim))
    C = 3.0 * rng.normal(size=(dim, rank))
    return np.linalg.inv(np.diag(a * a) + C @ C.T)


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_the_rank_of_a_contained_gaussian_is_found(rank):
    """Every column of a diag + rank-r covariance gains nats; at r the family contains the
    Laplace Gaussian (deficit 0 to L-BFGS's tolerance) and a column more gains nothing."""
    D = 10
    H = _diag_plus_low_rank_precision(D, rank, seed=rank)
    mu = np.linspace(-1.0, 1.0, D)
    choice = choose_rank(mu, H, default_rank(D))
    assert choice.rank == rank
    assert len(choice.deficits) == rank + 1          # the rejected column's deficit is kept
    assert choice.deficits[rank - 1] < 1e-6
    gains = -np.diff(choice.deficits)
    assert np.all(gains[:rank - 1] >= MIN_GAIN) and gains[rank - 1] < MIN_GAIN
    # the deficits are the family's own KL(q ‖ N(μ, H⁻¹)) at each rank: rank 1's start
    first = LowRank(D, 1).laplace_starts(mu, H, 0.0)[0]
    assert choice.deficits[0] == pytest.approx(gaussian_deficit(LowRank(D, 1), first, H))


def test_an_independent_gaussian_gets_rank_one_and_the_cap_holds():
    D = 6
    H = np.diag(np.linspace(0.5, 4.0, D))
    choice = choose_rank(np.zeros(D), H, default_rank(D))
    assert choice.rank == 1 and choice.deficits[0] < 1e-8
    correlated = _diag_plus_low_rank_precision(D, 3, seed=5)
    assert choose_rank(np.zeros(D), correlated, max_rank=2).rank == 2


def test_no_choice_without_a_positive_definite_precision():
    H = np.diag([1.0, -1.0, 2.0])
    assert choose_rank(np.zeros(3), H, 1) is None


def test_a_fit_chooses_the_rank_and_starts_exactly_as_with_that_rank_given(load_target):
    """On a Stan regression the fit without a rank computes the Laplace point once, for
    the rank and for its warm start: the same q, ledger and model evaluations as the fit given
    that rank, the ledger equal to the target's counter (the point's cost is charged once)."""
    target = load_target("linear_regression")
    auto = stanvi.fit(target, method="trustvi", family="lowrank", seed=2, progress=False,
                      draws=50)
    note = auto.info["lowrank_rank"]
    assert note["rank"] == auto.family.rank <= note["default_rank"] == default_rank(target.dim)
    given = stanvi.fit(target, method="trustvi", family="lowrank", seed=2, progress=False,
                       draws=50, family_options={"rank": auto.family.rank})
    assert "lowrank_rank" not in given.info
    np.testing.assert_array_equal(auto.params, given.params)
    assert auto.oracle == given.oracle
    assert auto.info["model_evaluations"] == given.info["model_evaluations"]
    o = auto.oracle
    assert auto.info["model_evaluations"] == {
        "log_density": o["log_density_draws"] + o["screening_draws"],
        "gradient": o["gradient_draws"] + o["redrawn_draws"], "hvp": o["hvp_draws"]}


def test_methods_without_the_laplace_start_keep_the_default_rank(load_target):
    target = load_target("linear_regression")
    fit = stanvi.fit(target, method="advi", family="lowrank", seed=0, progress=False, draws=20,
                     max_iterations=200)
    assert fit.family.rank == default_rank(target.dim) and "lowrank_rank" not in fit.info
