"""Advantage modes, aggregation weights and omega against hand-computed values."""

import math

import numpy as np
import pytest

from gmts_analysis.advantages import SingletonGroupWarning, compute_advantages, loss_weights, omega


def test_group_advantage_bessel_std():
    r = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    g = ["a", "a", "a", "b", "b", "b"]
    a = compute_advantages(r, g, "group")
    # group a: mean 1/3, std (ddof=1) = sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    s = math.sqrt(1 / 3)
    np.testing.assert_allclose(a[:3], [(2 / 3) / (s + 1e-4), (-1 / 3) / (s + 1e-4), (-1 / 3) / (s + 1e-4)])
    np.testing.assert_allclose(a[3:], 0.0)  # equal rewards -> 0


def test_batch_and_none_modes():
    r = np.array([1.0, 0.0, 2.0, 0.0])
    g = [0, 0, 1, 1]
    std_all = r.std(ddof=1)
    np.testing.assert_allclose(compute_advantages(r, g, "batch"),
                               [0.5 / (std_all + 1e-4), -0.5 / (std_all + 1e-4), 1 / (std_all + 1e-4), -1 / (std_all + 1e-4)])
    np.testing.assert_allclose(compute_advantages(r, g, "none"), [0.5, -0.5, 1.0, -1.0])


def test_batch_is_per_step():
    r = [1.0, 0.0, 5.0, 1.0]
    g = [0, 0, 0, 0]  # same group id but different steps -> different groups
    a = compute_advantages(r, g, "none", steps=[1, 1, 2, 2])
    np.testing.assert_allclose(a, [0.5, -0.5, 2.0, -2.0])


def test_singleton_group_warns_and_is_zero():
    with pytest.warns(SingletonGroupWarning):
        a = compute_advantages([1.0, 0.0, 1.0], ["x", "x", "y"], "group")
    assert a[2] == 0.0


def test_loss_weights():
    L = [2, 3, 5]
    np.testing.assert_allclose(loss_weights(L, "token-mean"), [0.1, 0.1, 0.1])
    np.testing.assert_allclose(loss_weights(L, "seq-mean-token-mean"), [1 / 6, 1 / 9, 1 / 15])
    np.testing.assert_allclose(loss_weights(L, "seq-mean-token-sum-norm"), [1 / 15] * 3)
    np.testing.assert_allclose(loss_weights(L, "seq-mean-token-sum-norm", max_len=10), [1 / 30] * 3)
    np.testing.assert_allclose(loss_weights(L, "token-mean", steps=[0, 0, 1]), [0.2, 0.2, 0.2])


def test_omega_on_and_off_policy():
    lp = np.log(np.array([0.5, 0.2, 0.9]))
    np.testing.assert_allclose(omega(0.1, 2.0, lp), [0.2, 0.2, 0.2])
    # off-policy: ratios 2.0, 1.0, 0.5
    old = lp - np.log([2.0, 1.0, 0.5])
    np.testing.assert_allclose(omega(1.0, 1.0, lp, old), [0.0, 1.0, 0.5])  # A>0 clipped above 1.28
    np.testing.assert_allclose(omega(1.0, -1.0, lp, old), [-2.0, -1.0, 0.0])  # A<0 clipped below 0.8
    # k3 KL gradient: beta (pi_ref / pi - 1)
    ref = np.log(np.array([0.25, 0.4, 0.9]))
    np.testing.assert_allclose(omega(1.0, 0.0, lp, ref_logprob=ref, kl_beta=0.5), [0.5 * -0.5, 0.5 * 1.0, 0.0],
                               atol=1e-12)
