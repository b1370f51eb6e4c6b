"""The work area of an unfinished run: fingerprint, ``run.json``, chunk records and parts.

While a probe runs, its output directory holds::

    run.json                         what this run is (fingerprint + hash), its attempts
    chunks/<key>.tokens.parquet      token rows of a few answers (with ``_answer_index``)
    chunks/<key>.groups.parquet      their per-layer/module norms (with --grad-groups)
    chunks/<key>.json                the chunk's record: answers done, answers failed
    parts/part-RRRRR-of-WWWWW.*      one rank's share, gathered from the chunks

Every file is written under a temporary name and renamed; a chunk counts as done only
once its record (``.json``, written last) exists, so a process killed at any moment
leaves either a whole chunk or nothing of it. The answers done are the union of the
records, whatever world size or chunk size wrote them: a run can be resumed on a
different number of GPUs. When the run finishes, the directory is replaced by the
final one (tokens.parquet, answers.parquet, stats.json, manifest.json, ...), whose
manifest keeps the hash.

The hash covers what changes the results: the model's files (config and tokenizer files
hashed whole, weight files by size and 16 sampled 64 KiB blocks), the rollouts file
(sha256), and every configuration field except those in :data:`NOT_IN_FINGERPRINT`, each
listed with the reason it cannot change a number (derived, so a new option is covered by
construction). ``figures`` and ``fidelity`` change only what finishing writes: a finished run
is compared with its manifest on those (:data:`FINISH_FIELDS`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.readers.models import resolve_model_path
from gmts_analysis.readers.sources import input_sha256
from gmts_analysis.util import io
from gmts_analysis.util.io import file_sha256

log = logging.getLogger("gmts_analysis.run.sharding")

STATE_FILE = "run.json"
CHUNKS = "chunks"
PARTS = "parts"
INDEX_COLUMN = "_answer_index"  # position of the answer in the rollouts file (0-based)
STATE_FORMAT = "gmts-run-state/1"

# The fingerprint is derived: every field of ProbeConfig is in it except those listed here, each
# with the reason it cannot change a number the run writes (tokens.parquet, answers.parquet,
# grad_groups.parquet, stats.json). A new option is fingerprinted unless it is added here.
NOT_IN_FINGERPRINT: dict[str, str] = {
    "model": "fingerprinted by content instead (model_fingerprint): nodes may mount it at other paths",
    "rollouts": "fingerprinted by content instead (its sha256, or the files of a rollouts directory)",
    "out": "where the run is written, not what",
    "overwrite": "whether a previous run may be replaced, not what the new one holds",
    "strict": "whether the job stops at the first failing answer; the answers it writes are the same",
    "answers_per_chunk": "how the work is cut into resumable records; the merged rows are the same",
    "quiet": "progress and info lines on stderr only",
    "offline": "whether a hub model may be downloaded; the model is fingerprinted by content",
    "config_file": "the file the options were read from; the options themselves are fingerprinted",
    "aliases": "the names the options were given under; the values they set are fingerprinted",
    "device": "where the numbers are computed: a run may resume on other devices or GPU counts "
              "(docs/scaling.md); the values agree to float tolerance",
    "chunk_size": "tokens per batched VJP: performance only (the same values to float tolerance)",
    "max_memory": "the memory budget of --chunk-size auto: performance only",
    "figures": "decided when the run is finished (gmts merge may change it); a finished run is compared "
               "with its manifest instead (FINISH_FIELDS)",
    "fidelity": "decided when the run is finished (gmts merge may change it); a finished run is compared "
                "with its manifest instead (FINISH_FIELDS)",
}
# options that only change what finishing the run writes: a finished run made with other values is
# not "already complete" (inspect_directory compares them with its manifest's config)
FINISH_FIELDS = ("figures", "fidelity")
_TEXT_SUFFIXES = (".json", ".txt", ".model", ".jinja", ".py", ".tiktoken", ".vocab", ".merges")
_BLOCK = 64 * 1024
_BLOCKS = 16


# ---------------------------------------------------------------- fingerprint

def _sampled_sha256(path: Path) -> str:
    """sha256 of the size and of ``_BLOCKS`` blocks at evenly spaced offsets (first and last included)."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= _BLOCK * _BLOCKS:
            h.update(f.read())
        else:
            for k in range(_BLOCKS):
                f.seek((size - _BLOCK) * k // (_BLOCKS - 1))
                h.update(f.read(_BLOCK))
    return h.hexdigest()


def model_fingerprint(name_or_path: str) -> dict[str, Any]:
    """What identifies the model's content: ``{file name: digest}`` of a local directory.

    Small text files (config, tokenizer) are hashed whole, others (weights) by size and
    sampled blocks, so two checkpoints of one architecture differ while a 14 GB model is
    fingerprinted in milliseconds. A GGUF file is fingerprinted as such a file. A name that is not a
    local directory or file (a hub id) is
    kept as given. The path itself is not part of it: nodes may mount it differently.
    """
    path = Path(resolve_model_path(name_or_path))
    if path.is_file():  # a GGUF file (smollm2 or a .gguf path): its content, sampled
        return {"files": {path.name: "sampled:" + _sampled_sha256(path)}}
    if not path.is_dir():
        return {"id": str(name_or_path)}
    files = {}
    for f in sorted(path.iterdir()):
        if not f.is_file() or f.name.startswith("."):
            continue
        small_text = f.suffix in _TEXT_SUFFIXES and f.stat().st_size <= 64 * 2**20
        files[f.name] = file_sha256(f) if small_text else "sampled:" + _sampled_sha256(f)
    return {"files": files}


def result_config(cfg: ProbeConfig) -> dict[str, Any]:
    """The configuration part of the fingerprint: every field of ``cfg`` but :data:`NOT_IN_FINGERPRINT`."""
    import dataclasses

    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in NOT_IN_FINGERPRINT}


