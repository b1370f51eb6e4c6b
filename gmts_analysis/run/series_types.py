"""The typed parts of a checkpoint-series audit (``gmts series``): its settings, the loss it probes with, and
``series.json``.

- :class:`SeriesSettings`: what the audit does, each option declared once (:func:`~gmts_analysis.options.fields.opt`):
  ``gmts series``'s flags are generated from it and the job (:func:`gmts_analysis.run.trl_series.audit_series`)
  takes it typed, beside :class:`~gmts_analysis.options.config.RunControl` (threads, progress).
- :class:`TrainedLoss`: the loss a TRL run trained, as the probe's options (``series.json``'s ``loss``), read from
  the run's own arguments (:func:`gmts_analysis.readers.trl_output.probe_loss_options`).
- :class:`SeriesRecord`: ``series.json``, typed as ``stats.json`` is (:mod:`gmts_analysis.analysis.stats_types`,
  whose :class:`~gmts_analysis.analysis.stats_types.Record` it builds on): :meth:`SeriesRecord.read` gives
  attributes, :meth:`SeriesRecord.write` is the one place the file is written, and a series.json read and written
  again keeps its keys, their order and their values (a key an older series.json lacks stays absent; a key this
  module does not know is kept). One :class:`CheckpointEntry` per checkpoint.

This module imports nothing heavy: ``gmts --help`` builds its flags from :class:`SeriesSettings`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from gmts_analysis.analysis.stats_types import Record
from gmts_analysis.errors import GmtsError
from gmts_analysis.options import checks
from gmts_analysis.options.fields import opt
from gmts_analysis.util.atomic import atomic_write_json
from gmts_analysis.util.files import read_json_object

__all__ = ["Agreement", "CheckpointEntry", "SERIES_FILE", "SeriesRecord", "SeriesSettings", "StepSeconds",
           "TrainedLoss"]

SERIES_FILE = "series.json"


@dataclass
class SeriesSettings:
    """What ``gmts series OUTPUT_DIR`` does (its flags; the training output directory is positional, and threads
    and progress are :class:`~gmts_analysis.options.config.RunControl`'s). ``batch_size`` is not a flag.

    The annotations are the flags' value types (``int``, ``float``, ``str``, ``bool``: the parser reads them); a
    default of None means "not given"."""

    out: str = opt(None, "output directory (default: runs/series-YYYYmmdd-HHMMSS)", group="output", metavar="DIR",
                   check=checks.output_path)
    base: str = opt(None, "the base model, step 0 (default: the model the example script recorded; without "
                    "one the series starts at the first checkpoint)", group="inputs", metavar="MODEL",
                    check=checks.model)
    prompts: str = opt(None, "held-out prompts, JSONL with 'prompt' and 'solution' (default: the output "
                       "directory's problems_heldout.jsonl, written by examples/trl_grpo_word_problems.py)",
                       group="inputs", metavar="FILE", check=checks.input_file)
    num_prompts: int = opt(16, "held-out prompts used (the first N)", group="inputs", metavar="PROMPTS",
                           check=checks.int_at_least(1))
    num_generations: int = opt(4, "answers per prompt at every checkpoint", group="inputs", metavar="G",
                               check=checks.int_at_least(2, "a group needs a baseline"))
    temperature: float = opt(None, "sampling temperature (default: the trainer's)", group="RL objective",
                             metavar="TAU", check=checks.positive_finite)
    max_completion_length: int = opt(None, "generation budget (default: the trainer's)", group="inputs",
                                     metavar="TOKENS", check=checks.int_at_least(1))
    verifier: str = opt("math_boxed", "reward of the held-out answers", group="inputs", metavar="NAME",
                        check=checks.verifier)
    grad_norm: str = opt("auto", "exact | sketch | auto: the cheaper of the two for the answers' lengths (said "
                         "per checkpoint)", choices=("auto", "exact", "sketch"), group="gradient engine")
    probes: int = opt(16, "sketch directions K", group="gradient engine", metavar="K", check=checks.probes)
    exact_subset: int = opt(4, "where the sketch runs, also probe this many answers exactly and record the "
                            "agreement (0: none)", group="gradient engine", metavar="ANSWERS",
                            check=checks.int_at_least(0))
    own_batches: bool = opt(False, "also probe each checkpoint on the training batch it generated (the trainer's "
                            "rollouts_dir)", group="inputs")
    token_answers: int = opt(8, "answers of the first checkpoint probed by every checkpoint, for the token view "
                             "(0: none)", group="inputs", metavar="ANSWERS", check=checks.int_at_least(0))
    steps: str = opt(None, "only these steps: '0,20,40' or ranges '0-40'", group="inputs", metavar="STEPS",
                     check=checks.step_spec)
    seed: int = opt(0, "sampling seed (the same at every checkpoint) and the sketch's", group="run control",
                    metavar="INT", check=checks.seed)
    figures: bool = opt(True, "draw the comparison's, the token view's and pass@1's figures", group="output",
                        flag_off="--no-figures", help_off="skip figures (default: off)")
    overwrite: bool = opt(False, "redo the runs of an existing series of gmts (default: resume it, reusing its "
                          "finished samples and runs); someone else's folder is refused whatever this says",
                          group="output")
    truncate: bool = opt(False, "cut answers that do not fit the model's context instead of failing",
                         group="inputs")
    fidelity: str = opt("auto", "update fidelity of each checkpoint's probe (needs its gradients in memory): auto = "
                        "on under 100k tokens when they fit", choices=("auto", "on", "off"), group="output")
    batch_size: int = opt(32, "held-out answers generated together", cli=False)


@dataclass
class TrainedLoss(Record):
    """The loss a TRL run trained, as the probe's options (:class:`~gmts_analysis.options.config.ProbeOptions`
    fields of the same names): TRL's ``loss_type``, the PPO clip epsilons, the KL weight and TRL's bias
    correction (``on`` / ``off``), the importance-sampling level, the sampling temperature tau and the completion
    budget in tokens (``None``: none recorded). ``series.json``'s ``loss``."""

    KEYS: ClassVar = ("loss_type", "clip_low", "clip_high", "kl_beta", "kl_bias_correction",
                      "importance_sampling_level", "temperature", "max_completion_length")
    loss_type: str | None = None
    clip_low: float | None = None
    clip_high: float | None = None
    kl_beta: float | None = None
    kl_bias_correction: str | None = None
    importance_sampling_level: str | None = None
    temperature: float | None = None
    max_completion_length: int | None = None


