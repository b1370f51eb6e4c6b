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


# --- against the real verl (0.9.1): these skip where verl is not installed; CI runs them in a venv of their own
# (.ci/run, the verl block), where they must pass ---------------------------------------------------------------

VERL_MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm", "token-sum"]


@pytest.fixture(scope="module")
def verl_cfg():
    """verl's composed default config (``ppo_trainer.yaml``), GRPO with 4 answers per prompt."""
    pytest.importorskip("verl")
    import os

    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    with initialize_config_dir(config_dir=os.path.join(os.path.dirname(main_ppo.__file__), "config"),
                               version_base=None):
        return compose(config_name="ppo_trainer", overrides=[
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])


def _real_verl_batch(seed=0, bs=8, P=3, T=10, n=4, dtype=torch.float32, max_len=None):
    """A verl ``DataProto`` as ``RayPPOTrainer.fit`` has it before ``compute_advantage``: left-padded prompts,
    right-padded responses (no answer reaches the horizon T unless ``max_len``), one 0/1 score per answer."""
    from verl.protocol import DataProto
    from verl.trainer.ppo.ray_trainer import compute_response_mask

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, (max_len or T - 1) + 1, (bs,), generator=g)
    resp_mask = (torch.arange(T)[None] < lengths[:, None]).long()
    attn = torch.cat([torch.ones(bs, P, dtype=torch.long), resp_mask], 1)
    scores = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0][:bs], dtype=dtype)
    tls = torch.zeros(bs, T, dtype=dtype)
    tls[torch.arange(bs), lengths - 1] = scores
    data = DataProto.from_dict(
        tensors={"prompts": torch.randint(3, 50, (bs, P), generator=g),
                 "responses": torch.randint(3, 50, (bs, T), generator=g) * resp_mask,
                 "attention_mask": attn, "token_level_scores": tls, "token_level_rewards": tls,
                 "old_log_probs": (-torch.rand(bs, T, generator=g, dtype=dtype) * 3) * resp_mask,
                 "ref_log_prob": (-torch.rand(bs, T, generator=g, dtype=dtype) * 3) * resp_mask,
                 "old_entropys": torch.rand(bs, T, generator=g, dtype=dtype) * 2 * resp_mask},
        non_tensors={"uid": np.array([f"p{i // n}" for i in range(bs)], dtype=object)})
    data.batch["response_mask"] = compute_response_mask(data)
    return data


def _grpo(data, cfg):
    from verl.trainer.ppo.ray_trainer import compute_advantage

    return compute_advantage(data, adv_estimator=cfg.algorithm.adv_estimator, num_repeat=4, config=cfg.algorithm)


def _verl_actor(cfg, mode, **over):
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    a = OmegaConf.merge(cfg.actor_rollout_ref.actor, {"loss_agg_mode": mode, "clip_ratio_high": 0.28, **over})
    return omega_conf_to_dataclass(a)


def _verl_ppo_loss(actor, old, lp, adv, mask, ref=None):
    """The actor's loss as verl 0.9.1's worker (``workers/utils/losses.py`` ``ppo_loss``) composes it from verl's
    own functions: ``get_policy_loss_fn`` + ``kl_penalty`` + ``agg_loss`` (one micro-batch = the mini-batch)."""
    from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty

    actor.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None,
                                   loss_scale_factor=actor.loss_scale_factor)
    pg, _ = get_policy_loss_fn(actor.policy_loss.loss_mode)(
        old_log_prob=old, log_prob=lp, advantages=adv, response_mask=mask.bool(), loss_agg_mode=actor.loss_agg_mode,
        config=actor)
    if actor.use_kl_loss:
        kld = kl_penalty(logprob=lp, ref_logprob=ref, kl_penalty=actor.kl_loss_type)
        pg = pg + actor.kl_loss_coef * agg_loss(loss_mat=kld, loss_mask=mask.bool(), loss_agg_mode=actor.loss_agg_mode,
                                                **actor.global_batch_info)
    return pg


