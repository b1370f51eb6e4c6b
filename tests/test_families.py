"""The exact engine on the decoder families transformers ships: tiny random configs (hidden 32, 2 layers,
vocabulary 96), each against the float64 per-token autograd loop, in float64 and float32, with the method
that ran asserted to be the fast exact path (never the loop).

What the families cover: untied and tied heads (llama, llama_tied, qwen2, qwen3, gemma2, gpt2), grouped-
query and multi-query attention (qwen2, mistral, falcon), sliding windows (mistral, gemma2), soft-capped
final logits and attention (gemma2), scaled logits (granite divides by ``logits_scaling``, cohere multiplies
by ``logit_scale``), mixture of experts (mixtral, qwen2_moe, deepseek_v3), multi-head latent attention
(deepseek_v3), parallel residuals (gpt_neox, phi, falcon, cohere), partial rotary (gpt_neox, phi), q/k
norms (olmo2, qwen3), GPT-2's Conv1D, biases (qwen2, phi, gpt2). The MoE models run their experts eagerly
in float64 (transformers' grouped_mm takes no float64) and with transformers' default (grouped_mm) in
float32: the same weights, so the float64 loop is the reference of both.
"""

from __future__ import annotations

import pytest
import torch
from conftest import plain_loop_grad_norms

from gmts_analysis.engine import grad_norms
from gmts_analysis.engine.logit_transforms import LOGIT_TRANSFORMS, LogitTransform, detect_logit_transform

VOCAB = 96
_C = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_H = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
TAU = 0.9  # the engine's temperature, applied after the logit transform


def _config(family: str):
    import transformers as T

    make = {
        "llama": lambda: T.LlamaConfig(**_H, num_key_value_heads=2, tie_word_embeddings=False, **_C),
        "llama_tied": lambda: T.LlamaConfig(**_H, num_key_value_heads=4, tie_word_embeddings=True, **_C),
        "qwen2": lambda: T.Qwen2Config(**_H, num_key_value_heads=2, tie_word_embeddings=True, **_C),
        "mistral": lambda: T.MistralConfig(**_H, num_key_value_heads=2, sliding_window=6, **_C),
        "gemma2": lambda: T.Gemma2Config(**_H, num_key_value_heads=2, head_dim=8, sliding_window=6,
                                         final_logit_softcapping=3.0, attn_logit_softcapping=5.0, **_C),
        "granite": lambda: T.GraniteConfig(**_H, num_key_value_heads=2, logits_scaling=4.0, embedding_multiplier=2.0,
                                           residual_multiplier=0.5, attention_multiplier=0.3, **_C),
        "mixtral": lambda: T.MixtralConfig(**_H, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                           **_C),
        "qwen2_moe": lambda: T.Qwen2MoeConfig(**_H, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                                              moe_intermediate_size=16, shared_expert_intermediate_size=32, **_C),
        "deepseek_v3": lambda: T.DeepseekV3Config(
            **_H, num_key_value_heads=4, moe_intermediate_size=16, n_routed_experts=4, n_shared_experts=1,
            num_experts_per_tok=2, n_group=1, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
            q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8, **_C),
        "gpt_neox": lambda: T.GPTNeoXConfig(**_H, rotary_pct=0.25, use_parallel_residual=True,
                                            tie_word_embeddings=False, **_C),
        "phi": lambda: T.PhiConfig(**_H, partial_rotary_factor=0.5, **_C),
        "olmo2": lambda: T.Olmo2Config(**_H, num_key_value_heads=2, **_C),
        "qwen3": lambda: T.Qwen3Config(**_H, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True, **_C),
        "cohere": lambda: T.CohereConfig(**_H, num_key_value_heads=2, logit_scale=0.5, **_C),
        "falcon": lambda: T.FalconConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         parallel_attn=True, new_decoder_architecture=False, multi_query=True,
                                         bias=False, alibi=False, **_C),
        "gpt2": lambda: T.GPT2Config(n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, **_C),
    }
    return make[family]()


FAMILIES = ("llama", "llama_tied", "qwen2", "mistral", "gemma2", "granite", "mixtral", "qwen2_moe", "deepseek_v3",
            "gpt_neox", "phi", "olmo2", "qwen3", "cohere", "falcon", "gpt2")
#: the logit transform each family's config declares (the others: none)
TRANSFORMS = {"gemma2": "softcap", "granite": "divide", "cohere": "multiply"}
#: float64 tolerance: Gemma 2's norms and attention softmax, and Cohere's layer norms, compute in float32
#: inside a float64 model (Gemma 2 here: 1.7e-7; 4e-16 with those two patched to float64)
TOL64 = {"gemma2": 1e-6, "cohere": 1e-6}
MOE = ("mixtral", "qwen2_moe", "deepseek_v3")


