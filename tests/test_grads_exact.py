"""The exact engine against the per-token autograd loop (independent reference)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from gmts_analysis.engine import grad_norms
from gmts_analysis.engine.reference import loop_grad_norms, naive_grad_norms
from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.testing import build_tiny_model

TOL = {torch.float32: 1e-4, torch.float64: 1e-9}



def _ids(n: int = 30, vocab: int = 64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (n,), generator=g)
    ids[2] = ids[n // 2] = ids[n - 2]  # repeated tokens: the embedding's equal-token pairs
    return ids


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a - b).abs() / b.abs()).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_exact_matches_loop(arch, dtype):
    model = build_tiny_model(arch, dtype=dtype)
    ids, P = _ids(22), 9
    for tau, chunks in ((1.0, (1, "auto")), (0.7, (5,))):
        ref = loop_grad_norms(model, ids, P, tau)
        assert ref.shape == (len(ids) - P,) and bool((ref > 0).all())
        for chunk in chunks:
            got = grad_norms(model, ids, P, temperature=tau, chunk_size=chunk)
            assert got.method == "exact" and got.lo is None and got.groups is None
            assert got.norms.dtype == torch.float64 and got.norms.shape == ref.shape
            assert _rel(got.norms, ref) <= TOL[dtype], (arch, dtype, tau, chunk, _rel(got.norms, ref))


def test_naive_equals_loop():
    model = build_tiny_model("qwen2", dtype=torch.float64)
    ids = _ids(16)
    assert (
        _rel(
            naive_grad_norms(model, ids, 5, 0.8, tokens=[0, 3, 10]),
            loop_grad_norms(model, ids, 5, 0.8)[[0, 3, 10]],
        )
        < 1e-12
    )


@pytest.mark.parametrize("groups", ["layer", "module"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_groups_add_up_and_match_loop(arch, groups):
    model = build_tiny_model(arch, dtype=torch.float64)
    ids, P = _ids(24), 6
    got = grad_norms(model, ids, P, groups=groups, chunk_size=5)
    total = sum(got.groups.values())
    assert _rel(total, got.norms**2) < 1e-12
    ref = grad_norms(model, ids, P, groups=groups, method="loop")
    assert set(got.groups) == set(ref.groups)
    for name, v in ref.groups.items():
        assert float((got.groups[name] - v).abs().max()) <= 1e-9 * float(v.abs().max() + 1e-30), name
    if groups == "layer":
        layers = "transformer.h" if arch == "gpt2" else "model.layers"
        assert {f"{layers}.0", f"{layers}.1"} <= set(got.groups)
        assert ("lm_head" in got.groups) == (arch == "llama")  # gpt2's head is tied to the embedding
    else:
        assert any(k.endswith(("q_proj", "c_attn")) for k in got.groups)


class _Scale(nn.Module):
    """A module type the engine does not know: its gradients are materialized per token."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, inner.out_features, dtype=inner.weight.dtype))

    def forward(self, x):
        return self.inner(x) * self.gain


def test_fallback_for_unknown_module_and_shared_weight():
    model = build_tiny_model("llama", dtype=torch.float64)
    mlp = model.model.layers[0].mlp
    mlp.down_proj = _Scale(mlp.down_proj)
    # a weight shared by two modules (not the head): must be materialized, counted once
    model.model.layers[1].self_attn.k_proj.weight = model.model.layers[1].self_attn.q_proj.weight
    ids, P = _ids(20), 5
    ref = loop_grad_norms(model, ids, P, 1.3)
    got = grad_norms(model, ids, P, temperature=1.3, chunk_size=4, groups="module")
    assert _rel(got.norms, ref) < 1e-9
    assert "model.layers.0.mlp.down_proj" in got.groups


