"""Read and validate rollouts (SPEC section 7): gmts JSONL/parquet, verl dumps, TRL completions.

Every reader returns a list of :class:`Answer` with token ids resolved. Bad input raises
:class:`GmtsError` naming the file and line (JSONL line number, or parquet row + 1)
and the field at fault.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from gmts_analysis.errors import GmtsError

FORMATS = ("auto", "gmts", "verl", "trl")
# TRL completions columns that are not reward functions
_TRL_NON_REWARD = {"step", "prompt", "completion", "advantage", "reward", "prompt_ids", "completion_ids", "images"}


@dataclass
class Answer:
    """One sampled answer with its prompt, as token ids."""

    answer_id: Any
    group_id: Any
    prompt_ids: list[int]
    response_ids: list[int]
    reward: float
    prompt: str | None = None
    response: str | None = None
    step: Any = None
    domain: str | None = None
    old_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    extra: dict = field(default_factory=dict)  # other scalar fields, carried to answers.parquet
    where: str = ""  # "file:line N", for error messages

    @property
    def length(self) -> int:
        return len(self.response_ids)


# ---------------------------------------------------------------- raw rows

def _read_rows(path: Path) -> list[tuple[int, dict]]:
    """``(line_number, row)`` pairs from JSONL (or a JSON list) or parquet."""
    if not path.exists():
        raise GmtsError(f"{path}: rollouts file not found")
    if path.is_dir():
        raise GmtsError(f"{path}: is a directory, expected a .jsonl or .parquet rollouts file")
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            df = pd.read_parquet(path)
        except Exception as e:
            raise GmtsError(f"{path}: cannot read parquet ({type(e).__name__})") from None
        rows = []
        for i, rec in enumerate(df.to_dict(orient="records")):
            rows.append((i + 1, {k: _py(v) for k, v in rec.items()}))
        return rows
    rows = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if text.lstrip().startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise GmtsError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
        if not isinstance(data, list):
            raise GmtsError(f"{path}: expected JSON lines or a JSON list of objects")
        for i, r in enumerate(data):
            if not isinstance(r, dict):
                raise GmtsError(f"{path}: item {i + 1}: expected a JSON object, got {type(r).__name__}")
        return [(i + 1, r) for i, r in enumerate(data)]
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise GmtsError(f"{path}: line {n}: invalid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise GmtsError(f"{path}: line {n}: expected a JSON object, got {type(rec).__name__}")
        rows.append((n, rec))
    return rows


def _py(v: Any) -> Any:
    """numpy/pandas scalars and arrays -> plain Python."""
    if v is None:
        return None
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        return v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def detect_format(rows: Sequence[tuple[int, dict]]) -> str:
    """``verl`` for ``input``/``output``/``score``, ``trl`` for ``completion``, else ``gmts``."""
    keys = set(rows[0][1]) if rows else set()
    if {"input", "output"} <= keys and ("score" in keys or "reward" in keys) and "response" not in keys:
        return "verl"
    if "completion" in keys and "response" not in keys and "response_ids" not in keys:
        return "trl"
    return "gmts"


def _to_text(v: Any) -> str:
    """TRL may log conversational prompts as lists of messages: join their contents."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        return "".join(m.get("content", "") if isinstance(m, dict) else str(m) for m in v)
    if isinstance(v, dict):
        return str(v.get("content", ""))
    return str(v)


def _normalize(rows: list[tuple[int, dict]], fmt: str) -> list[tuple[int, dict]]:
    """Map verl / TRL rows onto the gmts field names."""
    if fmt == "gmts":
        return rows
    out = []
    for n, r in rows:
        if fmt == "verl":
            m = {"prompt": r.get("input"), "response": r.get("output"), "reward": r.get("score", r.get("reward"))}
            if "step" in r:
                m["step"] = r["step"]
            for k, v in r.items():
                if k not in ("input", "output", "score", "reward", "step"):
                    m.setdefault(k, v)
        else:  # trl
            m = {"prompt": _to_text(r.get("prompt")), "response": _to_text(r.get("completion"))}
            if "step" in r:
                m["step"] = r["step"]
            if r.get("reward") is not None:
                m["reward"] = r["reward"]
            else:
                parts = [(k, v) for k, v in r.items() if k not in _TRL_NON_REWARD and isinstance(v, (int, float))
                         and not isinstance(v, bool)]
                if parts:
                    # TRL's default reward_weights are all 1: the reward is the sum of the functions
                    m["reward"] = None if any(v is None for _, v in parts) else float(sum(v for _, v in parts))
                    for k, v in parts:
                        m[f"reward_{k}"] = v
            if r.get("advantage") is not None:
                m["advantage_logged"] = r["advantage"]
        out.append((n, m))
    return out


