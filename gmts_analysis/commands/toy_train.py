"""``gmts toy-train``: train a shipped toy policy from scratch and write its card."""

from __future__ import annotations

import argparse

from gmts_analysis.options.config import ExamplesHelpFormatter

EXAMPLES = """examples:
  gmts toy-train --size tiny --out /tmp/tiny --max-steps 50
  gmts toy-train --size small --overwrite          # rewrites data/policies/small"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "toy-train",
        help="train the tiny or small toy policy (Qwen2 architecture) on the three toy domains",
        description="Train a toy policy by supervised learning on reference traces, evaluate pass@1 "
        "per domain on held-out prompts, and save weights, tokenizer and card.",
        epilog=EXAMPLES, formatter_class=ExamplesHelpFormatter,
    )
    p.add_argument("--size", choices=["tiny", "small"], required=True, help="which policy to train")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and training data (default 0)")
    p.add_argument("--out", default=None, help="output directory (default data/policies/<size>)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="optimizer steps (TRL's max_steps) (default: the size's recipe)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads (default 2, as the shipped runs)")
    p.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts per domain for the card (default 200)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; only warnings and errors on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.readers.models import data_dir
    from gmts_analysis.toy.card import CARD_PROMPTS, evaluate_pass_at_1, save_policy
    from gmts_analysis.toy.train import train_policy
    from gmts_analysis.util.io import staged_directory

    if args.max_steps is not None and args.max_steps < 1:
        raise GmtsError("--max-steps must be >= 1")
    if args.threads < 1:
        raise GmtsError("--threads must be >= 1")
    n_eval = CARD_PROMPTS if args.eval_prompts is None else args.eval_prompts
    if n_eval < 1:
        raise GmtsError("--eval-prompts must be >= 1")
    out = args.out or str(data_dir() / "policies" / args.size)
    with staged_directory(out, overwrite=args.overwrite, kind="policy") as tmp:
        model, tok, info = train_policy(args.size, args.seed, args.max_steps, args.threads, progress=not args.quiet)
        evaluation = evaluate_pass_at_1(model, tok, n_prompts=n_eval, progress=not args.quiet)
        card = save_policy(tmp, model, tok, info, evaluation)
        tmp.chmod(0o755)
    log = logging.getLogger("gmts")
    log.info("%s: %d parameters, trained in %.0f s", out, card["parameters"], info["train_seconds"])
    for d, v in card["pass_at_1"].items():
        log.info("  pass@1 %-10s %.3f", d, v)
    return 0
