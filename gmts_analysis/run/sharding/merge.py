"""Gather chunk records into parts and parts into the final run directory.

Rows come out in the order a single process writes them, whatever the sharding: answers
in input order (the ``_answer_index`` each row carries), tokens by position.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pandas as pd

from gmts_analysis.core.estimators import add_estimator_columns
from gmts_analysis.core.scores import NAN_SCORES
from gmts_analysis.errors import GmtsError
from gmts_analysis.probing import kernel, tables
from gmts_analysis.probing.inputs import ProbeInputs
from gmts_analysis.run import finalize as finalize_mod
from gmts_analysis.run.sharding import state
from gmts_analysis.run.sharding.job import ProbeJob
from gmts_analysis.util import io
from gmts_analysis.util.atomic import jsonl_text

log = logging.getLogger("gmts_analysis.run.sharding")

ERRORS_FILE = "errors.jsonl"


def _concat(frames: list[pd.DataFrame], order: Sequence[str] = ()) -> pd.DataFrame | None:
    """Concatenate tables, sort rows stably by answer index, fix id types, put ``order`` first."""
    frames = [f for f in frames if f is not None and len(f)]
    if not frames:
        return None
    df = pd.concat(frames, ignore_index=True, sort=False)
    perm = np.argsort(df[state.INDEX_COLUMN].to_numpy(), kind="stable")
    df = df.iloc[perm].reset_index(drop=True)
    for k in ("answer_id", "group_id"):
        if k in df.columns:
            df[k] = tables.id_column(list(df[k]))
    first = [c for c in order if c in df.columns]
    return df[first + [c for c in df.columns if c not in first]]


def check_rows(df: pd.DataFrame, path: Path, answers: Sequence[int], n_rows: int | None = None) -> pd.DataFrame:
    """The rows of one chunk or part table, checked against its record before they enter a run:
    the index and position columns present, only answers the record lists, no (answer, position) row
    twice, as many rows as the record says, and no NaN or infinity in a float column (the gradient
    norms may be NaN, under --grad-norm none, and ``rsi`` where the entropy is 0; never infinite).
    A table edited or damaged after it was recorded is refused in one line naming it, never merged."""
    for c in (state.INDEX_COLUMN, "position"):
        if c not in df.columns:
            raise GmtsError(f"{path}: no {c} column (not a table gmts recorded); remove it and its record "
                            "and run the probe again")
    listed = {int(i) for i in answers}
    idx = df[state.INDEX_COLUMN].to_numpy()
    stray = sorted({int(i) for i in idx} - listed)
    if stray:
        raise GmtsError(f"{path}: rows of answer number {stray[0]}, which its record does not list "
                        f"({len(stray)} such answer(s)); the table was changed after it was recorded")
    dup = df.duplicated([state.INDEX_COLUMN, "position"])
    if dup.any():
        r = df[dup].iloc[0]
        raise GmtsError(f"{path}: {int(dup.sum())} row(s) twice (first: answer number {int(r[state.INDEX_COLUMN])}, "
                        f"position {int(r['position'])}); the table was changed after it was recorded")
    if n_rows is not None and len(df) != int(n_rows):
        raise GmtsError(f"{path}: {len(df)} rows, its record says {int(n_rows)}; the table was changed after "
                        "it was recorded")
    for c in df.columns:
        if df[c].dtype.kind != "f":
            continue
        v = df[c].to_numpy()
        bad = ~np.isfinite(v)
        if c.startswith("grad_norm") or c in NAN_SCORES:
            bad &= ~np.isnan(v)
        if bad.any():
            i = int(np.argmax(bad))
            raise GmtsError(f"{path}: non-finite {c} ({v[i]}) at row {i} (answer number "
                            f"{int(idx[i])}, position {int(df['position'].iloc[i])}); the table was changed "
                            "after it was recorded")
    return df


def gather_chunks(out: Path, records: Sequence[state.ChunkRecord], wanted: set[int]
                  ) -> tuple[pd.DataFrame | None, pd.DataFrame | None, list[dict]]:
    """Rows (tokens, groups) and errors of the answers ``wanted``, each from its one owning record."""
    own = state.owners(records)
    tok_frames, grp_frames, errors = [], [], []
    for rec in records:
        mine = {i for i in rec.answers if i in wanted and own[i] is rec}
        if not mine:
            continue
        errors += [e for e in rec.errors if e["index"] in mine]
        for fname, frames in ((rec.tokens, tok_frames), (rec.groups, grp_frames)):
            if fname:
                df = io.read_parquet(out / state.CHUNKS / fname)
                if fname == rec.tokens:
                    check_rows(df, out / state.CHUNKS / fname, rec.answers, rec.n_rows or None)
                elif state.INDEX_COLUMN not in df.columns:
                    raise GmtsError(f"{out / state.CHUNKS / fname}: no {state.INDEX_COLUMN} column; the table was "
                                    "changed after it was recorded")
                frames.append(df[df[state.INDEX_COLUMN].isin(mine)])
    return (_concat(tok_frames, tables.TOKEN_COLUMNS), _concat(grp_frames),
            sorted(errors, key=lambda e: e["index"]))


def write_part(out: Path, rank: int, world_size: int, run_hash: str, attempt: int, share: Sequence[int],
               info: dict) -> Path:
    """Gather this rank's share from the chunk records into ``parts/part-RRRRR-of-WWWWW.*``.

    The ``.json`` (written last) lists the share's answers and errors; it marks the part complete.
    """
    records = state.read_chunks(out, run_hash)
    wanted = set(share)
    missing = wanted - set(state.owners(records))
    if missing:
        raise GmtsError(f"{out}: rank {rank}: {len(missing)} answer(s) of its share have no record in chunks/")
    tokens, groups, errors = gather_chunks(out, records, wanted)
    stem = state.part_stem(rank, world_size)
    d = out / state.PARTS
    meta = {"run_hash": run_hash, "attempt": attempt, "rank": rank, "world_size": world_size,
            "answers": sorted(int(i) for i in share), "errors": errors, "tokens": None, "groups": None, **info}
    if tokens is not None:
        meta["tokens"] = f"{stem}.parquet"
        io.atomic_write_parquet(d / meta["tokens"], tokens)
    if groups is not None:
        meta["groups"] = f"{stem}.groups.parquet"
        io.atomic_write_parquet(d / meta["groups"], groups)
    return io.atomic_write_json(d / f"{stem}.json", meta)


def parts_complete(out: Path, world_size: int, run_hash: str, attempt: int) -> list[dict] | None:
    """The parts' records when all ``world_size`` of this attempt exist, else None."""
    metas = []
    for r in range(world_size):
        m = state.read_part_meta(out, r, world_size)
        if not m or m.get("run_hash") != run_hash or m.get("attempt") != attempt:
            return None
        metas.append(m)
    return metas


