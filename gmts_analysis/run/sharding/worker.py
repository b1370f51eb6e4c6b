"""One rank's work: probe its answers chunk by chunk, record each chunk, survive bad answers.

An answer that raises (non-finite logits, say) is recorded with its id and reason and
skipped, unless ``strict``. Out of memory retries the same answer with half the batch the
engine used when it failed (the exact engine's tokens per VJP, the sketch's directions per
JVP; :mod:`gmts_analysis.engine.memory`), down to one, at most ``OOM_RETRIES`` times; an
answer still out of memory is recorded with ``out_of_memory: true``, which the manifest
counts (``n_out_of_memory``) and ``gmts probe`` / ``gmts run`` report in their summary and
exit status.

Testing hooks (environment variables, for the kill-and-resume tests; never set them
in real runs):

- ``GMTS_TEST_FAIL_AFTER_CHUNKS=k``: raise after this process has recorded k chunks.
- ``GMTS_TEST_SLOW_S=x``: sleep x seconds after each answer (lets a test kill a run mid-chunk).
- ``GMTS_TEST_OOM_ANSWER=id``: the answer ``id`` runs out of memory (simulated) at every try (lets a
  torchrun test drop an answer for lack of memory).
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from gmts_analysis.core.sizes import AUTO
from gmts_analysis.engine import memory
from gmts_analysis.engine.memory import is_out_of_memory
from gmts_analysis.errors import GmtsError
from gmts_analysis.probing import kernel, tables
from gmts_analysis.probing.settings import EngineSettings, KernelSettings
from gmts_analysis.readers.rollouts import Answer
from gmts_analysis.run.sharding import state
from gmts_analysis.run.sharding.context import DistContext
from gmts_analysis.util.interrupt import raise_if_interrupted
from gmts_analysis.util.progress import tqdm

log = logging.getLogger("gmts_analysis.run.sharding")

FAIL_AFTER_ENV = "GMTS_TEST_FAIL_AFTER_CHUNKS"
SLOW_ENV = "GMTS_TEST_SLOW_S"
OOM_ANSWER_ENV = "GMTS_TEST_OOM_ANSWER"


class InjectedFailure(RuntimeError):
    """Raised by the ``GMTS_TEST_FAIL_AFTER_CHUNKS`` hook."""


class AnswerOutOfMemory(MemoryError):
    """An answer still out of memory at the back-off's floor or after its last retry."""


def _free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def probe_with_retry(model: torch.nn.Module, answer: Answer, coef: Any, settings: KernelSettings,
                     token_text: Any) -> tuple[dict, pd.DataFrame | None]:
    """:func:`gmts_analysis.probing.kernel.probe_answer` (same arguments), retried on out of memory with half the
    batch that failed (:func:`gmts_analysis.engine.memory.batch_of`, else :func:`_unnoted_batch`;
    :meth:`~gmts_analysis.engine.memory.BatchLimit.halved`), at most
    :data:`~gmts_analysis.engine.memory.OOM_RETRIES` times. Raises :class:`AnswerOutOfMemory` naming the sizes tried when the batch is at its floor
    or the retries are spent."""
    limit = memory.BatchLimit()
    tried: list[str] = []
    for attempt in range(memory.OOM_RETRIES + 1):
        try:
            with memory.batch_limit(limit):
                if os.environ.get(OOM_ANSWER_ENV) == str(answer.answer_id):
                    raise torch.OutOfMemoryError(f"out of memory ({OOM_ANSWER_ENV}, simulated)")
                return kernel.probe_answer(model, answer, coef, settings, token_text)
        except Exception as e:
            if not is_out_of_memory(e):
                raise
            oom = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'out of memory'}"
            used = memory.batch_of(e)
        # outside the except block: the exception's frames (and their tensors) are released
        _free_memory()
        kind, size = used if used is not None else _unnoted_batch(settings.engine, answer, limit)
        tried.append(str(size))
        new = limit.halved(kind, size) if attempt < memory.OOM_RETRIES else None
        if new is None:
            break
        log.warning("answer '%s' (%d tokens): out of memory at %d %s; retrying at %d",
                    answer.answer_id, answer.length, size, memory.BATCH_KINDS[kind], getattr(new, kind))
        limit = new
    raise AnswerOutOfMemory(f"out of memory after {len(tried)} tries at {', '.join(tried)} {memory.BATCH_KINDS[kind]} "
                            f"(floor {memory.OOM_FLOOR[kind]}, at most {memory.OOM_RETRIES} retries): {oom}")


