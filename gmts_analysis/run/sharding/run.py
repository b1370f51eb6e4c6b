"""A probe run on one process or many (torchrun), resumable, merged by rank 0.

Steps, on every rank unless said:

1. rank 0 fingerprints the run and inspects ``out`` (fresh, resume, complete, or refuse);
   every rank gets its decision;
2. load the model on this rank's device, read the rollouts, compute advantages and
   aggregation weights from the whole file (batch-wide values on every rank), as the API does
   (:func:`gmts_analysis.probing.inputs.prepare_inputs`);
3. rank 0 creates or reopens the work area;
4. take the length-balanced share of whole groups (:func:`shard_answers`), skip the
   answers some chunk record already holds, probe the rest chunk by chunk, and write
   this rank's part;
5. rank 0 waits for every part and finishes the run (the other ranks wait for it): :func:`finish_job` (the job's manifest
   entries) -> :func:`merge.write_merged_run` (rows in single-process order, errors, the work
   area) -> :func:`gmts_analysis.run.finalize.write_result` (statistics, manifest, files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.probing.inputs import ProbeInputs, prepare_inputs
from gmts_analysis.probing.preflight import check_before_probe
from gmts_analysis.readers.models import resolve_model_path
from gmts_analysis.readers.sources import rollout_files
from gmts_analysis.run.sharding import merge, state
from gmts_analysis.run.sharding.context import (
    DistContext,
    broadcast_from_main,
    context_from_env,
    process_group,
    rank_device,
)
from gmts_analysis.run.sharding.job import ProbeJob
from gmts_analysis.run.sharding.shard import shard_answers
from gmts_analysis.run.sharding.worker import answers_per_chunk, probe_share
from gmts_analysis.util import io

log = logging.getLogger("gmts_analysis.run.sharding")


def check_inputs(cfg: ProbeConfig) -> None:
    """Errors any rank can tell before touching the disk, besides the options (checked once, where the job
    is made: :meth:`ProbeJob.of`): ``--out`` given, the rollouts file exists, ``--steps`` names steps of
    it, ``--out`` is writable and holds neither input. ``cfg``: the job's record."""
    if cfg.out is None:
        raise GmtsError("--out: an output directory is required")
    if not Path(cfg.rollouts).exists():
        raise GmtsError(f"{cfg.rollouts}: rollouts file not found")
    rollout_files(cfg.rollouts, cfg.steps)  # a file, or a directory of per-step files
    io.check_output_location(cfg.out, {"--rollouts": cfg.rollouts, "--model": resolve_model_path(cfg.model)})


def load_inputs(job: ProbeJob, device: str, rollouts_sha256: str | None = None) -> ProbeInputs:
    """The job's inputs on this rank (:func:`gmts_analysis.probing.inputs.prepare_inputs`): ``--model``
    loaded on ``device``, ``--rollouts`` read (``rollouts_sha256``: the fingerprint's, not hashed
    again), answers checked, coefficients computed; truncation counts logged."""
    cfg = job.config
    return prepare_inputs(cfg.model, cfg.rollouts, job.probe, offline=cfg.offline, device=device,
                          rollouts_sha256=rollouts_sha256, log=log)


@contextlib.contextmanager
def _log_level(name: str, level: int) -> Any:
    """Set logger ``name``'s level for the block, then restore it."""
    lg = logging.getLogger(name)
    old = lg.level
    lg.setLevel(level)
    try:
        yield lg
    finally:
        lg.setLevel(old)


def _on_main(ctx: DistContext, fn: Any) -> Any:
    """Run ``fn`` on rank 0 and give every rank its result; a GmtsError is raised on every rank."""
    msg = None
    if ctx.is_main:
        try:
            msg = ("ok", fn())
        except GmtsError as e:
            msg = ("error", str(e))
        except Exception as e:  # tell the others before failing, so they do not wait forever
            broadcast_from_main(ctx, ("error", f"rank 0 failed: {type(e).__name__}: {e}"))
            raise
    msg = broadcast_from_main(ctx, msg)
    if msg[0] == "error":
        raise GmtsError(msg[1])
    return msg[1]