@dataclass
class StepSeconds(Record):
    """``checkpoints[i].seconds``: wall-clock seconds of the checkpoint's sampling and of all its work."""

    KEYS: ClassVar = ("sample", "total")
    sample: float | None = None
    total: float | None = None


@dataclass
class Agreement(Record):
    """``checkpoints[i].sketch_vs_exact``: the sketch's per-token norms against the exact ones on the answers both
    probed: tokens compared, Spearman, the median relative error (the last two absent under 3 tokens)."""

    KEYS: ClassVar = ("n_tokens", "spearman", "median_rel_error")
    n_tokens: int | None = None
    spearman: float | None = None
    median_rel_error: float | None = None


#: the keys :func:`gmts_analysis.run.heldout.pass_at_1` gives, in its order (the reward audit's answer shares
#: among them; ``pass1_refused`` and ``caution`` only where they apply)
PASS1_KEYS = ("pass1", "ci_low", "ci_high", "se", "n_answers", "n_prompts", "zero_variance_groups", "boxed_share",
              "truncated_share", "modal_answer", "modal_answer_share", "modal_solution_share", "n_unscorable",
              "pass1_refused", "caution")


def _load(cls: type[Record]) -> Any:
    return lambda v, where: cls.from_dict(v, where)


def _load_list(cls: type[Record]) -> Any:
    def read(v: Any, where: str) -> list:
        if not isinstance(v, list):
            raise GmtsError(f"{SERIES_FILE} field {where}: expected a list, got {type(v).__name__}")
        return [cls.from_dict(x, f"{where}[{i}]") for i, x in enumerate(v)]

    return read