def _unnoted_batch(engine: EngineSettings, answer: Answer, limit: memory.BatchLimit) -> tuple[str, int]:
    """The batch to halve after an out-of-memory error outside any batch (a forward, the closed
    forms): the sketch's directions per JVP (its cap, else ``--probes``), else the exact engine's
    tokens per VJP (its cap, else the integer ``--chunk-size``, else what ``auto`` takes at most:
    256, and never more than the answer)."""
    if engine.method == "sketch":
        return "directions", limit.directions or engine.probes
    if limit.tokens is not None:
        return "tokens", limit.tokens
    return "tokens", max(1, min(answer.length, 256 if engine.chunk_size == AUTO else int(engine.chunk_size)))


def _reason(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, GmtsError):
        return msg
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def _tables(parts: list[dict], gparts: list[pd.DataFrame]) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    tokens = tables.concat_columns(parts) if parts else None
    groups = None
    if gparts:
        groups = pd.concat(gparts, ignore_index=True)
        groups["answer_id"] = tables.id_column(list(groups["answer_id"]))
    return tokens, groups


@dataclasses.dataclass
class ShareSummary:
    """What one rank did in this attempt."""

    n_answers: int = 0
    n_chunks: int = 0
    n_tokens: int = 0
    n_errors: int = 0
    seconds: float = 0.0


#: ``--answers-per-chunk`` auto: a rank's share is cut into this many records (fewer when it is smaller) ...
AUTO_RECORDS = 8
#: ... of at most this many answers each
MAX_AUTO_ANSWERS_PER_CHUNK = 16


