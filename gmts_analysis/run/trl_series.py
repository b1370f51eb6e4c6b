"""``gmts series``: audit a TRL training run across its checkpoints.

Given a TRL output directory as TRL leaves it (:mod:`gmts_analysis.readers.trl_output`: ``checkpoint-N`` folders
by step, the base model as step 0, the loss the trainer trained read from its own arguments, never unpickled), and a
fixed set of held-out prompts, for every checkpoint:

1. **sample** ``num_generations`` answers to each held-out prompt with that checkpoint (the same seed at every
   checkpoint: common random numbers), scored by the verifier (``math_boxed`` by default);
2. **probe** them (:func:`gmts_analysis.run.job.run_probe`: a run directory ``step-NNNNN/`` without figures or report.html, resumable) with
   the trained loss, by the exact engine or the sketch (``auto`` chooses from the answers' lengths,
   :func:`gmts_analysis.engine.choice.choose_method`, and says why); where the sketch carries a checkpoint, an
   exact subset (``exact_subset`` answers) is probed too and their agreement recorded;
3. optionally (``own_batches``) probe the checkpoint on the batch it generated during training
   (``batches/step-NNNNN/``: the trainer's exact ids, :func:`gmts_analysis.readers.trl_output.own_batch`);
4. the **token view**: the first ``token_answers`` answers of the first checkpoint's sample, the same answers
   probed by every checkpoint (``tokens/step-NNNNN/``), so a token's share of its answer's gradient can be
   followed (:mod:`gmts_analysis.views.token_moves`).

Then ``compare/`` (``gmts compare`` of the ``step-*`` runs, its figures of the trends) and ``series.json``
(:class:`~gmts_analysis.run.series_types.SeriesRecord`; per checkpoint: pass@1 with a 95% CI over prompts, the
method and why, the sketch's agreement, seconds). Killed, the same command resumes: finished samples and runs are
reused.

The loop over checkpoints, each probed into its own folder and recorded, and the comparison are the series
service's (:func:`gmts_analysis.run.series.run_series`); this module gives it the TRL-specific parts: the training
output directory read (:mod:`gmts_analysis.readers.trl_output`), the held-out sampling and pass@1
(:mod:`gmts_analysis.run.heldout`), the trained loss from the run's own arguments
(:class:`~gmts_analysis.run.series_types.TrainedLoss`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import numpy as np

from gmts_analysis.core.trl_args import TrlLossArgs
from gmts_analysis.engine.choice import choose_method
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ProbeConfig, RunControl
from gmts_analysis.readers.sources import parse_steps
from gmts_analysis.readers.trl_output import (
    CHECKPOINT_RE,
    TrlOutput,
    check_checkpoint,
    defaulted_loss_fields,
    own_batch,
    probe_loss_options,
    read_trl_output,
    training_args,
    training_args_file,
)
from gmts_analysis.run.heldout import key_path, pass_at_1, read_jsonl, sample_answers
from gmts_analysis.run.series import SeriesStep, probe_checkpoint, run_series
from gmts_analysis.run.series_dir import check_series_out
from gmts_analysis.run.series_types import (
    SERIES_FILE,
    Agreement,
    CheckpointEntry,
    SeriesRecord,
    SeriesSettings,
    StepSeconds,
    TrainedLoss,
)
from gmts_analysis.sampling.generate import read_prompts
from gmts_analysis.util.atomic import atomic_write_jsonl
from gmts_analysis.util.files import read_json_object
from gmts_analysis.util.io import read_parquet
from gmts_analysis.views.token_moves import plot_pass1, write_token_moves

log = logging.getLogger(__name__)

#: the held-out answers' budget in tokens when neither --max-completion-length nor the run's arguments give one (the
#: audit's own fallback, said in its first log line; a GRPOConfig always records its max_completion_length)
DEFAULT_BUDGET = 256


def _steps_wanted(spec: str | None, have: list[int]) -> list[int]:
    if not spec:
        return have
    want = parse_steps(spec)
    got = [s for s in have if s in want]
    missing = sorted(set(want) - set(have)) if want is not None else []
    if missing:
        raise GmtsError(f"--steps {spec}: no checkpoint for step(s) {missing} (steps present: {have})")
    return got


@dataclasses.dataclass
class _Series:
    """What every checkpoint of one audit shares: the audit's settings and how it runs, the TRL output, the
    checkpoints audited, the held-out rows, the trained loss (with the sampling temperature), the completion budget
    and the output directory."""

    settings: SeriesSettings
    control: RunControl
    trl: TrlOutput
    ckpts: list[tuple[int, str]]
    rows: list[dict]
    prompts: str
    loss: TrainedLoss
    max_new: int
    out: Path
    loss_source: str
    defaulted: list[str]

    def at(self, step: int, checkpoint: str) -> _CheckpointProbe:
        """What every probe of checkpoint ``step`` shares."""
        return _CheckpointProbe(self.settings, self.control, self.loss, step, checkpoint)


@dataclasses.dataclass(frozen=True)
class _CheckpointProbe:
    """What every probe of one checkpoint shares (its held-out answers, the exact subset, its own batch, the token
    view): the audit's settings, how it runs, the trained loss, the step and the checkpoint."""

    settings: SeriesSettings
    control: RunControl
    loss: TrainedLoss
    step: int
    checkpoint: str

    def config(self, rollouts: Path, run_dir: Path, method: str) -> ProbeConfig:
        """The probe of ``rollouts`` into ``run_dir`` by ``method`` with the trained loss. The runs of a series
        draw no figures of their own (a report of a real model's run is megabytes): the comparison, the token view
        and pass@1 are drawn; ``gmts figures RUN`` draws any one run's."""
        s, rc, loss = self.settings, self.control, self.loss
        return ProbeConfig(model=self.checkpoint, rollouts=str(rollouts), out=str(run_dir), grad_norm=method,
                           probes=s.probes, seed=s.seed, threads=rc.threads, quiet=rc.quiet, figures=False,
                           overwrite=s.overwrite, truncate=s.truncate, fidelity=s.fidelity,
                           loss_type=loss.loss_type, clip_low=loss.clip_low, clip_high=loss.clip_high,
                           kl_beta=loss.kl_beta, kl_bias_correction=loss.kl_bias_correction,
                           importance_sampling_level=loss.importance_sampling_level,
                           temperature=loss.temperature, max_completion_length=loss.max_completion_length)


