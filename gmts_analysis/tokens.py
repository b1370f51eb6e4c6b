"""The one place for the next-token shift and the per-token closed forms.

Shapes: ``S`` is the full sequence length (prompt + response), ``P`` the prompt
length, ``T = S - P`` the number of response tokens, ``V`` the vocabulary.
Response token ``t`` (0-based) is ``input_ids[P + t]``; it is predicted by the
logits at sequence position ``P + t - 1`` (the shift by one).

All quantities are computed in float32 (float64 when the logits are float64),
whatever the model's dtype. Entropy is in nats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def response_logits(logits: Tensor, prompt_len: int) -> Tensor:
    """Logits that predict the response tokens.

    logits: ``(S, V)`` or ``(B, S, V)`` raw model logits for the full sequence.
    Returns ``(T, V)`` (or ``(B, T, V)``): positions ``P-1 .. S-2``.
    """
    if prompt_len < 1:
        raise ValueError("prompt_len must be >= 1 (a response needs a preceding token)")
    return logits[..., prompt_len - 1 : -1, :]


def response_targets(input_ids: Tensor, prompt_len: int) -> Tensor:
    """The response token ids: ``input_ids[..., P:]``, shape ``(T,)`` or ``(B, T)``."""
    return input_ids[..., prompt_len:]


def scaled_log_softmax(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(z / tau)`` in the compute dtype (differentiable)."""
    z = logits.to(compute_dtype(logits.dtype))
    if temperature != 1.0:
        z = z / temperature
    return torch.log_softmax(z, dim=-1)


def gather_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log p(target)`` under ``softmax(logits / tau)``; logits ``(..., T, V)``, targets ``(..., T)``."""
    logp = scaled_log_softmax(logits, temperature)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(logits: Tensor, input_ids: Tensor, prompt_len: int, temperature: float = 1.0) -> Tensor:
    """Differentiable log-probs of the response tokens, ``(T,)`` (or ``(B, T)``).

    logits: full-sequence logits ``(S, V)`` / ``(B, S, V)``; input_ids ``(S,)`` / ``(B, S)``.
    """
    return gather_logprobs(response_logits(logits, prompt_len), response_targets(input_ids, prompt_len), temperature)


def entropy_from_logprobs(logp: Tensor) -> Tensor:
    """Entropy in nats ``-sum_v p log p`` over the last axis of log-probs ``(..., V)``, with 0 log 0 = 0."""
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)


@dataclass
class TokenQuantities:
    """Per-token closed forms for ``T`` response tokens (all shape ``(T,)``)."""

    logprob: Tensor  # log p(o_t), nats
    prob: Tensor  # p(o_t)
    entropy: Tensor  # -sum_v p log p, nats
    logit_grad_norm: Tensor  # ||d logprob / d z||_2 = ||e_o - p||_2 / tau
    sum_p2: Tensor  # sum_v p_v^2 (kept for checks)


@torch.no_grad()
def token_quantities(resp_logits: Tensor, targets: Tensor, temperature: float = 1.0) -> TokenQuantities:
    """Closed-form quantities from response logits ``(T, V)`` and targets ``(T,)``.

    ``logit_grad_norm = sqrt(1 - 2 p + sum_v p_v^2) / tau`` is the norm of the gradient of
    ``logprob`` with respect to the *raw* logits z (the 1/tau comes from ``z / tau``).
    """
    logp = scaled_log_softmax(resp_logits, temperature)
    p = logp.exp()
    lp_t = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    p_t = lp_t.exp()
    entropy = entropy_from_logprobs(logp)
    sum_p2 = (p * p).sum(-1)
    lgn = torch.clamp(1.0 - 2.0 * p_t + sum_p2, min=0.0).sqrt() / temperature
    return TokenQuantities(logprob=lp_t, prob=p_t, entropy=entropy, logit_grad_norm=lgn, sum_p2=sum_p2)
