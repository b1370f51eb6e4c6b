"""omega against autograd of the losses TRL 1.16 and verl actually train with.

omega is the coefficient of grad logprob_{i,t} in the gradient of the objective, so it must equal
``-d loss / d logprob_{i,t}`` with the current log-probs as leaves. For TRL the loss is computed by
TRL's own ``GRPOTrainer._compute_loss`` (called unbound on a minimal stand-in for the trainer: the
policy forward is replaced by the leaf tensor, the accelerator is one process). The vLLM
importance-sampling ratio (computed by TRL inside ``_generate_and_score_completions``, which cannot
be called in isolation) and verl's policy loss (verl is not installed) are re-implemented below from
their sources, independently of gmts_analysis.core.objective.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from gmts_analysis.core.objective import (
    LossSettings,
    answer_weights,
    loss_settings,
    omega_tensor,
    trl_loss_settings,
    verl_loss_settings,
)
from gmts_analysis.core.trl_args import TrlLossArgs
from gmts_analysis.errors import GmtsError

trl = pytest.importorskip("trl")
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

B, T = 6, 9
MAX_COMPLETION = 12


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 4, 7, 1, 9, 6])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    lp = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3 - 0.05
    old = lp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.35  # off-policy: ratios 0.5..2
    ref = lp + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.5
    samp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    adv = torch.tensor([1.3, -0.7, 0.0, 2.1, -1.6, 0.4], dtype=torch.float64)
    return mask, lp, old, ref, samp, adv


def _vllm_ratio_trl(old, samp, mask, mode, cmin, cmax):
    """TRL 1.16 trl/trainer/grpo_trainer.py:2660-2705 (_generate_and_score_completions), re-implemented."""
    d = torch.nan_to_num((old - samp) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        d = d.sum(dim=-1, keepdim=True)
    r = torch.exp(d)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(r, min=cmin, max=cmax)
    lo = cmin if cmin is not None else -math.inf
    hi = cmax if cmax is not None else math.inf
    return r.masked_fill((r < lo) | (r > hi), 0.0)


def _trl_loss_grad(args: GRPOConfig, lp, old, ref, samp, adv, mask):
    """-d loss / d logprob from TRL 1.16's own GRPOTrainer._compute_loss, on one process, one micro-batch."""
    leaf = lp.clone().requires_grad_(True)
    eps_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    acc = SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction="sum": x,
                          gather_for_metrics=lambda x: x, process_index=0)
    fake = SimpleNamespace(
        args=args, loss_type=args.loss_type, beta=args.beta, epsilon_low=args.epsilon, epsilon_high=eps_high,
        importance_sampling_level=args.importance_sampling_level, top_entropy_quantile=1.0,
        off_policy_mask_threshold=None, use_vllm=args.use_vllm,
        vllm_importance_sampling_correction=args.vllm_importance_sampling_correction,
        max_completion_length=args.max_completion_length, current_gradient_accumulation_steps=1,
        model=SimpleNamespace(training=True), accelerator=acc, aux_loss_enabled=False,
        _entropy_bonus_enabled=False, _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (leaf, torch.zeros_like(leaf), None),
    )
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long), "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": mask,
        "advantages": adv, "num_items_in_batch": mask.sum(), "old_per_token_logps": old,
    }
    if args.beta:
        inputs["ref_per_token_logps"] = ref
    if args.use_vllm and args.vllm_importance_sampling_correction:
        inputs["importance_sampling_ratio"] = _vllm_ratio_trl(
            old, samp, mask, args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
            args.vllm_importance_sampling_clip_max)
    loss = GRPOTrainer._compute_loss(fake, None, inputs)
    (grad,) = torch.autograd.grad(loss, leaf)
    return -grad * mask


def _config(tmp_path, **kw):
    kw.setdefault("max_completion_length", MAX_COMPLETION)
    return GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=B, num_generations=2, report_to=[],
                      use_cpu=True, **kw)


def _ours(args, lp, old, ref, samp, adv, mask):
    s = trl_loss_settings(TrlLossArgs.of(args))
    w = answer_weights(mask.sum(-1), s.loss_agg, s.max_len)
    return omega_tensor(lp, mask, adv, w, s, old_logprobs=old, ref_logprobs=ref if s.kl_beta else None,
                        sampling_logprobs=samp)


