"""Batched, seeded sampling of answer groups from a policy, scored by a domain's verifier.

Sampling draws token ``argmax(z / tau + g)`` with Gumbel noise ``g`` that comes from a
generator seeded per answer (``seed``, domain, prompt index, answer index): this is
exact sampling from ``softmax(z / tau)``, and an answer's draws do not depend on which
other answers share its batch. ``temperature == 0`` decodes greedily.

Rollout rows follow docs/definitions.md section 7: ``prompt``, ``prompt_ids`` (with ``<bos>``),
``response`` (text, no special tokens), ``response_ids`` (cut after the first
``<eos>``, which is kept), ``reward``, ``group_id``, ``answer_id``, plus ``domain``,
``difficulty`` and ``truncated`` (no ``<eos>`` within ``max_new_tokens``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from gmts_analysis.core.seeding import derive_seed
from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.domains import generate_problems, get_domain
from gmts_analysis.util.atomic import atomic_write_jsonl

log = logging.getLogger(__name__)


def answer_seed(seed: int, *key: object) -> int:
    """A 63-bit seed for one answer's sampling noise (:func:`gmts_analysis.core.seeding.derive_seed`)."""
    return derive_seed(seed, *key)


class _GumbelSampler:
    """Logits processor: ``z / tau + g`` with per-row, per-step Gumbel noise; greedy after it samples."""

    def __init__(self, noise: torch.Tensor | None, temperature: float, prompt_width: int):
        self.noise, self.temperature, self.prompt_width = noise, temperature, prompt_width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()
        if self.noise is None:
            return scores
        step = input_ids.shape[1] - self.prompt_width
        g = self.noise[:, step, : scores.shape[-1]].to(scores.device)
        return scores / self.temperature + g


def _gumbel(seeds: Sequence[int], steps: int, vocab: int) -> torch.Tensor:
    """(len(seeds), steps, vocab) float32 standard Gumbel noise, one generator per row."""
    rows = []
    for s in seeds:
        g = torch.Generator().manual_seed(int(s))
        u = torch.rand((steps, vocab), generator=g, dtype=torch.float64)
        u = u.clamp(1e-12, 1.0 - 1e-12)
        rows.append((-torch.log(-torch.log(u))).float())
    return torch.stack(rows)


@torch.no_grad()
def generate_responses(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str],
    row_seeds: Sequence[int],
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    batch_size: int = 64,
    progress: bool = False,
) -> list[list[int]]:
    """Sample one response per prompt (repeat a prompt for a group); returns response ids.

    Each list is cut after the first ``<eos>`` (kept) or holds ``max_new_tokens`` ids.
    The model is used as given (device, dtype, eval mode are the caller's).
    """
    if len(prompts) != len(row_seeds):
        raise ValueError("one seed per prompt row")
    if temperature < 0:
        raise GmtsError(f"--temperature must be >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise GmtsError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    from transformers import LogitsProcessorList

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    out: list[list[int]] = []
    starts = range(0, len(prompts), batch_size)
    if progress:
        from tqdm import tqdm

        starts = tqdm(starts, desc="sampling", unit="batch", leave=False)
    old_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        for start in starts:
            chunk = list(prompts[start : start + batch_size])
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=True)
            ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
            width = ids.shape[1]
            noise = None
            if temperature > 0:
                noise = _gumbel(row_seeds[start : start + batch_size], max_new_tokens, vocab)
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=False,
                num_beams=1,
                max_new_tokens=max_new_tokens,
                logits_processor=LogitsProcessorList([_GumbelSampler(noise, temperature, width)]),
                eos_token_id=eos,
                pad_token_id=pad,
                bos_token_id=tokenizer.bos_token_id,
            )
            for row in gen[:, width:].tolist():
                if eos in row:
                    row = row[: row.index(eos) + 1]
                out.append(row)
    finally:
        tokenizer.padding_side = old_side
    return out


def sample_rollouts(
    model: torch.nn.Module,
    tokenizer: Any,
    domain: str,
    num_prompts: int,
    group_size: int,
    temperature: float = 1.0,
    max_new_tokens: int = 96,
    seed: int = 0,
    difficulty: int | None = None,
    split: str = "heldout",
    batch_size: int = 64,
    progress: bool = False,
) -> list[dict]:
    """``num_prompts`` prompts of ``domain`` (seeded), ``group_size`` sampled answers each, verified.

    Returns rollout rows (docs/definitions.md section 7) in order (prompt-major); ``group_id`` is
    ``"<domain>-<prompt index:04d>"`` and ``answer_id`` ``"<group_id>-<answer index>"``.
    The same arguments give the same rows.
    """
    dom = get_domain(domain)
    if num_prompts < 1 or group_size < 1:
        raise GmtsError("--num-prompts and --group-size must be >= 1")
    problems = generate_problems(domain, num_prompts, seed, difficulty=difficulty, split=split)
    prompts, seeds, keys = [], [], []
    for i, p in enumerate(problems):
        for j in range(group_size):
            prompts.append(p.prompt)
            seeds.append(answer_seed(seed, domain, i, j))
            keys.append((i, j))
    responses = generate_responses(
        model, tokenizer, prompts, seeds, temperature, max_new_tokens, batch_size, progress
    )
    eos = tokenizer.eos_token_id
    prompt_ids = {p.prompt: tokenizer(p.prompt, add_special_tokens=True)["input_ids"] for p in problems}
    rows = []
    for (i, j), resp_ids in zip(keys, responses):
        p = problems[i]
        text = tokenizer.decode(resp_ids, skip_special_tokens=True)
        gid = f"{domain}-{i:04d}"
        rows.append(
            {
                "prompt": p.prompt,
                "prompt_ids": list(prompt_ids[p.prompt]),
                "response": text,
                "response_ids": list(resp_ids),
                "reward": float(dom.verify(p.prompt, text)),
                "group_id": gid,
                "answer_id": f"{gid}-{j}",
                "domain": domain,
                "difficulty": p.difficulty,
                "truncated": bool(not resp_ids or resp_ids[-1] != eos),
            }
        )
    return rows


def write_rollouts(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Write rollout rows as JSONL (one object per line, keys in insertion order), atomically."""
    atomic_write_jsonl(path, rows)
