"""verl recipe on verl-shaped tensors (verl itself not needed): masking the token-level
advantages reproduces 'drop the unselected tokens from the policy loss' through verl's own
clipped-surrogate arithmetic, for both normalizers; group scope follows verl's uid."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gmts_analysis.core.selection import aggregate_loss, select_tokens
from gmts_analysis.integrations.verl_recipe import apply_token_selection, verl_selection_mask


def verl_vanilla_pg_losses(old_log_prob, log_prob, advantages, clip_low=0.2, clip_high=0.28, clip_ratio_c=3.0):
    """verl's compute_policy_loss_vanilla per-token losses (dual clip), written out here."""
    ratio = torch.exp(log_prob - old_log_prob)
    l1 = -advantages * ratio
    l2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    c1 = torch.maximum(l1, l2)
    l3 = -advantages * clip_ratio_c
    c2 = torch.min(l3, c1)
    return torch.where(advantages < 0, c2, c1)


def verl_agg_loss(loss_mat, loss_mask, mode):
    """verl's agg_loss for token-mean and seq-mean-token-mean."""
    m = loss_mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum()
    return ((loss_mat * m).sum(-1) / (m.sum(-1) + 1e-8)).mean()


def _verl_batch(seed=0, bs=8, T=12, n_per_uid=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (bs,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).float()
    scores = torch.randint(0, 2, (bs,), generator=g).float()
    uid = np.array([f"uid-{i // n_per_uid}" for i in range(bs)], dtype=object)
    adv = torch.zeros(bs)
    for u in set(uid):
        idx = torch.tensor([i for i in range(bs) if uid[i] == u])
        s = scores[idx]
        adv[idx] = (s - s.mean()) / (s.std() + 1e-6)
    batch = {
        "old_entropys": torch.rand(bs, T, generator=g) * 2 * mask,
        "advantages": adv[:, None] * mask,  # verl broadcasts the answer's advantage
        "response_mask": mask,
        "old_log_probs": -torch.rand(bs, T, generator=g) * 3 * mask,
    }
    return SimpleNamespace(batch=batch, non_tensor_batch={"uid": uid})


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("normalizer", ["all", "selected"])
@pytest.mark.parametrize("selection", ["entropy", "gmts", "random"])
def test_masked_advantages_equal_selected_policy_loss(mode, normalizer, selection):
    data = _verl_batch(1)
    b = data.batch
    adv0, mask, old = b["advantages"].clone(), b["response_mask"], b["old_log_probs"]
    log_prob = old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2))  # off-policy: clips
    metrics = apply_token_selection(data, selection=selection, rho=0.25, normalizer=normalizer, loss_agg_mode=mode)
    sel = b["token_selection_mask"]
    got = verl_agg_loss(verl_vanilla_pg_losses(old, log_prob, b["advantages"]), mask, mode)
    want = aggregate_loss(verl_vanilla_pg_losses(old, log_prob, adv0), mask, sel, normalizer, mode)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
    assert int(sel.sum()) == math.ceil(0.25 * int(mask.sum()) - 1e-9)
    assert 0 <= metrics["gmts/selection/overlap_entropy"] <= 1
    assert metrics["gmts/selection/frac_selected"] == pytest.approx(int(sel.sum()) / int(mask.sum()))


def test_group_scope_uses_uid_and_gmts_is_entropy_abs_adv():
    data = _verl_batch(3)
    b = data.batch
    uid = data.non_tensor_batch["uid"]
    sel = verl_selection_mask(b["old_entropys"], b["advantages"], b["response_mask"], selection="gmts",
                              rho=0.3, scope="group", uid=uid)
    for u in set(uid):
        rows = torch.tensor([x == u for x in uid])
        n = int(b["response_mask"][rows].sum())
        assert int(sel[rows].sum()) == math.ceil(0.3 * n - 1e-9)
    # on-policy token-mean: GMTS ranks by entropy * |A| (w is one constant)
    ref = select_tokens(b["old_entropys"].double() * b["advantages"].abs().double(), b["response_mask"], 0.3,
                        "group", uid)
    assert torch.equal(sel, ref)
    assert not (sel & ~b["response_mask"].bool()).any()


def test_selection_all_keeps_advantages_and_bad_modes_raise():
    data = _verl_batch(0)
    adv0 = data.batch["advantages"].clone()
    apply_token_selection(data, selection="all")
    torch.testing.assert_close(data.batch["advantages"], adv0)
    with pytest.raises(ValueError):
        apply_token_selection(_verl_batch(0), normalizer="selected", loss_agg_mode="seq-mean-token-sum")
    with pytest.raises(ValueError):
        apply_token_selection(_verl_batch(0), normalizer="bogus")


class _Batch(dict):
    """Stand-in for verl's TensorDict batch (``keys()`` and item access are all the writer uses)."""


def test_verl_batch_written_in_our_format_and_probed(tmp_path, tiny_model_dirs):
    """write_verl_batch turns a DataProto after compute_advantage into rows `gmts probe` reads as is:
    left-padded prompts and right-padded responses lose exactly their padding."""
    import json

    import pandas as pd

    from gmts_analysis.cli import main
    from gmts_analysis.integrations.rollout_log import write_verl_batch

    g = torch.Generator().manual_seed(0)
    bs, P, R = 4, 5, 6
    plen, rlen = [5, 3, 4, 5], [6, 2, 4, 1]
    prompts = torch.randint(3, 60, (bs, P), generator=g)
    responses = torch.randint(3, 60, (bs, R), generator=g)
    attn = torch.zeros(bs, P + R, dtype=torch.long)
    for i in range(bs):
        attn[i, P - plen[i]:P] = 1
        attn[i, P:P + rlen[i]] = 1
        prompts[i, :P - plen[i]] = 0  # pad id
        responses[i, rlen[i]:] = 0
    rmask = attn[:, P:].float()
    scores = torch.zeros(bs, R)
    for i, r in enumerate([1.0, 0.0, 0.5, 1.0]):
        scores[i, rlen[i] - 1] = r  # verl puts the reward on the last response token
    adv = torch.tensor([0.7, -0.7, 0.3, -0.3])[:, None] * rmask
    old = -torch.rand(bs, R, generator=g) * rmask
    data = SimpleNamespace(batch=_Batch(prompts=prompts, responses=responses, attention_mask=attn,
                                        token_level_scores=scores, advantages=adv, old_log_probs=old),
                           non_tensor_batch={"uid": np.array(["a", "a", "b", "b"], dtype=object)})
    path = write_verl_batch(data, tmp_path / "rollouts", step=3)
    assert path.name == "rollouts_rank0_00003.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, r in enumerate(rows):
        assert r["prompt_ids"] == prompts[i, P - plen[i]:].tolist()
        assert r["response_ids"] == responses[i, :rlen[i]].tolist()
        assert r["reward"] == [1.0, 0.0, 0.5, 1.0][i] and r["group_id"] == "aabb"[i] and r["step"] == 3
        assert r["logged_advantage"] == pytest.approx(float(adv[i, 0]))
        assert r["old_logprobs"] == pytest.approx(old[i, :rlen[i]].tolist())
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(tmp_path / "rollouts"),
                 "--out", str(out), "--device", "cpu", "--grad-norm", "none", "--no-figures", "--fidelity", "off",
                 "--advantage", "logged", "--quiet"]) == 0
    ans = pd.read_parquet(out / "answers.parquet")
    assert [list(x) for x in ans["response_ids"]] == [r["response_ids"] for r in rows]
    assert ans["advantage"].tolist() == pytest.approx([r["logged_advantage"] for r in rows])