# ---------------------------------------------------------------- validation

def _ids(v: Any, where: str, name: str) -> list[int]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise GmtsError(f"{where}: field '{name}' must be a list of integers")
    return list(v)


def _resolve_ids(r: dict, field: str, tokenizer: Any, where: str, add_special_tokens: bool) -> list[int]:
    """``<field>_ids`` as given, else the text ``<field>`` tokenized (prompts with the special
    tokens, responses without: SPEC section 7)."""
    if r.get(f"{field}_ids") is not None:
        return _ids(r[f"{field}_ids"], where, f"{field}_ids")
    text = r.get(field)
    if not isinstance(text, str):
        raise GmtsError(f"{where}: missing field '{field}' (or '{field}_ids')")
    if tokenizer is None:
        raise GmtsError(f"{where}: text '{field}' needs a tokenizer, and the model ships none (give {field}_ids)")
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def _floats(v: Any, where: str, name: str, n: int) -> list[float]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, (int, float)) for x in v):
        raise GmtsError(f"{where}: field '{name}' must be a list of numbers")
    if len(v) != n:
        raise GmtsError(f"{where}: field '{name}' has {len(v)} values for {n} response tokens")
    if not all(math.isfinite(x) for x in v):
        raise GmtsError(f"{where}: field '{name}' has a non-finite value")
    return [float(x) for x in v]


_KNOWN = {"prompt", "prompt_ids", "response", "response_ids", "reward", "group_id", "answer_id", "step",
          "old_logprobs", "ref_logprobs", "domain"}


