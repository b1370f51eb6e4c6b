"""A probe job, end to end: rollouts in, a run directory out (docs/definitions.md section 8).

``run_probe(cfg)`` loads the model and reads the rollouts as the API does
(:func:`gmts_analysis.probing.inputs.prepare_inputs`), probes every answer with
:func:`gmts_analysis.probing.kernel.probe_answer` (sharded across torchrun ranks when launched so,
recorded chunk by chunk so that a killed run resumes, failures in ``errors.jsonl``, the
run fingerprint in the manifest), and finishes the directory: the job's manifest entries
(:func:`gmts_analysis.run.sharding.run.finish_job`), the rows merged
(:func:`gmts_analysis.run.sharding.merge.write_merged_run`), statistics and files
(:func:`gmts_analysis.run.finalize.write_result`). ``gmts probe`` calls it.

``sample_and_probe(cfg, sampling)`` is ``gmts run``: it samples the toy domains
(:func:`gmts_analysis.api.sample`) into a work file beside the run directory, then runs the
same job on that file. Run again with the same arguments after a crash, it reuses the
work file (or samples the same rows again) and the job resumes from its chunk records.
The sampled rows are kept in the finished directory as ``rollouts.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.sampling.domains import sample_rows, sampling_options
from gmts_analysis.util import io
from gmts_analysis.util.atomic import atomic_write_jsonl
from gmts_analysis.util.io import to_json

if TYPE_CHECKING:
    from gmts_analysis.run.sharding.job import ProbeJob

SAMPLE_ROLLOUTS = "rollouts.jsonl"


def run_probe(cfg: ProbeConfig, extra: dict | None = None, extra_files: dict[str, Path] | None = None) -> Path:
    """Load, read, probe, compute statistics (and fidelity, figures, report); write ``cfg.out``.
    ``cfg`` is checked once, here (:meth:`gmts_analysis.run.sharding.ProbeJob.of`).

    One process, or every rank of a torchrun job (each takes a share of whole groups; rank 0
    merges). Work is recorded chunk by chunk in ``cfg.out``: the same command run again
    after a crash resumes; the finished files appear only once everything is done (see
    :mod:`gmts_analysis.run.sharding` and docs/scaling.md). ``extra`` adds manifest entries and
    ``extra_files`` (name -> path) files copied into the finished directory.
    """
    return _run(_job(cfg), extra, extra_files)


def _job(cfg: ProbeConfig) -> "ProbeJob":
    """The checked job of ``cfg`` (a :class:`gmts_analysis.run.sharding.ProbeJob`)."""
    from gmts_analysis.run.sharding import ProbeJob  # deferred: torch, pandas

    return ProbeJob.of(cfg)


def _run(job: "ProbeJob", extra: dict | None, extra_files: dict[str, Path] | None) -> Path:
    """:func:`gmts_analysis.run.sharding.run_sharded` of the checked ``job``."""
    from gmts_analysis.run.sharding import run_sharded  # deferred: torch, pandas

    return run_sharded(job, extra=extra, extra_files=extra_files)


SAMPLE_STEM = "gmts-sample"


def sample_work_dir(out: str | Path) -> Path:
    """Where ``gmts run`` keeps its sampled rollouts until the run is finished: a hidden sibling of
    ours (by its marker; :func:`gmts_analysis.util.io.ours_beside`), or the name a new one gets."""
    out = Path(out)
    found = io.ours_beside(out, "sample", SAMPLE_STEM)
    if found:
        return found[0]
    plain = out.parent / f".{out.name}.{SAMPLE_STEM}"
    return plain if not os.path.lexists(plain) else io.fresh_sibling_name(out, SAMPLE_STEM)


def _own_work_dir(out: str | Path) -> Path:
    """:func:`sample_work_dir`, created with our marker when absent; a look-alike without it
    (someone else's) is never written into or removed."""
    work = sample_work_dir(out)
    if not os.path.lexists(work):
        work.mkdir(parents=True)
        io.mark_ours(work, "sample", out)
    return work


def _sampled_rollouts(cfg: ProbeConfig, sampling: dict[str, Any], progress: bool) -> Path:
    """The rollouts file of this sampling: reused when a work file of the same sampling exists,
    else sampled and written (atomically) with its parameters beside it."""
    work = _own_work_dir(cfg.out)
    path, params = work / SAMPLE_ROLLOUTS, work / "sampling.json"
    key = {"model": cfg.model, **sampling}
    if path.exists() and params.exists():
        try:
            same = json.loads(params.read_text()) == json.loads(io.to_json(key))
        except (OSError, ValueError):
            same = False
        if same:
            return path
    opts = sampling_options(cfg.model, sampling["domains"], {
        "num_prompts": sampling["num_prompts"], "num_generations": sampling["group_size"],
        "temperature": sampling["temperature"], "max_completion_length": sampling["max_new_tokens"],
        "seed": sampling["seed"], "device": sampling["device"],
        **({"verifier": sampling["verifier"]} if sampling.get("verifier") else {})}, where="gmts run")
    rows = sample_rows(cfg.model, opts, progress=progress, offline=cfg.offline)
    atomic_write_jsonl(path, rows)
    io.atomic_write_json(params, key)
    return path


def sample_and_probe(cfg: ProbeConfig, sampling: dict[str, Any]) -> Path:
    """``gmts run``: sample (``sampling``: domains, num_prompts, group_size, temperature,
    max_new_tokens, seed, device) with ``cfg.model``, then the job :func:`run_probe` runs, on the rows,
    into ``cfg.out`` (``cfg.rollouts`` is set here). Returns ``cfg.out``. ``cfg`` is checked once, before
    anything is sampled. The whole job, sampling included, holds the run directory's lock (a second
    job on ``--out`` stops at once)."""
    job = _job(cfg)
    with io.exclusive_lock(cfg.out):
        return _sample_and_probe(cfg, job, sampling)


def _sample_and_probe(cfg: ProbeConfig, job: "ProbeJob", sampling: dict[str, Any]) -> Path:
    out = Path(cfg.out)
    key = json.loads(_json({"model": cfg.model, **sampling}))
    work = sample_work_dir(out)
    if (out / SAMPLE_ROLLOUTS).exists() and not io.is_ours(work, "sample", out) and not cfg.overwrite:
        # a finished gmts run: if it is this sampling, its rollouts.jsonl is the input again
        # (the job then finds the run complete, or refuses a different configuration)
        try:
            old = json.loads((out / "manifest.json").read_text()).get("sampling")
        except (OSError, ValueError):
            old = None
        if old == key:
            work = _own_work_dir(out)
            io.atomic_write_text(work / SAMPLE_ROLLOUTS, (out / SAMPLE_ROLLOUTS).read_text(encoding="utf-8"))
            io.atomic_write_json(work / "sampling.json", key)
    rollouts = _sampled_rollouts(cfg, sampling, progress=not cfg.quiet)
    extra = {"job": "gmts run", "sampling": key,
             **{k: sampling[k] for k in ("domains", "num_prompts", "group_size", "max_new_tokens")}}
    result = _run(job.recorded(rollouts=str(rollouts)), extra, {SAMPLE_ROLLOUTS: rollouts})
    if (out / "manifest.json").exists() and io.is_ours(work, "sample", out):
        _record_own_rollouts(out)
        shutil.rmtree(work, ignore_errors=True)
    return result


def _record_own_rollouts(out: Path) -> None:
    """The finished run names the rollouts it holds (``out/rollouts.jsonl``), not the work file they
    were sampled into: ``manifest["config"]["rollouts"]`` and ``manifest["rollouts_file"]``."""
    path = out / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    own = str(out / SAMPLE_ROLLOUTS)
    cfg, src = manifest.get("config"), manifest.get("rollouts")
    if (manifest.get("rollouts_file") == SAMPLE_ROLLOUTS and isinstance(cfg, dict) and cfg.get("rollouts") == own
            and (not isinstance(src, dict) or src.get("path") == own)):
        return
    if isinstance(cfg, dict):
        cfg["rollouts"] = own
    if isinstance(src, dict):  # the read's note named the work file, which is deleted next
        src["path"] = own
    manifest["rollouts_file"] = SAMPLE_ROLLOUTS  # relative to the run directory
    io.atomic_write_json(path, manifest)


def _json(obj: Any) -> str:
    return to_json(obj)