def _probe(job: _CheckpointProbe, rollouts: Path, run_dir: Path, method: str, extra: dict | None = None) -> Path:
    """Probe ``rollouts`` with the checkpoint of ``job`` into ``run_dir`` (:func:`~gmts_analysis.run.series.probe_checkpoint`)."""
    return probe_checkpoint(job.config(rollouts, run_dir, method), job.checkpoint, run_dir,
                            {"step": job.step, "checkpoint": job.checkpoint, "job": "gmts series", **(extra or {})})


def _agreement(sketch_dir: Path, exact_dir: Path) -> Agreement:
    """Spearman between the sketch's and exact norms on the answers both probed, and the median relative error."""
    from scipy.stats import spearmanr

    a = read_parquet(sketch_dir / "tokens.parquet")[["answer_id", "position", "grad_norm_logp"]]
    b = read_parquet(exact_dir / "tokens.parquet")[["answer_id", "position", "grad_norm_logp"]]
    m = a.merge(b, on=["answer_id", "position"], suffixes=("_sketch", "_exact"))
    if len(m) < 3:
        return Agreement.make(n_tokens=int(len(m)))
    x, y = m["grad_norm_logp_sketch"].to_numpy(), m["grad_norm_logp_exact"].to_numpy()
    rel = np.abs(x - y) / np.maximum(np.abs(y), 1e-30)
    return Agreement.make(n_tokens=int(len(m)), spearman=float(spearmanr(x, y).statistic),
                          median_rel_error=float(np.median(rel)))


