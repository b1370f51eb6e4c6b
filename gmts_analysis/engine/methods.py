"""Per-token gradient-norm methods as entries: one :class:`GradMethod` per method in :data:`GRAD_METHODS`.

:func:`grad_norms` (``||d logprob_t / d theta||_2`` of a causal LM) checks what every method needs, then the
entry of ``method`` checks its own options (:attr:`GradMethod.check`) and runs (:attr:`GradMethod.run`).
A new method is one :func:`register_method` entry (its function may live in a module of its own, as the
exact engine and the sketch do); the probe offers it as ``--grad-norm NAME`` when its name is in
:data:`gmts_analysis.core.vocabulary.GRAD_NORM_METHODS` (the option's choices and help, without torch).

- ``exact`` (default): batched activation VJPs + ghost norms + causal truncation
  (:mod:`gmts_analysis.engine.exact`); a model or answer it refuses goes to the per-token loop.
- ``sketch``: closed-form head part + Gaussian forward-mode sketch of the rest, with a 95% interval per
  token (:mod:`gmts_analysis.engine.sketch`); an answer it refuses goes to ``exact``.
- ``loop``: one forward, ``autograd.grad`` per token (:mod:`gmts_analysis.engine.reference`).
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gmts_analysis.core.sizes import parse_chunk_size
from gmts_analysis.core.tokens import TokenQuantities, cat_quantities
from gmts_analysis.engine.base import GradNorms, forward_quantities, frozen_for_transforms, group_of
from gmts_analysis.engine.exact import CPU_BLOCK, ExactEngine, NumericalRefusal, exact_chunks, model_acc_dtype, plan_key
from gmts_analysis.engine.memory import exact_budget, limited_chunking, noting_batch
from gmts_analysis.engine.numerics import pinned_numerics
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.engine.reference import loop_grad_norms
from gmts_analysis.engine.sketch import sketch_grad_norms
from gmts_analysis.errors import GmtsError

log = logging.getLogger("gmts_analysis.engine")

GROUPINGS = ("layer", "module")


@dataclass(frozen=True)
class MethodArgs:
    """The options of one :func:`grad_norms` call that a method reads (``chunk_size`` parsed before ``run``)."""

    temperature: float
    chunk_size: int | str | None
    max_memory: int | None
    probes: int
    seed: int
    groups: str | None
    strict: bool
    where: str | None


@dataclass(frozen=True)
class GradMethod:
    """One gradient-norm method: ``run(model, input_ids, prompt_len, args)`` returns its :class:`GradNorms`;
    ``check(args)``, called after the checks every method shares and before any work, raises a one-line
    :class:`GmtsError` for options it cannot take."""

    name: str
    run: Callable[..., GradNorms]
    check: Callable[[MethodArgs], None] | None = None


#: name -> method, in the order the error messages list them
GRAD_METHODS: dict[str, GradMethod] = {}


def register_method(method: GradMethod) -> GradMethod:
    """Add (or replace) ``method`` in :data:`GRAD_METHODS`; returns it."""
    GRAD_METHODS[method.name] = method
    return method


def _check_args(model, input_ids, prompt_len, temperature, method, groups) -> GradMethod:
    """The checks every method shares; returns the method's entry."""
    if method not in GRAD_METHODS:
        raise GmtsError(f"grad-norm method '{method}': choose from {', '.join(GRAD_METHODS)}")
    if groups is not None and groups not in GROUPINGS:
        raise GmtsError(f"grad groups '{groups}': choose from {', '.join(GROUPINGS)}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 1:
        raise GmtsError("input_ids must be a 1-D tensor of token ids")
    S = int(input_ids.shape[0])
    if not 1 <= prompt_len < S:
        raise GmtsError(f"prompt_len={prompt_len} must be in [1, {S - 1}] for a sequence of {S} tokens")
    if not temperature > 0:
        raise GmtsError(f"temperature must be > 0 (got {temperature})")
    return GRAD_METHODS[method]


def _loop(model, input_ids, prompt_len, temperature, groups) -> GradNorms:
    q = forward_quantities(model, input_ids, prompt_len, temperature)
    if groups is None:
        return GradNorms(loop_grad_norms(model, input_ids, prompt_len, temperature), None, None, None, "loop", q)
    mapping: dict[str, list[str]] = {}
    for name, _ in trainable_parameters(model):
        mapping.setdefault(group_of(model, name.rsplit(".", 1)[0], groups), []).append(name)
    norms, g = loop_grad_norms(model, input_ids, prompt_len, temperature, groups=mapping)
    return GradNorms(norms, None, None, g, "loop", q)


def _exact(model, input_ids, prompt_len, temperature, chunk_size, max_memory, groups) -> GradNorms:
    acc = model_acc_dtype(model)
    S = input_ids.shape[0]
    T = S - prompt_len
    engine = ExactEngine(model, acc)
    with frozen_for_transforms(model):
        try:
            engine.install(input_ids[: min(S, 8)])
            budget = int(max_memory) if max_memory else exact_budget(engine, S, input_ids.device)
            # CPU: short blocks (less truncation waste); GPU: at least 64 tokens per block (more work per call);
            # both within the out-of-memory back-off's limit (engine/memory.py)
            size, cap = limited_chunking(chunk_size, CPU_BLOCK if input_ids.device.type == "cpu" else None)
            chunks = exact_chunks(T, prompt_len, size, engine, budget, cap=cap)
            per_module: dict[str, torch.Tensor] = {}
            parts: list[TokenQuantities] = []
            for s, e, sub in chunks:
                with noting_batch("tokens", min(sub, e - s)):
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


def _run_loop(model, input_ids, prompt_len, a: MethodArgs) -> GradNorms:
    return _loop(model, input_ids, prompt_len, a.temperature, a.groups)


def _check_sketch(a: MethodArgs) -> None:
    if int(a.probes) < 2:
        raise GmtsError(f"probes={a.probes}: must be >= 2")
    if a.groups is not None:
        raise GmtsError("grad groups need the exact norms, not the sketch")


def _run_sketch(model, input_ids, prompt_len, a: MethodArgs) -> GradNorms:
    """The sketch; an answer it refuses goes to :func:`_run_exact` (``strict``: refused)."""
    try:
        return sketch_grad_norms(
            model,
            input_ids,
            prompt_len,
            temperature=a.temperature,
            probes=int(a.probes),
            seed=a.seed,
            max_memory=a.max_memory,
        )
    except NotImplementedError as e:
        # never a dropped answer for a reason of the method's own: the exact engine (or its loop) takes it
        if a.strict:
            raise GmtsError(f"{a.where or 'this answer'}: the sketch refused it ({e}); --strict refuses the "
                            "fallback to exact norms (without --strict the exact engine takes it)") from None
        log.warning("%s: the sketch refused it (%s): exact norms instead", a.where or "this answer", e)
    return _run_exact(model, input_ids, prompt_len, a)


def _run_exact(model, input_ids, prompt_len, a: MethodArgs) -> GradNorms:
    """The exact engine; a model or answer it refuses goes to the per-token loop (:func:`_fallback`)."""
    key = plan_key(model)
    known = _NO_EXACT.get(model)
    if known is not None and known[0] == key:  # refused before: no planning pass
        return _fallback(model, input_ids, prompt_len, a.temperature, a.groups, known[1], a.where, a.strict,
                         again=True)
    try:
        return _exact(model, input_ids, prompt_len, a.temperature, a.chunk_size, a.max_memory, a.groups)
    except NotImplementedError as e:
        if not isinstance(e, NumericalRefusal):  # a check on numbers decides for this answer only
            _NO_EXACT[model] = (key, str(e))
        return _fallback(model, input_ids, prompt_len, a.temperature, a.groups, str(e), a.where, a.strict,
                         again=False)


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
    Norms are over all trainable parameters, tied tensors once. The call runs with autocast off and
    full-precision float32 matmuls (no TF32), whatever the caller set; the caller's settings are
    restored on return (:func:`gmts_analysis.engine.numerics.pinned_numerics`).

    chunk_size: tokens per batched VJP (``auto``: as many as fit ``max_memory`` bytes, by default
    an estimate of one forward-and-backward of the answer). probes/seed: sketch only. groups: ``layer`` | ``module`` also returns
    per-group squared norms that add up to ``norms**2``.

    When the exact engine refuses the model (``NotImplementedError``: a module or logit
    post-processing it does not support) the answer goes to the per-token loop (exact, slower),
    with a warning naming ``where`` (the answer), the reason and the expected slowdown
    (:func:`expected_loop_slowdown`), and ``GradNorms.fallback`` set; ``strict=True`` raises a
    :class:`GmtsError` instead.
    """
    args = MethodArgs(temperature, chunk_size, max_memory, probes, seed, groups, strict, where)
    entry = _check_args(model, input_ids, prompt_len, temperature, method, groups)
    if entry.check is not None:
        entry.check(args)
    args = dataclasses.replace(args, chunk_size=parse_chunk_size(chunk_size, "chunk_size"))
    with pinned_numerics():  # autocast off, float32 matmuls in full precision; restored on exit
        return entry.run(model, input_ids, prompt_len, args)


def expected_loop_slowdown(model: torch.nn.Module, prompt_len: int, T: int) -> float:
    """The per-token loop's arithmetic over the exact engine's, per token (a cost model; see
    docs/benchmarks.md for measured ratios). Loop: a backward with parameter gradients over all
    ``S = P + T`` positions, head included, ``~4 n S`` flops (``n`` trainable parameters). Engine:
    an activation backward and the ghost norms over the mean truncated prefix ``P + T/2``,
    ``~4 n_body (P + T/2)`` (``n_body``: without the embedding and head), plus the head's closed
    form ``2 V d``."""
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


register_method(GradMethod("exact", _run_exact))
register_method(GradMethod("sketch", _run_sketch, check=_check_sketch))
register_method(GradMethod("loop", _run_loop))
#: the names of the methods registered here (see :data:`GRAD_METHODS` for the registry itself)
METHODS = tuple(GRAD_METHODS)