def wait_for_parts(out: Path, world_size: int, run_hash: str, attempt: int, poll_s: float = 0.5) -> list[dict]:
    """Block (rank 0) until every rank's part exists. A rank that dies ends the job (torchrun)."""
    t0 = last = time.monotonic()
    while True:
        metas = parts_complete(out, world_size, run_hash, attempt)
        if metas is not None:
            return metas
        if time.monotonic() - last > 300:
            last = time.monotonic()
            n = sum(state.read_part_meta(out, r, world_size) is not None for r in range(world_size))
            log.info("waiting for the other ranks: %d of %d parts after %.0f s", n, world_size, last - t0)
        time.sleep(poll_s)


def assemble(out: Path, run_hash: str, n_answers: int, parts: list[dict] | None
             ) -> tuple[pd.DataFrame | None, pd.DataFrame | None, list[dict]]:
    """All rows, in single-process order: from ``parts`` when they cover every answer once, else
    straight from the chunk records. Raises when some answer has not been probed yet."""
    everything = set(range(n_answers))
    if parts is not None:
        covered = [i for m in parts for i in m["answers"]]
        if len(covered) == len(set(covered)) and set(covered) == everything:
            tok, grp = [], []
            for m in parts:
                if m.get("tokens"):
                    tok.append(check_rows(io.read_parquet(out / state.PARTS / m["tokens"]),
                                          out / state.PARTS / m["tokens"], m["answers"]))
                if m.get("groups"):
                    grp.append(io.read_parquet(out / state.PARTS / m["groups"]))
            errors = sorted((e for m in parts for e in m["errors"]), key=lambda e: e["index"])
            return _concat(tok, tables.TOKEN_COLUMNS), _concat(grp), errors
        log.warning("%s: the parts do not cover every answer once; merging from the records in chunks/", out)
    records = state.read_chunks(out, run_hash)
    missing = sorted(everything - set(state.owners(records)))
    if missing:
        raise GmtsError(f"{out}: {len(missing)} of {n_answers} answers are not probed yet (first: answer number "
                        f"{missing[0]}); run the same probe command again to finish the run")
    return gather_chunks(out, records, everything)


