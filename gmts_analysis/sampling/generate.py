"""Sample answer groups from any checkpoint on a prompts file, score them, write rollouts with ids.

The way to audit a checkpoint when no training log exists: ``gmts sample --model CKPT --prompts
FILE --verifier math --out rollouts.jsonl`` then ``gmts probe --rollouts rollouts.jsonl``.

Prompts file: JSONL or parquet, one prompt per row, a ``prompt`` column (text, or a list of
``{"role", "content"}`` messages) and any other columns the verifier reads (``solution``,
``answer``, ...), passed to it as TRL passes dataset columns.

Prompt ids (what the policy is conditioned on): a message list goes through the tokenizer's chat
template with the generation prompt (``apply_chat_template(..., add_generation_prompt=True)``, as
TRL does); text is tokenized with the tokenizer's special tokens. ``chat_template="on"`` wraps a text
prompt as one user message; ``"off"`` refuses message prompts. Answers stop at the first stop token
(the tokenizer's EOS and every ``eos_token_id`` of the generation config), which is kept.

Sampling is exact (Gumbel-max: ``argmax(z / tau + g)``) with noise from one generator per answer,
seeded by (``seed``, prompt index, answer index): an answer does not depend on its batch, and the
same arguments give the same file. Temperature 0 decodes greedily.

Rows (docs/definitions.md section 7): ``prompt``, ``prompt_ids``, ``response`` (text; for a message
prompt the assistant message, as TRL logs it), ``response_ids``, ``reward``, ``group_id``,
``answer_id``, ``truncated``, the prompt file's other columns, and with a verifier the reward audit's
fields (:mod:`gmts_analysis.readers.audit`: ``verifier``, ``boxed``, ``fallback``, ``copies_example``,
``final_answer``). An answer the verifier skipped
(``None``) gets ``reward`` 0.0 and ``unscorable: true`` (TRL leaves it out of its group's baseline).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gmts_analysis.core.seeding import derive_seed
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.audit import audit_fields
from gmts_analysis.readers.verifiers import score, verifier_name
from gmts_analysis.util.io import jsonl_objects, read_parquet

log = logging.getLogger(__name__)
CHAT_TEMPLATE_MODES = ("auto", "on", "off")


def row_seed(seed: int, *key: object) -> int:
    """A 63-bit seed of one answer's sampling noise (:func:`gmts_analysis.core.seeding.derive_seed`)."""
    return derive_seed(seed, "sample-prompts", *key)


def _is_messages(p: Any) -> bool:
    return isinstance(p, (list, tuple)) and len(p) > 0 and all(isinstance(m, dict) and "role" in m for m in p)


def read_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    """Rows of a prompts file (JSONL or parquet) that has a ``prompt`` column; ``limit`` keeps the first ones."""
    path = Path(path)
    if not path.is_file():
        raise GmtsError(f"--prompts {path}: no such file")
    rows: list[dict] = []
    if path.suffix.lower() == ".parquet":
        df = read_parquet(path)
        rows = [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()}
                for r in df.to_dict(orient="records")]
    elif path.suffix.lower() in (".jsonl", ".json"):
        rows = [r for _, r in jsonl_objects(path)]
    else:
        raise GmtsError(f"--prompts {path}: expected a .jsonl or .parquet file")
    for n, r in enumerate(rows, 1):
        p = r.get("prompt")
        if not (isinstance(p, str) and p) and not _is_messages(p):
            raise GmtsError(f"{path}: row {n}: field 'prompt' must be text or a list of {{role, content}} messages")
    if not rows:
        raise GmtsError(f"{path}: no prompts")
    return rows[:limit] if limit else rows


