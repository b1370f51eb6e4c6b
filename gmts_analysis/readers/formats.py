"""TRL completions tables and verl rollout dumps mapped onto the gmts fields.

**TRL** (``GRPOTrainer(log_completions=True)`` writes ``completions/completions_{step:05d}.parquet``
at each logging step): columns ``step``, ``prompt`` (text, or a list of chat messages),
``completion`` (text decoded without special tokens, or ``[{"role": "assistant", "content": ...}]``),
one float column per reward function (named after the function; NaN where it returned
None), one column per ``log_extra`` name, and ``advantage``. Only the columns the user names
are rewards; the reward is TRL's weighted sum with NaN skipped (``nansum``, in float32 as
TRL computes it). Rows come in consecutive blocks of ``num_generations`` per prompt.

**verl** (``trainer.rollout_data_dir`` writes ``{step}.jsonl``): ``input`` (the templated
prompt decoded without special tokens), ``output`` (decoded the same way), ``gts``,
``score`` (the summed token-level scores), ``step``, and every ``reward_extra_info`` of one
value per answer (``uid`` when the reward function passes it on).

Each format is one :class:`RolloutFormat` entry of :data:`FORMAT_ENTRIES` (``gmts``, ``verl``, ``trl``): how
its files are detected, how a row becomes gmts fields, where its rewards come from and what the reader does
differently for it. ``--format``'s choices, detection and the readers all read the entries, so a new format is
one :func:`register_format` call (files and directories it names in its own way aside:
:mod:`gmts_analysis.readers.sources`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Sequence

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.sources import RolloutFile, check_reward

log = logging.getLogger("gmts_analysis.readers")

# TRL completions columns that are never reward functions
TRL_NON_REWARD = {"step", "prompt", "completion", "advantage", "images", "image", "prompt_ids", "completion_ids"}
VERL_FIELDS = {"input", "output", "score", "step", "gts"}
GMTS_FIELDS = {"prompt", "prompt_ids", "response", "response_ids", "reward", "group_id", "answer_id", "step",
               "old_logprobs", "ref_logprobs", "sampling_logprobs", "domain", "logged_advantage"}


def detect_format(keys: Sequence[str]) -> str:
    """The first registered format whose ``detect`` takes these columns (``verl`` for ``input``/``output``,
    ``trl`` for ``completion``), else :data:`DEFAULT_FORMAT` (``gmts``)."""
    keys = set(keys)
    for entry in FORMAT_ENTRIES.values():
        if entry.detect is not None and entry.detect(keys):
            return entry.name
    return DEFAULT_FORMAT


def _names(v: Any, flag: str) -> list[str] | None:
    if v is None or v == "" or v == []:
        return None
    items = [s.strip() for s in v.split(",")] if isinstance(v, str) else [str(s).strip() for s in v]
    if any(not s for s in items):
        raise GmtsError(f"{flag}: empty name in '{v}'")
    if len(set(items)) != len(items):
        raise GmtsError(f"{flag}: a column is named twice in '{v}'")
    return items


def _weights(v: Any, n: int | None) -> list[float] | None:
    if v is None or v == "" or v == []:
        return None
    items = v.split(",") if isinstance(v, str) else list(v)
    try:
        w = [float(x) for x in items]
    except (TypeError, ValueError):
        raise GmtsError(f"--reward-weights: expected numbers separated by commas, got '{v}'") from None
    if not all(math.isfinite(x) for x in w):
        raise GmtsError(f"--reward-weights: every weight must be finite, got '{v}'")
    if n is None:
        raise GmtsError("--reward-weights needs --reward-columns (one weight per named column)")
    if len(w) != n:
        raise GmtsError(f"--reward-weights: {len(w)} weights for {n} reward columns")
    return w


@dataclass
class RewardSpec:
    """Which columns make the reward, with TRL's weights (default 1 each)."""

    columns: list[str] | None
    weights: list[float] | None
    chosen: str = "given"  # given | only-numeric-column | field
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_options(cls, columns: Any, weights: Any) -> "RewardSpec":
        names = _names(columns, "--reward-columns")
        return cls(names, _weights(weights, None if names is None else len(names)))


def resolve_trl_rewards(spec: RewardSpec, rf: RolloutFile) -> RewardSpec:
    """The reward columns of a TRL table: the named ones, or the only numeric candidate.

    Several numeric candidates and none named is refused, listing them: TRL's table holds
    one column per reward function *and* every ``log_extra`` column, which cannot be told apart.
    """
    if spec.columns is not None:
        missing = [c for c in spec.columns if c not in rf.columns]
        if missing:
            raise GmtsError(f"{rf.path}: --reward-columns: no column '{missing[0]}' in the table "
                            f"(columns: {', '.join(rf.columns)})")
        return spec
    cands = [c for c in rf.columns if c in rf.numeric_columns and c not in TRL_NON_REWARD]
    if len(cands) > 1:
        raise GmtsError(f"{rf.path}: several numeric columns could be rewards ({', '.join(cands)}): name the reward "
                        "function columns with --reward-columns NAME[,NAME...] (and --reward-weights if TRL's "
                        "reward_weights were not all 1)")
    if len(cands) == 1:
        msg = (f"using the only numeric column '{cands[0]}' of the TRL table as the reward "
               "(name it with --reward-columns to silence this)")
        log.warning(msg)
        return RewardSpec([cands[0]], None, chosen="only-numeric-column", notes=[msg])
    return RewardSpec(None, None, chosen="none")