def test_model_left_unchanged():
    model = build_tiny_model("qwen2")
    model.model.layers[1].mlp.up_proj.weight.requires_grad_(False)  # a frozen tensor stays frozen, and is excluded
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    impl = model.config._attn_implementation
    ids, P = _ids(20), 4
    ref = loop_grad_norms(model, ids, P)
    for method in ("exact", "sketch"):
        grad_norms(model, ids, P, method=method, groups="layer" if method == "exact" else None)
    got = grad_norms(model, ids, P)
    assert _rel(got.norms, ref) < 1e-4
    assert model.config._attn_implementation == impl
    assert not model.training
    for name, mod in model.named_modules():
        assert not mod._forward_hooks and not mod._forward_pre_hooks and not mod._backward_hooks, name
    for n, p in model.named_parameters():
        assert p.grad is None and p.requires_grad == flags[n] and torch.equal(p, before[n]), n


def test_bad_arguments():
    model = build_tiny_model("gpt2")
    ids = _ids(10)
    with pytest.raises(GmtsError):
        grad_norms(model, ids, 0)
    with pytest.raises(GmtsError):
        grad_norms(model, ids, 10)
    with pytest.raises(GmtsError):
        grad_norms(model, ids, 3, method="fast")
    with pytest.raises(GmtsError):
        grad_norms(model, ids, 3, groups="tensor")
    with pytest.raises(GmtsError):
        grad_norms(model, ids, 3, chunk_size=0)
    with pytest.raises(GmtsError):
        grad_norms(model, ids.unsqueeze(0), 3)


def test_padding_row_gets_no_gradient():
    """nn.Embedding(padding_idx) gives the padding row no gradient; the engine must agree."""
    model = build_tiny_model("qwen2", dtype=torch.float64)
    model.model.embed_tokens.padding_idx = 0
    ids = _ids(18)
    ids[[1, 7, 12]] = 0
    ref = loop_grad_norms(model, ids, 4)
    assert _rel(grad_norms(model, ids, 4, chunk_size=5).norms, ref) < 1e-9


def _hf_tiny(kind: str) -> nn.Module:
    """Models whose embeddings subclass ``nn.Embedding`` with another ``forward``: Gemma scales
    the lookup by sqrt(d) (tied to the head), OPT offsets its learned positions by 2."""
    import transformers as T

    c = dict(vocab_size=64, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if kind == "gemma":
        cfg = T.GemmaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=1, head_dim=8, **c)
    else:
        cfg = T.OPTConfig(hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                          word_embed_proj_dim=32, dropout=0.0, **c)
    from gmts_analysis.core.seeding import seeded_global_rng

    with seeded_global_rng(0):
        model = T.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    assert sum(p.numel() for p in model.parameters()) < 200_000
    return model.double().eval()


@pytest.mark.parametrize("kind", ["gemma", "opt"])
def test_embedding_subclass_with_own_forward(kind):
    from gmts_analysis.engine.plan import EMBEDDING, rule_for

    model = _hf_tiny(kind)
    emb = model.model.embed_tokens if kind == "gemma" else model.model.decoder.embed_positions
    assert isinstance(emb, nn.Embedding) and type(emb).forward is not nn.Embedding.forward
    assert rule_for(emb) is not EMBEDDING  # the base class's rule would give the wrong norm
    ids, P = _ids(22), 6
    ref = loop_grad_norms(model, ids, P, 0.9)
    got = grad_norms(model, ids, P, temperature=0.9, chunk_size=5)
    assert got.method == "exact" and _rel(got.norms, ref) < 1e-9, _rel(got.norms, ref)
    if kind == "gemma":  # the sketch's embedding tangents carry the scale too
        sk = grad_norms(model, ids, P, temperature=0.9, method="sketch", probes=256)
        assert abs(float(((sk.norms - ref) / ref).mean())) < 0.05


def _softcapped_gemma2() -> torch.nn.Module:
    import transformers as T

    from gmts_analysis.core.seeding import seeded_global_rng

    cfg = T.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=8,
                         final_logit_softcapping=3.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    with seeded_global_rng(0):
        model = T.AutoModelForCausalLM.from_config(cfg).double().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(30.0)  # logits large enough for the cap to show
    return model