def _keep_recorded_base(out: str, base: str | None, trl: TrlOutput) -> None:
    """A series made when step 0 was the training machine's ``model_path`` (before :func:`script_base` preferred
    the shipped name) goes on with that path, so that it resumes instead of probing step 0 again."""
    path = trl.script_args.get("model_path")
    if base is not None or not trl.checkpoints or trl.checkpoints[0][0] != 0 or not path:
        return
    try:
        old = SeriesRecord.read(Path(out) / SERIES_FILE).checkpoints
    except GmtsError:
        return
    if old and old[0].step == 0 and old[0].checkpoint == str(path):
        trl.checkpoints[0] = (0, str(path))
        trl.base_source = "gmts_script_args.json model_path (as this series recorded it)"


def _series_inputs(output_dir: str, s: SeriesSettings, rc: RunControl) -> _Series:
    """Read the TRL output directory, the trained loss (:func:`~gmts_analysis.readers.trl_output.training_args`:
    the run's ``gmts_training_args.json``, else the newest checkpoint's ``training_args.bin``, never unpickled)
    and the held-out prompts; check that ``--out`` is the series' own (:mod:`gmts_analysis.run.series_dir`)."""
    trl = read_trl_output(output_dir, s.base)
    _keep_recorded_base(s.out, s.base, trl)
    steps = _steps_wanted(s.steps, trl.steps)
    newest = next((p for st, p in reversed(trl.checkpoints) if st > 0), None)
    if newest is None:
        raise GmtsError(f"{output_dir}: holds only a checkpoint-0; nothing was trained to audit")
    src = training_args_file(newest)  # the run's gmts_training_args.json, else the newest checkpoint's .bin
    saved = training_args(newest)
    args = TrlLossArgs.of(saved)
    defaulted = defaulted_loss_fields(args)
    loss = TrainedLoss.from_dict(probe_loss_options(args, where=src), "loss")
    if defaulted:
        log.warning("%s: not a GRPO configuration (%s): the loss is TRL's defaults for %s; pass --temperature and "
                    "--max-completion-length if the run used others", src,
                    saved.saved_class or "no loss fields", ", ".join(defaulted))
    if s.temperature is not None:
        loss = dataclasses.replace(loss, temperature=s.temperature)  # the probe's log-probs at the sampling temperature
    prompts = s.prompts or (str(trl.heldout_prompts()) if trl.heldout_prompts() else None)
    if prompts is None:
        raise GmtsError(f"{output_dir}: no held-out prompts: pass --prompts FILE (the example script writes "
                        "problems_heldout.jsonl)")
    inputs = {"OUTPUT_DIR": output_dir, "--prompts": prompts,
              **({"the run's rollouts": str(trl.rollouts_dir)} if trl.rollouts_dir is not None else {}),
              **{f"checkpoint {st}": p for st, p in trl.checkpoints if Path(p).exists()}}
    for st, p in trl.checkpoints:  # every checkpoint checked before anything is loaded or written
        if st in steps and Path(p).is_dir() and CHECKPOINT_RE.match(Path(p).name):
            check_checkpoint(p)
    out = check_series_out(s.out, inputs, overwrite=s.overwrite)
    return _Series(settings=s, control=rc, trl=trl, ckpts=[(st, p) for st, p in trl.checkpoints if st in steps],
                   rows=read_prompts(prompts, limit=s.num_prompts), prompts=str(prompts), loss=loss,
                   max_new=s.max_completion_length or loss.max_completion_length or DEFAULT_BUDGET, out=out,
                   loss_source=str(src), defaulted=defaulted)
