"""The engines' memory: the budget they batch within, what they keep, and the out-of-memory back-off.

**Budget.** Both engines batch work within a byte budget: the exact engine tokens per batched VJP
(``--chunk-size auto``), the sketch directions per batched JVP. Without ``--max-memory`` the budget
is an estimate of one forward and backward (:func:`gmts_analysis.engine.exact.default_budget`, the
sketch's own); on CUDA it is also capped by what the device has free (:func:`free_device_memory`:
``torch.cuda.mem_get_info`` plus the blocks torch's caching allocator holds unused), less what the
engine keeps while it batches (:func:`kept_bytes`: the forward's saved activations, the ghost
norms' captures, among them the float32 copies of linear inputs kept for bfloat16 models, the
logits and closed forms of a block), times :data:`HEADROOM`. On the CPU the budget is the
estimate alone, as before.

**Back-off.** An engine that runs out of memory inside a batch says which batch it was
(:func:`noting_batch` sets :func:`batch_of` on the exception: ``("tokens", n)`` for the exact
engine's tokens per VJP, ``("directions", k)`` for the sketch's directions per JVP). The job's
retry (:func:`gmts_analysis.run.sharding.worker.probe_with_retry`) then runs the answer again
inside :func:`batch_limit` with half that size (:meth:`BatchLimit.halved`), down to a floor of
one, at most :data:`OOM_RETRIES` times. The limit only caps the batch: the exact norms do not
depend on it; the sketch's directions are drawn per batch, so a smaller batch gives other (equally
distributed) directions.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Iterator

import torch

from gmts_analysis.engine.exact import ExactEngine, default_budget
from gmts_analysis.engine.plan import LinearRule

#: fraction of the device's free memory a budget may use (the estimates are rough)
HEADROOM = 0.8
#: retries of one answer after out of memory, each with half the batch of the last failure
OOM_RETRIES = 8
#: the smallest batch a retry tries, per kind
OOM_FLOOR = {"tokens": 1, "directions": 1}
#: what each kind of batch is, for messages
BATCH_KINDS = {"tokens": "tokens per batched VJP", "directions": "sketch directions per batched JVP"}


def is_out_of_memory(e: BaseException) -> bool:
    """An allocation failure: torch's ``OutOfMemoryError`` (CUDA and other backends), or a
    ``RuntimeError`` saying out of memory."""
    if isinstance(e, torch.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def free_device_memory(device: torch.device | str) -> int | None:
    """Bytes torch can still allocate on a CUDA ``device``: the driver's free memory plus the
    blocks the caching allocator reserved and does not use; ``None`` for any other device."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _ = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return int(free) + max(0, int(cached))


