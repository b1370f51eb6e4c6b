"""What every gradient-norm method of :mod:`gmts_analysis.engine.methods` shares: the result
(:class:`GradNorms`), the model frozen for function transforms, parameter groups, and the per-token closed
forms of one no-grad forward (:func:`forward_quantities`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gmts_analysis.core.tokens import (
    TokenQuantities,
    compute_dtype,
    response_prefix,
    response_targets,
    token_quantities,
)
from gmts_analysis.engine.head import check_transformed_logits
from gmts_analysis.engine.logit_transforms import detect_logit_transform, logit_jacobian
from gmts_analysis.engine.numerics import pinned_numerics
from gmts_analysis.engine.params import attention_implementation
from gmts_analysis.engine.plan import layer_group


@dataclass
class GradNorms:
    """Per-token gradient norms of one answer (all tensors ``(T,)`` float64 on CPU)."""

    norms: torch.Tensor  # grad_norm_logp per response token
    lo: torch.Tensor | None  # 95% lower bound (sketch only)
    hi: torch.Tensor | None  # 95% upper bound (sketch only)
    groups: dict[str, torch.Tensor] | None  # group -> SQUARED norms; sum over groups == norms**2
    method: str  # "exact" | "sketch" | "loop"
    quantities: TokenQuantities | None = None  # closed forms of the response tokens, from the same forward
    fallback: str | None = None  # why the exact engine refused this answer (method "loop" then), else None


@contextlib.contextmanager
def frozen_for_transforms(model: torch.nn.Module) -> Iterator[None]:
    """Attention that function transforms can batch, and ``requires_grad=False`` on every
    parameter; both restored on exit.

    SDPA stays SDPA but runs its MATH backend (composite ops with batching and forward-mode
    rules, and no float32 down-cast for float64 models); eager stays eager; any other
    implementation (flash, flex, ...) is switched to eager for the call.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    ctx = contextlib.nullcontext() if impl in (None, "sdpa", "eager") else attention_implementation(model, "eager")
    with ctx, sdpa_kernel(SDPBackend.MATH):
        try:
            for p in params:
                p.requires_grad_(False)
            yield
        finally:
            for p, f in zip(params, flags):
                p.requires_grad_(f)


def group_of(model: torch.nn.Module, module_name: str, groups: str) -> str:
    """Group name of a module for ``groups`` = ``module`` or ``layer``."""
    return module_name if groups == "module" else layer_group(model, module_name)


def _head_has_bias(head: torch.nn.Module | None) -> bool:
    b = getattr(head, "bias", None)
    return isinstance(b, torch.Tensor) and b.requires_grad


@torch.no_grad()
def forward_quantities(
    model: torch.nn.Module, input_ids: torch.LongTensor, prompt_len: int, temperature: float = 1.0
) -> TokenQuantities:
    """The response tokens' closed forms from one no-grad forward: log-prob, probability,
    entropy, ``logit_grad_norm`` and ``head_grad_norm`` (the head's input and output captured by a
    hook; only the ``T`` predicting positions' logits are computed when the model allows it). Runs
    with the engine's numerics pinned (:func:`gmts_analysis.engine.numerics.pinned_numerics`).

    ``head_grad_norm`` goes through the logits' elementwise transform (soft-capping, scaling:
    :mod:`gmts_analysis.engine.logit_transforms`) where the config declares one and the logits are
    that transform of the head's output; for post-processing no entry recognises, it is the norm the
    head would have without it.

    input_ids ``(S,)``, ``prompt_len`` = P >= 1. See :func:`gmts_analysis.core.tokens.token_quantities`."""
    T = int(input_ids.shape[0]) - int(prompt_len)
    L = response_prefix(prompt_len, 0, T)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    captured: dict[str, torch.Tensor] = {}
    handle = None
    if isinstance(head, torch.nn.Module):
        handle = head.register_forward_hook(lambda m, a, o: captured.update(h=a[0], z=o))
    kw = {"input_ids": input_ids[:L].unsqueeze(0), "use_cache": False}
    if _accepts(model, "logits_to_keep"):
        kw["logits_to_keep"] = T
    try:
        with pinned_numerics():
            logits = model(**kw).logits[0, -T:]
    finally:
        if handle is not None:
            handle.remove()
    h = captured.get("h")
    return token_quantities(
        logits, response_targets(input_ids, prompt_len), temperature,
        head_input=None if h is None else h[0, -T:], head_bias=_head_has_bias(head),
        logit_jacobian=_checked_jacobian(model, captured.get("z"), logits, T, compute_dtype(logits.dtype)),
    )


def _checked_jacobian(model: torch.nn.Module, z: torch.Tensor | None, logits: torch.Tensor, T: int,
                      dtype: torch.dtype) -> torch.Tensor | None:
    """``f'(z)`` ``(T, V)`` of the transform the model's config declares when its logits ``(T, V)`` are
    that transform of the head's output ``z`` ``(1, >=T, V)``; else ``None``."""
    if not isinstance(z, torch.Tensor) or z.dim() != 3:
        return None
    z = z[0, -T:]
    try:
        transform = detect_logit_transform(model)
        if transform is None:
            return None
        check_transformed_logits(z, logits, transform)
    except NotImplementedError:
        return None
    return logit_jacobian(z, transform, dtype)


def _accepts(model: torch.nn.Module, arg: str) -> bool:
    import inspect

    try:
        return arg in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