def read_rollouts(
    path: str | Path,
    tokenizer: Any = None,
    fmt: str = "auto",
    verifier: Callable[[list[str], list[str]], list[float]] | None = None,
) -> list[Answer]:
    """Read a rollouts file into answers with token ids.

    Text prompts are tokenized with the tokenizer's special tokens, text responses without
    them, and concatenated (SPEC section 7). Ids are used as given. ``verifier`` (a TRL-shaped
    reward function ``(prompts, completions, **kwargs) -> list[float]``) scores answers whose
    ``reward`` is missing. Groups default to answers with the same prompt (and step).
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise GmtsError(f"--format: unknown format '{fmt}' (choose from {', '.join(FORMATS)})")
    rows = _read_rows(path)
    if not rows:
        raise GmtsError(f"{path}: no rollouts in the file (empty input)")
    if fmt == "auto":
        fmt = detect_format(rows)
    rows = _normalize(rows, fmt)
    unit = "row" if path.suffix == ".parquet" else "line"
    return _answers_from_rows(rows, tokenizer, verifier, f"{path}: {unit}", str(path))


def read_rollouts_rows(
    rows: Sequence[dict],
    tokenizer: Any = None,
    verifier: Callable[[list[str], list[str]], list[float]] | None = None,
    where: str = "rollouts",
) -> list[Answer]:
    """Like :func:`read_rollouts` for rows already in memory (gmts fields); ``where`` names them in errors."""
    if not rows:
        raise GmtsError(f"{where}: no rollouts (empty input)")
    return _answers_from_rows([(i + 1, r) for i, r in enumerate(rows)], tokenizer, verifier, f"{where}: row", where)


def _answers_from_rows(
    rows: list[tuple[int, dict]],
    tokenizer: Any,
    verifier: Callable | None,
    unit: str,
    source: str,
) -> list[Answer]:
    answers: list[Answer] = []
    need_verify: list[int] = []
    for idx, (n, r) in enumerate(rows):
        where = f"{unit} {n}"
        prompt, response = r.get("prompt"), r.get("response")
        prompt_ids = _resolve_ids(r, "prompt", tokenizer, where, add_special_tokens=True)
        response_ids = _resolve_ids(r, "response", tokenizer, where, add_special_tokens=False)
        if not prompt_ids:
            raise GmtsError(f"{where}: empty prompt (a response needs at least one preceding token)")
        reward = r.get("reward")
        if reward is None:
            if verifier is None:
                raise GmtsError(f"{where}: missing field 'reward' (or name a verifier with --verifier)")
            need_verify.append(idx)
            reward = float("nan")
        elif isinstance(reward, bool) or not isinstance(reward, (int, float)):
            raise GmtsError(f"{where}: field 'reward' must be a number, got {reward!r}")
        elif not math.isfinite(reward):
            raise GmtsError(f"{where}: field 'reward' is {reward} (must be finite)")
        old = r.get("old_logprobs")
        ref = r.get("ref_logprobs")
        ans = Answer(
            answer_id=r["answer_id"] if r.get("answer_id") is not None else idx,
            group_id=r.get("group_id"),
            prompt_ids=prompt_ids,
            response_ids=response_ids,
            reward=float(reward),
            prompt=prompt if isinstance(prompt, str) else None,
            response=response if isinstance(response, str) else None,
            step=r.get("step"),
            domain=r.get("domain"),
            old_logprobs=None if old is None else _floats(old, where, "old_logprobs", len(response_ids)),
            ref_logprobs=None if ref is None else _floats(ref, where, "ref_logprobs", len(response_ids)),
            extra={k: v for k, v in r.items() if k not in _KNOWN and isinstance(v, (int, float, str, bool))},
            where=where,
        )
        answers.append(ans)

    if need_verify:
        sel = [answers[i] for i in need_verify]
        prompts = [a.prompt if a.prompt is not None else _decode(tokenizer, a.prompt_ids) for a in sel]
        comps = [a.response if a.response is not None else _decode(tokenizer, a.response_ids) for a in sel]
        kwargs = {"domain": [a.domain for a in sel]}
        scores = verifier(prompts, comps, **kwargs)
        for a, s in zip(sel, scores):
            a.reward = float(s)

    _fill_groups(answers)
    ids = [str(a.answer_id) for a in answers]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise GmtsError(f"{source}: field 'answer_id' is not unique ('{dup}' appears more than once)")
    return answers


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if tokenizer is None:
        return ""
    return tokenizer.decode(ids, skip_special_tokens=True)


def _fill_groups(answers: list[Answer]) -> None:
    """Answers without ``group_id`` are grouped by (step, prompt ids)."""
    keys: dict[tuple, int] = {}
    for a in answers:
        if a.group_id is None:
            key = (str(a.step), tuple(a.prompt_ids))
            a.group_id = keys.setdefault(key, len(keys))


def validate_against_model(answers: Sequence[Answer], vocab_size: int, max_len: int | None, truncate: bool) -> int:
    """Check token ids are in ``[0, vocab_size)`` and sequences fit the context.

    With ``truncate`` an answer too long for the context keeps its first tokens (the
    response is cut). Returns the number of truncated answers.
    """
    cut = 0
    for a in answers:
        for name, ids in (("prompt_ids", a.prompt_ids), ("response_ids", a.response_ids)):
            bad = next((t for t in ids if t < 0 or t >= vocab_size), None)
            if bad is not None:
                raise GmtsError(
                    f"{a.where}: answer '{a.answer_id}': token id {bad} in {name} is outside the vocabulary "
                    f"(size {vocab_size})"
                )
        total = len(a.prompt_ids) + len(a.response_ids)
        if max_len is not None and total > max_len:
            if not truncate or len(a.prompt_ids) >= max_len:
                raise GmtsError(
                    f"{a.where}: answer '{a.answer_id}' has {total} tokens, longer than the model's context "
                    f"({max_len}); pass --truncate to cut responses to fit"
                )
            keep = max_len - len(a.prompt_ids)
            a.response_ids = a.response_ids[:keep]
            if a.old_logprobs is not None:
                a.old_logprobs = a.old_logprobs[:keep]
            if a.ref_logprobs is not None:
                a.ref_logprobs = a.ref_logprobs[:keep]
            a.extra["truncated"] = True
            cut += 1
    return cut