def kept_bytes(engine: ExactEngine, L: int, block: int = 256) -> int:
    """Bytes the exact engine keeps during one block's batched VJPs over a prefix of ``L``
    positions, whatever the tokens per VJP: the forward's saved activations (about two values per
    tapped output per position, in the model's dtype, and the attention probabilities), the ghost
    norms' captures (a linear layer's input in the accumulation dtype, a new copy when the model's
    dtype is narrower, as for bfloat16 models; its ``L x L`` Gram matrix when ``L`` is under its
    width; a norm's normalized input) and the block's logits, logit gradients and cotangents
    (``block`` tokens, at most ``L``)."""
    plan = engine.plan
    acc_es = torch.finfo(engine.acc).bits // 8
    p0 = next((p for _, p in engine.named), None)
    model_es = p0.element_size() if p0 is not None else acc_es
    copies = model_es != acc_es  # x.to(acc) makes a new tensor
    outs = 0
    captures = 0
    for tap in plan.taps if plan is not None else []:
        din, dout = plan.widths.get(tap.name, (1, 1))
        outs += dout
        if isinstance(tap.rule, LinearRule):
            captures += (L * din if copies else 0) + (L * L if L < din else 0)
        elif tap.rule.is_norm:
            captures += L * dout
    n_layers = max(1, sum(1 for t in plan.taps if t.rule.is_norm) // 2) if plan is not None else 1
    acts = L * 2 * outs + n_layers * engine.n_heads * L * L
    c = min(L, block)
    head = plan.head.weight if plan is not None else None
    V, d = (head.shape[0], head.shape[1]) if head is not None else (1, 1)
    closed = c * V * (model_es + acc_es) + c * c * d * model_es
    return int(model_es * acts + acc_es * captures + closed)


def exact_budget(engine: ExactEngine, seq_len: int, device: torch.device | str) -> int:
    """The exact engine's default budget (bytes) for an answer of ``seq_len`` tokens:
    :func:`gmts_analysis.engine.exact.default_budget`, on CUDA at most :data:`HEADROOM` of the free
    memory less :func:`kept_bytes` at the whole answer (at least one byte: one token per VJP)."""
    budget = default_budget(engine, seq_len)
    free = free_device_memory(device)
    if free is None:
        return budget
    return max(1, min(budget, int(HEADROOM * free) - kept_bytes(engine, seq_len)))


def sketch_budget(budget: int, device: torch.device | str) -> int:
    """The sketch's budget (bytes) for its batched JVPs: ``budget``, on CUDA at most
    :data:`HEADROOM` of the memory free once its forward and closed forms are kept (at least one
    byte: one direction per JVP)."""
    free = free_device_memory(device)
    return int(budget) if free is None else max(1, min(int(budget), int(HEADROOM * free)))


@dataclasses.dataclass(frozen=True)
class BatchLimit:
    """Caps on the engines' batches set by the out-of-memory back-off (``None``: no cap)."""

    tokens: int | None = None  # the exact engine's tokens per batched VJP (and per block)
    directions: int | None = None  # the sketch's directions per batched JVP

    def halved(self, kind: str, used: int) -> BatchLimit | None:
        """This limit with the ``kind`` batch at half of ``used`` (the size that failed), or
        ``None`` when ``used`` is at the floor already (:data:`OOM_FLOOR`)."""
        floor = OOM_FLOOR[kind]
        if used <= floor:
            return None
        return dataclasses.replace(self, **{kind: max(floor, int(used) // 2)})


_NO_LIMIT = BatchLimit()
_LIMIT: contextvars.ContextVar[BatchLimit | None] = contextvars.ContextVar("gmts_batch_limit", default=None)


def current_limit() -> BatchLimit:
    """The :class:`BatchLimit` in force (no caps outside :func:`batch_limit`)."""
    return _LIMIT.get() or _NO_LIMIT


@contextlib.contextmanager
def batch_limit(limit: BatchLimit) -> Iterator[BatchLimit]:
    """Run the block with the engines' batches capped by ``limit``."""
    token = _LIMIT.set(limit)
    try:
        yield limit
    finally:
        _LIMIT.reset(token)


def limited_chunking(chunk_size: int | str, cap: int | None) -> tuple[int | str, int | None]:
    """The exact engine's ``(chunk_size, cap)`` (see :func:`gmts_analysis.engine.exact.exact_chunks`)
    under the tokens limit in force: an integer chunk size at most the limit, ``auto`` with blocks
    of at most the limit."""
    lim = current_limit().tokens
    if lim is None:
        return chunk_size, cap
    if chunk_size != "auto":
        return min(int(chunk_size), lim), cap
    return chunk_size, lim if cap is None else min(cap, lim)


_BATCH_ATTR = "gmts_batch"


@contextlib.contextmanager
def noting_batch(kind: str, size: int) -> Iterator[None]:
    """Run one batch of ``size`` (``kind``: a key of :data:`BATCH_KINDS`); an out-of-memory error
    leaving it carries ``(kind, size)`` for :func:`batch_of` (the innermost batch is kept)."""
    try:
        yield
    except BaseException as e:
        if is_out_of_memory(e) and getattr(e, _BATCH_ATTR, None) is None:
            try:
                setattr(e, _BATCH_ATTR, (kind, int(size)))
            except AttributeError:  # pragma: no cover - an exception type without a __dict__
                pass
        raise


def batch_of(e: BaseException) -> tuple[str, int] | None:
    """``(kind, size)`` of the batch an out-of-memory error ``e`` left (:func:`noting_batch`), or
    ``None`` when it happened outside one (a forward, the closed forms)."""
    return getattr(e, _BATCH_ATTR, None)


__all__ = ["BATCH_KINDS", "BatchLimit", "HEADROOM", "OOM_FLOOR", "OOM_RETRIES", "batch_limit", "batch_of",
           "current_limit", "exact_budget", "free_device_memory", "is_out_of_memory", "kept_bytes",
           "limited_chunking", "noting_batch", "sketch_budget"]
