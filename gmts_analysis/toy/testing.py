"""Tiny random models built from configs, for tests and benchmarks (no network).

``build_tiny_model(arch)`` gives a model of a few thousand to a few hundred
thousand parameters; ``save_tiny_model(arch, path)`` writes it (and a character
tokenizer) so it loads through the same path a user's checkpoint takes.
"""

from __future__ import annotations

from pathlib import Path

import torch

from gmts_analysis.core.seeding import seeded_global_rng
from gmts_analysis.toy.tokenizer import build_char_tokenizer

ARCHS = ("gpt2", "llama", "qwen2")


def tiny_config(arch: str, vocab_size: int = 64, hidden: int = 32, layers: int = 2, max_len: int = 256):
    """Config of a tiny model: ``gpt2`` (tied embeddings), ``llama`` (untied), ``qwen2`` (GQA, tied)."""
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    if arch == "gpt2":
        return GPT2Config(
            vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_len,
            tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )
    if arch == "llama":
        return LlamaConfig(
            vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_len,
            tie_word_embeddings=False,
        )
    if arch == "qwen2":
        return Qwen2Config(
            vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_len,
            tie_word_embeddings=True,
        )
    raise ValueError(f"unknown arch {arch!r}; choose from {ARCHS}")


def build_tiny_model(arch: str, dtype: torch.dtype = torch.float32, seed: int = 0, **kw) -> torch.nn.Module:
    """A tiny random causal LM in eval mode. Weights are scaled up a little so that
    the softmax is far from uniform (random init gives near-uniform logits)."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(arch, **kw)
    with seeded_global_rng(seed):  # from_config initialises from the global generator
        model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.mul_(3.0)
    n = sum(p.numel() for p in model.parameters())
    assert n < 2_000_000, f"tiny model unexpectedly large ({n} params): misspelt config field?"
    return model.to(dtype).eval()


def save_tiny_model(arch: str, path: str | Path, seed: int = 0, **kw) -> Path:
    """Save a tiny model and a character tokenizer to ``path``; returns ``path``."""
    path = Path(path)
    tok = build_char_tokenizer()
    kw.setdefault("vocab_size", len(tok))
    model = build_tiny_model(arch, seed=seed, **kw)
    model.config.bos_token_id = tok.bos_token_id
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
