"""``gmts rl``: RLVR on the toy domains with token selection (the arms of :mod:`gmts_analysis.core.scores`)."""

from __future__ import annotations

import argparse

from gmts_analysis.options.config import ExamplesHelpFormatter

EXAMPLES = """examples:
  gmts rl --model tiny --selection all gmts --seed 0 --max-steps 20 --out /tmp/rl.json
  gmts rl --num_generations 8 --max_completion_length 64 --top_entropy_quantile 0.2 --figures none
  gmts rl --selection entropy gmts --seed 0 1 --threads 1 -q"""


#: RLConfig fields spelled otherwise on the command line (errors of the trainer name the field)
KEYWORD_FLAGS = {"policy": "--model", "steps": "--max-steps"}


def register(subparsers: argparse._SubParsersAction) -> None:
    from gmts_analysis.core.scores import MASKED_ARMS
    from gmts_analysis.core.vocabulary import NORMALIZERS, SCOPES
    from gmts_analysis.options.config import add_offline_flag
    from gmts_analysis.rl.config import ALL_DOMAINS, DEFAULT_ARMS, SELECTION_ARMS, RLConfig

    d = RLConfig()
    p = subparsers.add_parser(
        "rl",
        help="train a toy policy with GRPO, updating only selected tokens; compare selections over seeds",
        description="On-policy GRPO on the toy domains where only the top --rho tokens by a score enter the "
        f"loss ({' | '.join(SELECTION_ARMS)}; gmts_lgn = logit-gradient norm x |omega|). Runs every --selection x "
        "--seed, evaluates pass@1 at "
        "temperature 1.0 on held-out prompts every --eval-every steps, logs per-step diagnostics, "
        "writes the results JSON (--out) and learning-curve figures (--figures).",
        epilog=EXAMPLES, formatter_class=ExamplesHelpFormatter,
    )
    p.add_argument("--model", default=d.policy, help="shipped policy tiny | small, a checkpoint directory or a "
                   f"hub id (default: {d.policy})")
    add_offline_flag(p)
    p.add_argument("--selection", nargs="+", default=list(DEFAULT_ARMS), choices=SELECTION_ARMS,
                   help=f"one or more arms; {' and '.join(MASKED_ARMS)} are the masked baselines (score "
                   f"x 1[omega != 0]) (default: {' '.join(DEFAULT_ARMS)})")
    p.add_argument("--seed", nargs="+", type=int, default=[0, 1, 2], help="one or more seeds (default: 0 1 2)")
    p.add_argument("--max-steps", type=int, default=d.steps,
                   help=f"optimizer steps per run (TRL's max_steps) "
                   f"(default: {d.steps})")
    p.add_argument("--domains", nargs="+", default=list(ALL_DOMAINS), help="toy domains, space- or comma-separated (default: all three)")
    p.add_argument("--rho", type=float, default=d.rho, help=f"fraction of tokens kept (default: {d.rho})")
    p.add_argument("--scope", choices=SCOPES, default=d.scope, help="selection scope (default: batch)")
    p.add_argument("--normalizer", choices=NORMALIZERS, default=d.normalizer,
                   help="loss divided by all response tokens (TRL, GMTS code) or by the selected ones (80/20 "
                   "code) (default: all)")
    p.add_argument("--lr", type=float, default=d.lr, help=f"AdamW learning rate (default: {d.lr:g})")
    p.add_argument("--prompts-per-domain", type=int, default=d.prompts_per_domain,
                   help=f"training prompts per domain per step (default: {d.prompts_per_domain})")
    p.add_argument("--num-generations", type=int, default=d.group_size,
                   help=f"answers per prompt G (TRL's num_generations) (default: {d.group_size})")
    p.add_argument("--max-completion-length", type=int, default=d.max_new_tokens,
                   help=f"generation budget in tokens (TRL's max_completion_length) (default: {d.max_new_tokens})")
    _evaluation_and_output_options(p, d)
    p.set_defaults(func=run)


