"""``gmts run``: the main job on the embedded default.

Samples groups of answers from a model (default: the shipped ``small`` policy) on the toy
domains, or, for a real instruct model (``--model smollm2``, a GGUF file, any checkpoint that is not a
toy policy), on grade-school word problems (:mod:`gmts_analysis.wordproblems`; the ``word`` domain, with
its own default size, :data:`WORD_DEFAULTS`), then runs the same job as ``gmts probe`` on them (:func:`gmts_analysis.job.sample_and_probe`:
resumable chunk records, run fingerprint, ``errors.jsonl``), and prints within-answer vs
cross-answer Spearman for entropy and gmts, overall and per domain. Killed, the same
command (same ``--out``) resumes.
"""

from __future__ import annotations

import argparse
import time

DEFAULT_DOMAINS = "arithmetic,program,logic"
#: the toy world's sampling defaults (the shipped policies; max_new_tokens None = the policy card's)
TOY_DEFAULTS = {"num_prompts": 8, "group_size": 8, "temperature": 1.0, "max_new_tokens": None, "grad_norm": "exact"}
#: the real-model world's (``word``): sized to finish in about 15 minutes on 2 CPU cores with SmolLM2-135M
#: (README, "A real model"); mixed rewards in most groups at this temperature
WORD_DEFAULTS = {"num_prompts": 8, "group_size": 4, "temperature": 0.7, "max_new_tokens": 32,
                 "grad_norm": "exact"}


def is_toy_policy(model: str) -> bool:
    """``tiny``/``small`` or a directory with a policy card (a toy policy speaks the toy domains' format)."""
    from pathlib import Path

    from gmts_analysis.models import ALIASES

    return model in ALIASES or (Path(model) / "card.json").is_file()