def _grad(actor, old, lp, adv, mask, ref=None):
    leaf = lp.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(_verl_ppo_loss(actor, old, leaf, adv, mask, ref), leaf)
    return g


@pytest.mark.parametrize("mode, normalizer", [(m, "all") for m in VERL_MODES]
                         + [("token-mean", "selected"), ("seq-mean-token-mean", "selected")])
def test_real_verl_masked_advantages_drop_unselected_tokens(verl_cfg, mode, normalizer):
    """verl's DataProto, GRPO compute_advantage and vanilla policy loss (dual clip, off-policy ratios): the
    masked advantages give verl's own gradient with the unselected tokens dropped, in every loss_agg_mode
    (the selected normalizer is defined for token-mean and seq-mean-token-mean)."""
    data = _grpo(_real_verl_batch(1), verl_cfg)
    b = data.batch
    adv0, mask, old = b["advantages"].clone(), b["response_mask"], b["old_log_probs"]
    lp = old + 0.4 * torch.randn(old.shape, generator=torch.Generator().manual_seed(2))
    actor = _verl_actor(verl_cfg, mode)
    apply_token_selection(data, selection="gmts", rho=0.25, scope="group", normalizer=normalizer, actor=actor)
    sel = b["token_selection_mask"]
    assert 0 < int(sel.sum()) < int(mask.sum())
    got = _grad(actor, old, lp, b["advantages"], mask)
    full = _grad(actor, old, lp, adv0, mask)
    if normalizer == "all":
        want = full * sel
    else:  # the policy term is verl's loss over the selected tokens alone
        want = _grad(_verl_actor(verl_cfg, mode), old, lp, adv0, sel.long())
        if mode == "seq-mean-token-mean":  # verl counts the answers that have a selected token; ours all answers
            want = want * int((sel.sum(-1) > 0).sum()) / sel.shape[0]
    err = (got - want).abs().max().item()
    print(f"verl {mode} normalizer={normalizer}: max |grad - verl's| = {err:.3g} (max |grad| "
          f"{want.abs().max().item():.3g})")
    torch.testing.assert_close(got, want, rtol=0 if normalizer == "all" else 1e-6, atol=0 if normalizer == "all" else 1e-8)
    assert (got[mask.bool() & ~sel] == 0).all()


