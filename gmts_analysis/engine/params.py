"""What the engine differentiates: a model's trainable parameters (each tied tensor once) and the
attention implementation the function transforms need."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, impl: str = "eager") -> Iterator[torch.nn.Module]:
    """Temporarily switch the model's attention implementation (restored on every path).

    Function transforms (``torch.func.vmap`` over VJPs, forward-mode ``jvp``) have no
    batching rule for SDPA's fused backward; ``eager`` attention always works.
    """
    config = getattr(model, "config", None)
    old = getattr(config, "_attn_implementation", None)
    if config is None or old is None or old == impl:
        yield model
        return
    model.set_attn_implementation(impl)
    try:
        yield model
    finally:
        model.set_attn_implementation(old)


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Named trainable parameters, each shared (tied) tensor once (first name wins)."""
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        out.append((name, p))
    return out
