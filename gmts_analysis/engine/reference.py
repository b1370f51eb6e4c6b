"""Reference per-token gradient norms: the plain loops the fast engines are checked against.

``loop_grad_norms``: one shared forward, then ``torch.autograd.grad(logprob[t], params,
retain_graph=True)`` for every response token ``t``. ``naive_grad_norms``: a fresh forward
and backward per token (what a user would write first). Both are exact and slow; tests and
``gmts bench`` use them. Shapes: ``input_ids`` ``(S,)``, ``P = prompt_len``, ``T = S - P``.
"""

from __future__ import annotations

import torch

from gmts_analysis.core.tokens import compute_dtype, sequence_logprobs
from gmts_analysis.engine.params import trainable_parameters


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _sq_norm(grads, acc_dtype: torch.dtype) -> torch.Tensor:
    total = torch.zeros((), dtype=acc_dtype, device=grads[0].device if grads else "cpu")
    for g in grads:
        if g is not None:
            total = total + g.to(acc_dtype).pow(2).sum()
    return total


def _forward_logprobs(model, input_ids: torch.Tensor, prompt_len: int, temperature: float) -> torch.Tensor:
    """Log-probs of the response tokens, the log-softmax in float64 (the model's logits cast up,
    exactly): its backward ``e_y - p`` then keeps ``1 - p_y`` for confident tokens, which float32
    loses (relative error ~6e-8 / (1 - p_y): 4e-3 at ``p_y = 0.99999``, where the smallest norms are)."""
    logits = model(input_ids=input_ids.unsqueeze(0), use_cache=False).logits[0]
    return sequence_logprobs(logits.double(), input_ids, prompt_len, temperature)


def loop_grad_norms(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    prompt_len: int,
    temperature: float = 1.0,
    tokens: list[int] | None = None,
    groups: dict[str, list[str]] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Exact ``||d logprob_t / d theta||_2`` for each response token, by a per-token autograd loop.

    One forward; ``T`` calls of ``autograd.grad(..., retain_graph=True)``. Returns ``(T,)``
    float64 on CPU (only the positions in ``tokens`` when given, in that order). With
    ``groups`` (name -> parameter names) also returns the per-group squared norms ``(T,)``.
    """
    named = trainable_parameters(model)
    params = [p for _, p in named]
    acc = compute_dtype(_model_dtype(model))
    lp = _forward_logprobs(model, input_ids, prompt_len, temperature)
    idx = list(range(lp.shape[0])) if tokens is None else list(tokens)
    out = torch.zeros(len(idx), dtype=torch.float64)
    gout = {g: torch.zeros(len(idx), dtype=torch.float64) for g in (groups or {})}
    pos = {n: i for i, (n, _) in enumerate(named)}
    for i, t in enumerate(idx):
        grads = torch.autograd.grad(lp[t], params, retain_graph=True, allow_unused=True)
        out[i] = _sq_norm(grads, acc).double().sqrt().cpu()
        for g, names in (groups or {}).items():
            gout[g][i] = _sq_norm([grads[pos[n]] for n in names], acc).double().cpu()
    del lp
    return (out, gout) if groups is not None else out


def naive_grad_norms(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    prompt_len: int,
    temperature: float = 1.0,
    tokens: list[int] | None = None,
) -> torch.Tensor:
    """Exact per-token norms with a full forward and backward per token (the naive baseline).

    Returns ``(T,)`` float64 on CPU (or the positions in ``tokens``).
    """
    params = [p for _, p in trainable_parameters(model)]
    acc = compute_dtype(_model_dtype(model))
    T = input_ids.shape[0] - prompt_len
    idx = list(range(T)) if tokens is None else list(tokens)
    out = torch.zeros(len(idx), dtype=torch.float64)
    for i, t in enumerate(idx):
        lp = _forward_logprobs(model, input_ids, prompt_len, temperature)
        grads = torch.autograd.grad(lp[t], params, allow_unused=True)
        out[i] = _sq_norm(grads, acc).double().sqrt().cpu()
    return out
