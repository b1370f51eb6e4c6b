"""Read and validate rollouts (docs/definitions.md section 7): ours, verl dumps, TRL completions.

A rollouts path is a JSONL or parquet file, or a directory of per-step files as TRL
(``completions/completions_{step:05d}.parquet``) and verl (``rollout_data_dir/{step}.jsonl``)
write them. Every reader returns :class:`Answer` objects with token ids resolved: ids as
given, or text tokenized the way the policy saw it (chat template, stop token restored:
see :mod:`gmts_analysis.readers.context`); what was restored is reported on stderr and in
``Rollouts.report`` (recorded in manifest.json). Bad input raises :class:`GmtsError` naming
the file and line (JSONL line number, or parquet row + 1) and the field at fault.

The pieces live in :mod:`gmts_analysis.readers` (files and rows, formats, context).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.context import Contextualizer
from gmts_analysis.readers.formats import (
    FORMAT_ENTRIES,
    FORMATS,
    GMTS_FIELDS,
    RewardSpec,
    format_entry,
    format_names,
    normalize_row,
)
from gmts_analysis.readers.formats import (
    detect_format as _detect_keys,
)
from gmts_analysis.readers.sources import (
    RolloutFile,
    check_logprobs,
    check_reward,
    check_step,
    check_text,
    input_sha256,
    iter_rows,
    parse_steps,
    rollout_files,
)
from gmts_analysis.readers.texts import response_text
from gmts_analysis.readers.verifiers import score

__all__ = ["Answer", "FORMATS", "ReaderOptions", "Rollouts", "detect_format", "input_sha256", "read_rollouts",
           "read_rollouts_rows", "validate_against_model"]

log = logging.getLogger("gmts_analysis.readers")


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
    sampling_logprobs: list[float] | None = None  # the rollout engine's (vLLM), for TRL's IS correction
    extra: dict = field(default_factory=dict)  # other scalar fields, carried to answers.parquet
    where: str = ""  # "file: line N", for error messages
    logged_advantage: float | None = None  # the trainer's own advantage (TRL's `advantage` column)

    @property
    def length(self) -> int:
        return len(self.response_ids)


class Rollouts(list):
    """A list of :class:`Answer` with ``report``: how they were read (format, files, reward
    columns, groups, and what the context restoration did; a JSON-able dict)."""

    report: dict

    def __init__(self, answers: Iterable[Answer] = (), report: dict | None = None) -> None:
        super().__init__(answers)
        self.report = report or {}


@dataclass
class ReaderOptions:
    """How to read rollouts; every field is the ``gmts probe`` flag of the same name.

    ``max_tokens`` is the model's context length (text beyond what it can hold is refused
    before tokenization); ``truncate`` lets a too-long response be cut instead.
    """

    format: str = "auto"
    steps: Any = None  # "10,20", "10-30", or a list of ints
    reward_columns: Any = None  # "a,b" or a list
    reward_weights: Any = None  # "1,0.5" or a list
    num_generations: int | None = None
    chat_template: str = "auto"
    max_completion_length: int | None = None
    max_tokens: int | None = None
    truncate: bool = False

    @classmethod
    def from_config(cls, cfg: ReaderFields | None = None, **overrides: Any) -> "ReaderOptions":
        """The reader fields of a job's options (a ``ProbeOptions``, ``ProbeConfig`` or ``RunSettings``; ``None``:
        the defaults), then ``overrides`` (``max_tokens``: the model's context, which the options do not hold)."""
        kw: dict[str, Any] = {} if cfg is None else {
            "format": cfg.format, "steps": cfg.steps, "reward_columns": cfg.reward_columns,
            "reward_weights": cfg.reward_weights, "num_generations": cfg.num_generations,
            "chat_template": cfg.chat_template, "max_completion_length": cfg.max_completion_length,
            "truncate": cfg.truncate}
        kw.update(overrides)
        return cls(**kw)


class ReaderFields(Protocol):
    """The reader fields of :class:`gmts_analysis.options.config.ProbeOptions` (the ``gmts probe`` flags of the
    same names), as a type this layer can name without importing the options (a layer above)."""

    format: str
    steps: str | None
    reward_columns: str | None
    reward_weights: str | None
    num_generations: int | None
    chat_template: str
    max_completion_length: int | None
    truncate: bool


def detect_format(rows: Sequence) -> str:
    """``verl`` for ``input``/``output``, ``trl`` for ``completion``, else ``gmts`` (from the first
    row: a dict, or a ``(line, dict)`` pair)."""
    if not rows:
        return "gmts"
    first = rows[0]
    if isinstance(first, tuple):
        first = first[1]
    return _detect_keys(list(first))


# ---------------------------------------------------------------- public entry points

def read_rollouts(
    path: str | Path,
    tokenizer: Any = None,
    fmt: str = "auto",
    verifier: Callable[..., list] | None = None,
    options: ReaderOptions | None = None,
) -> Rollouts:
    """Read a rollouts file or directory into answers with token ids.

    ``options``: the :class:`ReaderOptions` (a job builds them once from its settings with
    :meth:`ReaderOptions.from_config`; ``None``: the defaults);
    ``fmt`` is used when the options do not name a format. ``verifier`` (a TRL-shaped reward
    function called with ``prompts=``, ``completions=``, ``completion_ids=`` and the rows'
    other columns) scores answers without a reward. Groups: ``group_id`` (verl: ``uid``),
    else consecutive blocks of ``num_generations`` rows, else the same prompt and step.
    """
    opts = _options(options, fmt)
    files = rollout_files(path, opts.steps)
    spec = RewardSpec.from_options(opts.reward_columns, opts.reward_weights)
    state = _ReadState(opts, spec)
    state.verified = verifier is not None
    rows = _file_rows(files, opts, state)
    answers = _build(rows, tokenizer, verifier, opts, state, str(path))
    state.report["files"] = [f.path.name for f in files][:50]
    state.report["n_files"] = len(files)
    return answers


def read_rollouts_rows(
    rows: Sequence[dict],
    tokenizer: Any = None,
    verifier: Callable[..., list] | None = None,
    where: str = "rollouts",
    fmt: str = "gmts",
    options: ReaderOptions | None = None,
) -> Rollouts:
    """Like :func:`read_rollouts` for rows already in memory (dicts, e.g. a DataFrame's records);
    ``fmt`` as ``--format`` (default: gmts field names); ``where`` names them in errors."""
    opts = _options(options, fmt)
    if not rows:
        raise GmtsError(f"{where}: no rollouts (empty input)")
    spec = RewardSpec.from_options(opts.reward_columns, opts.reward_weights)
    state = _ReadState(opts, spec)
    state.verified = verifier is not None
    numbered = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise GmtsError(f"{where}: row {i + 1}: expected a dict of fields, got {type(r).__name__}")
        numbered.append((i + 1, {str(k): _py(v) for k, v in r.items()}))
    keys: list[str] = []
    for _, r in numbered:
        keys.extend(k for k in r if k not in keys)
    rf = RolloutFile(Path(where), "rows", None, keys,
                     {k for k in keys if all(_number_or_none(r.get(k)) for _, r in numbered)})
    it = _one_file(rf, iter(numbered), opts, state, unit=f"{where}: row")
    return _build(it, tokenizer, verifier, opts, state, where)


def _options(options: ReaderOptions | None, fmt: str) -> ReaderOptions:
    opts = ReaderOptions() if options is None else options
    if opts.format in (None, "auto") and fmt not in (None, "auto"):
        opts = dataclasses.replace(opts, format=fmt)
    if opts.format not in format_names():
        raise GmtsError(f"--format: unknown format '{opts.format}' (choose from {', '.join(format_names())})")
    if opts.num_generations is not None:
        g = opts.num_generations
        if isinstance(g, bool) or not isinstance(g, int) or g < 1:
            raise GmtsError(f"--num-generations: must be a positive integer, got {g!r}")
    return opts


def _number_or_none(v: Any) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def _py(v: Any) -> Any:
    """numpy/pandas scalars and arrays -> plain Python; a NaN field (pandas' missing value) -> None."""
    if v is None:
        return None
    if isinstance(v, float) and math.isnan(v):
        return None
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        v = v.tolist()
        if isinstance(v, list):
            return [_py(x) for x in v]
        return v
    if isinstance(v, dict):
        return {k: _py(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_py(x) for x in v]
    return v.item() if hasattr(v, "item") and not isinstance(v, (str, bytes)) else v


# ---------------------------------------------------------------- rows of all files

class _ReadState:
    def __init__(self, opts: ReaderOptions, spec: RewardSpec) -> None:
        self.opts = opts
        self.spec = spec
        self.fmt: str | None = None
        self.file_spec: RewardSpec | None = None  # where the files' rewards come from (the format's entry decides)
        self.step_type: type | None = None
        self.wanted = parse_steps(opts.steps)
        self.group_source = "group_id"
        self.report: dict = {}
        self.last_digest: str | None = None
        self.repeated_files: list[str] = []
        self.verified = False  # a --verifier scores the answers (a TRL table's reward columns are then not read)


def _file_rows(files: list, opts: ReaderOptions, state: _ReadState) -> Iterator[tuple[str, dict]]:
    for rf in files:
        yield from _one_file(rf, iter_rows(rf), opts, state, unit=f"{rf.path}: {rf.unit}")


def _one_file(rf: Any, rows: Iterator[tuple[int, dict]], opts: ReaderOptions, state: _ReadState,
              unit: str) -> Iterator[tuple[str, dict]]:
    """The normalized rows ``(where, row)`` of one rollouts file: its format checked against
    the earlier files', each row's step and group set, rows outside ``--steps`` left out, and a
    TRL file that repeats the previous one skipped."""
    first = next(rows, None)
    if first is None:
        raise GmtsError(f"{rf.path}: no rollouts in the file (empty input)")
    if not rf.columns:
        rf.columns = list(first[1])
    fmt = _file_format(rf, opts, state)
    spec = _file_reward_spec(rf, fmt, state)
    batches = FORMAT_ENTRIES[fmt].batch_files
    G = opts.num_generations
    count = 0
    buffered: list[tuple[str, dict]] = []  # a file of one generation batch (TRL) is held to spot repeats
    for n, row in _chain(first, rows):
        where = f"{unit} {n}"
        m = normalize_row(row, fmt, spec, where)
        step = _row_step(m, rf, state, where)
        m["step"] = step
        _set_group(m, row, fmt, step, count, G)
        count += 1
        if not _step_wanted(step, state):
            continue
        if batches:
            buffered.append((where, m))
        else:
            yield where, m
    if G is not None and count % G:
        raise GmtsError(f"{rf.path}: {count} rows are not whole groups of --num-generations {G} "
                        f"({count % G} left over)")
    if batches and buffered and not _repeats_previous_file(rf, buffered, state):
        yield from buffered


def _file_format(rf: Any, opts: ReaderOptions, state: _ReadState) -> str:
    """The file's format (``--format``, else detected from its columns); the first file's is
    every file's."""
    fmt = opts.format if opts.format != "auto" else _detect_keys(rf.columns)
    if state.fmt is None:
        state.fmt = fmt
    elif fmt != state.fmt:
        raise GmtsError(f"{rf.path}: a {fmt} file among {state.fmt} files (one format per rollouts directory)")
    return fmt


def _file_reward_spec(rf: Any, fmt: str, state: _ReadState) -> RewardSpec | None:
    """Where the file's rewards come from, as its format's entry decides (``rewards``): the verifier,
    TRL's reward columns (the first file decides them when none are named), or ``--reward-columns``,
    checked present."""
    spec = FORMAT_ENTRIES[fmt].rewards(state.spec, rf, state.verified, state.file_spec)
    state.file_spec = spec
    return spec


def _row_step(m: dict, rf: Any, state: _ReadState, where: str) -> int | str | None:
    """The row's training step (its field, else the file name's); one type for all steps."""
    step = check_step(m.get("step"), where)
    if step is None:
        step = rf.name_step
    if step is not None:
        t = int if isinstance(step, int) else str
        if state.step_type is None:
            state.step_type = t
        elif t is not state.step_type:
            raise GmtsError(f"{where}: field 'step' is {step!r}, but earlier steps are "
                            f"{'integers' if state.step_type is int else 'text'} (one type for all steps)")
    return step


def _set_group(m: dict, row: dict, fmt: str, step: int | str | None, index_in_file: int, G: int | None) -> None:
    """Without a group id and with ``--num-generations G``: block ``index // G`` of the file (per
    step); record where the group came from in ``m["_group_from"]``."""
    if G is not None and m.get("group_id") is None:
        m["group_id"] = f"{step}:{index_in_file // G}" if step is not None else index_in_file // G
        m["_group_from"] = "num_generations"
    elif m.get("group_id") is not None:
        field = FORMAT_ENTRIES[fmt].group_field
        m["_group_from"] = field if field is not None and row.get(field) is not None else "group_id"


def _step_wanted(step: int | str | None, state: _ReadState) -> bool:
    """Whether a row of ``step`` is read under ``--steps`` (always without it)."""
    if state.wanted is None:
        return True
    s = step if isinstance(step, int) else int(step) if isinstance(step, str) and step.isdigit() else None
    return s in state.wanted


def _repeats_previous_file(rf: Any, buffered: list[tuple[str, dict]], state: _ReadState) -> bool:
    """TRL writes its last generation batch at every logging step: with logging_steps below
    steps_per_generation (or num_iterations > 1) consecutive files repeat the same rows. True
    (and a warning) when this file's rows are the previous file's."""
    digest = _rows_digest(m for _, m in buffered)
    if digest == state.last_digest:
        state.repeated_files.append(str(rf.path.name))
        log.warning("%s repeats the previous file's rows (TRL logs its last generation batch at every logging "
                    "step): skipped", rf.path.name)
        return True
    state.last_digest = digest
    return False


def _rows_digest(rows: Iterable[dict]) -> str:
    import hashlib
    import json

    h = hashlib.sha256()
    for m in rows:
        h.update(json.dumps([m.get("prompt"), m.get("response"), m.get("reward"), m.get("logged_advantage")],
                            sort_keys=True, default=str).encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def _chain(first: Any, rest: Iterator) -> Iterator:
    yield first
    yield from rest


# ---------------------------------------------------------------- answers

def _build(rows: Iterable[tuple[str, dict]], tokenizer: Any, verifier: Callable | None, opts: ReaderOptions,
           state: _ReadState, source: str) -> Rollouts:
    """The answers of the normalized ``rows``, scored by ``verifier`` where they have no reward,
    grouped, with unique ids; and the read's report."""
    ctx = Contextualizer(tokenizer, opts.chat_template, opts.max_completion_length, opts.max_tokens, opts.truncate)
    answers: list[Answer] = []
    need_verify: list[int] = []
    raw_for_verifier: list[dict] = []
    group_from: set[str] = set()
    for idx, (where, r) in enumerate(rows):
        a, unscored = _answer(idx, where, r, ctx, tokenizer, verifier)
        if r.get("_group_from"):
            group_from.add(r["_group_from"])
        answers.append(a)
        if unscored:
            need_verify.append(idx)
            raw_for_verifier.append(r)
    if not answers:
        raise GmtsError(f"{source}: no rollouts" + (" at the chosen --steps" if state.wanted is not None else
                                                    " (empty input)"))
    if need_verify:
        _verify([answers[i] for i in need_verify], raw_for_verifier, verifier)
    if any(a.group_id is None for a in answers):
        group_from.add("prompt")
    _fill_groups(answers)
    _check_unique_ids(answers, source)
    state.report.update(_read_report(answers, opts, state, ctx, group_from))
    out = Rollouts(answers, state.report)
    return out


def _answer(idx: int, where: str, r: dict, ctx: Contextualizer, tokenizer: Any, verifier: Callable | None
            ) -> tuple[Answer, bool]:
    """The :class:`Answer` of normalized row ``r`` (``idx``: its index in the read), and whether
    the verifier must score it (no reward; NaN until then)."""
    prompt_ids = ctx.prompt_ids(r, where)
    response_ids = ctx.response_ids(r, where)
    if not prompt_ids:
        raise GmtsError(f"{where}: empty prompt (a response needs at least one preceding token)")
    reward, unscored = _row_reward(r, where, verifier)
    old, ref, samp = r.get("old_logprobs"), r.get("ref_logprobs"), r.get("sampling_logprobs")
    prompt, response = r.get("prompt"), r.get("response")
    extra, logged = _extra_fields(r, where, response_ids, ctx)
    domain = r.get("domain")
    if domain is not None and not isinstance(domain, str):
        raise GmtsError(f"{where}: field 'domain' must be text, got {type(domain).__name__}")
    a = Answer(
        answer_id=r["answer_id"] if r.get("answer_id") is not None else idx,
        group_id=r.get("group_id"),
        prompt_ids=prompt_ids,
        response_ids=response_ids,
        reward=float(reward),
        prompt=prompt if isinstance(prompt, str) else _decode(tokenizer, prompt_ids) if prompt is not None else None,
        response=response_text(response),
        step=r.get("step"),
        domain=domain,
        old_logprobs=None if old is None else check_logprobs(old, where, "old_logprobs", len(response_ids)),
        ref_logprobs=None if ref is None else check_logprobs(ref, where, "ref_logprobs", len(response_ids)),
        sampling_logprobs=None if samp is None else check_logprobs(samp, where, "sampling_logprobs",
                                                                   len(response_ids), allow_nan=True),
        extra=extra,
        where=where,
        logged_advantage=logged,
    )
    if isinstance(a.answer_id, (list, dict, float)) or isinstance(a.group_id, (list, dict)):
        raise GmtsError(f"{where}: fields 'answer_id' and 'group_id' must be integers or text")
    return a, unscored


def _row_reward(r: dict, where: str, verifier: Callable | None) -> tuple[float, bool]:
    """``(reward, unscored)``: the row's checked reward, or NaN and True when a verifier will
    score it; without either, a :class:`GmtsError` naming the missing field."""
    reward = r.get("reward")
    if reward is not None:
        return check_reward(reward, where, (r.get("_missing") or {}).get("reward", "reward")), False
    if verifier is None:
        note = format_entry(r.get("_source")).no_reward
        if note is not None:
            raise GmtsError(f"{where}: {note}")
        name = (r.get("_missing") or {}).get("reward", "reward")
        raise GmtsError(f"{where}: missing field '{name}' (or name a verifier with --verifier)")
    return float("nan"), True


def _extra_fields(r: dict, where: str, response_ids: list[int], ctx: Contextualizer) -> tuple[dict, float | None]:
    """``(extra, logged)``: the row's extra scalar fields (text checked), whether the stop token
    was restored to a TRL/verl text response (``eos_restored``) and the logged advantage
    (checked; also returned alone, None without one)."""
    extra = {}
    for k, v in r.items():
        if k in GMTS_FIELDS or k.startswith("_") or not isinstance(v, (int, float, str, bool)):
            continue
        extra[k] = check_text(v, where, k) if isinstance(v, str) else v
    if format_entry(r.get("_source")).logged_text and r.get("response_ids") is None:
        extra["eos_restored"] = bool(response_ids) and response_ids[-1] == ctx.report.eos_token_id \
            and ctx.report.eos_token_id is not None
    logged = r.get("logged_advantage")
    if logged is not None:
        logged = check_reward(logged, where, "advantage")
        extra["logged_advantage"] = logged
    return extra, logged


def _check_unique_ids(answers: list[Answer], source: str) -> None:
    """A :class:`GmtsError` naming the first ``answer_id`` that appears twice."""
    ids = [str(a.answer_id) for a in answers]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise GmtsError(f"{source}: field 'answer_id' is not unique ('{dup}' appears more than once)")


def _read_report(answers: list[Answer], opts: ReaderOptions, state: _ReadState, ctx: Contextualizer,
                 group_from: set[str]) -> dict:
    """What the read found and restored (recorded in manifest.json), also logged."""
    report = {
        "format": state.fmt,
        "n_answers": len(answers),
        "steps": sorted({a.step for a in answers if a.step is not None}, key=str)[:100],
        "reward": _reward_note(state),
        "groups": sorted(group_from),
        "num_generations": opts.num_generations,
        "chat_template": opts.chat_template,
        "context": ctx.report.to_dict(),
        "restored": ctx.report.lines(),
        "repeated_files_skipped": state.repeated_files,
    }
    warn = set(ctx.report.warnings())
    for line in ctx.report.lines():
        (log.warning if line in warn else log.info)(line)
    n_unscorable = sum(1 for a in answers if a.extra.get("unscorable") is True)
    if n_unscorable:
        report["unscorable"] = n_unscorable
        log.warning("%d answer(s) are marked unscorable (every reward function skipped them; reward 0.0 written in "
                    "their place): TRL left them out of their group's baseline with advantage 0, so only "
                    "--advantage logged reproduces its advantages", n_unscorable)
    note = format_entry(state.fmt).grouping_note
    if "prompt" in group_from and note is not None:
        log.info(note)
    return report


def _reward_note(state: _ReadState) -> dict:
    spec = state.file_spec if state.file_spec is not None else state.spec
    if spec is not None and spec.chosen == "verifier":
        return {"columns": None, "field": None, "chosen": "verifier (the table's reward columns are not used)"}
    if spec is None or spec.columns is None:
        return {"columns": None, "field": format_entry(state.fmt).reward_field}
    return {"columns": spec.columns, "weights": spec.weights or [1.0] * len(spec.columns), "chosen": spec.chosen}


def _verify(sel: list[Answer], rows: list[dict], verifier: Callable) -> None:
    """Score answers with a TRL-shaped reward function, called with keywords as TRL calls it
    (:func:`gmts_analysis.readers.verifiers.score`); the rows' other columns go along as lists."""
    columns: dict[str, list] = {}
    for r in rows:
        for k in r:
            if k not in ("prompt", "response", "prompt_ids", "response_ids", "reward") and not k.startswith("_"):
                columns.setdefault(k, [])
    for k in columns:
        columns[k] = [r.get(k) for r in rows]
    scores = score(verifier, [r.get("prompt") for r in rows], [r.get("response") for r in rows],
                   [a.response_ids for a in sel], columns)
    for a, s in zip(sel, scores):
        if isinstance(s, float) and math.isnan(s):
            raise GmtsError(f"{a.where}: the verifier skipped this answer (returned None); an unscorable answer "
                            "(TRL trains it with advantage 0) is not modelled")
        a.reward = check_reward(s, a.where, "reward (from --verifier)")


def _decode(tokenizer: Any, ids: list[int]) -> str | None:
    """The rendered text of a templated prompt (special tokens kept), for display."""
    try:
        return tokenizer.decode(ids, skip_special_tokens=False)
    except Exception:
        return None


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
            if len(a.prompt_ids) >= max_len:  # cutting the response cannot help
                raise GmtsError(
                    f"{a.where}: answer '{a.answer_id}': its prompt alone has {len(a.prompt_ids)} tokens, as many "
                    f"as the model's context ({max_len}) or more; leave this prompt out or use a model with a longer "
                    "context"
                )
            if not truncate:
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
            if a.sampling_logprobs is not None:
                a.sampling_logprobs = a.sampling_logprobs[:keep]
            a.extra["truncated"] = True
            cut += 1
    return cut
