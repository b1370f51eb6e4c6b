"""``gmts sample``: sample answer groups from a policy (on toy domains, or on a prompts file for any
checkpoint), score them with a verifier and write rollouts with their ids."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from gmts_analysis.config import add_offline_flag

    p = subparsers.add_parser(
        "sample",
        help="sample groups of answers on a toy domain, verify them, write rollouts (JSONL)",
        description="Sample --group-size answers to each of --num-prompts held-out prompts of each toy "
        "domain, score them with the domain's verifier and write rollouts (docs/definitions.md section 7) (JSONL). "
        "The same seed gives the same file.",
    )
    p.add_argument("--model", default="tiny", help="tiny, small (shipped policies), smollm2 (the real extra), a "
                   "local path, a .gguf file or a hub id (default tiny)")
    add_offline_flag(p)
    p.add_argument("--domains", nargs="+", default=None, metavar="DOMAIN",
                   help="one or more toy domains: arithmetic, program, logic, or word (grade-school word problems "
                   "through the chat template, math verifier: for real models such as smollm2) (space- or "
                   "comma-separated)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="instead of --domains: a JSONL/parquet prompts file for any checkpoint ('prompt': text or "
                   "chat messages, plus the verifier's columns such as 'solution')")
    p.add_argument("--verifier", default=None, metavar="NAME|module:function",
                   help="with --prompts: reward function (math, a toy domain, or module:function / file.py:function, "
                   "called as TRL calls reward functions); without it no reward is written")
    p.add_argument("--chat-template", default="auto", choices=("auto", "on", "off"),
                   help="with --prompts: auto = message prompts through the chat template (generation prompt added), "
                   "text as is; on = text prompts as one user message too; off = no template (default auto)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="prompts (groups) to sample per domain (default 8); with --prompts: the first N (default all)")
    p.add_argument("--group-size", type=int, default=8, help="answers per prompt (default 8)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0 is greedy (default 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=96, help="generation budget per answer (default 96)")
    p.add_argument("--difficulty", type=int, default=None, help="difficulty level 1-3 (default: uniform mix)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and the sampling (default 0)")
    p.add_argument("--batch-size", type=int, default=64, help="sequences generated together (default 64)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N; auto = cuda if available, else cpu "
                   "(the same --seed gives the same file on the same device) (default: auto)")
    p.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    p.add_argument("--out", required=True, metavar="FILE", help="rollouts file to write (JSONL)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; only warnings and errors on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    import torch

    from gmts_analysis.api import WORD_DOMAIN, sample_word_problems
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.models import load_model
    from gmts_analysis.toy.domains import get_domain
    from gmts_analysis.toy.sample import sample_rollouts, write_rollouts

    if (args.domains is None) == (args.prompts is None):
        raise GmtsError("gmts sample: give exactly one of --domains (toy domains) or --prompts FILE")
    if args.prompts is not None:
        return _run_prompts(args)
    if args.num_prompts is None:
        args.num_prompts = 8
    domains = [d for x in args.domains for d in x.split(",") if d.strip()]
    for d in domains:
        if d != WORD_DOMAIN:
            get_domain(d)
    if args.num_prompts < 1 or args.group_size < 1:
        raise GmtsError("--num-prompts and --group-size must be >= 1")
    if args.batch_size < 1:
        raise GmtsError("--batch-size must be >= 1")
    if not (args.temperature >= 0 and args.temperature != float("inf")):
        raise GmtsError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.max_new_tokens < 1:
        raise GmtsError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    from pathlib import Path

    from gmts_analysis.io import check_output_location

    out = Path(args.out)
    if out.is_dir():
        raise GmtsError(f"--out {args.out}: is a directory; expected a file name (e.g. rollouts.jsonl)")
    check_output_location(out.parent, flag=f"--out {args.out}: directory", whole_dir=False)
    model, tokenizer = load_model(args.model, args.device, args.dtype, offline=args.offline)
    if tokenizer is None:
        raise GmtsError(f"--model {args.model}: no tokenizer saved with the checkpoint (sampling needs one)")
    with torch.inference_mode():
        rows = []
        for d in domains:
            if d == WORD_DOMAIN:  # grade-school word problems for real models: chat template, math verifier
                rows += sample_word_problems(model, tokenizer, args.num_prompts, args.group_size, args.temperature,
                                             args.max_new_tokens, args.seed, progress=not args.quiet)
                continue
            rows += sample_rollouts(model, tokenizer, d, args.num_prompts, args.group_size,
                                    args.temperature, args.max_new_tokens, args.seed, args.difficulty,
                                    batch_size=args.batch_size, progress=not args.quiet)
    write_rollouts(args.out, rows)
    mean = sum(r["reward"] for r in rows) / len(rows)
    logging.getLogger("gmts").info("%s: %d answers in %d groups, mean reward %.3f",
                                   args.out, len(rows), args.num_prompts * len(domains), mean)
    return 0


def _run_prompts(args: argparse.Namespace) -> int:
    """``gmts sample --prompts FILE``: any checkpoint, its chat template, a TRL-style verifier."""
    import logging
    import math
    from pathlib import Path

    import torch

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.io import check_output_location
    from gmts_analysis.models import load_model
    from gmts_analysis.sampling import read_prompts, sample_prompts
    from gmts_analysis.toy.sample import write_rollouts
    from gmts_analysis.verifiers import resolve_verifier

    if args.num_prompts is not None and args.num_prompts < 1:
        raise GmtsError("--num-prompts must be >= 1")
    if args.group_size < 1 or args.batch_size < 1:
        raise GmtsError("--group-size and --batch-size must be >= 1")
    if not (args.temperature >= 0 and math.isfinite(args.temperature)):
        raise GmtsError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.max_new_tokens < 1:
        raise GmtsError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    out = Path(args.out)
    if out.is_dir():
        raise GmtsError(f"--out {args.out}: is a directory; expected a file name (e.g. rollouts.jsonl)")
    check_output_location(out.parent, flag=f"--out {args.out}: directory", whole_dir=False)
    rows = read_prompts(args.prompts, args.num_prompts)
    verifier = resolve_verifier(args.verifier)
    model, tokenizer = load_model(args.model, args.device, args.dtype, offline=args.offline)
    if tokenizer is None:
        raise GmtsError(f"--model {args.model}: no tokenizer saved with the checkpoint (sampling needs one)")
    with torch.inference_mode():
        answers = sample_prompts(model, tokenizer, rows, args.group_size, verifier=verifier,
                                 temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                 chat_template=args.chat_template, batch_size=args.batch_size,
                                 progress=not args.quiet, where=str(args.prompts))
    write_rollouts(args.out, answers)
    msg = f"{args.out}: {len(answers)} answers to {len(rows)} prompts"
    if verifier is not None:
        msg += f", mean reward {sum(a['reward'] for a in answers) / len(answers):.3f}"
    logging.getLogger("gmts").info("%s", msg)
    return 0