def answers_per_chunk(setting: int | None, n_answers: int, world_size: int = 1) -> int:
    """The answers per record: ``setting`` when given, else (auto) a rank's share of ``n_answers`` over
    :data:`AUTO_RECORDS`, rounded up, between 1 and :data:`MAX_AUTO_ANSWERS_PER_CHUNK`: a killed run of
    16 answers redoes at most 2 of them, not all 16."""
    if setting is not None:
        return int(setting)
    share = -(-max(int(n_answers), 0) // max(int(world_size), 1))
    return max(1, min(MAX_AUTO_ANSWERS_PER_CHUNK, -(-share // AUTO_RECORDS)))


def probe_share(model: torch.nn.Module, tokenizer: Any, answers: Sequence[Answer], coefs: Sequence[Any],
                todo: Sequence[int], settings: KernelSettings, per_chunk: int, out: Path, run_hash: str,
                ctx: DistContext, attempt: int, progress: bool) -> ShareSummary:
    """Probe the answers ``todo`` (indices into ``answers``) in chunks of ``per_chunk`` answers (the job's
    ``--answers-per-chunk``, auto resolved: :func:`answers_per_chunk`), recording each chunk."""
    fail_after = int(os.environ.get(FAIL_AFTER_ENV) or 0)
    slow = float(os.environ.get(SLOW_ENV) or 0)
    token_text = kernel.TokenText(tokenizer)
    summary = ShareSummary()
    meta = {"rank": ctx.rank, "world_size": ctx.world_size, "attempt": attempt}
    t_start = time.perf_counter()
    bar = tqdm(total=len(todo), desc=f"probe (rank 0 of {ctx.world_size})" if ctx.distributed else "probe",
               unit="answer", disable=not progress, dynamic_ncols=True)
    try:
        for start in range(0, len(todo), per_chunk):
            chunk = list(todo[start:start + per_chunk])
            record = _ChunkRecord(out, run_hash, meta)
            for i in chunk:
                _probe_one(model, answers[i], i, coefs[i], settings, token_text, record)
                raise_if_interrupted()  # a Ctrl-C whose KeyboardInterrupt was lost: stop before recording
                bar.update(1)
                if slow:
                    time.sleep(slow)
            record.write(chunk)
            summary.n_answers += len(chunk)
            summary.n_chunks += 1
            summary.n_tokens += record.n_tok
            summary.n_errors += len(record.errors)
            elapsed = time.perf_counter() - t_start
            bar.set_postfix(tok_s=f"{summary.n_tokens / max(elapsed, 1e-9):.1f}")
            if fail_after and summary.n_chunks >= fail_after:
                raise InjectedFailure(f"{FAIL_AFTER_ENV}={fail_after}: stopping after {summary.n_chunks} chunk(s)")
    finally:
        bar.close()
    summary.seconds = time.perf_counter() - t_start
    return summary


class _ChunkRecord:
    """One chunk's results as its answers finish (token columns, group rows, errors, the
    answers done and their tokens), and its record in the run directory."""

    def __init__(self, out: Path, run_hash: str, meta: dict) -> None:
        self.out, self.run_hash, self.meta = out, run_hash, meta
        self.parts: list[dict] = []
        self.gparts: list[pd.DataFrame] = []
        self.errors: list[dict] = []
        self.done: list[int] = []
        self.n_tok = 0
        self.t0 = time.perf_counter()

    def add(self, i: int, cols: dict, g: pd.DataFrame | None, n_tokens: int) -> None:
        """The tables of answer ``i`` (``n_tokens`` response tokens), tagged with its index."""
        n = len(cols["position"])
        cols[state.INDEX_COLUMN] = np.full(n, i, dtype=np.int64)
        if g is not None:
            g[state.INDEX_COLUMN] = np.int64(i)
            self.gparts.append(g)
        self.parts.append(cols)
        self.n_tok += n_tokens

    def skip(self, i: int, a: Answer, reason: str, out_of_memory: bool = False) -> None:
        """Answer ``i`` failed: logged, its reason kept for errors.jsonl (``out_of_memory``: still
        out of memory after the back-off), memory freed."""
        log.warning("answer '%s' failed and is skipped: %s", a.answer_id, reason)
        err = {"index": int(i), "answer_id": a.answer_id, "group_id": a.group_id,
               "where": a.where, "reason": reason, "rank": self.meta["rank"]}
        if out_of_memory:
            err["out_of_memory"] = True
        self.errors.append(err)
        _free_memory()

    def write(self, indices: list[int]) -> None:
        """Record the chunk of answers ``indices`` (:func:`state.write_chunk`)."""
        tokens, groups = _tables(self.parts, self.gparts)
        state.write_chunk(self.out, self.run_hash, indices, tokens, groups, self.errors,
                          time.perf_counter() - self.t0, self.n_tok, self.meta)


def _probe_one(model: torch.nn.Module, a: Answer, i: int, coef: Any, settings: KernelSettings, token_text: Any,
               record: _ChunkRecord) -> None:
    """Probe answer ``a`` (index ``i``) into ``record``. A failure is recorded and the answer
    skipped; under ``--strict`` the chunk's finished answers are written and a GmtsError raised."""
    try:
        cols, g = probe_with_retry(model, a, coef, settings, token_text)
    except Exception as e:
        reason = _reason(e)
        if settings.engine.strict:
            if record.done:  # keep what this chunk finished
                record.write(record.done)
            raise GmtsError(f"{a.where}: answer '{a.answer_id}' failed: {reason} "
                            "(--strict; without it the answer is skipped)") from e
        record.skip(i, a, reason, out_of_memory=isinstance(e, AnswerOutOfMemory))
    else:
        record.add(i, cols, g, a.length)
    record.done.append(i)