def _evaluation_and_output_options(p: argparse.ArgumentParser, d) -> None:
    """gmts rl's evaluation, diagnostics, device and output options (``d``: the RLConfig defaults)."""
    p.add_argument("--eval-every", type=int, default=d.eval_every, help=f"steps between evaluations (default: {d.eval_every})")
    p.add_argument("--eval-prompts", type=int, default=d.eval_prompts,
                   help=f"held-out prompts per domain for pass@1 (default: {d.eval_prompts})")
    p.add_argument("--final-eval-prompts", type=int, default=d.final_eval_prompts,
                   help="held-out prompts per domain for the final pass@1 only (the learning curve keeps "
                   "--eval-prompts); 0 = --eval-prompts (default: 0)")
    p.add_argument("--eval-seed", type=int, default=d.eval_seed,
                   help="seed of the evaluation: which held-out prompts are drawn and their sampling noise, the "
                   f"same for every arm and checkpoint (default: {d.eval_seed}, every run in data/rl up to the "
                   "replication of docs/rl.md section 9)")
    p.add_argument("--dynamic-sampling", action="store_true",
                   help="drop groups whose rewards are all equal before each update (DAPO's dynamic sampling; "
                   "the batch is not refilled, the number kept is logged per step)")
    p.add_argument("--diag-every", type=int, default=d.diag_every,
                   help=f"steps between grad-norm diagnostics, 0 = never (default: {d.diag_every})")
    p.add_argument("--diag-answers", type=int, default=d.diag_answers,
                   help=f"answers per grad-norm diagnostic (default: {d.diag_answers})")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]; auto = cuda if available, else cpu "
                   "(the results in data/rl were trained on cpu: give --device cpu to reproduce them on a GPU "
                   "machine) (default: auto)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads; the toy policies run fastest on one, "
                   "and two processes with disjoint --seed lists use two cores (default: 1)")
    p.add_argument("--out", default="data/rl/rl.json", help="results JSON (default: data/rl/rl.json); runs are "
                   "kept beside it in <stem>.runs/ and reused when the configuration matches")
    p.add_argument("--figures", default="figures", help="directory for rl_<stem>_curves.png and "
                   "rl_<stem>_diagnostics.png ('none' to skip) (default: figures)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; only warnings and errors on stderr")


def _is_rl_result(path) -> bool:
    import json

    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    return isinstance(j, dict) and {"selections", "runs", "summary"} <= set(j)


def _check_targets(out, figures) -> None:
    """--out: absent, or an experiment JSON of gmts rl; its ``<stem>.runs/`` directory: absent or only
    run records of gmts rl; --figures: the two rl_<stem>_*.png files may be replaced, nothing else is
    touched. Anything else is someone else's: refused before any training."""
    import re

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.rl.config import runs_dir
    from gmts_analysis.util.io import check_output_file

    check_output_file(out, "--out", _is_rl_result, overwrite=None)
    runs = runs_dir(out)
    if runs.exists():
        if not runs.is_dir() or runs.is_symlink():
            raise GmtsError(f"--out {out}: {runs} exists and is not a directory of run records; choose another --out")
        foreign = sorted(c.name for c in runs.iterdir()
                         if not re.fullmatch(r"(initial|[A-Za-z_]+-s\d+)\.json|\..+\.tmp", c.name))
        if foreign:
            raise GmtsError(f"--out {out}: {runs} holds files that gmts rl did not write ({', '.join(foreign[:3])}); "
                            "choose another --out")
    if figures is not None:
        for name in (f"rl_{out.stem}_curves.png", f"rl_{out.stem}_diagnostics.png"):
            p = figures / name
            if p.is_symlink() or p.is_dir():
                raise GmtsError(f"--figures {figures}: {name} is a link or a directory; choose another --figures")


def run(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    import torch

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.readers.models import resolve_device
    from gmts_analysis.rl.config import RLConfig
    from gmts_analysis.rl.experiment import run_experiment

    if args.threads < 1:
        raise GmtsError("--threads must be >= 1")
    torch.set_num_threads(args.threads)
    cfg = RLConfig(
        policy=args.model, steps=args.max_steps, domains=tuple(d for x in args.domains for d in x.split(",") if d.strip()), rho=args.rho, scope=args.scope,
        normalizer=args.normalizer, lr=args.lr, prompts_per_domain=args.prompts_per_domain,
        group_size=args.num_generations, max_new_tokens=args.max_completion_length, eval_every=args.eval_every,
        eval_prompts=args.eval_prompts, final_eval_prompts=args.final_eval_prompts, eval_seed=args.eval_seed,
        dynamic_sampling=args.dynamic_sampling, diag_every=args.diag_every, diag_answers=args.diag_answers,
        device=str(resolve_device(args.device)),
    )
    cfg.check()
    out = Path(args.out)
    _check_targets(out, None if args.figures == "none" else Path(args.figures))
    result = run_experiment(cfg, args.selection, args.seed, out, progress=not args.quiet, offline=args.offline)
    log = logging.getLogger("gmts")
    if args.figures != "none":
        from gmts_analysis.rl.plots import plot_diagnostics, plot_learning_curves

        fdir = Path(args.figures)
        for p in (plot_learning_curves(result, fdir / f"rl_{out.stem}_curves.png"),
                  plot_diagnostics(result, fdir / f"rl_{out.stem}_diagnostics.png")):
            log.info("wrote %s", p)
    log.info("wrote %s (%.0f s of training runs)", out, result["timing_s"]["sum_of_runs"])
    for arm, block in result["summary"].items():
        m = block["mean"]
        log.info("  %-8s final pass@1 (mean over domains) %.3f (min %.3f, max %.3f, %d seeds)",
                 arm, m["mean"], m["min"], m["max"], m["n_seeds"])
    return 0
