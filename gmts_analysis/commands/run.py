"""``gmts run``: the main job on the embedded default.

Samples groups of answers from a model (default: the shipped ``small`` policy) on the toy
domains, or, for a real instruct model (``--model smollm2``, a GGUF file, any checkpoint that is not a
toy policy), on grade-school word problems (:mod:`gmts_analysis.sampling.wordproblems`; the ``word`` domain, with
its own default size, :data:`WORD_DEFAULTS`), then runs the same job as ``gmts probe`` on them (:func:`gmts_analysis.run.job.sample_and_probe`:
resumable chunk records, run fingerprint, ``errors.jsonl``), and prints within-answer vs
cross-answer Spearman for entropy and gmts, overall and per domain. Killed, the same
command (same ``--out``) resumes.
"""

from __future__ import annotations

from pathlib import Path

from gmts_analysis.options.command import Command
from gmts_analysis.options.config import ProbeConfig, RunControl, SamplingOptions
from gmts_analysis.readers.models import ALIASES
from gmts_analysis.sampling import domains as _sampling

DEFAULT_DOMAINS = ",".join(_sampling.DEFAULT_DOMAINS)
#: the toy world's sampling defaults (the shipped policies; max_completion_length None = the policy card's)
TOY_DEFAULTS = {"num_prompts": 8, "num_generations": 8, "temperature": 1.0, "max_completion_length": None,
                "grad_norm": "exact"}
#: the real-model world's (``word``): :data:`gmts_analysis.sampling.domains.WORD_DEFAULTS`
WORD_DEFAULTS = _sampling.WORD_DEFAULTS


def is_toy_policy(model: str) -> bool:
    """``tiny``/``small`` or a directory with a policy card (a toy policy speaks the toy domains' format)."""

    return model in ALIASES or (Path(model) / "card.json").is_file()


EXAMPLES = """examples:
  gmts run                                             # small policy, three toy domains, runs/run-<time>/
  gmts run --model smollm2                             # SmolLM2-135M-Instruct on word problems (the real extra)
  gmts run --loss_type dr_grpo --max_completion_length 96 --epsilon 0.2 --beta 0.04 --top_entropy_quantile 0.2"""

#: options of gmts probe that gmts run does not take: its input is the rollouts it samples
NOT_IN_RUN = ("rollouts", "format", "steps", "reward_columns", "reward_weights", "chat_template",
              "prompts", "batch_size", "difficulty")


COMMAND = Command(
    "run", job="gmts_analysis.commands.run_job:run", settings=(SamplingOptions, ProbeConfig, RunControl), skip=NOT_IN_RUN,
    defaults={"domains": None, "out": None, **{k: None for k in TOY_DEFAULTS}},  # by world, in run()
    help="the main job: sample from a shipped policy (or a real model), probe, statistics, figures, report",
    description="Sample answers from a shipped toy policy on the toy domains (or from a real instruct model such "
    "as --model smollm2 on grade-school word problems: domain word, defaults "
    f"{', '.join(f'{k} {v}' for k, v in WORD_DEFAULTS.items())}), probe them with exact per-token gradient norms, "
    "and write a complete run directory (tables, stats.json, figures, report.html, and the sampled "
    "rollouts.jsonl). Resumable like gmts probe: run the same command again after a crash. Every option "
    "of gmts probe that is not about an input file applies (TRL's and verl's names too: docs/cli.md).",
    epilog=EXAMPLES,
)
register = COMMAND.register