def prompt_ids(tokenizer: Any, prompt: Any, chat_template: str = "auto", where: str = "prompt") -> list[int]:
    """The ids the policy is conditioned on for ``prompt`` (see the module docstring)."""
    if chat_template not in CHAT_TEMPLATE_MODES:
        raise GmtsError(f"--chat-template: expected one of {', '.join(CHAT_TEMPLATE_MODES)}, got '{chat_template}'")
    msgs = prompt if _is_messages(prompt) else None
    if msgs is None and chat_template == "on":
        msgs = [{"role": "user", "content": prompt}]
    if msgs is not None and chat_template == "off":
        raise GmtsError(f"{where}: a message-list prompt needs a chat template (--chat-template off was given)")
    if msgs is None:
        return list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise GmtsError(f"{where}: the tokenizer has no chat template for a message-list prompt")
    ids = tokenizer.apply_chat_template(list(msgs), add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every stop token: the tokenizer's EOS and the generation config's ``eos_token_id`` (int or list)."""
    out: list[int] = []
    for v in (getattr(tokenizer, "eos_token_id", None),
              getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            if x is not None and int(x) not in out:
                out.append(int(x))
    if not out:
        raise GmtsError("the tokenizer and generation config define no EOS token: answers could not stop")
    return out


class _RowGumbel:
    """Logits processor: ``z / tau + g``, ``g`` drawn per step from each row's own generator."""

    def __init__(self, generators: list[torch.Generator] | None, temperature: float):
        self.gens, self.tau = generators, temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()
        if self.gens is None:
            return scores
        V = scores.shape[-1]
        u = torch.stack([torch.rand(V, generator=g, dtype=torch.float64) for g in self.gens])
        g = -torch.log(-torch.log(u.clamp(1e-12, 1.0 - 1e-12)))
        return scores / self.tau + g.to(device=scores.device, dtype=scores.dtype)


def _cache_kwarg() -> str:
    """``generate``'s name for a given KV cache: ``cache`` in recent transformers, ``past_key_values`` before."""
    try:
        from transformers.generation.utils import ALL_CACHE_NAMES
    except ImportError:
        return "past_key_values"
    return "cache" if "cache" in ALL_CACHE_NAMES else "past_key_values"


@torch.no_grad()
def shared_prompt_cache(model: torch.nn.Module, chunk: Sequence[Sequence[int]], ids: torch.Tensor,
                        mask: torch.Tensor) -> Any:
    """The KV cache of ``ids[:, :-1]`` (left-padded prompts ``(B, W)``, ``mask`` their attention mask),
    computed once per distinct prompt and gathered to every row; ``None`` when no prompt repeats or the
    model's cache cannot be gathered (``generate`` then runs the whole prompt of every row).

    Positions are those ``generate`` gives left-padded rows (cumulative sum of the mask, minus one), so
    the cached keys and values are the ones ``generate`` would compute itself.
    """
    keys = [tuple(p) for p in chunk]
    first: dict[tuple, int] = {}
    for i, k in enumerate(keys):
        first.setdefault(k, i)
    if len(first) == len(keys) or ids.shape[1] < 2:
        return None
    uniq = list(first.values())
    u_ids, u_mask = ids[uniq, :-1], mask[uniq, :-1]
    pos = (u_mask.long().cumsum(-1) - 1).masked_fill(u_mask == 0, 1)
    out = model(input_ids=u_ids, attention_mask=u_mask, position_ids=pos, use_cache=True)
    cache = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
    if cache is None or not hasattr(cache, "reorder_cache"):
        return None
    slot = {k: j for j, k in enumerate(first)}
    cache.reorder_cache(torch.tensor([slot[k] for k in keys], device=ids.device))
    return cache


@torch.no_grad()
def generate_from_ids(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    seeds: Sequence[int],
    stops: Sequence[int],
    pad_id: int,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    progress: bool = False,
    share_prompts: bool = True,
) -> list[list[int]]:
    """One sampled response per prompt id list, cut after the first stop token (kept); left-padded batches.

    With ``share_prompts``, a prompt repeated inside a batch (the answers of one group) is run through the
    model once: its KV cache is computed per distinct prompt and copied to each of its rows
    (:func:`shared_prompt_cache`) before ``generate`` decodes every row with the KV cache.
    """
    from transformers import LogitsProcessorList

    if temperature < 0 or not math.isfinite(temperature):
        raise GmtsError(f"--temperature must be a finite number >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise GmtsError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
    device = next(model.parameters()).device
    starts = range(0, len(prompts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="sampling", unit="batch", leave=False)
    out: list[list[int]] = []
    for s in starts:
        chunk = [list(p) for p in prompts[s:s + batch_size]]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        gens = None
        if temperature > 0:
            gens = [torch.Generator().manual_seed(int(x)) for x in seeds[s:s + batch_size]]
        cache = shared_prompt_cache(model, chunk, ids, mask) if share_prompts else None
        gen = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
            logits_processor=LogitsProcessorList([_RowGumbel(gens, temperature)]), eos_token_id=list(stops),
            pad_token_id=pad_id, temperature=None, top_p=None, top_k=None,
            **({_cache_kwarg(): cache} if cache is not None else {}),
        )
        for row in gen[:, width:].tolist():
            cut = next((i for i, t in enumerate(row) if t in stops), None)
            out.append(row[: cut + 1] if cut is not None else row)
    return out


def sample_prompts(
    model: torch.nn.Module,
    tokenizer: Any,
    rows: Sequence[dict],
    group_size: int,
    *,
    verifier: Any = None,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    seed: int = 0,
    chat_template: str = "auto",
    batch_size: int = 16,
    progress: bool = False,
    where: str = "prompts",
) -> list[dict]:
    """``group_size`` answers to each prompt row, scored by ``verifier`` (a TRL reward function; None:
    no reward column). Returns rollout rows, prompt-major (see the module docstring)."""
    if group_size < 1:
        raise GmtsError("--group-size must be >= 1")
    stops = stop_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    p_ids = [prompt_ids(tokenizer, r["prompt"], chat_template, f"{where}: row {i + 1}") for i, r in enumerate(rows)]
    flat_p, seeds, keys = [], [], []
    for i, ids in enumerate(p_ids):
        for j in range(group_size):
            flat_p.append(ids)
            seeds.append(row_seed(seed, i, j))
            keys.append((i, j))
    resp = generate_from_ids(model, flat_p, seeds, stops, pad, temperature, max_new_tokens, batch_size, progress)
    out = []
    for (i, j), r_ids in zip(keys, resp):
        src = rows[i]
        text = tokenizer.decode(r_ids, skip_special_tokens=True)
        conv = _is_messages(src["prompt"])
        row = {
            "prompt": src["prompt"],
            "prompt_ids": list(p_ids[i]),
            "response": [{"role": "assistant", "content": text}] if conv else text,
            "response_ids": list(r_ids),
            "group_id": f"p{i:05d}",
            "answer_id": f"p{i:05d}-{j}",
            "truncated": bool(not r_ids or r_ids[-1] not in stops),
            "temperature": float(temperature),  # the probe's --temperature must be the same (TRL's log-probs)
        }
        for k, v in src.items():
            if k not in row and k not in ("reward",):
                row[k] = v
        out.append(row)
    if verifier is not None:
        cols = sorted({k for r in rows for k in r if k != "prompt"})
        columns = {k: [r.get(k) for r in out] for k in cols}
        rewards = score(verifier, [r["prompt"] for r in out], [r["response"] for r in out],
                        [r["response_ids"] for r in out], columns)
        audit = audit_fields(verifier_name(verifier), [r["prompt"] for r in out], [r["response"] for r in out])
        for r, x, fields in zip(out, rewards, audit):
            r.update(fields)  # the reward audit's per-answer facts (gmts_analysis.readers.audit)
            if math.isnan(x):
                r["reward"], r["unscorable"] = 0.0, True
            else:
                r["reward"] = x
        n_skip = sum(1 for x in rewards if math.isnan(x))
        if n_skip:
            log.warning("the verifier skipped %d of %d answers (reward 0.0, unscorable: true)", n_skip, len(out))
    return out
