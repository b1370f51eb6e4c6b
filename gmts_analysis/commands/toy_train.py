"""``gmts toy-train``: train a shipped toy policy from scratch and write its card."""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.options import checks
from gmts_analysis.options.command import Command
from gmts_analysis.options.config import QUIET_HELP
from gmts_analysis.options.fields import opt

EXAMPLES = """examples:
  gmts toy-train --size tiny --out /tmp/tiny --max-steps 50
  gmts toy-train --size small --overwrite          # rewrites data/policies/small"""


@dataclass
class ToyTrainOptions:
    """The flags of ``gmts toy-train``."""

    size: str = opt(None, "which policy to train", choices=("tiny", "small"), required=True, group="inputs")
    seed: int = opt(0, "seed of initialisation and training data (default 0)", metavar="INT", check=checks.seed)
    out: str = opt(None, "output directory (default data/policies/<size>)", group="output", metavar="DIR",
                   check=checks.output_path)
    max_steps: int = opt(None, "optimizer steps (TRL's max_steps) (default: the size's recipe)", metavar="STEPS",
                         check=checks.int_at_least(1))
    threads: int = opt(2, "CPU threads (default 2, as the shipped runs)", metavar="THREADS",
                       check=checks.int_at_least(1))
    eval_prompts: int = opt(None, "held-out prompts per domain for the card (default 200)", group="inputs",
                            metavar="PROMPTS", check=checks.int_at_least(1))
    overwrite: bool = opt(False, "replace an existing output directory", group="output")
    quiet: bool = opt(False, QUIET_HELP, short="-q")


COMMAND = Command(
    "toy-train", job="gmts_analysis.commands.toy_train_job:toy_train", settings=(ToyTrainOptions,),
    help="train the tiny or small toy policy (Qwen2 architecture) on the three toy domains",
    description="Train a toy policy by supervised learning on reference traces, evaluate pass@1 "
    "per domain on held-out prompts, and save weights, tokenizer and card.", epilog=EXAMPLES,
)
register = COMMAND.register