CASES = [
    dict(),  # TRL's defaults: dapo, epsilon 0.2, beta 0
    dict(beta=0.04),  # use_bias_correction_kl defaults to True
    dict(beta=0.04, use_bias_correction_kl=False),
    dict(beta=0.1, epsilon_high=0.28),
    dict(beta=0.04, importance_sampling_level="sequence", epsilon=3e-2, epsilon_high=4e-2),  # GSPO
    dict(beta=0.04, importance_sampling_level="sequence", use_bias_correction_kl=False, epsilon=0.1),
]
VLLM = [
    dict(vllm_importance_sampling_mode="token_truncate", vllm_importance_sampling_clip_max=1.5),
    dict(vllm_importance_sampling_mode="token_mask", vllm_importance_sampling_clip_max=1.3,
         vllm_importance_sampling_clip_min=0.7),
    dict(vllm_importance_sampling_mode="sequence_mask", vllm_importance_sampling_clip_max=3.0),
    dict(vllm_importance_sampling_mode="sequence_truncate", vllm_importance_sampling_clip_max=1.2),
]


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
@pytest.mark.parametrize("case", range(len(CASES) + len(VLLM)))
def test_omega_equals_autograd_of_trl_loss(tmp_path, loss_type, case):
    mask, lp, old, ref, samp, adv = _batch(case)
    if case < len(CASES):
        kw = dict(CASES[case])
    else:
        kw = dict(beta=0.02, **VLLM[case - len(CASES)])
        kw["importance_sampling_level"] = "sequence" if case % 2 else "token"
    if kw.get("vllm_importance_sampling_mode"):
        # GRPOConfig refuses use_vllm without vllm installed on some paths; the loss only reads the flags
        args = _config(tmp_path, loss_type=loss_type, **kw)
        args.use_vllm = True
    else:
        args = _config(tmp_path, loss_type=loss_type, **kw)
    want = _trl_loss_grad(args, lp, old, ref, samp, adv, mask)
    got = _ours(args, lp, old, ref, samp, adv, mask)
    assert want.abs().max() > 1e-3  # the comparison is not vacuous
    # some tokens are clipped (zero policy gradient) and some are not
    err = (got - want).abs().max().item()
    assert err < 1e-12 * max(1.0, want.abs().max().item()), (loss_type, kw, err)


def test_some_tokens_are_clipped_in_the_test_batch():
    mask, lp, old, ref, samp, adv = _batch(0)
    r = torch.exp(lp - old)
    A = adv[:, None].expand_as(r)
    flat = ((A > 0) & (r > 1.2)) | ((A < 0) & (r < 0.8))
    assert 0 < int((flat & mask.bool()).sum()) < int(mask.sum())


def test_on_policy_default_is_w_times_a():
    mask, lp, _, _, _, adv = _batch(1)
    w = answer_weights(mask.sum(-1), "token-mean")
    got = omega_tensor(lp, mask, adv, w, LossSettings())
    want = (adv / mask.sum())[:, None] * mask
    assert torch.allclose(got, want.double(), rtol=0, atol=1e-15)


def test_trl_default_epsilon_high_is_epsilon(tmp_path):
    s = trl_loss_settings(TrlLossArgs.of(_config(tmp_path)))
    assert (s.clip_low, s.clip_high, s.loss_agg, s.kl_bias_correction) == (0.2, 0.2, "token-mean", True)
    assert LossSettings().clip_high == 0.2


@pytest.mark.parametrize("kw, name", [
    (dict(loss_type="cispo"), "cispo"), (dict(loss_type="sapo"), "sapo"), (dict(loss_type="vespo"), "vespo"),
    (dict(loss_type="luspo", importance_sampling_level="sequence"), "luspo"), (dict(delta=1.5), "delta"),
    (dict(off_policy_mask_threshold=0.5), "off_policy_mask_threshold"),
    (dict(top_entropy_quantile=0.2), "top_entropy_quantile"), (dict(entropy_coef=0.01), "entropy"),
    (dict(mask_truncated_completions=True), "mask_truncated_completions"),
    (dict(router_aux_loss_coef=0.01), "router_aux_loss_coef"),
])
def test_unmodelled_trl_settings_are_refused(tmp_path, kw, name):
    with pytest.raises(GmtsError, match=name):
        trl_loss_settings(TrlLossArgs.of(_config(tmp_path, **kw)))


def test_moe_router_aux_loss_of_a_trainer_is_refused(tmp_path):
    """TRL adds the MoE load-balancing loss whenever the model config declares a coefficient
    (``aux_loss_enabled``), even with ``router_aux_loss_coef`` left at None in the config."""
    args = _config(tmp_path)
    trainer = SimpleNamespace(args=args, aux_loss_enabled=True, _compute_loss=None)
    with pytest.raises(GmtsError, match="router_aux_loss_coef"):
        trl_loss_settings(TrlLossArgs.of_trainer(trainer))
    trainer.aux_loss_enabled = False
    assert trl_loss_settings(TrlLossArgs.of_trainer(trainer)) == trl_loss_settings(TrlLossArgs.of(args))


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo", "luspo", "ppo"])
def test_cli_loss_type_refused(loss_type):
    with pytest.raises(GmtsError, match=loss_type):
        loss_settings(loss_type)


def test_cli_loss_type_mapping():
    assert loss_settings("grpo").loss_agg == "seq-mean-token-mean"
    assert loss_settings("bnpo").loss_agg == "token-mean"
    assert loss_settings("dapo").kl_bias_correction is True
    assert loss_settings(None).kl_bias_correction is False
    assert loss_settings("dr_grpo", max_len=256).loss_agg == "seq-mean-token-sum-norm"
    with pytest.raises(GmtsError, match="max_len="):
        loss_settings("dr_grpo")
    with pytest.raises(GmtsError, match="but loss_agg=token-mean was given"):
        loss_settings("grpo", "token-mean")


