"""Advantage modes, aggregation weights and omega against hand-computed values."""

import math

import numpy as np
import pytest

from gmts_analysis.core.advantages import SingletonGroupWarning, compute_advantages, loss_weights, omega


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
    np.testing.assert_allclose(omega(1.0, 1.0, lp, old), [0.0, 1.0, 0.5])  # A>0 clipped above 1.2
    np.testing.assert_allclose(omega(1.0, -1.0, lp, old), [-2.0, -1.0, 0.0])  # A<0 clipped below 0.8
    # k3 KL gradient: beta (pi_ref / pi - 1)
    ref = np.log(np.array([0.25, 0.4, 0.9]))
    np.testing.assert_allclose(omega(1.0, 0.0, lp, ref_logprob=ref, kl_beta=0.5), [0.5 * -0.5, 0.5 * 1.0, 0.0],
                               atol=1e-12)


def test_omega_table_matches_tensor_version():
    """The table API and the tensor API are one implementation: same numbers on the same answer."""
    import torch

    from gmts_analysis.core.selection_tensor import token_omega

    rng = np.random.default_rng(0)
    lp = -rng.random(7) * 2
    old = lp + rng.normal(0, 0.3, 7)
    ref = lp + rng.normal(0, 0.3, 7)
    kw = dict(clip_high=0.28, kl_beta=0.1, kl_bias_correction=True, importance_sampling_level="sequence")
    table = omega(1 / 7, 0.8, lp, old, ref, **kw)
    t = lambda x: torch.tensor(x)[None]  # noqa: E731
    tensor = token_omega(torch.tensor([0.8], dtype=torch.float64), torch.ones(1, 7), logprobs=t(lp), old_logprobs=t(old),
                         ref_logprobs=t(ref), **kw)[0].numpy()
    np.testing.assert_allclose(table, tensor, rtol=1e-14, atol=0)


def test_nan_rewards_are_left_out_as_trl_does():
    """TRL 1.16 (_generate_and_score_completions): unscorable rows are NaN, excluded from the group's
    nanmean / nanstd (trl.trainer.utils.nanstd, Bessel-corrected), and get advantage 0."""
    import torch

    trl_utils = pytest.importorskip("trl.trainer.utils")
    r = [1.0, float("nan"), 0.0, 1.0, 0.5, float("nan"), float("nan"), 2.0]
    G = 4
    a = compute_advantages(r, [0, 0, 0, 0, 1, 1, 1, 1], "group")
    rt = torch.tensor(r, dtype=torch.float64)
    mean = torch.nanmean(rt.view(-1, G), dim=1).repeat_interleave(G)
    std = trl_utils.nanstd(rt.view(-1, G), dim=1).repeat_interleave(G)
    want = torch.nan_to_num((rt - mean) / (std + 1e-4), nan=0.0).numpy()
    np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
    assert a[1] == 0.0 and a[5] == 0.0


def test_logged_advantages_used_as_given():
    from gmts_analysis.errors import GmtsError

    np.testing.assert_array_equal(compute_advantages([0, 1], [0, 0], "logged", logged=[0.3, -0.3]), [0.3, -0.3])
    with pytest.raises(GmtsError, match="logged"):
        compute_advantages([0, 1], [0, 0], "logged")
    with pytest.raises(GmtsError, match="row 1"):
        compute_advantages([0, 1], [0, 0], "logged", logged=[0.3, None])
