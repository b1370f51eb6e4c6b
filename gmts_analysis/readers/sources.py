"""Which rollout files to read, and their rows streamed one at a time.

A rollouts path is a file or a directory of per-step files (TRL:
``completions/completions_00010.parquet``; verl: ``rollout_data_dir/10.jsonl``; ours: any
``*.jsonl`` / ``*.parquet``). The step of a file is the last integer of its name, used for
rows that carry no ``step``. Parquet is told by its magic bytes (``PAR1``), whatever the
name; anything else is read as UTF-8 JSON lines (or one JSON list of objects), line by line.

Every problem is a one-line :class:`GmtsError` naming the file, the line (JSONL line, or
parquet row + 1) and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import file_sha256

PARQUET_MAGIC = b"PAR1"
_STEP_IN_NAME = re.compile(r"(\d+)(?!.*\d)")
ROLLOUT_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class RolloutFile:
    """One input file: its path, kind (``parquet`` or ``jsonl``) and the step its name gives."""

    path: Path
    kind: str
    name_step: int | None = None
    columns: list[str] = field(default_factory=list)  # parquet: from the schema; jsonl: first row's keys
    numeric_columns: set[str] = field(default_factory=set)

    @property
    def unit(self) -> str:
        return "row" if self.kind == "parquet" else "line"


# ---------------------------------------------------------------- files and steps

def parse_steps(spec: Any) -> set[int] | None:
    """``--steps``: ``"10,20"``, ranges ``"10-30"`` (inclusive), or a list of ints; None = all."""
    if spec is None or spec == "":
        return None
    if isinstance(spec, int) and not isinstance(spec, bool):
        return {spec}
    if isinstance(spec, (list, tuple, set)):
        items = [str(s) for s in spec]
    else:
        items = str(spec).split(",")
    out: set[int] = set()
    for item in items:
        item = item.strip()
        m = re.fullmatch(r"(\d+)\s*(?:-|\.\.|:)\s*(\d+)", item)
        try:
            if m:
                a, b = int(m.group(1)), int(m.group(2))
                if b < a:
                    raise ValueError
                if b - a > 10_000_000:
                    raise GmtsError(f"--steps: range '{item}' is too wide")
                out.update(range(a, b + 1))
            else:
                out.add(int(item))
        except ValueError:
            raise GmtsError(f"--steps: expected step numbers or ranges like '10,20' or '10-30', got '{item}'") \
                from None
    return out


def sniff_kind(path: Path) -> str:
    """``parquet`` when the file starts with the parquet magic bytes, else ``jsonl``."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise GmtsError(f"{path}: cannot read rollouts file ({e.strerror or type(e).__name__})") from None
    return "parquet" if head == PARQUET_MAGIC else "jsonl"


def name_step(path: Path) -> int | None:
    """The last integer in the file's name without suffix (``completions_00010`` -> 10)."""
    m = _STEP_IN_NAME.search(path.name.split(".")[0])
    return int(m.group(1)) if m else None


#: files a TRL ``output_dir`` holds at its top, never rollouts: the final model's after ``save_model()``, and what
#: the example script records (its arguments, its training and held-out problems)
_NOT_ROLLOUTS = re.compile(r"^(config|generation_config|tokenizer|tokenizer_config|special_tokens_map|"
                          r"added_tokens|trainer_state|adapter_config|chat_template|vocab|preprocessor_config|"
                          r"model\.safetensors\.index|all_results|train_results|eval_results)\.json$|^gmts_|"
                           r"^problems_(train|heldout)\.jsonl$")


def _is_trl_output_dir(path: Path) -> bool:
    """A TRL ``output_dir``: its top holds no rollout file but the final model's files (or none), beside
    ``checkpoint-N`` folders, a ``completions/`` folder or a ``rollouts/`` folder of the drop-in."""
    tops = [p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")
            and p.suffix.lower() in ROLLOUT_SUFFIXES]
    return all(_NOT_ROLLOUTS.match(p.name) for p in tops)