def run_sharded(job: ProbeJob, ctx: DistContext | None = None, extra: dict | None = None,
                extra_files: dict[str, Path] | None = None) -> Path:
    """Probe the job's rollouts with its model into its ``--out`` on this rank; rank 0 merges.

    ``job``: the checked job (:meth:`ProbeJob.of`). With no torchrun environment this is one process
    doing everything. Returns ``--out``.
    ``extra`` (manifest entries) and ``extra_files`` (name -> path of a file copied in) go into
    the finished directory (``gmts run`` records its sampling and the sampled rollouts so); both
    are kept in ``run.json`` so that ``gmts merge`` finishes the same directory.
    """
    ctx = ctx or context_from_env()
    check_inputs(job.config)
    out = Path(job.config.out)
    with process_group(ctx), contextlib.ExitStack() as held:
        if not ctx.is_main:  # progress and info lines on rank 0 only (levels restored on exit)
            _quiet_logs(held)
        t_start = time.perf_counter()
        # rank 0 holds the run directory's lock for the whole job: a second job on it stops here
        _on_main(ctx, lambda: str(held.enter_context(io.exclusive_lock(out))))
        status, fp = _on_main(ctx, lambda: _inspect_out(job.config, out))
        if status == "complete":
            log.warning("%s: this run is already complete (same model, rollouts and configuration); nothing to do",
                        out)
            return out
        device = rank_device(ctx, job.probe.device)
        inputs = load_inputs(job, device, fp.rollouts_sha256)
        job = _chunked_and_checked(job, ctx, inputs, out)
        attempt, work = _open_work_area(job.config, ctx, out, fp, status, extra, extra_files)
        _probe_into_part(job, ctx, inputs, fp, work, attempt, device)

        def finish() -> str:
            parts = merge.wait_for_parts(work, ctx.world_size, fp.run_hash, attempt)
            return str(finish_job(job, out, inputs, fp, parts, time.perf_counter() - t_start, ctx.world_size,
                                  extra, extra_files, work=work))

        # the other ranks wait for rank 0 to finish the run (its error is theirs), so that every rank's exit
        # status tells how the run ended (gmts probe: 3 when answers were dropped out of memory)
        return Path(_on_main(ctx, finish) if ctx.distributed else finish())


def _quiet_logs(held: contextlib.ExitStack) -> None:
    """On a rank other than 0: the probe's progress and the job's info lines off until ``held`` closes."""
    held.enter_context(_log_level("gmts_analysis.probing.kernel", logging.ERROR))
    held.enter_context(_log_level("gmts_analysis.run.sharding", logging.WARNING))


def _inspect_out(cfg: ProbeConfig, out: Path) -> tuple[str, state.Fingerprint]:
    """(rank 0) The run's fingerprint and what to do with ``out`` (:func:`state.inspect_directory`:
    ``fresh``, ``resume``, ``complete`` or ``overwrite``), stale siblings of killed jobs cleaned first."""
    fp = state.run_fingerprint(cfg)
    io.clean_stale_siblings(out)
    finishing = {k: getattr(cfg, k) for k in state.FINISH_FIELDS}
    return state.inspect_directory(out, fp, cfg.overwrite, finishing), fp


def _chunked_and_checked(job: ProbeJob, ctx: DistContext, inputs: ProbeInputs, out: Path) -> ProbeJob:
    """``job`` with ``--answers-per-chunk`` auto resolved for the run (the same on every rank), once every
    need knowable before the model runs (memory, disk) is checked on rank 0 (refused on every rank)."""
    # recorded so, not fingerprinted: a run started with another value (an old run's 16) resumes as it is
    job = job.recorded(answers_per_chunk=answers_per_chunk(job.config.answers_per_chunk, len(inputs.answers),
                                                           ctx.world_size))
    _on_main(ctx, lambda: check_before_probe(job.probe.kernel.engine, inputs.model, inputs.answers, out,
                                             job.config.figures))
    return job


def _open_work_area(cfg: ProbeConfig, ctx: DistContext, out: Path, fp: state.Fingerprint, status: str,
                    extra: dict | None, extra_files: dict[str, Path] | None) -> tuple[int, Path]:
    """(rank 0, given to every rank) This attempt's number and the work area, created or reopened
    (:func:`state.prepare_directory`): ``out`` itself, or beside it under --overwrite (the previous run
    kept until the end); ``extra`` and ``extra_files`` are kept there for the finish."""
    finishing = {"extra": extra or {}, "extra_files": {k: str(v) for k, v in (extra_files or {}).items()}}
    attempt, work = _on_main(ctx, lambda: state.prepare_directory(out, fp, cfg, status, ctx.world_size,
                                                                 finishing))
    return attempt, Path(work)


def _probe_into_part(job: ProbeJob, ctx: DistContext, inputs: ProbeInputs, fp: state.Fingerprint, work: Path,
                     attempt: int, device: str) -> None:
    """This rank's length-balanced share of whole groups (:func:`shard_answers`): the answers no chunk
    record holds yet probed chunk by chunk into ``work``, then the share written as this rank's part
    (:func:`merge.write_part`, with its probe time in seconds, answers and tokens probed, device)."""
    share = shard_answers(inputs.answers, ctx.world_size)[ctx.rank]
    done = state.owners(state.read_chunks(work, fp.run_hash))
    todo = [i for i in share if i not in done]
    if ctx.is_main:
        _log_probing(inputs, device, ctx, len(done))
    summary = probe_share(inputs.model, inputs.tokenizer, inputs.answers, inputs.coefs, todo, job.probe.kernel,
                          job.config.answers_per_chunk, work, fp.run_hash, ctx, attempt,
                          progress=ctx.is_main and not job.config.quiet)
    merge.write_part(work, ctx.rank, ctx.world_size, fp.run_hash, attempt, share,
                     {"probe_wall_s": summary.seconds, "n_probed": summary.n_answers,
                      "n_tokens_probed": summary.n_tokens, "device": device})