def register(sub: argparse._SubParsersAction) -> None:
    from gmts_analysis.config import add_offline_flag

    p = sub.add_parser(
        "run",
        help="the main job: sample from a shipped policy (or a real model), probe, statistics, figures, report",
        description="Sample answers from a shipped toy policy on the toy domains (or from a real instruct model "
        "such as --model smollm2 on grade-school word problems), probe them with exact per-token gradient norms, "
        "and write a complete run directory (tables, stats.json, figures, report.html). Resumable like "
        "gmts probe: run the same command again after a crash.",
    )
    p.add_argument("--out", default=None, help="run directory (default: runs/run-YYYYmmdd-HHMMSS)")
    p.add_argument("--model", default="small", help="shipped policy (tiny | small), smollm2 (SmolLM2-135M-Instruct, "
                   "the real extra), a checkpoint directory, a .gguf file or a hub id (default: small)")
    add_offline_flag(p)
    p.add_argument("--domains", nargs="+", default=None, metavar="DOMAIN",
                   help=f"one or more of the toy domains (arithmetic, program, logic) and word (grade-school word "
                   f"problems, for real models), space- or comma-separated (default: {DEFAULT_DOMAINS} for a toy "
                   "policy, word for any other model)")
    p.add_argument("--num-prompts", type=int, default=None, help="prompts per domain (default: 8)")
    p.add_argument("--group-size", type=int, default=None,
                   help=f"answers per prompt (default: {TOY_DEFAULTS['group_size']}; word: {WORD_DEFAULTS['group_size']})")
    p.add_argument("--temperature", type=float, default=None, help="sampling and probing temperature (default: "
                   f"{TOY_DEFAULTS['temperature']}; word: {WORD_DEFAULTS['temperature']})")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generation budget (default: the policy card's; "
                   f"word: {WORD_DEFAULTS['max_new_tokens']})")
    p.add_argument("--grad-norm", default=None, choices=("exact", "sketch", "none"),
                   help=f"per-token gradient norm (default: {TOY_DEFAULTS['grad_norm']}; word: "
                   f"{WORD_DEFAULTS['grad_norm']})")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda[:N]; auto = cuda if available, else cpu "
                   "(data/example_run was made on cpu: give --device cpu to reproduce it on a GPU machine) "
                   "(default: auto)")
    p.add_argument("--rho", type=float, default=0.2, metavar="FRACTION",
                   help="keep fraction of the token selections quoted by the report, update fidelity and the "
                   "summary (TRL's top_entropy_quantile) (default: 0.2)")
    p.add_argument("--seed", type=int, default=0, help="sampling, bootstrap and selection seed (default: 0)")
    p.add_argument("--no-figures", dest="figures", action="store_false", help="skip figures and report (default: drawn)")
    p.add_argument("--fidelity", default="auto", choices=("auto", "on", "off"),
                   help="update fidelity of selections (default: auto = on under 100k tokens when its gradients fit in "
                   "memory)")
    p.add_argument("--answers-per-chunk", type=int, default=16,
                   help="answers per record (a resumable unit of work) (default: 16)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run directory (default: resume "
                   "a run of the same arguments, refuse anything else)")
    p.add_argument("--strict", action="store_true", help="stop at the first answer that fails, and count an answer "
                   "the exact engine refuses as failed (default: skip a failed answer; send a refused one to the "
                   "per-token loop, exact but slower, with a warning)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; only warnings and errors on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from gmts_analysis import io
    from gmts_analysis.api import ALL_DOMAINS, WORD_DOMAIN
    from gmts_analysis.config import ProbeConfig
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.job import sample_and_probe
    from gmts_analysis.models import resolve_device, resolve_model_path
    from gmts_analysis.validate import validate_options

    t0 = time.perf_counter()
    given = args.domains
    if given is None:
        given = [DEFAULT_DOMAINS if is_toy_policy(args.model) else WORD_DOMAIN]
    given = [given] if isinstance(given, str) else list(given)  # str: an old caller
    domains = [d.strip() for x in given for d in x.split(",") if d.strip()]
    unknown = [d for d in domains if d not in ALL_DOMAINS]
    if not domains or unknown:
        raise GmtsError(f"--domains: unknown domain(s) {', '.join(unknown) or '(none given)'} "
                        f"(choose from {', '.join(ALL_DOMAINS)})")
    defaults = WORD_DEFAULTS if domains == [WORD_DOMAIN] else TOY_DEFAULTS
    for k, v in defaults.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.num_prompts < 1 or args.group_size < 2:
        raise GmtsError("--num-prompts must be >= 1 and --group-size >= 2 (a group needs a baseline)")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise GmtsError(f"--max-new-tokens: must be an integer >= 1, got {args.max_new_tokens}")
    out = Path(args.out or time.strftime("runs/run-%Y%m%d-%H%M%S"))
    cfg = ProbeConfig(model=args.model, rollouts=None, out=str(out), device=args.device,
                      temperature=args.temperature, grad_norm=args.grad_norm, fidelity=args.fidelity,
                      figures=args.figures, seed=args.seed, overwrite=args.overwrite, quiet=args.quiet,
                      answers_per_chunk=args.answers_per_chunk, rho=args.rho, offline=args.offline,
                      strict=bool(getattr(args, "strict", False)),
                      aliases=dict(getattr(args, "aliases", None) or {}))
    # checked before sampling (the job checks again before probing)
    validate_options(cfg)
    io.check_output_location(out, {"--model": resolve_model_path(args.model)})
    io.check_ours(out)  # someone else's files are never replaced, --overwrite or not
    sampling = {"domains": domains, "num_prompts": args.num_prompts, "group_size": args.group_size,
                "temperature": args.temperature, "max_new_tokens": args.max_new_tokens, "seed": args.seed,
                "device": str(resolve_device(args.device))}  # the device sampled on (auto resolved)
    sample_and_probe(cfg, sampling)
    stats = json.loads((out / "stats.json").read_text())
    from gmts_analysis.summary import summary_text

    print(summary_text(stats, domains))
    answers = io.read_parquet(out / "answers.parquet")
    if "domain" in answers:
        rewards = answers.groupby("domain")["reward"].mean()
        print("pass@1 of the sampled answers: " + ", ".join(f"{d} {rewards.get(d, float('nan')):.2f}" for d in domains))
    wall = time.perf_counter() - t0
    n_tokens = int(answers["length"].sum()) if "length" in answers else 0
    print(f"{n_tokens} tokens, {len(answers)} answers in {wall:.0f} s -> {out}/ (report: {out / 'report.html'})")
    return 0