def trl_completions_dir(path: Path) -> Path:
    """``path``, or the rollouts of a TRL ``output_dir``: its ``rollouts/`` folder when the drop-in wrote the exact
    ids there (``rollouts_rank{R}_{N}.jsonl``), else its ``completions/`` (``GRPOTrainer(log_completions=True)``).
    The final model's files that ``save_model()`` leaves at its top (config.json, ...) are not rollouts."""
    if not path.is_dir() or not _is_trl_output_dir(path):
        return path
    ours = path / "rollouts"
    if ours.is_dir() and any(re.fullmatch(r"rollouts_rank\d+_\d+\.jsonl", p.name) for p in ours.iterdir()):
        return ours
    sub = path / "completions"
    return sub if sub.is_dir() else path


def rollout_files(path: str | Path, steps: Any = None) -> list[RolloutFile]:
    """The files to read, in step order; a directory holds one file per training step (a TRL
    ``output_dir`` is read from its ``completions/``)."""
    path = trl_completions_dir(Path(path))
    if not path.exists():
        raise GmtsError(f"{path}: rollouts file not found")
    if path.is_file():
        # a single file gives its step only under the names TRL and verl write
        known = re.fullmatch(r"(completions_\d+\.parquet|\d+\.jsonl)", path.name)
        return [RolloutFile(path, sniff_kind(path), name_step(path) if known else None)]
    if not path.is_dir():
        raise GmtsError(f"{path}: not a file or directory")
    wanted = parse_steps(steps)
    found = []
    for p in sorted(path.iterdir()):
        if p.name.startswith(".") or not p.is_file():
            continue
        if p.suffix.lower() in ROLLOUT_SUFFIXES:
            found.append(p)
    if not found:
        raise GmtsError(f"{path}: no rollout files in the directory (expected *.jsonl or *.parquet, one per step)")
    files = [RolloutFile(p, sniff_kind(p), name_step(p)) for p in found]
    if any(f.name_step is None for f in files) and len(files) > 1:
        bad = next(f.path.name for f in files if f.name_step is None)
        raise GmtsError(f"{path}: file '{bad}' has no step number in its name (a directory holds one file per "
                        "step, e.g. completions_00010.parquet or 10.jsonl)")
    files.sort(key=lambda f: (f.name_step if f.name_step is not None else -1, f.path.name))
    if wanted is not None:
        files = [f for f in files if f.name_step in wanted]
        if not files:
            raise GmtsError(f"{path}: --steps selects none of the files (steps present: "
                            f"{_short([f.name_step for f in rollout_files(path)])})")
    return files


def _short(values: list) -> str:
    s = ", ".join(str(v) for v in values[:12])
    return s + (f", ... ({len(values)} in all)" if len(values) > 12 else "")


