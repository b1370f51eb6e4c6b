"""``gmts probe``: per-token entropy, exact gradient norms and GMTS scores for a rollouts file."""

from __future__ import annotations

from gmts_analysis.options.command import Command
from gmts_analysis.options.config import ConfigFile, ProbeConfig

EXAMPLES = """examples:
  gmts probe --model tiny --rollouts rollouts.jsonl                       # -> runs/probe-<time>/
  gmts probe --model_name_or_path ./ckpt --rollouts trl_output_dir --loss_type dr_grpo \\
             --max_completion_length 256 --output_dir runs/ckpt --threads 1
  gmts probe --model ckpt-100,ckpt-200 --rollouts rollouts.jsonl --grad-norm sketch --probes 32"""


COMMAND = Command(
    "probe", job="gmts_analysis.commands.probe_job:probe", settings=(ConfigFile, ProbeConfig),
    help="probe a model on rollouts: tokens.parquet, answers.parquet, stats.json, manifest.json",
    description="Run a causal LM on sampled answers and write, per response token, entropy, log-prob, "
    "the exact norm of the per-token policy gradient, the advantage, omega and the GMTS score. "
    "Flags also take TRL's and verl's names and underscores (--loss_type, --epsilon, --beta, "
    "--top_entropy_quantile, ...: docs/cli.md).", epilog=EXAMPLES,
)
register = COMMAND.register