@pytest.mark.parametrize("mode", VERL_MODES)
def test_real_verl_omega_is_minus_the_gradient_with_kl(verl_cfg, mode):
    """omega under verl_loss_settings(actor) equals -d loss / d logprob of verl's loss (policy + low_var_kl), every
    loss_agg_mode; seq-mean-token-sum-norm on a batch where no answer reaches the horizon (longest 7 of 10)."""
    from gmts_analysis.core.objective import answer_weights, omega_tensor, verl_loss_settings

    data = _grpo(_real_verl_batch(3, dtype=torch.float64, max_len=7), verl_cfg)
    b = data.batch
    mask, old, ref, adv = b["response_mask"], b["old_log_probs"], b["ref_log_prob"], b["advantages"]
    assert int(mask.sum(-1).max()) == 7 < mask.shape[-1] == 10
    lp = old + 0.4 * torch.randn(old.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    actor = _verl_actor(verl_cfg, mode, use_kl_loss=True, kl_loss_coef=0.05)
    want = -_grad(actor, old, lp, adv, mask, ref) * mask
    s = verl_loss_settings(actor, verl_cfg.algorithm, horizon=mask.shape[-1])
    got = omega_tensor(lp, mask, adv, answer_weights(mask.sum(-1), s.loss_agg, s.max_len), s, old_logprobs=old,
                       ref_logprobs=ref)
    err = ((got - want).abs().max() / want.abs().max()).item()
    print(f"verl {mode}: omega vs -grad, max relative error {err:.3g}; horizon {s.max_len}")
    assert err < 1e-12
    if mode == "seq-mean-token-sum-norm":
        assert s.max_len == 10
        stale = omega_tensor(lp, mask, adv, answer_weights(mask.sum(-1), s.loss_agg, None), s, old_logprobs=old,
                             ref_logprobs=ref)  # the longest answer as L_max: off by horizon / longest
        ratio = (stale.abs().sum() / want.abs().sum()).item()
        print(f"  longest answer instead of the horizon: omega off by {ratio:.6g} (10 / 7 = {10 / 7:.6g})")
        assert ratio == pytest.approx(10 / 7, rel=1e-12)
        s2 = verl_loss_settings(_verl_actor(verl_cfg, mode, loss_scale_factor=16))
        assert s2.max_len == 16  # loss_scale_factor wins over the padded width


def test_real_verl_default_config_read_and_refused(verl_cfg):
    """verl's composed default config: the V1 trainer is the default, and every actor field the recipe reads
    exists with the meaning it assumes; what omega does not model is refused."""
    from omegaconf import OmegaConf

    from gmts_analysis.core.objective import verl_loss_settings
    from gmts_analysis.errors import GmtsError

    assert verl_cfg.trainer.use_v1 is True and verl_cfg.trainer.v1.trainer_mode == "sync"
    a = verl_cfg.actor_rollout_ref.actor
    for key in ("loss_agg_mode", "clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "entropy_coeff",
                "use_kl_loss", "kl_loss_coef", "kl_loss_type", "loss_scale_factor", "policy_loss"):
        assert key in a, key
    s = verl_loss_settings(a, verl_cfg.algorithm)
    assert (s.loss_agg, s.clip_low, s.clip_high, s.clip_ratio_c, s.kl_beta) == ("token-mean", 0.2, 0.2, 3.0, 0.0)
    assert verl_loss_settings(_verl_actor(verl_cfg, "token-mean")).clip_high == 0.28  # the dataclass reads too
    bad = [({"entropy_coeff": 0.01}, "entropy_coeff"), ({"policy_loss": {"loss_mode": "gspo"}}, "gspo"),
           ({"use_kl_loss": True, "kl_loss_type": "k3+"}, r"k3\+"), ({"use_kl_loss": True, "kl_loss_type": "mse"}, "mse"),
           ({"loss_agg_mode": "seq-mean-token-sum-norm"}, "loss_scale_factor")]
    for over, name in bad:
        with pytest.raises(GmtsError, match=name):
            verl_loss_settings(OmegaConf.merge(a, over))
    with pytest.raises(GmtsError, match="rollout_is"):
        verl_loss_settings(a, OmegaConf.merge(verl_cfg.algorithm, {"rollout_correction": {"rollout_is": "token"}}))
    data = _grpo(_real_verl_batch(0), verl_cfg)
    with pytest.raises(GmtsError, match="entropy_coeff"):
        apply_token_selection(data, actor=OmegaConf.merge(a, {"entropy_coeff": 0.01}))


def test_real_verl_selected_factor_in_the_advantages_dtype(verl_cfg):
    """normalizer='selected' on a float64 batch: n_all / n_selected in float64 (it was float32: ~4e-8 off)."""
    from gmts_analysis.integrations.verl_recipe import selected_normalizer_factor

    data = _grpo(_real_verl_batch(5, dtype=torch.float64), verl_cfg)
    b = data.batch
    adv0, mask = b["advantages"].clone(), b["response_mask"]
    assert adv0.dtype == torch.float64
    apply_token_selection(data, selection="gmts", rho=0.3, normalizer="selected", actor=verl_cfg.actor_rollout_ref.actor)
    sel = b["token_selection_mask"]
    n_all, n_sel = int(mask.sum()), int(sel.sum())
    want = adv0 * sel * (n_all / n_sel)  # the exact factor, float64
    err = ((b["advantages"] - want).abs().max() / want.abs().max()).item()
    old = ((adv0 * sel * selected_normalizer_factor(mask, sel, "token-mean") - want).abs().max()
           / want.abs().max()).item()
    print(f"selected factor {n_all}/{n_sel}: relative error {err:.3g} in float64 (float32 factor: {old:.3g})")
    assert err <= 1e-15 < old


def _fake_transfer_queue(monkeypatch, rows):
    """An in-memory stand-in for the TransferQueue's KV calls the V1 trainer makes (``kv_batch_get`` returns the
    stored fields of the keys, jagged fields nested, as verl's ``list_of_dict_to_tensordict`` builds them)."""
    import transfer_queue as tq
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    def get(keys, partition_id, select_fields):
        fields = [f for f in select_fields if f in rows[keys[0]]]
        return list_of_dict_to_tensordict([{f: rows[k][f] for f in fields} for k in keys])

    def put(keys, partition_id, fields):
        for i, k in enumerate(keys):
            for name in fields.keys():
                v = fields[name]
                rows[k][name] = v[i] if not v.is_nested else v.unbind()[i]
        return tq.KVBatchMeta(keys=list(keys), tags=[{} for _ in keys], partition_id=partition_id)

    monkeypatch.setattr(tq, "kv_batch_get", get)
    monkeypatch.setattr(tq, "kv_batch_put", put)


def test_real_verl_v1_trainer_selects_after_its_own_advantages(verl_cfg, monkeypatch):
    """verl 0.9.1's default V1 trainer: 'gmts_sync' is in verl's trainer registry, and its _compute_advantage
    (verl's own, then the selection) writes the same advantages as the recipe applied to verl's padded batch."""
    import transfer_queue as tq
    from omegaconf import OmegaConf, open_dict
    from verl.trainer.ppo.v1 import PPOTrainerSync, get_trainer_cls

    from gmts_analysis.integrations.verl_trainer import GmtsPPOTrainerSync

    assert get_trainer_cls("gmts_sync") is GmtsPPOTrainerSync and issubclass(GmtsPPOTrainerSync, PPOTrainerSync)
    ref = _grpo(_real_verl_batch(7), verl_cfg)
    rows = {}
    keys = []
    for i in range(8):
        n = int(ref.batch["response_mask"][i].sum())
        key = f"p{i // 4}_{i % 4}_0"  # verl's {uid}_{session_id}_{index}
        keys.append(key)
        rows[key] = {"uid": f"p{i // 4}", "response_mask": ref.batch["response_mask"][i, :n],
                     "rm_scores": ref.batch["token_level_scores"][i, :n], "old_log_probs": ref.batch["old_log_probs"][i, :n],
                     "entropy": ref.batch["old_entropys"][i, :n]}
    _fake_transfer_queue(monkeypatch, rows)
    trainer = GmtsPPOTrainerSync.__new__(GmtsPPOTrainerSync)
    trainer.config = OmegaConf.merge(verl_cfg, {})
    with open_dict(trainer.config):  # as hydra's +gmts.<key>=... adds them
        trainer.config.gmts = {"selection": "gmts", "rho": 0.25, "scope": "group"}
    metrics = {}
    trainer._compute_advantage(tq.KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), metrics)
    apply_token_selection(ref, selection="gmts", rho=0.25, scope="group", actor=verl_cfg.actor_rollout_ref.actor)
    for i, k in enumerate(keys):
        n = int(ref.batch["response_mask"][i].sum())
        torch.testing.assert_close(rows[k]["advantages"], ref.batch["advantages"][i, :n], rtol=0, atol=0)
    assert metrics["gmts/selection/frac_selected"] == pytest.approx(
        int(ref.batch["token_selection_mask"].sum()) / int(ref.batch["response_mask"].sum()))
    with open_dict(trainer.config):
        trainer.config.gmts.bogus = 1
    from gmts_analysis.errors import GmtsError
    with pytest.raises(GmtsError, match="gmts.bogus"):
        trainer._compute_advantage(tq.KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), {})
    with open_dict(trainer.config):
        del trainer.config.gmts.bogus
        trainer.config.algorithm.rollout_correction.bypass_mode = True  # no old-policy entropies then
    with pytest.raises(GmtsError, match="bypass_mode"):
        trainer._compute_advantage(tq.KVBatchMeta(keys=keys, tags=[{} for _ in keys], partition_id="train"), {})