def weighted_reward(row: dict, spec: RewardSpec, where: str) -> float | None:
    """TRL's reward: ``nansum(weights * r)`` over the named columns in float32, None when every
    column is NaN/None (TRL's unscorable completion, which it trains with advantage 0)."""
    import numpy as np  # here, not at the top: --format's choices are read when the command line is built

    assert spec.columns is not None
    w = spec.weights or [1.0] * len(spec.columns)
    vals = []
    for c in spec.columns:
        v = row.get(c)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            vals.append(np.nan)
            continue
        vals.append(check_reward(v, where, c))
    arr = np.asarray(vals, dtype=np.float32)
    if np.isnan(arr).all():
        return None
    total = float(np.nansum(arr * np.asarray(w, dtype=np.float32)))
    return check_reward(total, where, "reward (weighted sum of " + ", ".join(spec.columns) + ")")


def _scalar_extras(row: dict, skip: set) -> dict:
    out = {}
    for k, v in row.items():
        if k in skip or k.startswith("_"):
            continue
        if isinstance(v, (int, float, str, bool)) or v is None:
            out[k] = v
    return out


def _completion_text(v: Any, where: str) -> Any:
    """TRL's conversational completion ``[{"role": "assistant", "content": text}]`` -> text."""
    if isinstance(v, list):
        if len(v) != 1 or not isinstance(v[0], dict) or v[0].get("role") != "assistant":
            raise GmtsError(f"{where}: field 'completion' holds {len(v)} messages; only one assistant message is "
                            "supported (tool-call turns cannot be re-tokenized exactly)")
        if v[0].get("tool_calls"):
            raise GmtsError(f"{where}: field 'completion' has tool calls, which cannot be re-tokenized exactly")
        # TRL parses the completion with the tokenizer's response schema when it has one (e.g. Qwen3's
        # thinking goes to 'reasoning_content'): 'content' alone is then not what the policy generated
        other = sorted(k for k, x in v[0].items() if k not in ("role", "content") and x not in (None, "", [], {}))
        if other:
            raise GmtsError(f"{where}: field 'completion' was split by the tokenizer's response schema ("
                            f"{', '.join(repr(k) for k in other)} beside 'content'), which cannot be re-tokenized "
                            "exactly; write the rollouts at the source (gmts_analysis.integrations.rollout_log)")
        return v[0].get("content")
    return v


def _normalize_gmts(row: dict, spec: RewardSpec | None, where: str) -> dict:
    m = dict(row)
    if spec is not None and spec.columns is not None:
        m["reward"] = weighted_reward(row, spec, where)
    m["_source"] = "gmts"
    return m


def _normalize_verl(row: dict, spec: RewardSpec | None, where: str) -> dict:
    m = {"prompt": row.get("input"), "response": row.get("output"), "step": row.get("step"),
         "_source": "verl", "_missing": {"prompt": "input", "response": "output", "reward": "score"}}
    if spec is not None and spec.columns is not None:
        m["reward"] = weighted_reward(row, spec, where)
    else:
        m["reward"] = row.get("score", row.get("reward"))
    if row.get("uid") is not None:
        m["group_id"] = row["uid"]
    for k, v in _scalar_extras(row, {"input", "output", "score", "step", "uid"}).items():
        m.setdefault(k, v)
    return m


def _normalize_trl(row: dict, spec: RewardSpec | None, where: str) -> dict:
    m = {"prompt": row.get("prompt"), "response": _completion_text(row.get("completion"), where),
         "step": row.get("step"), "_source": "trl", "_missing": {"response": "completion"}}
    if spec is not None and spec.columns is not None:
        m["reward"] = weighted_reward(row, spec, where)
        if m["reward"] is None:
            raise GmtsError(f"{where}: every reward column ({', '.join(spec.columns)}) is NaN: TRL's unscorable "
                            "completion (trained with advantage 0) is not modelled; drop the row or score it "
                            "with --verifier")
    adv = row.get("advantage")
    if adv is not None:
        m["logged_advantage"] = check_reward(adv, where, "advantage")
    skip = {"prompt", "completion", "step", "advantage", "images", "image"}
    for k, v in _scalar_extras(row, skip).items():
        m.setdefault(k, v)
    return m


def named_rewards(spec: RewardSpec, rf: RolloutFile, verified: bool, previous: RewardSpec | None) -> RewardSpec:
    """A file's rewards when they are fields of its rows: ``--reward-columns``, checked present, else the
    format's reward field (``verified``: a verifier scores the rows without one)."""
    if spec.columns is not None:
        missing = [c for c in spec.columns if c not in rf.columns]
        if missing:
            raise GmtsError(f"{rf.path}: --reward-columns: no column '{missing[0]}' (columns: {', '.join(rf.columns)})")
    return spec