def _log_probing(inputs: ProbeInputs, device: str, ctx: DistContext, n_done: int) -> None:
    """The job's opening line: answers, tokens, model class, device, ranks, and the answers a resumed
    run already holds (``n_done``)."""
    answers = inputs.answers
    log.info("probing %d answers (%d tokens) with %s on %s%s%s", len(answers),
             sum(a.length for a in answers), type(inputs.model).__name__, device,
             f", {ctx.world_size} ranks" if ctx.distributed else "",
             f"; resuming: {n_done} answers already done" if n_done else "")


def finish_job(job: ProbeJob, out: Path, inputs: ProbeInputs, fp: state.Fingerprint, parts: list[dict] | None,
               wall_s: float, world_size: int, more: dict | None = None,
               extra_files: dict[str, Path] | None = None, work: Path | None = None) -> Path:
    """The job's last step (rank 0): its manifest entries (timings, truncation counts, the rollouts
    note, the distribution record, then ``more``), then :func:`merge.write_merged_run` writes the run
    (``work``: the work area, ``out`` unless the run replaces a previous one: :func:`state.work_area`)."""
    work = out if work is None else work
    records = state.read_chunks(work, fp.run_hash)
    n_tok = sum(r.n_tokens for r in records)
    probe_s = sum(r.seconds for r in records)
    st = state.read_state(work)
    timings = {"load_s": inputs.load_s, "probe_s": probe_s,
               "tokens_per_s": n_tok / probe_s if probe_s > 0 else float("nan"), "wall_s": wall_s}
    extra = {
        **inputs.truncation_counts(),
        "rollouts": inputs.source,
        "distributed": {
            "world_size": world_size,
            "attempts": st.get("attempts", []),
            "ranks": [{k: m.get(k) for k in ("rank", "device", "probe_wall_s", "n_probed", "n_tokens_probed")}
                      for m in parts or []],
            "answers_per_chunk": job.config.answers_per_chunk,
            "n_chunks": len(records),
        },
    }
    extra.update(more or {})
    return merge.write_merged_run(job, out, inputs, fp, parts, timings, extra, extra_files, work=work)


def merge_run(run_dir: str | Path, device: str = "auto", figures: bool | None = None,
              fidelity: str | None = None, quiet: bool = False) -> Path:
    """``gmts merge RUN_DIR``: finish an unfinished run whose answers are all probed.

    Uses the parts when every rank of the last attempt wrote one, else the chunk records.
    The model and rollouts must still match the run's fingerprint.
    """
    out = Path(run_dir)
    if not out.is_dir() and not state.work_area_sibling(out).is_dir():  # (an existing one is ours)
        raise GmtsError(f"{out}: no such run directory")
    with io.exclusive_lock(out):  # no probe or merge may work on it meanwhile
        io.clean_stale_siblings(out)
        st = state.read_state(out)
        fields = {f.name for f in dataclasses.fields(ProbeConfig)}
        cfg = ProbeConfig(**{k: v for k, v in st["config"].items() if k in fields})
        cfg = dataclasses.replace(cfg, out=str(out), device=device, quiet=quiet,
                                  figures=cfg.figures if figures is None else figures,
                                  fidelity=cfg.fidelity if fidelity is None else fidelity)
        job = ProbeJob.of(cfg)
        check_inputs(job.config)
        return _merge_locked(job, out, st, device)


def _merge_locked(job: ProbeJob, out: Path, st: dict, device: str) -> Path:
    fp = state.run_fingerprint(job.config)
    if fp.run_hash != st.get("run_hash"):
        why = "; ".join(fp.differences(st.get("fingerprint") or {}))
        raise GmtsError(f"{out}: the model or rollouts changed since the run started ({why})")
    t0 = time.perf_counter()
    inputs = load_inputs(job, rank_device(DistContext(), device), fp.rollouts_sha256)
    attempts = st.get("attempts") or [{}]
    world = int(attempts[-1].get("world_size", 1))
    parts = merge.parts_complete(out, world, fp.run_hash, len(attempts))
    done = st.get("finish") or {}
    return finish_job(job, out, inputs, fp, parts, time.perf_counter() - t0, world, done.get("extra"),
                      {k: Path(v) for k, v in (done.get("extra_files") or {}).items()})