def _audit_checkpoint(ser: _Series, st: SeriesStep) -> CheckpointEntry:
    """One checkpoint: sample, choose the method, probe; the exact subset, its own batch and the token view as
    asked. Returns its ``series.json`` entry."""
    s, out, loss = ser.settings, ser.out, ser.loss
    step, path, tag = st.step, st.checkpoint, st.run
    job = ser.at(step, path)
    t0 = time.perf_counter()
    sample = out / "samples" / f"{tag}.jsonl"
    sample.parent.mkdir(parents=True, exist_ok=True)
    if s.overwrite:  # the cached answers may be a changed checkpoint's (their key names its path, not its weights)
        key_path(sample).unlink(missing_ok=True)
    answers = sample_answers(path, ser.rows, s.num_generations, temperature=loss.temperature,
                             max_new_tokens=ser.max_new, seed=s.seed, verifier=s.verifier, batch_size=s.batch_size,
                             progress=not ser.control.quiet, path=sample)
    t_sample = time.perf_counter() - t0
    lengths = [len(a["response_ids"]) for a in answers]
    method, why = choose_method(lengths, s.probes) if s.grad_norm == "auto" else (s.grad_norm,
                                                                                   "as asked (--grad-norm)")
    log.info("%s (%s): %s", tag, path, why)
    _probe(job, sample, out / tag, method)
    p1 = pass_at_1(answers, seed=s.seed)
    if p1["pass1"] is None:
        log.warning("%s: none of the %d held-out answers could be scored (%s): pass@1 is not given", tag,
                    p1["n_answers"], s.verifier)
    elif p1["n_unscorable"]:
        log.warning("%s: %d of %d held-out answers could not be scored (%s): pass@1 is over the other %d", tag,
                    p1["n_unscorable"], p1["n_answers"], s.verifier, p1["n_answers"] - p1["n_unscorable"])
    more: dict[str, Agreement | str | None] = {}
    if method == "sketch" and s.exact_subset > 0:
        more["sketch_vs_exact"] = _agreement(out / tag, _probe_subset(
            job, answers[: s.exact_subset], out / "exact_subset" / tag, "exact"))
    if s.own_batches:
        more["own_batch"] = _probe_own_batch(ser, job, method)
    if s.token_answers > 0:  # the first checkpoint's answers, the same file for every checkpoint
        _probe_subset(job, answers[: s.token_answers], out / "tokens" / tag, "exact",
                      rows_file=out / "tokens" / "answers.jsonl")
    seconds = StepSeconds.make(sample=round(t_sample, 1), total=round(time.perf_counter() - t0, 1))
    return CheckpointEntry.make(step=step, checkpoint=path, run=tag, method=method, why=why,
                                mean_answer_tokens=float(np.mean(lengths)), **p1, seconds=seconds, **more)


def _probe_subset(job: _CheckpointProbe, answers: list[dict], run_dir: Path, method: str,
                  rows_file: Path | None = None) -> Path:
    """Probe ``answers`` (written once to ``rows_file``, default ``run_dir`` + ``.jsonl``: a file that exists is
    kept) into ``run_dir``; returns ``run_dir``."""
    rows_file = rows_file or run_dir.with_suffix(".jsonl")
    if not rows_file.is_file() or job.settings.overwrite:
        rows_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_jsonl(rows_file, answers)
    _probe(job, rows_file, run_dir, method)
    return run_dir


def _probe_own_batch(ser: _Series, job: _CheckpointProbe, method: str) -> str | None:
    """Probe the checkpoint on the training batch it generated (``batches/step-NNNNN``), or None (logged) when
    the run logged none."""
    tag = f"step-{job.step:05d}"
    files = own_batch(ser.trl, job.step)
    if files is None:
        log.warning("%s: no training batch generated by this checkpoint was logged (rollouts_dir)", tag)
        return None
    bfile = ser.out / "batches" / f"{tag}.jsonl"
    if not bfile.is_file() or job.settings.overwrite:
        bfile.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_jsonl(bfile, [r for f in files for r in read_jsonl(f)])
    _probe(job, bfile, ser.out / "batches" / tag, method, extra={"own_batch": str(files[0])})
    return f"batches/{tag}"


def _record(ser: _Series, checkpoints: list[CheckpointEntry], token_moves: dict | None = None) -> SeriesRecord:
    """The ``series.json`` of the audit with the checkpoints finished so far (and the token view's summary once
    it is written)."""
    s = ser.settings
    return SeriesRecord.make(
        output_dir=str(ser.trl.root), base_source=ser.trl.base_source, prompts=ser.prompts,
        num_prompts=len(ser.rows), num_generations=s.num_generations, temperature=ser.loss.temperature,
        max_completion_length=ser.max_new, seed=s.seed, verifier=s.verifier, loss=ser.loss,
        loss_source=ser.loss_source, loss_defaulted=ser.defaulted, checkpoints=list(checkpoints),
        **({"token_moves": token_moves} if token_moves is not None else {}))


