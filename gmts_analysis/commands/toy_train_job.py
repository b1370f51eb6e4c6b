"""``gmts toy-train``: what it does (declared in :mod:`gmts_analysis.commands.toy_train`)."""

from __future__ import annotations

import logging

from gmts_analysis.commands.toy_train import ToyTrainOptions
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.models import data_dir
from gmts_analysis.toy.card import CARD_PROMPTS, evaluate_pass_at_1, save_policy
from gmts_analysis.toy.train import train_policy
from gmts_analysis.util.io import staged_directory


def toy_train(opts: ToyTrainOptions) -> int:
    """Train, evaluate and save the toy policy ``opts.size`` (:mod:`gmts_analysis.commands.toy_train`)."""
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