def test_softcapped_logits_take_the_fast_paths():
    """Gemma 2 soft-caps its logits (``3 tanh(z / 3)`` here, most logits near the cap): the exact engine and
    the sketch carry the cap's derivative and stay on their paths; the norms and the head's closed form
    match the loop's. (Gemma's norms compute in float32 inside a float64 model, so 1e-6.)"""
    model = _softcapped_gemma2()
    ids, P = _ids(14), 5
    ref = grad_norms(model, ids, P, temperature=0.9, method="loop", groups="module")
    got = grad_norms(model, ids, P, temperature=0.9, chunk_size=4, groups="module")
    assert got.method == "exact" and got.fallback is None
    assert _rel(got.norms, ref.norms) < 1e-6
    for key in ("model.embed_tokens",):  # the tied head: the cross term carries f'(z) too
        assert _rel(got.groups[key], ref.groups[key]) < 1e-6
    assert _rel(got.quantities.head_grad_norm, ref.quantities.head_grad_norm) < 1e-12
    sk = grad_norms(model, ids, P, temperature=0.9, method="sketch", probes=256)
    assert sk.method == "sketch" and abs(float(((sk.norms - ref.norms) / ref.norms).mean())) < 0.05


def test_refused_model_goes_to_the_loop_once(caplog):
    """A config two logit transforms claim (here a test entry claiming Gemma 2 beside soft-capping: the
    order they apply in is unknown) is a structural refusal: the exact engine refuses it, once; later answers
    go to the loop without a planning pass or a second warning, and the norms are exact."""
    import logging

    from gmts_analysis.engine.logit_transforms import LOGIT_TRANSFORMS, LogitTransform, register_logit_transform

    model = _softcapped_gemma2()
    register_logit_transform(LogitTransform(
        "test_gemma2_scale", lambda cfg: {"scale": 2.0} if cfg.model_type == "gemma2" else None,
        forward=lambda z, p: z * p["scale"], derivative=lambda z, p: p["scale"]))
    ids, P = _ids(14), 5
    try:
        with caplog.at_level(logging.WARNING, logger="gmts_analysis"):
            a = grad_norms(model, ids, P)
            b = grad_norms(model, ids[:12], P)
    finally:
        del LOGIT_TRANSFORMS["test_gemma2_scale"]
    assert a.method == b.method == "loop" and "several logit transforms" in a.fallback
    assert sum("exact engine unavailable" in r.getMessage() for r in caplog.records) == 1
    assert _rel(a.norms, loop_grad_norms(model, ids, P)) < 1e-12
    assert _rel(b.norms, loop_grad_norms(model, ids[:12], P)) < 1e-12


def test_confident_tokens_float32_close_to_float64():
    """Tokens with p near 1 have the smallest norms; ``1 - p_y`` cancels in float32 unless it is
    summed from the other probabilities (engine) or the log-softmax runs in float64 (loop).
    Before: 10% relative error on the most confident token here (1 - p = 2e-7), for both."""
    import copy

    from gmts_analysis.engine import forward_quantities

    m64 = build_tiny_model("qwen2", dtype=torch.float64, seed=2)
    with torch.no_grad():
        m64.model.norm.weight.mul_(20.0)
    ids = _ids(6)
    with torch.no_grad():  # greedy: confident targets
        for _ in range(14):
            ids = torch.cat([ids, m64(ids[None]).logits[0, -1].argmax().view(1)])
    P = 6
    q = forward_quantities(m64, ids, P)
    assert float((1 - q.prob).min()) < 1e-5, (1 - q.prob)  # the regime where float32 cancels
    ref = loop_grad_norms(m64, ids, P)
    m32 = copy.deepcopy(m64).float()
    assert _rel(grad_norms(m32, ids, P, chunk_size=5).norms, ref) < 1e-4
    assert _rel(loop_grad_norms(m32, ids, P), ref) < 1e-4