def _write_views(ser: _Series, checkpoints: list[CheckpointEntry]) -> dict | None:
    """The token view and the pass@1 figure (two checkpoints at least; the comparison is the series service's).
    Returns the token view's summary, or None when none was made."""
    s = ser.settings
    if len(ser.ckpts) < 2:
        return None
    moves = None
    if s.token_answers > 0:
        moves = write_token_moves([ser.out / "tokens" / f"step-{st:05d}" for st, _ in ser.ckpts], ser.out / "tokens",
                                  figures=s.figures)
    if s.figures:
        plot_pass1([c.to_dict() for c in checkpoints], ser.out / "pass1.png")
    return moves


#: seconds per answer token of the exact probe per 1e8 parameters on one CPU thread: SmolLM2-135M's exact probe
#: ran at 0.8 tokens/s on 2 cores (issue 46), 2 x 1.25 s / 1.35 = 1.85 (a rough figure; a GPU is far faster)
EXACT_THREAD_SECONDS_PER_TOKEN_1E8 = 1.85


def _parameters(model: str) -> int | None:
    """A decoder's parameter count from its config.json (embeddings + layers of attention and MLP; no load), or
    None when the config does not say."""
    try:
        c = read_json_object(Path(model) / "config.json")
        d, n, v = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
        ff = int(c.get("intermediate_size") or 4 * d)
    except (GmtsError, KeyError, TypeError, ValueError, OSError):
        return None
    return v * d + n * (4 * d * d + 3 * d * ff)


def estimated_cost(ser: _Series) -> str:
    """One line, said before the audit starts: the answer tokens it samples and probes (at most: every answer at
    the budget), a rough time of the exact probe (:data:`EXACT_THREAD_SECONDS_PER_TOKEN_1E8`), and the options
    that cut it."""
    s = ser.settings
    k = len(ser.ckpts)
    answers = len(ser.rows) * s.num_generations
    per = answers + min(s.token_answers, answers) + (min(s.exact_subset, answers) if s.grad_norm != "exact" else 0)
    tokens = k * per * ser.max_new
    line = (f"estimated cost: {k} checkpoints x ({answers} held-out answers + {min(s.token_answers, answers)} token-view"
            f" answers) x up to {ser.max_new} tokens = up to {tokens:,} answer tokens sampled and probed")
    params = _parameters(ser.ckpts[-1][1]) if ser.ckpts else None
    if params:
        threads = ser.control.threads or os.cpu_count() or 1
        sec = tokens * EXACT_THREAD_SECONDS_PER_TOKEN_1E8 * params / 1e8 / threads
        when = f"{sec / 3600:.1f} h" if sec >= 3600 else f"{sec / 60:.1f} min" if sec >= 60 else f"{sec:.0f} s"
        line += (f"; the exact probe of a {params:,}-parameter model on {threads} CPU thread(s): up to ~{when} "
                 "(rough; a GPU is far faster, the sketch cheaper for long answers)")
    return line + ("; to cut it: fewer --num-prompts / --num-generations / --token-answers, a smaller "
                   "--max-completion-length, fewer --steps, or --grad-norm sketch")


def audit_series(output_dir: str, s: SeriesSettings, rc: RunControl) -> Path:
    """Audit the TRL output directory ``output_dir`` (module docstring) into ``s.out``, its probes run as ``rc``
    says (threads, progress); returns ``s.out``."""
    ser = _series_inputs(output_dir, s, rc)
    loss = ser.loss
    log.info("series of %d checkpoints (steps %s; base from %s), %d held-out prompts x %d answers, loss %s, "
             "temperature %g, %d tokens", len(ser.ckpts), [c[0] for c in ser.ckpts], ser.trl.base_source or "none",
             len(ser.rows), s.num_generations, loss.loss_type, loss.temperature, ser.max_new)
    log.info("%s", estimated_cost(ser))
    steps = [SeriesStep(st, p, f"step-{st:05d}") for st, p in ser.ckpts]
    entries = run_series(steps, ser.out, lambda i, st: _audit_checkpoint(ser, st),
                         record=lambda done: _record(ser, done).write(ser.out),  # a killed audit keeps them
                         figures=s.figures, compare_from=2)
    _record(ser, entries, _write_views(ser, entries)).write(ser.out)
    return ser.out