def input_sha256(path: str | Path) -> str:
    """sha256 of a rollouts file, or of a directory's rollout files (names and contents)."""
    path = trl_completions_dir(Path(path))
    if path.is_file():
        return file_sha256(path)
    h = hashlib.sha256()
    for p in sorted(path.iterdir()):
        if p.is_file() and not p.name.startswith(".") and p.suffix.lower() in ROLLOUT_SUFFIXES:
            h.update(p.name.encode() + b"\0")
            with open(p, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            h.update(b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------- rows

def iter_rows(rf: RolloutFile) -> Iterator[tuple[int, dict]]:
    """``(line, row)`` pairs of one file, streamed (parquet by record batches, JSONL by line)."""
    if rf.kind == "parquet":
        yield from _parquet_rows(rf)
    else:
        yield from _jsonl_rows(rf)


def _parquet_rows(rf: RolloutFile) -> Iterator[tuple[int, dict]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(rf.path)
        schema = pf.schema_arrow
    except Exception as e:
        raise GmtsError(f"{rf.path}: cannot read parquet ({type(e).__name__}: {_first_line(e)})") from None
    rf.columns = [c for c in schema.names if not c.startswith("__index_level_")]
    rf.numeric_columns = {f.name for f in schema if (pa.types.is_integer(f.type) or pa.types.is_floating(f.type))}
    n = 0
    try:
        batches = pf.iter_batches(batch_size=256, columns=rf.columns)
        for batch in batches:
            for rec in batch.to_pylist():
                n += 1
                yield n, rec
    except GmtsError:
        raise
    except Exception as e:
        raise GmtsError(f"{rf.path}: row {n + 1}: cannot read parquet ({type(e).__name__}: {_first_line(e)})") \
            from None


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else "")[:200]


def _decode_line(raw: bytes, path: Path, n: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise GmtsError(f"{path}: line {n}: not valid UTF-8 (byte {e.start + 1} of the line); rollouts must be "
                        "UTF-8 text or parquet") from None


def _loads(text: str, path: Path, n: int) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise GmtsError(f"{path}: line {n}: invalid JSON (nested too deeply)") from None
    except json.JSONDecodeError as e:
        raise GmtsError(f"{path}: line {n}: invalid JSON ({e.msg}, column {e.colno})") from None
    except ValueError as e:  # e.g. an integer literal with more digits than Python converts
        msg = _first_line(e)
        if "integer string conversion" in msg:
            msg = "an integer literal with more digits than any id, reward or step can have"
        raise GmtsError(f"{path}: line {n}: invalid JSON ({msg})") from None


def _jsonl_rows(rf: RolloutFile) -> Iterator[tuple[int, dict]]:
    path = rf.path
    try:
        f = open(path, "rb")
    except OSError as e:
        raise GmtsError(f"{path}: cannot read rollouts file ({e.strerror or type(e).__name__})") from None
    with f:
        head = f.read(4)
        if head[:2] in (b"\xff\xfe", b"\xfe\xff") or (len(head) >= 2 and (head[0] == 0) != (head[1] == 0)):
            raise GmtsError(f"{path}: line 1: UTF-16 text; rollouts must be UTF-8 (or parquet)")
        f.seek(3 if head[:3] == b"\xef\xbb\xbf" else 0)
        first = _peek_nonspace(f)
        if first == b"[":  # one JSON list of objects (a small-file convenience: read whole)
            text = _decode_line(f.read(), path, 1)
            data = _loads(text, path, 1)
            if not isinstance(data, list):
                raise GmtsError(f"{path}: expected JSON lines or a JSON list of objects")
            for i, r in enumerate(data):
                if not isinstance(r, dict):
                    raise GmtsError(f"{path}: item {i + 1}: expected a JSON object, got {type(r).__name__}")
                yield i + 1, r
            return
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            rec = _loads(_decode_line(raw, path, n), path, n)
            if not isinstance(rec, dict):
                raise GmtsError(f"{path}: line {n}: expected a JSON object, got {type(rec).__name__}")
            if not rf.columns:
                rf.columns = list(rec)
                rf.numeric_columns = {k for k, v in rec.items() if _is_number(v) or v is None}
            yield n, rec


def _peek_nonspace(f: Any) -> bytes:
    """The first non-blank byte ahead, without consuming anything."""
    pos = f.tell()
    c = f.read(1)
    while c and c.isspace():
        c = f.read(1)
    f.seek(pos)
    return c


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# ---------------------------------------------------------------- values

MAX_ABS_REWARD = 1e15  # no verifiable reward is larger; beyond it float32 columns and variances lose meaning
MIN_LOGPROB = -1000.0  # exp(-1000) is 0 in float64: no sampler can have drawn such a token


def check_text(v: Any, where: str, name: str) -> str:
    """A string that is valid Unicode (no lone surrogates) or an error naming the field."""
    if not isinstance(v, str):
        raise GmtsError(f"{where}: field '{name}' must be text, got {type(v).__name__}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GmtsError(f"{where}: field '{name}' holds a lone surrogate (\\u{ord(v[e.start]):04x} at character "
                        f"{e.start + 1}), not valid Unicode") from None
    return v


def check_messages(v: Any, where: str, name: str) -> list[dict]:
    """A chat: a list of ``{role, content}`` dicts with text content (None-valued keys dropped)."""
    if not isinstance(v, list) or not v:
        raise GmtsError(f"{where}: field '{name}' must be text or a non-empty list of chat messages")
    out = []
    for i, m in enumerate(v):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or "content" not in m:
            raise GmtsError(f"{where}: field '{name}': message {i + 1} must be an object with 'role' and 'content'")
        m = {k: x for k, x in m.items() if x is not None}
        if not isinstance(m.get("content"), str):
            raise GmtsError(f"{where}: field '{name}': message {i + 1} has non-text content "
                            "(multimodal messages are not supported)")
        check_text(m["role"], where, f"{name}[{i}].role")
        check_text(m["content"], where, f"{name}[{i}].content")
        out.append(m)
    return out


def check_reward(v: Any, where: str, name: str = "reward") -> float:
    """A finite number within ``MAX_ABS_REWARD``."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise GmtsError(f"{where}: field '{name}' must be a number, got {_repr(v)}")
    try:
        x = float(v)
    except OverflowError:
        raise GmtsError(f"{where}: field '{name}' is too large ({len(str(v))} digits)") from None
    if not math.isfinite(x):
        raise GmtsError(f"{where}: field '{name}' is {x} (must be finite)")
    if abs(x) > MAX_ABS_REWARD:
        raise GmtsError(f"{where}: field '{name}' is {x:g}, outside [-{MAX_ABS_REWARD:g}, {MAX_ABS_REWARD:g}]")
    return x


def check_logprobs(v: Any, where: str, name: str, n: int, allow_nan: bool = False) -> list[float]:
    """``n`` finite log-probabilities in ``[MIN_LOGPROB, 0]``. ``allow_nan``: a missing value
    (None or NaN: a token vLLM could not score, which TRL's correction leaves at ratio 1) is NaN."""
    if not isinstance(v, (list, tuple)):
        raise GmtsError(f"{where}: field '{name}' must be a list of numbers")
    if len(v) != n:
        raise GmtsError(f"{where}: field '{name}' has {len(v)} values for {n} response tokens")
    out = []
    for i, x in enumerate(v):
        if allow_nan and (x is None or (isinstance(x, float) and math.isnan(x))):
            out.append(math.nan)
            continue
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise GmtsError(f"{where}: field '{name}' must be a list of numbers (item {i + 1} is {_repr(x)})")
        try:
            y = float(x)
        except OverflowError:
            raise GmtsError(f"{where}: field '{name}' item {i + 1} is too large") from None
        if not math.isfinite(y):
            raise GmtsError(f"{where}: field '{name}' has a non-finite value ({y} at item {i + 1})")
        if y > 0:
            raise GmtsError(f"{where}: field '{name}' item {i + 1} is {y:g} > 0 (a log-probability is at most 0)")
        if y < MIN_LOGPROB:
            raise GmtsError(f"{where}: field '{name}' item {i + 1} is {y:g}, below {MIN_LOGPROB:g} "
                            "(a probability no sampler can draw)")
        out.append(y)
    return out


def check_ids(v: Any, where: str, name: str) -> list[int]:
    if not isinstance(v, (list, tuple)) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise GmtsError(f"{where}: field '{name}' must be a list of integers")
    return list(v)


def check_step(v: Any, where: str) -> int | str | None:
    """A step is an integer (an integral float from a parquet column with nulls is accepted) or text."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise GmtsError(f"{where}: field 'step' must be an integer or text, got a boolean")
    if isinstance(v, int):
        if abs(v) > 2 ** 63:
            raise GmtsError(f"{where}: field 'step' is too large")
        return v
    if isinstance(v, float):
        if math.isfinite(v) and v.is_integer():
            return int(v)
        raise GmtsError(f"{where}: field 'step' must be an integer, got {v}")
    if isinstance(v, str):
        return check_text(v, where, "step")
    raise GmtsError(f"{where}: field 'step' must be an integer or text, got {type(v).__name__}")


def _repr(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 60 else s[:57] + "..."

