"""The one place for the next-token shift and the per-token closed forms.

Shapes: ``S`` is the full sequence length (prompt + response), ``P`` the prompt
length, ``T = S - P`` the number of response tokens, ``V`` the vocabulary.
Response token ``t`` (0-based) is ``input_ids[P + t]``; it is predicted by the
logits at sequence position ``P + t - 1`` (the shift by one).

All quantities are computed in float32 (float64 when the logits are float64),
whatever the model's dtype. Entropy is in nats.

One home per formula (everything else in the package calls these):

- the shift: :func:`response_logits` / :func:`response_targets` (one sequence),
  :func:`response_prefix` (causal truncation: which prefix predicts a token range),
  :func:`response_positions` / :func:`gather_positions` (right-padded batches);
- log-probabilities and entropy: :func:`scaled_log_softmax`, :func:`target_logprobs`, :func:`gather_logprobs`,
  :func:`sequence_logprobs`, :func:`entropy_from_logprobs`;
- the logit gradient ``c = (e_y - p) / tau`` (:func:`logit_grad`) and its squared norm
  (:func:`logit_grad_sq`); the output-head gradient norm ``||c|| sqrt(||h||^2 + [bias])``
  (:func:`head_grad_sq`); all of them per token in :func:`token_quantities`.
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


def response_prefix(prompt_len: int, start: int, end: int) -> int:
    """Causal truncation of the shift: response tokens ``[start, end)`` are predicted by the
    *last* ``end - start`` logits of a forward over ``input_ids[:L]``, ``L = P + end - 1``
    (positions ``P + start - 1 .. P + end - 2``); nothing after ``L`` can influence them.
    Returns ``L``. Pass ``logits_to_keep = end - start`` to compute only those logits."""
    if prompt_len < 1:
        raise ValueError("prompt_len must be >= 1 (a response needs a preceding token)")
    if not 0 <= start < end:
        raise ValueError(f"response token range [{start}, {end}) is empty or negative")
    return prompt_len + end - 1

def response_positions(prompt_len: int, n_tokens: int, seq_len: int) -> Tensor:
    """Sequence positions of the logits that predict response tokens ``0 .. n_tokens-1`` of a
    row whose prompt has ``prompt_len`` tokens: ``P - 1 + t``, clamped to ``seq_len - 1`` (the
    clamped ones are padding; mask them). Shape ``(n_tokens,)`` long. This is the shift of
    :func:`response_logits` for right-padded batches whose rows have different prompt lengths."""
    if prompt_len < 1:
        raise ValueError("prompt_len must be >= 1 (a response needs a preceding token)")
    return torch.clamp(prompt_len - 1 + torch.arange(n_tokens), max=seq_len - 1)


def gather_positions(logits: Tensor, positions: Tensor) -> Tensor:
    """``logits[b, positions[b, t], :]``: ``(B, S, V)`` logits and ``(B, T)`` positions (from
    :func:`response_positions`) give ``(B, T, V)`` response logits (differentiable)."""
    idx = positions.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return logits.gather(1, idx)


def scaled_log_softmax(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """``log softmax(z / tau)`` in the compute dtype (differentiable)."""
    z = logits.to(compute_dtype(logits.dtype))
    if temperature != 1.0:
        z = z / temperature
    return torch.log_softmax(z, dim=-1)


def target_logprobs(logp: Tensor, targets: Tensor) -> Tensor:
    """``logp[..., t, targets[..., t]]``: log-probs ``(..., T, V)`` and targets ``(..., T)`` give ``(..., T)``."""
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def gather_logprobs(logits: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``log p(target)`` under ``softmax(logits / tau)``; logits ``(..., T, V)``, targets ``(..., T)``."""
    return target_logprobs(scaled_log_softmax(logits, temperature), targets)


def sequence_logprobs(logits: Tensor, input_ids: Tensor, prompt_len: int, temperature: float = 1.0) -> Tensor:
    """Differentiable log-probs of the response tokens, ``(T,)`` (or ``(B, T)``).

    logits: full-sequence logits ``(S, V)`` / ``(B, S, V)``; input_ids ``(S,)`` / ``(B, S)``.
    """
    return gather_logprobs(response_logits(logits, prompt_len), response_targets(input_ids, prompt_len), temperature)


def entropy_from_logprobs(logp: Tensor) -> Tensor:
    """Entropy in nats ``-sum_v p log p`` over the last axis of log-probs ``(..., V)``, with 0 log 0 = 0."""
    p = logp.exp()
    return -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1)


