"""``gmts toy-train``: train a shipped toy policy from scratch and write its card."""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.errors import GmtsError
from gmts_analysis.options import checks
from gmts_analysis.options.command import Command
from gmts_analysis.options.config import QUIET_HELP
from gmts_analysis.options.fields import opt
from gmts_analysis.readers.models import data_dir
from gmts_analysis.util.io import staged_directory

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


def toy_train(opts: ToyTrainOptions) -> int:
    """Train, evaluate and save the toy policy ``opts.size`` (module docstring)."""
    import logging

    from gmts_analysis.toy.card import CARD_PROMPTS, evaluate_pass_at_1, save_policy  # deferred: torch
    from gmts_analysis.toy.train import train_policy  # deferred: torch

    if opts.max_steps is not None and opts.max_steps < 1:
        raise GmtsError("--max-steps must be >= 1")
    if opts.threads < 1:
        raise GmtsError("--threads must be >= 1")
    n_eval = CARD_PROMPTS if opts.eval_prompts is None else opts.eval_prompts
    if n_eval < 1:
        raise GmtsError("--eval-prompts must be >= 1")
    out = opts.out or str(data_dir() / "policies" / opts.size)
    with staged_directory(out, overwrite=opts.overwrite, kind="policy") as tmp:
        model, tok, info = train_policy(opts.size, opts.seed, opts.max_steps, opts.threads, progress=not opts.quiet)
        evaluation = evaluate_pass_at_1(model, tok, n_prompts=n_eval, progress=not opts.quiet)
        card = save_policy(tmp, model, tok, info, evaluation)
        tmp.chmod(0o755)
    log = logging.getLogger("gmts")
    log.info("%s: %d parameters, trained in %.0f s", out, card["parameters"], info["train_seconds"])
    for d, v in card["pass_at_1"].items():
        log.info("  pass@1 %-10s %.3f", d, v)
    return 0


COMMAND = Command(
    "toy-train", job=toy_train, settings=(ToyTrainOptions,),
    help="train the tiny or small toy policy (Qwen2 architecture) on the three toy domains",
    description="Train a toy policy by supervised learning on reference traces, evaluate pass@1 "
    "per domain on held-out prompts, and save weights, tokenizer and card.", epilog=EXAMPLES,
)
register = COMMAND.register