@dataclass
class CheckpointEntry(Record):
    """One checkpoint of the audit (``series.json``'s ``checkpoints[i]``): its step, path and run folder
    (``step-NNNNN``), the gradient-norm method and why, the answers' mean length in tokens, pass@1 with its 95% CI
    and the reward audit's answer shares (:data:`PASS1_KEYS`), seconds, and where asked the sketch's agreement
    with the exact norms and the folder of its own training batch (``None``: none logged)."""

    KEYS: ClassVar = ("step", "checkpoint", "run", "method", "why", "mean_answer_tokens", *PASS1_KEYS, "seconds",
                      "sketch_vs_exact", "own_batch")
    LOAD: ClassVar = {"seconds": _load(StepSeconds), "sketch_vs_exact": _load(Agreement)}
    step: int | None = None
    checkpoint: str | None = None
    run: str | None = None
    method: str | None = None
    why: str | None = None
    mean_answer_tokens: float | None = None
    pass1: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    se: float | None = None
    n_answers: int | None = None
    n_prompts: int | None = None
    zero_variance_groups: float | None = None
    boxed_share: float | None = None
    truncated_share: float | None = None
    modal_answer: str | None = None
    modal_answer_share: float | None = None
    modal_solution_share: float | None = None
    n_unscorable: int | None = None
    pass1_refused: str | None = None
    caution: str | None = None
    seconds: StepSeconds = field(default_factory=StepSeconds)
    sketch_vs_exact: Agreement = field(default_factory=Agreement)
    own_batch: str | None = None


@dataclass
class SeriesRecord(Record):
    """A whole ``series.json``: the audit's inputs (the training output directory, where its base model came
    from, the held-out prompts and how many, answers per prompt, the sampling temperature and budget, the seed,
    the verifier), the trained loss and where it was read (``loss_defaulted``: the loss fields TRL's defaults
    stood in for), one :class:`CheckpointEntry` per checkpoint, and the token view's summary
    (:func:`gmts_analysis.views.token_moves.write_token_moves`; two checkpoints at least)."""

    KEYS: ClassVar = ("output_dir", "base_source", "prompts", "num_prompts", "num_generations", "temperature",
                      "max_completion_length", "seed", "verifier", "loss", "loss_source", "loss_defaulted",
                      "checkpoints", "token_moves")
    LOAD: ClassVar = {"loss": _load(TrainedLoss), "checkpoints": _load_list(CheckpointEntry)}
    output_dir: str | None = None
    base_source: str | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    num_generations: int | None = None
    temperature: float | None = None
    max_completion_length: int | None = None
    seed: int | None = None
    verifier: str | None = None
    loss: TrainedLoss = field(default_factory=TrainedLoss)
    loss_source: str | None = None
    loss_defaulted: list[str] = field(default_factory=list)
    checkpoints: list[CheckpointEntry] = field(default_factory=list)
    token_moves: dict = field(default_factory=dict)

    @classmethod
    def read(cls, path: str | os.PathLike) -> SeriesRecord:
        """The record of a series.json file (errors name the file and the field)."""
        try:
            return cls.from_dict(read_json_object(path), "")
        except GmtsError as e:
            msg = str(e)
            for name in ("stats.json", SERIES_FILE):  # Record's messages name the file generically
                if msg.startswith(f"{name} field"):
                    msg = f"{path}{msg[len(name):]}"
            raise GmtsError(msg) from None

    def write(self, out: str | os.PathLike) -> Path:
        """Write this record as ``out/series.json`` (atomically, NaN as null): the one writer of the file."""
        return atomic_write_json(Path(out) / SERIES_FILE, self.to_dict())
