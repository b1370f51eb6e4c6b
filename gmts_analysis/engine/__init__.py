"""Per-token gradient norms ``||d logprob_t / d theta||_2`` of a causal LM.

``grad_norms(model, input_ids, prompt_len)`` is the one entry point. Methods:

- ``exact`` (default): batched activation VJPs + ghost norms + causal truncation
  (:mod:`gmts_analysis.engine.exact`); exact to float32 rounding (float64 for float64 models).
- ``sketch``: closed-form head part + Gaussian forward-mode sketch of the rest, with a 95%
  interval per token (:mod:`gmts_analysis.engine.sketch`).
- ``loop``: one forward, ``autograd.grad`` per token (:mod:`gmts_analysis.engine.reference`).

The model is left as it was found: attention implementation restored, hooks removed,
``requires_grad`` flags restored, no ``.grad`` written.

Every method also returns the per-token closed forms of the forward it ran
(:class:`gmts_analysis.core.tokens.TokenQuantities`: log-prob, probability, entropy, logit- and
head-gradient norms), so a caller needs no forward of its own; :func:`forward_quantities`
gives them alone (one no-grad forward) when no gradient norm is wanted.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from gmts_analysis.core.tokens import TokenQuantities, cat_quantities
from gmts_analysis.errors import GmtsError

log = logging.getLogger(__name__)

METHODS = ("exact", "sketch", "loop")
GROUPINGS = ("layer", "module")


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

    from gmts_analysis.engine.params import attention_implementation

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
    from gmts_analysis.engine.plan import layer_group

    return module_name if groups == "module" else layer_group(model, module_name)


def _check_args(model, input_ids, prompt_len, temperature, method, groups, probes):
    if method not in METHODS:
        raise GmtsError(f"grad-norm method '{method}': choose from {', '.join(METHODS)}")
    if groups is not None and groups not in GROUPINGS:
        raise GmtsError(f"grad groups '{groups}': choose from {', '.join(GROUPINGS)}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        raise GmtsError("input_ids must be a 1-D tensor of token ids")
    S = int(input_ids.shape[0])
    if not 1 <= prompt_len < S:
        raise GmtsError(f"prompt_len={prompt_len} must be in [1, {S - 1}] for a sequence of {S} tokens")
    if not temperature > 0:
        raise GmtsError(f"temperature must be > 0 (got {temperature})")
    if method == "sketch" and int(probes) < 2:
        raise GmtsError(f"probes={probes}: must be >= 2")
    if method == "sketch" and groups is not None:
        raise GmtsError("grad groups need the exact norms, not the sketch")


def _head_has_bias(head: torch.nn.Module | None) -> bool:
    b = getattr(head, "bias", None)
    return isinstance(b, torch.Tensor) and b.requires_grad


@torch.no_grad()
def forward_quantities(
    model: torch.nn.Module, input_ids: torch.LongTensor, prompt_len: int, temperature: float = 1.0
) -> TokenQuantities:
    """The response tokens' closed forms from one no-grad forward: log-prob, probability,
    entropy, ``logit_grad_norm`` and ``head_grad_norm`` (the head's input captured by a hook;
    only the ``T`` predicting positions' logits are computed when the model allows it).

    input_ids ``(S,)``, ``prompt_len`` = P >= 1. See :func:`gmts_analysis.core.tokens.token_quantities`."""
    from gmts_analysis.core.tokens import response_prefix, response_targets, token_quantities

    T = int(input_ids.shape[0]) - int(prompt_len)
    L = response_prefix(prompt_len, 0, T)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    captured: dict[str, torch.Tensor] = {}
    handle = None
    if isinstance(head, torch.nn.Module):
        handle = head.register_forward_hook(lambda m, a, o: captured.__setitem__("h", a[0]))
    kw = {"input_ids": input_ids[:L].unsqueeze(0), "use_cache": False}
    if _accepts(model, "logits_to_keep"):
        kw["logits_to_keep"] = T
    try:
        logits = model(**kw).logits[0, -T:]
    finally:
        if handle is not None:
            handle.remove()
    h = captured.get("h")
    return token_quantities(
        logits, response_targets(input_ids, prompt_len), temperature,
        head_input=None if h is None else h[0, -T:], head_bias=_head_has_bias(head),
    )


def _accepts(model: torch.nn.Module, arg: str) -> bool:
    import inspect

    try:
        return arg in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _loop(model, input_ids, prompt_len, temperature, groups) -> GradNorms:
    from gmts_analysis.engine.params import trainable_parameters
    from gmts_analysis.engine.reference import loop_grad_norms

    q = forward_quantities(model, input_ids, prompt_len, temperature)
    if groups is None:
        return GradNorms(loop_grad_norms(model, input_ids, prompt_len, temperature), None, None, None, "loop", q)
    mapping: dict[str, list[str]] = {}
    for name, _ in trainable_parameters(model):
        mapping.setdefault(group_of(model, name.rsplit(".", 1)[0], groups), []).append(name)
    norms, g = loop_grad_norms(model, input_ids, prompt_len, temperature, groups=mapping)
    return GradNorms(norms, None, None, g, "loop", q)


def _exact(model, input_ids, prompt_len, temperature, chunk_size, max_memory, groups) -> GradNorms:
    from gmts_analysis.engine.exact import CPU_BLOCK, ExactEngine, default_budget, exact_chunks, model_acc_dtype

    acc = model_acc_dtype(model)
    S = input_ids.shape[0]
    T = S - prompt_len
    engine = ExactEngine(model, acc)
    with frozen_for_transforms(model):
        try:
            engine.install(input_ids[: min(S, 8)])
            budget = int(max_memory) if max_memory else default_budget(engine, S)
            # CPU: short blocks (less truncation waste); GPU: at least 64 tokens per block (more work per call)
            chunks = exact_chunks(T, prompt_len, chunk_size, engine, budget,
                                  cap=CPU_BLOCK if input_ids.device.type == "cpu" else None)
            per_module: dict[str, torch.Tensor] = {}
            parts: list[TokenQuantities] = []
            for s, e, sub in chunks:
                res, q = engine.chunk(input_ids, prompt_len, s, e, temperature, sub)
                parts.append(q)
                for name, v in res.items():
                    buf = per_module.setdefault(name, torch.zeros(T, dtype=torch.float64))
                    buf[s:e] += v.detach().double().cpu()
        finally:
            engine.remove()
    total = sum(per_module.values())
    norms = total.clamp_min(0.0).sqrt()
    out_groups = None
    if groups is not None:
        out_groups = {}
        for name, v in per_module.items():
            key = group_of(model, name, groups)
            out_groups[key] = out_groups.get(key, 0) + v
    return GradNorms(norms, None, None, out_groups, "exact", cat_quantities(parts))


def grad_norms(
    model: torch.nn.Module,
    input_ids: torch.LongTensor,
    prompt_len: int,
    *,
    temperature: float = 1.0,
    method: str = "exact",
    chunk_size: int | str = "auto",
    max_memory: int | None = None,
    probes: int = 32,
    seed: int = 0,
    groups: str | None = None,
    strict: bool = False,
    where: str | None = None,
) -> GradNorms:
    """Per-token ``||d logprob_t / d theta||_2`` for the ``T = S - P`` response tokens.

    input_ids: ``(S,)`` on the model's device; ``prompt_len`` = P >= 1. logprob_t is
    ``log softmax(z_{P+t-1} / tau)[input_ids[P+t]]`` (:func:`gmts_analysis.core.tokens.sequence_logprobs`).
    Norms are over all trainable parameters, tied tensors once.

    chunk_size: tokens per batched VJP (``auto``: as many as fit ``max_memory`` bytes, by default
    an estimate of one forward-and-backward of the answer). probes/seed: sketch only. groups: ``layer`` | ``module`` also returns
    per-group squared norms that add up to ``norms**2``.

    When the exact engine refuses the model (``NotImplementedError``: a module or logit
    post-processing it does not support) the answer goes to the per-token loop (exact, slower),
    with a warning naming ``where`` (the answer), the reason and the expected slowdown
    (:func:`expected_loop_slowdown`), and ``GradNorms.fallback`` set; ``strict=True`` raises a
    :class:`GmtsError` instead.
    """
    _check_args(model, input_ids, prompt_len, temperature, method, groups, probes)
    from gmts_analysis.core.sizes import parse_chunk_size

    chunk_size = parse_chunk_size(chunk_size, "chunk_size")
    if method == "loop":
        return _loop(model, input_ids, prompt_len, temperature, groups)
    if method == "sketch":
        from gmts_analysis.engine.sketch import sketch_grad_norms

        try:
            return sketch_grad_norms(
                model,
                input_ids,
                prompt_len,
                temperature=temperature,
                probes=int(probes),
                seed=seed,
                max_memory=max_memory,
            )
        except NotImplementedError as e:
            # never a dropped answer for a reason of the method's own: the exact engine (or its loop) takes it
            if strict:
                raise GmtsError(f"{where or 'this answer'}: the sketch refused it ({e}); --strict refuses the "
                                "fallback to exact norms (without --strict the exact engine takes it)") from None
            log.warning("%s: the sketch refused it (%s): exact norms instead", where or "this answer", e)
            method = "exact"
    from gmts_analysis.engine.exact import plan_key

    key = plan_key(model)
    known = _NO_EXACT.get(model)
    if known is not None and known[0] == key:  # refused before: no planning pass
        return _fallback(model, input_ids, prompt_len, temperature, groups, known[1], where, strict, again=True)
    try:
        return _exact(model, input_ids, prompt_len, temperature, chunk_size, max_memory, groups)
    except NotImplementedError as e:
        from gmts_analysis.engine.exact import NumericalRefusal

        if not isinstance(e, NumericalRefusal):  # a check on numbers decides for this answer only
            _NO_EXACT[model] = (key, str(e))
        return _fallback(model, input_ids, prompt_len, temperature, groups, str(e), where, strict, again=False)


def expected_loop_slowdown(model: torch.nn.Module, prompt_len: int, T: int) -> float:
    """The per-token loop's arithmetic over the exact engine's, per token (a cost model; see
    docs/benchmarks.md for measured ratios). Loop: a backward with parameter gradients over all
    ``S = P + T`` positions, head included, ``~4 n S`` flops (``n`` trainable parameters). Engine:
    an activation backward and the ghost norms over the mean truncated prefix ``P + T/2``,
    ``~4 n_body (P + T/2)`` (``n_body``: without the embedding and head), plus the head's closed
    form ``2 V d``."""
    from gmts_analysis.engine.params import trainable_parameters

    n = sum(p.numel() for _, p in trainable_parameters(model))
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vd = int(head.weight.numel()) if isinstance(getattr(head, "weight", None), torch.Tensor) else 0
    n_emb = int(emb.weight.numel()) if isinstance(getattr(emb, "weight", None), torch.Tensor) else 0
    tied = head is not None and emb is not None and getattr(head, "weight", None) is getattr(emb, "weight", None)
    n_body = max(1, n - n_emb - (0 if tied else vd))
    S = prompt_len + T
    return 4.0 * n * S / (4.0 * n_body * (prompt_len + T / 2) + 2.0 * vd)


def _fallback(model, input_ids, prompt_len, temperature, groups, reason, where, strict, again) -> GradNorms:
    T = int(input_ids.shape[0]) - int(prompt_len)
    who = where or "this answer"
    slow = expected_loop_slowdown(model, prompt_len, T)
    if strict:
        raise GmtsError(f"{who}: the exact engine refused it ({reason}); --strict refuses the per-token loop "
                        f"(without --strict its {T} tokens go to the loop: exact, expected about {slow:.1f}x slower)")
    if again:
        log.warning("%s: %d tokens by the per-token loop (expected about %.1fx slower than the exact engine): "
                    "the engine refused this model (%s)", who, T, slow, reason)
    else:
        log.warning("exact engine unavailable for %s (%s): its %d tokens go to the per-token loop (exact; "
                    "expected about %.1fx slower)", who, reason, T, slow)
    out = _loop(model, input_ids, prompt_len, temperature, groups)
    out.fallback = reason
    return out


# model -> (plan key, reason): models the exact engine refused for what they are made of (as for
# the plan cache; never a refusal from comparing numbers), so that later answers go to the loop
# at once and it is said once
_NO_EXACT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


__all__ = ["GROUPINGS", "METHODS", "GradNorms", "expected_loop_slowdown", "forward_quantities", "frozen_for_transforms", "grad_norms"]
