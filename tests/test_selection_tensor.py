"""Tensor-level token selection (gmts_analysis.core.selection's tensor API): exact k, ties, padding,
groups, GMTS = entropy x |A| x w on-policy, omega against the numpy reference, loss normalizers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from gmts_analysis.core import selection
from gmts_analysis.core.advantages import loss_weights, omega
from gmts_analysis.core.selection import (
    aggregate_loss,
    gmts_scores,
    select_tokens,
    selection_mask,
    token_omega,
)


def _batch(seed=0, B=6, T=9, ties=False):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    scores = torch.rand(B, T, generator=g)
    if ties:
        scores = torch.randint(0, 3, (B, T), generator=g).float()
    scores = torch.where(mask.bool(), scores, torch.full_like(scores, 99.0))  # padding scores high on purpose
    return scores, mask


@pytest.mark.parametrize("rho", [0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_k_batch_scope_and_no_padding(rho, seed):
    scores, mask = _batch(seed)
    sel = select_tokens(scores, mask, rho, "batch")
    n = int(mask.sum())
    assert int(sel.sum()) == min(n, math.ceil(rho * n - 1e-9))
    assert not (sel & ~mask.bool()).any()
    if 0 < sel.sum() < n:  # every kept score >= every dropped real score
        assert scores[sel].min() >= scores[mask.bool() & ~sel].max()


@pytest.mark.parametrize("rho", [0.1, 0.2, 0.5])
def test_group_scope_exact_k_per_group_never_mixes(rho):
    scores, mask = _batch(3, B=8)
    groups = torch.tensor([0, 0, 1, 1, 1, 2, 2, 5])
    # make group 0 dominate: if groups were mixed, it would take everything
    scores[:2] += 10.0
    sel = select_tokens(scores, mask, rho, "group", group_ids=groups)
    for gid in groups.unique():
        rows = groups == gid
        n = int(mask[rows].sum())
        assert int(sel[rows].sum()) == min(n, math.ceil(rho * n - 1e-9))
    assert not (sel & ~mask.bool()).any()
    # string labels (verl's uid) give the same selection
    labels = [f"u{int(x)}" for x in groups]
    assert torch.equal(select_tokens(scores, mask, rho, "group", group_ids=labels), sel)


def test_ties_broken_by_row_then_position():
    scores = torch.ones(3, 4)
    mask = torch.ones(3, 4)
    sel = select_tokens(scores, mask, 0.25, "batch")  # k = 3: the first three of row 0
    assert sel[0, :3].all() and int(sel.sum()) == 3
    mask[0] = 0  # row 0 is padding: the first three of row 1
    sel = select_tokens(scores, mask, 0.375, "batch")  # n = 8, k = 3
    assert sel[1, :3].all() and int(sel.sum()) == 3
    # deterministic on repeated calls with random ties
    s, m = _batch(5, ties=True)
    assert torch.equal(select_tokens(s, m, 0.3), select_tokens(s, m, 0.3))


@pytest.mark.parametrize("scope", ["batch", "group"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_dataframe_selection(scope, seed):
    """The tensor API and the tokens-table API (colleague's select_top) pick the same tokens."""
    scores, mask = _batch(seed, ties=True)
    B, T = scores.shape
    groups = torch.arange(B) // 2
    rows = [(i, t) for i in range(B) for t in range(T) if mask[i, t]]
    df = pd.DataFrame(
        {
            "answer_id": [i for i, _ in rows],
            "position": [t for _, t in rows],
            "group_id": [int(groups[i]) for i, _ in rows],
            "s": [float(scores[i, t]) for i, t in rows],
        }
    )
    ref = selection.select_top(df, "s", 0.3, scope)
    sel = select_tokens(scores, mask, 0.3, scope, group_ids=groups)
    assert np.array_equal(np.array([bool(sel[i, t]) for i, t in rows]), ref)


def test_nan_scores_rank_last():
    scores = torch.tensor([[float("nan"), 0.1, 0.2, float("nan")]])
    mask = torch.ones(1, 4)
    sel = select_tokens(scores, mask, 0.75, "batch")  # k = 3: both reals, then the first NaN
    assert sel.tolist() == [[True, True, True, False]]


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_on_policy_gmts_is_entropy_abs_advantage_weight(loss_agg):
    g = torch.Generator().manual_seed(0)
    _, mask = _batch(1)
    B, T = mask.shape
    ent = torch.rand(B, T, generator=g) * 3
    adv = torch.randn(B, generator=g)
    lengths = mask.sum(-1).numpy()
    w = loss_weights(lengths, loss_agg)  # the lead's numpy reference (docs/definitions.md section 3)
    want = ent.double() * adv.abs().double()[:, None] * torch.from_numpy(w)[:, None] * mask
    got = gmts_scores(ent, adv, mask, loss_agg=loss_agg)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    # verl-shaped (B, T) advantages give the same
    torch.testing.assert_close(gmts_scores(ent, adv[:, None] * mask, mask, loss_agg=loss_agg), want)


def test_full_omega_matches_numpy_reference():
    g = torch.Generator().manual_seed(4)
    _, mask = _batch(2)
    B, T = mask.shape
    lp = -torch.rand(B, T, generator=g) * 2
    old = lp + 0.4 * torch.randn(B, T, generator=g)  # ratios on both sides of the clip range
    ref = lp + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, generator=g)
    got = token_omega(adv, mask, logprobs=lp, old_logprobs=old, ref_logprobs=ref, kl_beta=0.05)
    w = loss_weights(mask.sum(-1).numpy(), "token-mean")
    for i in range(B):
        L = int(mask[i].sum())
        want = omega(w[i], float(adv[i]), lp[i, :L].numpy(), old[i, :L].numpy(), ref[i, :L].numpy(), kl_beta=0.05)
        np.testing.assert_allclose(got[i, :L].numpy(), want, rtol=1e-6)
        assert (got[i, L:] == 0).all()
    no_kl = token_omega(adv, mask, logprobs=lp, old_logprobs=old)
    assert ((no_kl == 0) & mask.bool()).any(), "the test should exercise the trust indicator"