def test_real_verl_legacy_trainer_insertion_points(verl_cfg):
    """verl 0.9.1's legacy RayPPOTrainer: fit computes the old log-probs with _compute_old_log_prob (returning
    the DataProto and its MFU), pops 'entropys', unions the rest into the batch, computes the advantages and
    then calls _update_actor(batch): the order GmtsRayPPOTrainer's two overrides rely on."""
    import inspect

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    from gmts_analysis.integrations.verl_trainer import GmtsRayPPOTrainer

    src = inspect.getsource(RayPPOTrainer.fit)
    marks = ["old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)", 'old_log_prob.batch.pop("entropys")',
             "batch = batch.union(old_log_prob)", "batch = compute_advantage(", "actor_output = self._update_actor(batch)"]
    at = [src.find(m) for m in marks]
    assert -1 not in at and at == sorted(at), dict(zip(marks, at))
    for name in ("_compute_old_log_prob", "_update_actor"):
        assert list(inspect.signature(getattr(RayPPOTrainer, name)).parameters) == ["self", "batch"]
        assert getattr(GmtsRayPPOTrainer, name) is not getattr(RayPPOTrainer, name)


class _FakeActorWorkers:
    """Stands in for verl's actor worker group (the Ray workers): ``compute_log_prob`` answers, for the unpadded
    (nested) sequences verl sends, a log-prob and an entropy per token; ``update_actor`` keeps what it receives."""

    def __init__(self):
        self.updates = []

    def compute_log_prob(self, td):
        from verl.utils import tensordict_utils as tu

        ids = td["input_ids"]
        lp = torch.nested.nested_tensor_from_jagged(-(ids.values() % 7).float() / 3, offsets=ids.offsets())
        ent = torch.nested.nested_tensor_from_jagged((ids.values() % 5).float() / 2, offsets=ids.offsets())
        return tu.get_tensordict({"log_probs": lp, "entropy": ent}, non_tensor_dict={"metrics": {"mfu": 0.0}})

    def update_actor(self, td):
        from verl.utils import tensordict_utils as tu

        self.updates.append(td)
        return tu.get_tensordict({}, non_tensor_dict={"metrics": {"mfu": 0.0}})