def _build(family: str, dtype: torch.dtype, state: dict | None = None) -> torch.nn.Module:
    """The family's tiny model in ``dtype`` (weights of rank >= 2 scaled by 3, for logits far from uniform);
    ``state``: load these weights instead."""
    import transformers as T

    from gmts_analysis.core.seeding import seeded_global_rng

    kw = {"experts_implementation": "eager"} if family in MOE and dtype == torch.float64 else {}
    with seeded_global_rng(0):
        model = T.AutoModelForCausalLM.from_config(_config(family), **kw)
    if state is not None:
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    else:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(3.0)
    assert sum(p.numel() for p in model.parameters()) < 100_000
    return model.to(dtype).eval()


def _ids(n: int = 18, seed: int = 1) -> torch.Tensor:
    ids = torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))
    ids[3] = ids[n - 3]  # a repeated token: the embeddings' equal-token rows
    return ids


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs()).max())


@pytest.mark.parametrize("family", FAMILIES)
def test_family_exact_matches_the_float64_loop(family):
    m64 = _build(family, torch.float64)
    t = detect_logit_transform(m64)
    assert (t.transform.name if t else None) == TRANSFORMS.get(family)
    ids, P = _ids(), 6
    ref = plain_loop_grad_norms(m64, ids, P, TAU)
    assert bool((ref > 0).all())
    got = grad_norms(m64, ids, P, temperature=TAU, chunk_size=4, strict=True)
    assert got.method == "exact" and got.fallback is None
    assert _rel(got.norms, ref) < TOL64.get(family, 1e-9), _rel(got.norms, ref)
    m32 = _build(family, torch.float32, state=m64.state_dict())
    got32 = grad_norms(m32, ids, P, temperature=TAU, strict=True)
    assert got32.method == "exact" and got32.fallback is None
    assert _rel(got32.norms, ref) < 1e-4, _rel(got32.norms, ref)


@pytest.mark.parametrize("family", sorted(TRANSFORMS))
def test_transformed_logits_are_checked_and_sketched(family):
    """The transform matters on these models: with its entry taken out of the registry the check refuses
    (the logits are not the head's output) and the answer goes to the loop, loudly; with it, the sketch
    stays on its path and is unbiased within its noise."""
    m64 = _build(family, torch.float64)
    ids, P = _ids(), 6
    name = TRANSFORMS[family]
    entry = LOGIT_TRANSFORMS.pop(name)
    try:
        off = grad_norms(m64, ids, P, temperature=TAU)
    finally:
        LOGIT_TRANSFORMS[name] = entry
    assert off.method == "loop" and "not the output head's output" in off.fallback
    sk = grad_norms(m64, ids, P, temperature=TAU, method="sketch", probes=128)
    assert sk.method == "sketch"
    assert abs(float((sk.norms**2 / off.norms**2).mean()) - 1.0) < 0.1


def test_a_declared_custom_transform_keeps_the_fast_path():
    """A transform no family ships (``4 asinh(z / 4)`` after the head, declared by a config field of the
    user's) is one registry entry; without it the answer goes to the loop, with it to the exact engine."""
    from gmts_analysis.engine.logit_transforms import register_logit_transform

    model = _build("llama", torch.float64)
    model.config.asinh_cap = 4.0

    def after_model(module, args, kwargs, out):
        out.logits = 4.0 * torch.asinh(out.logits / 4.0)
        return out

    model.register_forward_hook(after_model, with_kwargs=True)
    ids, P = _ids(), 6
    ref = plain_loop_grad_norms(model, ids, P, TAU)
    assert grad_norms(model, ids, P, temperature=TAU).method == "loop"
    register_logit_transform(LogitTransform(
        "asinh_cap", detect=lambda cfg: {"c": cfg.asinh_cap} if getattr(cfg, "asinh_cap", None) else None,
        forward=lambda z, p: p["c"] * torch.asinh(z / p["c"]),
        derivative=lambda z, p: 1 / torch.sqrt(1 + (z / p["c"]) ** 2)))
    try:
        got = grad_norms(model, ids, P, temperature=TAU, chunk_size=5, strict=True)
    finally:
        del LOGIT_TRANSFORMS["asinh_cap"]
    assert got.method == "exact" and _rel(got.norms, ref) < 1e-9