def logit_grad(logp: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``c = d logprob / d z = (e_y - p) / tau`` with respect to the *raw* logits z.

    logp: ``(..., T, V)`` log-probs ``log softmax(z / tau)`` (:func:`scaled_log_softmax`);
    targets ``(..., T)``. Returns ``(..., T, V)`` in logp's dtype. The target's entry ``1 - p_y``
    is summed from the other probabilities (as in :func:`logit_grad_sq`): ``1 - exp(logp_y)``
    cancels when ``p_y`` is near 1 (relative error ~6e-8 / (1 - p_y) in float32: 4e-3 at
    ``p_y = 0.99999``), which is where the smallest gradient norms are."""
    y = targets.unsqueeze(-1)
    c = -logp.exp()
    c.scatter_(-1, y, torch.zeros_like(y, dtype=c.dtype))
    c.scatter_(-1, y, -c.sum(-1, keepdim=True))
    return c / temperature if temperature != 1.0 else c


def logit_grad_sq(logp: Tensor, targets: Tensor, temperature: float = 1.0) -> Tensor:
    """``||(e_y - p) / tau||^2 = ((sum_{v != y} p_v)^2 + sum_{v != y} p_v^2) / tau^2``, ``(..., T)``.

    Written with the non-target probabilities only (``1 - p_y = sum_{v != y} p_v``), so nothing
    cancels: the textbook ``1 - 2 p_y + sum_v p_v^2`` loses every digit when ``p_y`` is near 1
    (and ``log p_y`` itself rounds to 0 in float32 there)."""
    y = targets.unsqueeze(-1)
    others = logp.exp().scatter(-1, y, torch.zeros_like(y, dtype=logp.dtype))
    return (others.sum(-1).pow(2) + others.pow(2).sum(-1)) / (temperature * temperature)


def head_grad_sq(logit_grad_sq_: Tensor, h: Tensor, bias: bool) -> Tensor:
    """Squared norm of one token's gradient on the output projection ``z = h W^T (+ b)`` alone:
    the gradient is ``c (x) h`` (weight) and ``c`` (bias), so its squared norm is
    ``||c||^2 (||h||^2 + [bias])``. ``logit_grad_sq_`` ``(T,)`` from :func:`logit_grad_sq`,
    ``h`` ``(T, d)`` the head's inputs at the predicting positions; computed in the dtype of
    ``logit_grad_sq_``. For a head tied to the input embedding this is the head *use* only
    (the embedding's own use is not included)."""
    hh = h.to(logit_grad_sq_.dtype)
    h2 = hh.pow(2).sum(-1)
    return logit_grad_sq_ * (h2 + 1.0 if bias else h2)


@dataclass
class TokenQuantities:
    """Per-token closed forms for ``T`` response tokens (all shape ``(T,)``)."""

    logprob: Tensor  # log p(o_t), nats
    prob: Tensor  # p(o_t)
    entropy: Tensor  # -sum_v p log p, nats
    logit_grad_norm: Tensor  # ||d logprob / d z||_2 = ||e_o - p||_2 / tau
    sum_p2: Tensor  # sum_v p_v^2 (kept for checks)
    head_grad_norm: Tensor | None = None  # ||d logprob / d (W, b) of the output head||, see head_grad_sq
    finite: bool = True  # every logit was finite
    head_cotangent: Tensor | None = None  # (T, V) d logprob / d z, z the head's output; only when asked for
    head_cotangent_sq: Tensor | None = None  # (T,) its squared norm; only when asked for


@torch.no_grad()
def token_quantities(
    resp_logits: Tensor, targets: Tensor, temperature: float = 1.0, head_input: Tensor | None = None,
    head_bias: bool = False, with_head_cotangent: bool = False, logit_jacobian: Tensor | None = None,
) -> TokenQuantities:
    """Closed-form quantities from response logits ``(T, V)`` and targets ``(T,)``.

    ``logit_grad_norm = ||e_y - p||_2 / tau`` (:func:`logit_grad_sq`) is the norm of the
    gradient of ``logprob`` with respect to the model's logits l (the 1/tau comes from ``l / tau``).
    ``logit_jacobian`` ``(T, V)``: ``f'(z)`` where the logits are ``l = f(z)``, ``f`` elementwise and
    ``z`` the output head's output (soft-capping, scaling; ``None``: ``l = z``); the head's gradient
    is then taken through it: ``d logprob / d z = f'(z) * (e_y - p) / tau``.
    ``head_input`` ``(T, d)``: the output head's inputs at the predicting positions; gives
    ``head_grad_norm`` (:func:`head_grad_sq` of ``||d logprob / d z||^2``; ``head_bias``: the head has a
    trainable bias). ``with_head_cotangent``: also keep the ``(T, V)`` vectors ``d logprob / d z``
    (:func:`logit_grad`, times ``f'(z)``) and their squared norms ``(T,)``.
    """
    logp = scaled_log_softmax(resp_logits, temperature)
    p = logp.exp()
    lp_t = target_logprobs(logp, targets)
    p_t = lp_t.exp()
    entropy = entropy_from_logprobs(logp)
    sum_p2 = (p * p).sum(-1)
    lg2 = logit_grad_sq(logp, targets, temperature)
    cot, cot2 = None, lg2  # d logprob / d z and its squared norm (z = l without a transform)
    if logit_jacobian is not None:
        cot = logit_grad(logp, targets, temperature) * logit_jacobian.to(logp.dtype)
        cot2 = cot.pow(2).sum(-1)
    elif with_head_cotangent:
        cot = logit_grad(logp, targets, temperature)
    head = None if head_input is None else head_grad_sq(cot2, head_input, head_bias).sqrt()
    return TokenQuantities(
        logprob=lp_t, prob=p_t, entropy=entropy, logit_grad_norm=lg2.sqrt(), sum_p2=sum_p2,
        head_grad_norm=head, finite=bool(torch.isfinite(resp_logits).all()),
        head_cotangent=cot if with_head_cotangent else None, head_cotangent_sq=cot2 if with_head_cotangent else None,
    )


def cat_quantities(parts: list[TokenQuantities]) -> TokenQuantities:
    """Concatenate the quantities of consecutive token ranges (chunks) along the token axis."""
    def cat(name):
        vals = [getattr(q, name) for q in parts]
        return None if any(v is None for v in vals) else torch.cat(vals)

    return TokenQuantities(
        logprob=cat("logprob"), prob=cat("prob"), entropy=cat("entropy"),
        logit_grad_norm=cat("logit_grad_norm"), sum_p2=cat("sum_p2"), head_grad_norm=cat("head_grad_norm"),
        finite=all(q.finite for q in parts),
    )