def test_vllm_correction_needs_sampling_logprobs():
    mask, lp, old, _, _, adv = _batch(2)
    s = LossSettings(vllm_is_mode="token_truncate")
    with pytest.raises(GmtsError, match="sampling_logprobs"):
        omega_tensor(lp, mask, adv, answer_weights(mask.sum(-1)), s, old_logprobs=old)


def test_kl_without_reference_is_refused():
    mask, lp, _, _, _, adv = _batch(2)
    with pytest.raises(GmtsError, match="ref_logprobs"):
        omega_tensor(lp, mask, adv, answer_weights(mask.sum(-1)), LossSettings(kl_beta=0.1))


# --- verl -----------------------------------------------------------------------------------------

def _verl_loss(log_prob, old_log_prob, ref, advantages, response_mask, clip_low, clip_high, clip_c, beta):
    """verl core_algos.py compute_policy_loss_vanilla (lines 1160-1250 at b178a3c) with token-mean agg_loss
    (lines 1025-1082), plus the actor's KL loss: kl_penalty_forward 'low_var_kl' (lines 1867-1900) times
    kl_loss_coef, aggregated the same way. Re-implemented here (verl is not a dependency)."""
    neg_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(neg_kl)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    c1 = torch.maximum(pg1, pg2)
    pg3 = -advantages * clip_c
    c2 = torch.min(pg3, c1)
    pg = torch.where(advantages < 0, c2, c1)
    m = response_mask.to(pg.dtype)
    loss = (pg * m).sum() / m.sum()
    if beta:
        kl = torch.clamp(ref - log_prob, min=-20, max=20)
        kld = torch.clamp(torch.exp(kl) - kl - 1, min=-10, max=10)
        loss = loss + beta * (kld * m).sum() / m.sum()
    return loss


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_omega_equals_autograd_of_verl_dual_clip(beta):
    mask, lp, old, ref, _, adv = _batch(3)
    old = lp + torch.randn(B, T, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 1.2
    A = adv[:, None].expand(B, T).clone()
    leaf = lp.clone().requires_grad_(True)
    loss = _verl_loss(leaf, old, ref, A, mask, 0.2, 0.28, 3.0, beta)
    (grad,) = torch.autograd.grad(loss, leaf)
    want = -grad * mask
    actor = {"clip_ratio": 0.2, "clip_ratio_high": 0.28, "loss_agg_mode": "token-mean",
             "use_kl_loss": bool(beta), "kl_loss_coef": beta, "kl_loss_type": "low_var_kl"}
    s = verl_loss_settings(actor)
    assert s.clip_ratio_c == 3.0
    r = torch.exp(lp - old)
    assert bool(((A < 0) & (r > 3.0) & mask.bool()).any())  # the dual clip matters in this batch
    got = omega_tensor(lp, mask, A, answer_weights(mask.sum(-1)), s, old_logprobs=old,
                       ref_logprobs=ref if beta else None)
    assert (got - want).abs().max().item() < 1e-14


@pytest.mark.parametrize("actor, name", [
    ({"policy_loss": {"loss_mode": "gspo"}}, "gspo"), ({"policy_loss": {"loss_mode": "clip_cov"}}, "clip_cov"),
    ({"use_kl_loss": True, "kl_loss_type": "k1"}, "k1"), ({"loss_agg_mode": "seq-sum"}, "seq-sum"),
    ({"use_kl_loss": True, "kl_loss_type": "k3+"}, r"k3\+"),
    ({"entropy_coeff": 0.001}, "entropy_coeff"),
])
def test_unmodelled_verl_settings_are_refused(actor, name):
    with pytest.raises(GmtsError, match=name):
        verl_loss_settings(actor)


def test_verl_rollout_correction_refused():
    verl_loss_settings({}, algorithm={"rollout_correction": {"rollout_is": None}})
    with pytest.raises(GmtsError, match="rollout_is='token'"):
        verl_loss_settings({}, algorithm={"rollout_correction": {"rollout_is": "token"}})


def test_verl_token_sum_is_the_plain_masked_sum():
    # verl-project/verl#7197: the global masked token sum (w = 1 on every response token)
    s = verl_loss_settings({"loss_agg_mode": "token-sum"})
    assert s.loss_agg == "token-sum"
    w = answer_weights(torch.tensor([2, 3, 7]), loss_agg=s.loss_agg)
    assert w.tolist() == [1.0, 1.0, 1.0]


def test_verl_defaults():
    s = verl_loss_settings({})
    assert (s.clip_low, s.clip_high, s.clip_ratio_c, s.loss_agg, s.kl_beta) == (0.2, 0.2, 3.0, "token-mean", 0.0)
