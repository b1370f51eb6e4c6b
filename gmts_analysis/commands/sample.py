"""``gmts sample``: sample answer groups from a policy (on toy domains, or on a prompts file for any
checkpoint), score them with a verifier and write rollouts with their ids."""

from __future__ import annotations

from gmts_analysis.options.command import Command
from gmts_analysis.options.config import OutputOptions, RunControl, SamplingOptions

EXAMPLES = """examples:
  gmts sample --model small --domains arithmetic --num_generations 4 --max_completion_length 48 --output_dir runs/s1
  gmts sample --model ./ckpt --prompts prompts.jsonl --verifier math --num-generations 8 --out rollouts.jsonl
  gmts sample --domains logic --num-prompts 16 --temperature 0.7 --threads 1 -q"""


COMMAND = Command(
    "sample", job="gmts_analysis.commands.sample_job:sample", settings=(SamplingOptions, OutputOptions, RunControl),
    help="sample groups of answers on a toy domain, verify them, write rollouts (JSONL)",
    description="Sample --num-generations answers to each of --num-prompts held-out prompts of each toy "
    "domain, score them with the domain's verifier and write rollouts (docs/definitions.md section 7) (JSONL). "
    "The same seed gives the same file. --out is a .jsonl file, or a directory (TRL's output_dir) that "
    "gets rollouts.jsonl.", epilog=EXAMPLES,
)
register = COMMAND.register
