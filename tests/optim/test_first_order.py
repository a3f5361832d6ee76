"""The host first-order updates (stanvi.optim.first_order): Adam's bias-corrected moments and
heavy-ball momentum, against their formulas written out (Kingma & Ba 2015, Algorithm 1)."""

import numpy as np
import pytest

from stanvi.optim.first_order import ADAM_EPS, AdamState, adam_update, heavy_ball


def test_adam_first_step_is_lr_times_the_sign_and_second_step_follows_the_formula():
    g1 = np.array([0.5, -2.0, 1e-3])
    u1, s1 = adam_update(g1, AdamState(), lr=0.1)
    # t = 1: m̂ = g, v̂ = g², so the update is −lr·g/(|g| + eps)
    np.testing.assert_allclose(u1, -0.1 * g1 / (np.abs(g1) + ADAM_EPS), rtol=1e-15)
    assert s1.t == 1
    g2 = np.array([-1.0, 0.5, 2.0])
    u2, s2 = adam_update(g2, s1, lr=0.1)
    m = 0.9 * 0.1 * g1 + 0.1 * g2
    v = 0.999 * 0.001 * g1 ** 2 + 0.001 * g2 ** 2
    expected = -0.1 * (m / (1 - 0.9 ** 2)) / (np.sqrt(v / (1 - 0.999 ** 2)) + ADAM_EPS)
    np.testing.assert_allclose(u2, expected, rtol=1e-12)
    assert s2.t == 2 and s1.t == 1          # the state is not mutated


def test_adam_minimizes_a_quadratic():
    x, state = np.array([3.0, -4.0]), AdamState()
    for _ in range(2000):
        update, state = adam_update(2.0 * x, state, lr=0.05)
        x = x + update
    assert np.max(np.abs(x)) < 1e-2


def test_heavy_ball():
    g = np.array([1.0, -1.0])
    v = heavy_ball(g, None, 0.9)
    np.testing.assert_array_equal(v, g)
    np.testing.assert_array_equal(heavy_ball(g, v, 0.9), 0.9 * g + g)
    with pytest.raises(TypeError):
        heavy_ball(g, v)   # the momentum is required