def write_merged_run(job: ProbeJob, out: Path, inputs: ProbeInputs, fp: state.Fingerprint,
                     parts: list[dict] | None, timings: dict, extra: dict,
                     extra_files: dict[str, Any] | None = None, work: Path | None = None) -> Path:
    """Merge the rows and write the final run directory (statistics, manifest, figures, report:
    :func:`gmts_analysis.run.finalize.write_result`).

    ``work`` is the work area (run.json, chunks/, parts/): ``out`` itself (default), or its
    sibling :func:`state.replacement_area` for a run started with ``--overwrite``, where the
    previous run stays complete at ``out`` until the finished directory replaces it in one
    rename; any failure leaves it as it was. When every answer failed, ``errors.jsonl`` is
    written into the work area and a :class:`GmtsError` raised.
    """
    t0 = time.perf_counter()
    answers, coefs = inputs.answers, inputs.coefs
    work = out if work is None else work
    tokens, groups, errors = _merged_tables(work, fp.run_hash, len(answers), parts)
    failed = {e["index"] for e in errors}
    keep = [i for i in range(len(answers)) if i not in failed]
    errors_text = jsonl_text(errors, default=str)
    if not keep:  # nothing to analyse: say so in one line, keep the reasons (and the work area)
        _refuse_all_failed(work, errors, errors_text, len(answers))
    ok_answers = [answers[i] for i in keep]
    ok_coefs = [coefs[i] for i in keep]
    timings = {**timings, "merge_s": time.perf_counter() - t0}
    result = kernel.ProbeResult(tokens=tokens, answers=tables.answers_table(ok_answers, ok_coefs),
                                grad_groups=groups, timings=timings)
    extra = {**extra, **_fingerprint_and_errors(fp, errors)}
    _write_finished(job, out, work, inputs, ok_answers, result, extra,
                    {**(extra_files or {}), ERRORS_FILE: errors_text})
    if errors:
        log.warning("%d answer(s) failed and were skipped: see %s", len(errors), out / ERRORS_FILE)
    return out


def _merged_tables(work: Path, run_hash: str, n_answers: int, parts: list[dict] | None
                   ) -> tuple[pd.DataFrame, pd.DataFrame | None, list[dict]]:
    """The run's rows in single-process order (:func:`assemble`) without the answer index column: the
    token table (an empty one when no row was probed) with its estimator columns, the per-group table
    of gradient norms (or None), and the errors in answer order."""
    tokens, groups, errors = assemble(work, run_hash, n_answers, parts)
    if tokens is None:
        tokens = tables.concat_columns([])
    tokens = tokens.drop(columns=[state.INDEX_COLUMN], errors="ignore")
    add_estimator_columns(tokens)
    if groups is not None:
        groups = groups.drop(columns=[state.INDEX_COLUMN])
    return tokens, groups, errors