def test_selection_mask_modes():
    scores, mask = _batch(0)
    ent = scores.clamp(max=5)
    adv = torch.linspace(-1, 1, scores.shape[0])
    assert torch.equal(selection_mask("all", ent, adv, mask), mask.bool())
    e = selection_mask("entropy", ent, adv, mask, rho=0.2)
    assert torch.equal(e, select_tokens(ent, mask, 0.2))
    r1 = selection_mask("random", ent, adv, mask, rho=0.2, generator=torch.Generator().manual_seed(1))
    r2 = selection_mask("random", ent, adv, mask, rho=0.2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(r1, r2) and int(r1.sum()) == int(e.sum())
    gm = selection_mask("gmts", ent, adv, mask, rho=0.2)
    assert torch.equal(gm, select_tokens(gmts_scores(ent, adv, mask), mask, 0.2))
    # a row with A = 0 has GMTS 0 everywhere: not selected while other rows have positive scores left
    adv0 = adv.clone()
    adv0[0] = 0.0
    gm0 = selection_mask("gmts", ent, adv0, mask, rho=0.2)
    assert not gm0[0].any()
    with pytest.raises(ValueError):
        selection_mask("bogus", ent, adv, mask)


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_aggregate_loss_normalizers(loss_agg):
    scores, mask = _batch(7)
    loss = torch.randn(scores.shape, generator=torch.Generator().manual_seed(0))
    sel = select_tokens(scores, mask, 0.3)
    m = mask.double()
    full = aggregate_loss(loss.double(), mask, None, "all", loss_agg)
    if loss_agg == "token-mean":
        torch.testing.assert_close(full, (loss.double() * m).sum() / m.sum())
        s = sel.double()
        torch.testing.assert_close(aggregate_loss(loss.double(), mask, sel, "all"), (loss * s).sum().double() / m.sum())
        torch.testing.assert_close(
            aggregate_loss(loss.double(), mask, sel, "selected"), (loss * s).sum().double() / s.sum()
        )
    # selecting everything changes nothing, whatever the normalizer
    torch.testing.assert_close(aggregate_loss(loss.double(), mask, mask.bool(), "selected", loss_agg), full)
    # padding terms never leak in
    noisy = torch.where(mask.bool(), loss, torch.full_like(loss, 1e6)).double()
    torch.testing.assert_close(aggregate_loss(noisy, mask, sel, "all", loss_agg),
                               aggregate_loss(loss.double(), mask, sel, "all", loss_agg))


def test_bad_inputs_raise():
    scores, mask = _batch(0)
    with pytest.raises(ValueError):
        select_tokens(scores, mask, 1.5)
    with pytest.raises(ValueError):
        select_tokens(scores, mask, 0.2, "group")
    with pytest.raises(ValueError):
        select_tokens(scores, mask[:, :-1], 0.2)


def test_masked_baselines_select_like_the_masked_table_score():
    from gmts_analysis.core.selection_tensor import MASKED_SELECTIONS, masked_scores, selection_mask

    g = torch.Generator().manual_seed(0)
    ent = torch.rand(6, 5, generator=g, dtype=torch.float64)
    lp = -torch.rand(6, 5, generator=g, dtype=torch.float64)
    mask = torch.ones(6, 5)
    mask[2, 3:] = 0
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, -0.5])
    for name, x in (("entropy_inf", ent), ("one_minus_prob_inf", 1 - torch.exp(lp))):
        want = torch.where((adv != 0)[:, None] & mask.bool(), x, torch.zeros_like(x))
        got = masked_scores(name, ent, adv, mask, token_logprobs=lp)
        assert torch.equal(got, want) and name in MASKED_SELECTIONS
        sel = selection_mask(name, ent, adv, mask, rho=0.3, token_logprobs=lp)
        assert not sel[2:4].any()  # 30% of 28 tokens = 9 picks, all among the 20 with signal
        assert int(sel.sum()) == 9
    with pytest.raises(ValueError, match="log-probs"):
        masked_scores("one_minus_prob_inf", ent, adv, mask)