@dataclass
class Fingerprint:
    """Identity of a run: model content, rollouts content, result-changing configuration."""

    model: dict
    rollouts_sha256: str
    config: dict
    run_hash: str = ""

    def __post_init__(self) -> None:
        if not self.run_hash:
            blob = json.dumps({"model": self.model, "rollouts": self.rollouts_sha256, "config": self.config},
                              sort_keys=True, default=str)
            self.run_hash = hashlib.sha256(blob.encode()).hexdigest()

    def to_json(self) -> dict:
        return asdict(self)

    def differences(self, other: dict) -> list[str]:
        """Human-readable list of what differs from a stored fingerprint (``to_json`` form)."""
        out = []
        if other.get("model") != self.model:
            out.append("the model's files")
        if other.get("rollouts_sha256") != self.rollouts_sha256:
            out.append("the rollouts file's content")
        old_cfg = other.get("config") or {}
        for k in sorted(set(old_cfg) | set(self.config)):
            if old_cfg.get(k) != self.config.get(k):
                out.append(f"--{k.replace('_', '-')} {old_cfg.get(k)} -> {self.config.get(k)}")
        return out or ["the run hash"]


def run_fingerprint(cfg: ProbeConfig) -> Fingerprint:
    return Fingerprint(model=model_fingerprint(cfg.model), rollouts_sha256=input_sha256(Path(cfg.rollouts)),
                       config=result_config(cfg))


# ---------------------------------------------------------------- the directory