def test_real_verl_legacy_trainer_keeps_entropies_and_selects_before_the_update(verl_cfg):
    """GmtsRayPPOTrainer through verl 0.9.1's own _compute_old_log_prob and _update_actor (their padding
    conversions included, the workers faked): 'old_entropys' survive fit's pop, and the actor update receives
    the recipe's masked advantages."""
    from omegaconf import OmegaConf, open_dict

    from gmts_analysis.integrations.verl_trainer import GmtsRayPPOTrainer

    data = _real_verl_batch(9)
    b = data.batch
    bs, P = b["prompts"].shape
    b["input_ids"] = torch.cat([b["prompts"], b["responses"]], 1)
    b["position_ids"] = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    trainer = GmtsRayPPOTrainer.__new__(GmtsRayPPOTrainer)
    trainer.config = OmegaConf.merge(verl_cfg, {})
    with open_dict(trainer.config):
        trainer.config.gmts = {"selection": "gmts", "rho": 0.25, "scope": "group"}
    trainer.actor_rollout_wg = _FakeActorWorkers()
    old, _ = trainer._compute_old_log_prob(data)
    torch.testing.assert_close(old.batch["old_entropys"], old.batch["entropys"], rtol=0, atol=0)
    mask = b["response_mask"].bool()
    T = b["responses"].shape[1]  # the model's output at the token before each response token (verl's shift)
    want_ent = (b["input_ids"][:, P - 1:P - 1 + T] % 5).float() / 2
    torch.testing.assert_close(old.batch["old_entropys"][mask], want_ent[mask], rtol=0, atol=0)
    old.batch.pop("entropys")  # what fit does, then batch.union(old_log_prob)
    data.batch.pop("old_log_probs"), data.batch.pop("old_entropys")  # the rollout batch has neither before
    data = data.union(old)
    data = _grpo(data, verl_cfg)
    ref = data.select(deepcopy=True)
    out = trainer._update_actor(data)
    apply_token_selection(ref, selection="gmts", rho=0.25, scope="group", entropy_key="old_entropys",
                          actor=verl_cfg.actor_rollout_ref.actor)
    sent = trainer.actor_rollout_wg.updates[0]["advantages"]
    torch.testing.assert_close(sent, ref.batch["advantages"], rtol=0, atol=0)
    sel = ref.batch["token_selection_mask"]
    assert 0 < int(sel.sum()) < int(mask.sum()) and (sent[mask & ~sel] == 0).all()
    assert out.meta_info["metrics"]["gmts/selection/frac_selected"] == pytest.approx(int(sel.sum()) / int(mask.sum()))