def _refuse_all_failed(work: Path, errors: list[dict], errors_text: str, n_answers: int) -> NoReturn:
    """No answer is left to analyse: ``errors_text`` (the errors as JSON lines) written to the work area's
    ``errors.jsonl`` and a :class:`GmtsError` raised in one line, naming the first reason."""
    io.atomic_write_text(work / ERRORS_FILE, errors_text)
    first = errors[0]["reason"] if errors else "no answer"
    raise GmtsError(f"every answer failed ({len(errors)} of {n_answers}; first: {first}); "
                    f"the reasons are in {work / ERRORS_FILE}")


def _fingerprint_and_errors(fp: state.Fingerprint, errors: list[dict]) -> dict[str, Any]:
    """The manifest entries of the run's identity and its failed answers: run hash and fingerprint, the
    counts (all, still out of memory) and the first 100 (answer id, reason)."""
    return {"run_hash": fp.run_hash, "run_fingerprint": fp.to_json(), "n_errors": len(errors),
            "n_out_of_memory": sum(1 for e in errors if e.get("out_of_memory")),
            "errors": [{k: e[k] for k in ("answer_id", "reason")} for e in errors[:100]]}


def _write_finished(job: ProbeJob, out: Path, work: Path, inputs: ProbeInputs, ok_answers: list,
                    result: kernel.ProbeResult, extra: dict, files: dict[str, Any]) -> None:
    """The finished directory at ``out`` (:func:`gmts_analysis.run.finalize.write_result`, ``files``: name ->
    path or text), then the work area gone; until then the previous run (``--overwrite``) or the work area
    stays where it was."""
    def write() -> None:
        finalize_mod.write_result(job.config, job.probe, inputs.model, inputs.model_path, ok_answers, result, extra=extra,
                                  extra_files=files)

    if work != out:  # --overwrite: the finished directory replaces the previous run (kept until then)
        write()
        shutil.rmtree(work, ignore_errors=True)
    else:
        _with_work_area_aside(out, write)


def _with_work_area_aside(out: Path, write: Callable[[], None]) -> None:
    """Run ``write``, which builds the finished directory in a temporary sibling and renames it to ``out``,
    with the work area at ``out`` stepped aside (marked ours) meanwhile; it comes back if ``write`` fails
    (see :func:`state.recover_work_area`) and is removed once ``write`` succeeds."""
    if not io.is_ours(out, "work", out):
        io.mark_ours(out, "work", out)
    aside = io.fresh_sibling_name(out, state.WORK_STEM)
    os.replace(out, aside)
    try:
        write()
    except BaseException:
        if not os.path.lexists(out):
            os.replace(aside, out)
        raise
    shutil.rmtree(aside, ignore_errors=True)


#: exit status of ``gmts probe`` / ``gmts run`` when the run finished but dropped answers still out of memory
EXIT_OUT_OF_MEMORY = 3


def skipped_answers(out: Path) -> tuple[int, int, int]:
    """``(n_errors, n_out_of_memory, n_answers)`` of the finished run ``out`` from its manifest (the
    answers skipped, those among them still out of memory after the back-off, the answers kept);
    zeros for a manifest without them."""
    m = io.read_json(Path(out) / "manifest.json")
    return int(m.get("n_errors") or 0), int(m.get("n_out_of_memory") or 0), int(m.get("n_answers") or 0)


def skipped_line(out: Path) -> str | None:
    """The summary's line on skipped answers of the finished run ``out``, or ``None`` when none was
    skipped; it names those dropped for lack of memory (the exit status is then
    :data:`EXIT_OUT_OF_MEMORY`)."""
    n_err, n_oom, n_kept = skipped_answers(out)
    if not n_err:
        return None
    oom = (f", {n_oom} still out of memory after the back-off (exit status {EXIT_OUT_OF_MEMORY})"
           if n_oom else "")
    return (f"{n_err} of {n_err + n_kept} answers failed and were skipped{oom}: "
            f"the statistics leave them out; reasons in {Path(out) / ERRORS_FILE}")