def trl_rewards(spec: RewardSpec, rf: RolloutFile, verified: bool, previous: RewardSpec | None) -> RewardSpec:
    """A TRL table's rewards: the verifier's, which replace the logged ones (kept as columns), or the reward
    columns (:func:`resolve_trl_rewards`): the first file decides them when none are named (``previous``),
    later files must hold them."""
    if verified:
        return RewardSpec(None, None, chosen="verifier")
    return resolve_trl_rewards(previous or spec, rf)


@dataclass(frozen=True)
class RolloutFormat:
    """One rollouts format (``--format NAME``, a row's ``_source``): how its files are recognised, how a row
    becomes gmts fields and what the reader does differently for it. Registered in :data:`FORMAT_ENTRIES`
    (:func:`register_format`); the readers, ``--format`` and the reader's report all read the entry."""

    name: str
    #: ``(row, spec, where) -> dict``: the row as gmts fields, with ``_source`` (the name) and ``_missing``
    #: (the format's own names of prompt / response / reward, for the messages)
    normalize: Callable[[dict, RewardSpec | None, str], dict]
    #: ``(columns) -> bool``: a file with these columns is of this format (tried in registration order;
    #: None for the fallback, :data:`DEFAULT_FORMAT`)
    detect: Callable[[set], bool] | None = None
    #: ``(spec, file, verified, previous file's spec) -> RewardSpec``: where a file's rewards come from
    rewards: Callable[..., RewardSpec] = named_rewards
    #: the row field of the reward when no columns are named (the report's ``reward.field``)
    reward_field: str | None = "reward"
    #: a row field that gives the group (recorded as where the groups came from)
    group_field: str | None = None
    #: rows hold text a trainer decoded without special tokens (no ids): the stop token is restored to the
    #: response (``eos_restored``), and a missing prompt or response names no ids field
    logged_text: bool = False
    #: the prompt is the chat template's rendering, decoded: restored by matching the template (verl)
    templated_prompt: bool = False
    #: each file is one generation batch, which the trainer may log again: a file that repeats the
    #: previous one is skipped (TRL)
    batch_files: bool = False
    #: the message after ``{where}:`` when a row has no reward and no verifier scores it (None: the missing field)
    no_reward: str | None = None
    #: logged when its answers are grouped by identical (step, prompt)
    grouping_note: str | None = None


#: name -> format, in registration order (detection tries them in this order); ``auto`` is not one
FORMAT_ENTRIES: dict[str, RolloutFormat] = {}
#: the format of a file that no entry's ``detect`` claims
DEFAULT_FORMAT = "gmts"


def register_format(entry: RolloutFormat) -> RolloutFormat:
    """Add (or replace) ``entry`` in :data:`FORMAT_ENTRIES`: ``--format NAME`` and detection know it from then on.

    Args:
        entry: the format (its ``name`` is the ``--format`` value).

    Returns:
        ``entry``.
    """
    FORMAT_ENTRIES[entry.name] = entry
    return entry


def format_names() -> tuple[str, ...]:
    """The values of ``--format``.

    Returns:
        ``auto`` and every registered format's name, in registration order.
    """
    return ("auto", *FORMAT_ENTRIES)


def format_entry(name: str | None) -> RolloutFormat:
    """The entry of a row's ``_source``.

    Args:
        name: a format's name, or ``None``.

    Returns:
        Its :class:`RolloutFormat`; the default format's (:data:`DEFAULT_FORMAT`) when ``name`` is ``None`` or
        not registered.
    """
    return FORMAT_ENTRIES.get(name or DEFAULT_FORMAT) or FORMAT_ENTRIES[DEFAULT_FORMAT]


def normalize_row(row: dict, fmt: str, spec: RewardSpec | None, where: str) -> dict:
    """One row of format ``fmt`` as gmts fields (plus ``_source``); extras carried as scalars."""
    entry = FORMAT_ENTRIES.get(fmt)
    if entry is None:
        raise GmtsError(f"--format: unknown format '{fmt}' (choose from {', '.join(format_names())})")
    return entry.normalize(row, spec, where)


def _no_answer_text(keys: set) -> bool:
    return "response" not in keys and "response_ids" not in keys


register_format(RolloutFormat("gmts", _normalize_gmts))
register_format(RolloutFormat(
    "verl", _normalize_verl, detect=lambda keys: {"input", "output"} <= keys and _no_answer_text(keys),
    reward_field="score", group_field="uid", logged_text=True, templated_prompt=True))
register_format(RolloutFormat(
    "trl", _normalize_trl, detect=lambda keys: "completion" in keys and _no_answer_text(keys), rewards=trl_rewards,
    reward_field=None, logged_text=True, batch_files=True,
    no_reward="no reward: the TRL table has no numeric reward column (name them with --reward-columns, or score "
              "answers with --verifier)",
    grouping_note="TRL rows grouped by identical (step, prompt); pass --num-generations G to use TRL's "
                  "consecutive blocks of G rows"))
#: the values of ``--format`` (``auto`` and the formats registered here; :func:`format_names` after more)
FORMATS = format_names()