@pytest.mark.parametrize("loss_scale_factor", [None, 16])
def test_real_verl_worker_loss_on_unpadded_answers_divides_by_the_longest(verl_cfg, loss_scale_factor):
    """verl 0.9.1's worker loss (``workers/utils/losses.py`` ``ppo_loss``) on the V1 trainer's unpadded (nested)
    answers: seq-mean-token-sum-norm divides by the micro-batch's longest answer when loss_scale_factor is unset
    (why gmts_sync refuses that mode without it), by loss_scale_factor when set; omega matches the latter."""
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.losses import ppo_loss

    from gmts_analysis.core.objective import answer_weights, verl_loss_settings

    actor = _verl_actor(verl_cfg, "seq-mean-token-sum-norm", loss_scale_factor=loss_scale_factor)
    P, lens = 3, [4, 7, 5]

    def nest(xs):
        return torch.nested.as_nested_tensor(xs, layout=torch.jagged)

    g = torch.Generator().manual_seed(0)
    full = [-torch.rand(P + n, generator=g) for n in lens]
    data = tu.get_tensordict({
        "prompts": nest([torch.ones(P, dtype=torch.long)] * 3),
        "responses": nest([torch.ones(n, dtype=torch.long) for n in lens]),
        "response_mask": nest([torch.ones(n) for n in lens]),
        "old_log_probs": nest([lp[P - 1:P - 1 + n] for lp, n in zip(full, lens)]),  # ratio 1
        "advantages": nest([torch.ones(n) for n in lens])},
        non_tensor_dict={"dp_size": 1, "batch_num_tokens": sum(lens), "global_batch_size": 3})
    leaf = torch.cat(full).requires_grad_(True)
    offsets = torch.tensor([0] + [P + n for n in lens]).cumsum(0)
    loss, _ = ppo_loss(actor, {"log_probs": torch.nested.nested_tensor_from_jagged(leaf, offsets=offsets)}, data)
    (grad,) = torch.autograd.grad(loss, leaf)
    got = sorted(set((-grad[grad != 0]).tolist()))
    assert got == pytest.approx([1 / (3 * (loss_scale_factor or max(lens)))], rel=1e-6)
    if loss_scale_factor:
        s = verl_loss_settings(actor)
        assert answer_weights(torch.tensor(lens), s.loss_agg, s.max_len).tolist() == pytest.approx([got[0]] * 3)
    else:
        from gmts_analysis.errors import GmtsError
        from gmts_analysis.integrations.verl_trainer import _check_horizon

        with pytest.raises(GmtsError, match="loss_scale_factor"):
            _check_horizon(actor)


def test_real_verl_gmts_sync_is_registered_in_the_task_runner_process(verl_cfg):
    """The V1 registry lives in the Ray process of verl's task runner: GmtsTaskRunner (what the entry point hands
    run_ppo) is one, and there verl's get_trainer_cls('gmts_sync') finds the recipe's trainer (a local Ray, 1 CPU)."""
    import os

    import ray

    from gmts_analysis.integrations.verl_trainer import GmtsTaskRunner

    def in_ray_process(self):  # local: Ray sends it by value (the tests are no module in that process)
        import os

        from verl.trainer.ppo.v1 import get_trainer_cls

        return os.getpid(), get_trainer_cls("gmts_sync").__name__

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        pid, name = ray.get(GmtsTaskRunner.remote().__ray_call__.remote(in_ray_process), timeout=240)
    finally:
        ray.shutdown()
    assert pid != os.getpid() and name == "GmtsPPOTrainerSync"