def _read_json_or_none(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


WORK_STEM = "gmts-work"  # the work area stepped aside while the finished directory is renamed in
NEXT_STEM = "gmts-next"  # the work area of a run replacing another (--overwrite)


def work_area_sibling(out: Path) -> Path:
    """The work area of ``out`` stepped aside (ours, by its marker) while the finished directory is
    renamed into place; a new name when there is none (never a look-alike's)."""
    found = io.ours_beside(out, "work", WORK_STEM)
    return found[0] if found else io.fresh_sibling_name(out, WORK_STEM)


def replacement_area(out: Path) -> Path:
    """Where a run started with ``--overwrite`` works while the previous run stays intact at ``out``
    (one of ours left by an interrupted job, else a new name)."""
    found = io.ours_beside(out, "next", NEXT_STEM)
    return found[0] if found else io.fresh_sibling_name(out, NEXT_STEM)


def recover_work_area(out: Path) -> None:
    """Undo an interrupted final rename: bring the work area back, or drop it if the run finished.

    Only a sibling carrying our marker (:func:`gmts_analysis.util.io.is_ours`, written when the work area
    was created) is touched; a directory that merely has such a name is left alone."""
    import shutil

    for work in io.ours_beside(out, "work", WORK_STEM):
        if out.exists() and (out / "manifest.json").exists():
            shutil.rmtree(work, ignore_errors=True)
            continue
        if out.is_dir() and not out.is_symlink() and not any(out.iterdir()):
            out.rmdir()  # an empty directory took the work area's place: the work area wins
        if not os.path.lexists(out):
            os.replace(work, out)
            log.warning("%s: recovered the work area of an interrupted job (%s)", out, work.name)
        else:
            log.warning("%s: %s holds the work of an interrupted job and %s is in its place; not touching either",
                        out, work, out)


def inspect_directory(out: Path, fp: Fingerprint, overwrite: bool, finishing: dict | None = None) -> str:
    """What to do with ``out``: ``fresh``, ``resume``, ``complete`` or ``overwrite``.

    ``finishing``: the :data:`FINISH_FIELDS` of this job; a finished run of the same fingerprint
    made with other values is not ``complete`` (refused, naming them).

    Raises :class:`GmtsError` when ``out`` holds anything else than this run (another
    model, rollouts or configuration, or files that are not a run) and not ``overwrite``.
    """
    recover_work_area(out)
    if out.exists() and not out.is_dir():
        raise GmtsError(f"{out}: exists and is not a directory")
    if not out.exists() or not any(out.iterdir()) or _interrupted_start(out):
        return "fresh"
    io.check_ours(out)  # someone else's files: refused whatever --overwrite says
    if overwrite:
        return "overwrite"
    manifest = _read_json_or_none(out / "manifest.json") if (out / "manifest.json").exists() else None
    if manifest is not None and (out / "tokens.parquet").exists():
        if manifest.get("run_hash") == fp.run_hash:
            old_cfg = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
            changed = [f"--{k} {old_cfg.get(k)} -> {v}" for k, v in (finishing or {}).items()
                       if k in old_cfg and old_cfg.get(k) != v]
            if changed:
                raise GmtsError(f"{out}: holds this run finished with other settings ({'; '.join(changed)}); "
                                "pass --overwrite to redo it (or gmts figures / gmts stats on it)")
            return "complete"
        old = manifest.get("run_fingerprint")
        why = "; ".join(fp.differences(old)) if isinstance(old, dict) else "an earlier run"
        raise GmtsError(f"{out}: holds a finished run of a different model, rollouts or configuration ({why}); "
                        "pass --overwrite to replace it")
    state = _read_json_or_none(out / STATE_FILE) if (out / STATE_FILE).exists() else None
    if isinstance(state, dict) and state.get("format") == STATE_FORMAT:
        if state.get("run_hash") == fp.run_hash:
            return "resume"
        why = "; ".join(fp.differences(state.get("fingerprint") or {}))
        raise GmtsError(f"{out}: holds an unfinished run of a different model, rollouts or configuration ({why}); "
                        "rerun its own command to resume it, or pass --overwrite to start over")
    raise GmtsError(f"{out}: holds an unreadable or incomplete gmts run (no usable manifest.json or {STATE_FILE}); "
                    "pass --overwrite to replace it")


def _interrupted_start(out: Path) -> bool:
    """Whether ``out`` holds only what :func:`prepare_directory` writes before the run state: our work
    marker (or its temporary), empty chunks/ and parts/ folders. A job stopped there (a SIGINT just after
    the folder was made) left no work; the same command starts it afresh instead of refusing the folder."""
    import re

    tmp = re.compile(r"^\..+\.tmp$")
    for c in out.iterdir():
        if c.name in (CHUNKS, PARTS) and c.is_dir() and not c.is_symlink() and not any(c.iterdir()):
            continue
        if tmp.match(c.name) and c.is_file():
            continue
        if c.name == io.OWNER_MARKER and io.is_ours(out, "work", out):
            continue
        return False
    return True


def prepare_directory(out: Path, fp: Fingerprint, cfg: ProbeConfig, status: str, world_size: int,
                      finishing: dict | None = None) -> tuple[int, Path]:
    """Create or reopen the work area (rank 0 only); returns this attempt's number (1, 2, ...)
    and the work area: ``out`` itself, or under ``overwrite`` :func:`replacement_area`.

    ``overwrite`` never empties ``out``: the new run is built in a work area beside it
    (:func:`replacement_area`; one of ours left by an interrupted job of the same fingerprint is
    resumed, of another removed) and replaces the previous run only once complete.
    A new work area gets our marker. Parts of earlier attempts are removed (they are rebuilt from
    the chunk records); chunk records are kept.
    """
    import shutil

    work = replacement_area(out) if status == "overwrite" else out
    state = None
    if status == "overwrite":
        io.check_ours(out)  # the run it will replace: never someone else's files
        if os.path.lexists(work):  # ours (replacement_area checks the marker)
            state = _read_json_or_none(work / STATE_FILE)
            if not (isinstance(state, dict) and state.get("run_hash") == fp.run_hash):
                state = None  # a replacement of another configuration: start over
                shutil.rmtree(work)
            else:
                log.info("%s: resuming the replacement of %s left by an interrupted --overwrite job", work, out)
    elif status == "resume":
        state = _read_json_or_none(work / STATE_FILE)
    work.mkdir(parents=True, exist_ok=True)
    if not isinstance(state, dict):
        state = {"format": STATE_FORMAT, "run_hash": fp.run_hash, "fingerprint": fp.to_json(),
                 "config": asdict(cfg), "created": _now(), "attempts": []}
    role = "next" if status == "overwrite" else "work"
    if not io.is_ours(work, role, out):
        io.mark_ours(work, role, out)
    state["attempts"].append({"started": _now(), "world_size": world_size})
    state["config"] = asdict(cfg)  # the latest command (gmts merge uses it)
    state["finish"] = finishing or {}  # manifest entries and files the finished directory gets (gmts merge too)
    shutil.rmtree(work / PARTS, ignore_errors=True)
    (work / CHUNKS).mkdir(exist_ok=True)
    (work / PARTS).mkdir(exist_ok=True)
    io.atomic_write_json(work / STATE_FILE, state)
    return len(state["attempts"]), work


def read_state(out: Path) -> dict:
    recover_work_area(out)
    state = _read_json_or_none(out / STATE_FILE)
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        if (out / "manifest.json").exists() and (out / "tokens.parquet").exists():
            raise GmtsError(f"{out}: this run is already complete (tokens.parquet and manifest.json exist)")
        raise GmtsError(f"{out}: not an unfinished probe run (no readable {STATE_FILE})")
    return state


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- chunk records

@dataclass
class ChunkRecord:
    """A finished chunk: ``answers`` (indices) done, ``errors`` among them, the files holding the rows."""

    name: str
    answers: list[int]
    errors: list[dict] = field(default_factory=list)
    tokens: str | None = None  # file name under chunks/ (None: no rows)
    groups: str | None = None
    n_rows: int = 0
    seconds: float = 0.0
    n_tokens: int = 0


def chunk_name(indices: Sequence[int]) -> str:
    digest = hashlib.sha1(",".join(map(str, indices)).encode()).hexdigest()[:10]
    return f"c{min(indices):09d}-{digest}"


def write_chunk(out: Path, run_hash: str, indices: Sequence[int], tokens: Any, groups: Any, errors: list[dict],
                seconds: float, n_tokens: int, meta: dict) -> ChunkRecord:
    """Write a chunk's tables, then its record (the commit point)."""
    name = chunk_name(indices)
    d = out / CHUNKS
    rec = ChunkRecord(name=name, answers=[int(i) for i in indices], errors=errors, seconds=seconds,
                      n_tokens=n_tokens)
    if tokens is not None and len(tokens):
        rec.tokens = f"{name}.tokens.parquet"
        rec.n_rows = len(tokens)
        io.atomic_write_parquet(d / rec.tokens, tokens)
    if groups is not None and len(groups):
        rec.groups = f"{name}.groups.parquet"
        io.atomic_write_parquet(d / rec.groups, groups)
    io.atomic_write_json(d / f"{name}.json", {"run_hash": run_hash, **asdict(rec), **meta})
    return rec


def read_chunks(out: Path, run_hash: str) -> list[ChunkRecord]:
    """Valid chunk records of this run, by name (that is, by first answer index)."""
    recs = []
    for p in sorted((out / CHUNKS).glob("c*.json")):
        d = _read_json_or_none(p)
        if not isinstance(d, dict) or d.get("run_hash") != run_hash:
            log.warning("%s: ignoring an unreadable or foreign record", p)
            continue
        ids = d.get("answers")
        if not (isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids)
                and len(set(ids)) == len(ids) and type(d.get("n_rows", 0)) is int
                and isinstance(d.get("errors", []), list) and isinstance(d.get("tokens") or "", str)
                and isinstance(d.get("groups") or "", str)):
            log.warning("%s: ignoring a record whose answers, rows or files are not as gmts writes them", p)
            continue
        rec = ChunkRecord(**{k: d[k] for k in ChunkRecord.__dataclass_fields__ if k in d})
        missing = [f for f in (rec.tokens, rec.groups) if f and not (out / CHUNKS / f).exists()]
        if missing:
            log.warning("%s: its table %s is missing; its answers will be probed again", p, missing[0])
            continue
        recs.append(rec)
    return recs


def owners(records: Iterable[ChunkRecord]) -> dict[int, ChunkRecord]:
    """Answer index -> the record that holds it (the first by name if two do)."""
    own: dict[int, ChunkRecord] = {}
    for r in records:
        for i in r.answers:
            own.setdefault(i, r)
    return own


# ---------------------------------------------------------------- parts

def part_stem(rank: int, world_size: int) -> str:
    return f"part-{rank:05d}-of-{world_size:05d}"


def read_part_meta(out: Path, rank: int, world_size: int) -> dict | None:
    p = out / PARTS / f"{part_stem(rank, world_size)}.json"
    return _read_json_or_none(p) if p.exists() else None
