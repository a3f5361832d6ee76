"""The low-rank family's reverse-KL Laplace start (stanvi/families/lowrank_start.py;
docs/algorithms.md#lowrank-start): its gradient against finite differences, exactness on a
Gaussian in the family, never worse than the PPCA start in KL(q ‖ N(m, H⁻¹)), and the option."""

from __future__ import annotations

import numpy as np
import pytest

from stanvi.families.lowrank import LowRank
from stanvi.families.lowrank_start import _objective, gaussian_deficit, reverse_kl_params


def _kl_part(fam: LowRank, params: np.ndarray, H: np.ndarray) -> float:
    """½ tr(HΣ) − ½ log det Σ (KL(q ‖ N(m, H⁻¹)) up to a constant, q centred at m)."""
    S = fam.covariance(params)
    return 0.5 * (np.trace(H @ S) - np.linalg.slogdet(S)[1])


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    D, k = 6, 2
    A = rng.normal(size=(D, D))
    H = A @ A.T + np.eye(D)
    mask = np.tri(D, k)
    x = rng.normal(size=D + D * k) * 0.3
    x[D:] *= mask.ravel()
    f, g = _objective(x, H, np.diagonal(H).copy(), D, k, mask)
    for i in rng.choice(len(x), 10, replace=False):
        if i >= D and mask.ravel()[i - D] == 0:
            continue
        e = np.zeros_like(x)
        e[i] = 1e-6
        fd = (_objective(x + e, H, np.diagonal(H).copy(), D, k, mask)[0]
              - _objective(x - e, H, np.diagonal(H).copy(), D, k, mask)[0]) / 2e-6
        assert fd == pytest.approx(g[i], rel=1e-5, abs=1e-7)


def test_exact_on_a_gaussian_of_the_family_and_never_worse_than_ppca():
    rng = np.random.default_rng(1)
    D, k = 8, 3
    fam = LowRank(D, k, laplace_fit="reverse_kl")
    lam, psi = rng.normal(size=(D, k)), rng.uniform(0.5, 1.0, D)
    S = np.diag(psi) + lam @ lam.T
    params = fam.params_from_precision(np.zeros(D), np.linalg.inv(S), 0.0)
    np.testing.assert_allclose(fam.covariance(params), S, atol=1e-6)
    # outside the family: the fit lowers the KL below PPCA's (which keeps H⁻¹'s variances)
    A = rng.normal(size=(D, D))
    H = A @ A.T + np.eye(D)
    ppca = LowRank(D, k, laplace_fit="ppca").params_from_precision(np.zeros(D), H, 0.0)
    rkl = fam.params_from_precision(np.zeros(D), H, 0.0)
    assert _kl_part(fam, rkl, H) < _kl_part(fam, ppca, H) - 1e-3
    assert np.array_equal(rkl[:D], np.zeros(D))


def test_the_option_is_checked_and_saved():
    with pytest.raises(ValueError, match="laplace_fit"):
        LowRank(4, 2, laplace_fit="pca")
    assert LowRank(4, 2).family_options() == {"rank": 2}
    assert LowRank(4, 2, laplace_fit="ppca").family_options() == {
        "rank": 2, "laplace_fit": "ppca"}


def test_the_deficit_is_the_kl_to_the_laplace_gaussian():
    """gaussian_deficit(λ, H) = KL(q ‖ N(m, H⁻¹)) = ½(tr(HΣ) − D − log det(HΣ)) against the dense
    formula; 0 for a Gaussian in the family (the reverse-KL fit recovers it), None for an
    indefinite H."""
    rng = np.random.default_rng(4)
    D, k = 8, 2
    fam = LowRank(D, k, laplace_fit="ppca")
    A = rng.normal(size=(D, D))
    H = A @ A.T + np.eye(D)
    params = fam.params_from_precision(np.zeros(D), H, 0.0)
    S = fam.covariance(params)
    dense = 0.5 * (np.trace(H @ S) - D - np.linalg.slogdet(H @ S)[1])
    assert dense > 0.1
    assert gaussian_deficit(fam, params, H) == pytest.approx(dense, rel=1e-10)
    assert fam.laplace_deficit(params, H) == gaussian_deficit(fam, params, H)
    lam, psi = rng.normal(size=(D, k)), rng.uniform(0.5, 1.0, D)
    inside = np.linalg.inv(np.diag(psi) + lam @ lam.T)
    exact = LowRank(D, k, laplace_fit="reverse_kl").params_from_precision(np.zeros(D), inside, 0.0)
    assert gaussian_deficit(fam, exact, inside) < 1e-8
    assert gaussian_deficit(fam, params, -H) is None
