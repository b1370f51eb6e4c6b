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

import argparse
import time
from pathlib import Path
from typing import Any

from gmts_analysis.options.config import ExamplesHelpFormatter, ProbeConfig
from gmts_analysis.sampling import domains as _sampling

DEFAULT_DOMAINS = ",".join(_sampling.DEFAULT_DOMAINS)
#: the toy world's sampling defaults (the shipped policies; max_completion_length None = the policy card's)
TOY_DEFAULTS = {"num_prompts": 8, "num_generations": 8, "temperature": 1.0, "max_completion_length": None,
                "grad_norm": "exact"}
#: the real-model world's (``word``): :data:`gmts_analysis.sampling.domains.WORD_DEFAULTS`
WORD_DEFAULTS = _sampling.WORD_DEFAULTS


def is_toy_policy(model: str) -> bool:
    """``tiny``/``small`` or a directory with a policy card (a toy policy speaks the toy domains' format)."""
    from pathlib import Path

    from gmts_analysis.readers.models import ALIASES

    return model in ALIASES or (Path(model) / "card.json").is_file()


EXAMPLES = """examples:
  gmts run                                             # small policy, three toy domains, runs/run-<time>/
  gmts run --model smollm2                             # SmolLM2-135M-Instruct on word problems (the real extra)
  gmts run --loss_type dr_grpo --max_completion_length 96 --epsilon 0.2 --beta 0.04 --top_entropy_quantile 0.2"""

#: options of gmts probe that gmts run does not take: its input is the rollouts it samples
NOT_IN_RUN = ("rollouts", "format", "steps", "reward_columns", "reward_weights", "chat_template",
              "prompts", "batch_size", "difficulty")


def register(sub: argparse._SubParsersAction) -> None:
    from gmts_analysis.options.config import ProbeConfig, RunControl, SamplingOptions, add_options

    p = sub.add_parser(
        "run",
        help="the main job: sample from a shipped policy (or a real model), probe, statistics, figures, report",
        description="Sample answers from a shipped toy policy on the toy domains (or from a real instruct model such "
        "as --model smollm2 on grade-school word problems: domain word, defaults "
        f"{', '.join(f'{k} {v}' for k, v in WORD_DEFAULTS.items())}), probe them with exact per-token gradient norms, "
        "and write a complete run directory (tables, stats.json, figures, report.html, and the sampled "
        "rollouts.jsonl). Resumable like gmts probe: run the same command again after a crash. Every option "
        "of gmts probe that is not about an input file applies (TRL's and verl's names too: docs/cli.md).",
        epilog=EXAMPLES, formatter_class=ExamplesHelpFormatter,
    )
    add_options(p, SamplingOptions, ProbeConfig, RunControl, skip=NOT_IN_RUN,
                defaults={"domains": None, "out": None, **{k: None for k in TOY_DEFAULTS}})  # by world, in run()
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """``gmts run``: sample, probe (resumable), print the results; the exit status of :func:`gmts_analysis.commands.probe.exit_status`."""
    from gmts_analysis.commands.probe import exit_status
    from gmts_analysis.run.job import sample_and_probe
    from gmts_analysis.run.sharding.merge import skipped_line

    t0 = time.perf_counter()
    domains = _domains_and_defaults(args)
    out, cfg = _checked_probe_config(args, domains)
    sample_and_probe(cfg, _sampling_record(args, domains))
    _print_statistics(out, domains)
    _print_answers(out, domains, t0)
    line = skipped_line(out)  # never only in errors.jsonl
    if line:
        print(line)
    return exit_status([out], quiet=True)


def _domains_and_defaults(args: argparse.Namespace) -> list[str]:
    """The domains to sample (``--domains``, else the model's world: the toy domains for a toy policy,
    ``word`` otherwise), checked; the world's sampling defaults filled into ``args`` where not given,
    then the group sizes and ``--max-completion-length`` checked."""
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.sampling.domains import WORD_DOMAIN, check_verifiers_installed, domain_list

    given = args.domains
    if given is None:
        given = [DEFAULT_DOMAINS if is_toy_policy(args.model) else WORD_DOMAIN]
    domains = domain_list(given, flag="--domains")
    check_verifiers_installed(domains)  # before the model is loaded (or a GGUF file converted)
    for k, v in (WORD_DEFAULTS if domains == [WORD_DOMAIN] else TOY_DEFAULTS).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.num_prompts < 1 or args.num_generations < 2:
        raise GmtsError("--num-prompts must be >= 1 and --num-generations >= 2 (a group needs a baseline)")
    if args.max_completion_length is not None and args.max_completion_length < 1:
        raise GmtsError(f"--max-completion-length: must be an integer >= 1, got {args.max_completion_length}")
    return domains


def _checked_probe_config(args: argparse.Namespace, domains: list[str]) -> tuple[Path, ProbeConfig]:
    """The run directory (``--out``, default ``runs/run-<time>``) and the probe half's configuration
    (every gmts probe option), both checked before anything is sampled (the job checks again before probing)."""
    from gmts_analysis.options.config import default_out, from_args
    from gmts_analysis.probing.validate import validate_options
    from gmts_analysis.readers.models import resolve_model_path
    from gmts_analysis.sampling.domains import check_word_verifier
    from gmts_analysis.util import io

    out = Path(args.out or default_out("run"))
    # num_generations is the sampling's (the rows carry group ids); the verifier scores the sampled
    # answers (word problems only); the probe reads their rewards as sampled
    check_word_verifier(args.verifier, domains)
    cfg = from_args(ProbeConfig, args, rollouts=None, out=str(out), num_generations=None, verifier=None,
                    aliases=dict(getattr(args, "aliases", None) or {}))
    validate_options(cfg)
    io.check_output_location(out, {"--model": resolve_model_path(args.model)})
    io.check_ours(out)  # someone else's files are never replaced, --overwrite or not
    return out, cfg


def _sampling_record(args: argparse.Namespace, domains: list[str]) -> dict[str, Any]:
    """The sampling half's settings as the job takes and records them (``manifest.json`` ``sampling``)."""
    from gmts_analysis.readers.models import resolve_device
    from gmts_analysis.sampling.domains import WORD_DOMAIN, WORD_VERIFIER

    sampling = {"domains": domains, "num_prompts": args.num_prompts, "group_size": args.num_generations,
                "temperature": args.temperature, "max_new_tokens": args.max_completion_length, "seed": args.seed,
                "device": str(resolve_device(args.device))}  # the device sampled on (auto resolved)
    if WORD_DOMAIN in domains:  # the word problems' verifier is part of the sampling (toy runs' keys unchanged)
        sampling["verifier"] = args.verifier or WORD_VERIFIER
    return sampling


def _print_statistics(out: Path, domains: list[str]) -> None:
    """The results table of the finished run ``out`` (overall and per domain, stdout), then its warnings:
    too few groups, and (logged) too many groups whose rewards are all equal."""
    from gmts_analysis.analysis.stats_types import Statistics
    from gmts_analysis.analysis.summary import summary_text
    from gmts_analysis.commands.stats import warn_few_groups
    from gmts_analysis.sampling.signal import signal_warning

    st = Statistics.read(out / "stats.json")  # parsed once for the table and the warning
    print(summary_text(st, domains))
    warn_few_groups(st)
    za = st.zero_advantage  # groups without an informative token: all their rewards equal
    flat = signal_warning(za.groups, st.meta.n_groups) if za is not None and isinstance(za.groups, int) \
        and isinstance(st.meta.n_groups, int) else None
    if flat is not None:
        import logging

        logging.getLogger("gmts_analysis.sampling").warning("%s: %s", out, flat)


def _print_answers(out: Path, domains: list[str], t0: float) -> None:
    """The sampled answers' pass@1 per domain, then the run's size and wall time since ``t0``
    (``time.perf_counter()`` seconds) and where it is (stdout)."""
    from gmts_analysis.util import io

    answers = io.read_parquet(out / "answers.parquet")
    if "domain" in answers:
        rewards = answers.groupby("domain")["reward"].mean()
        print("pass@1 of the sampled answers: " + ", ".join(f"{d} {rewards.get(d, float('nan')):.2f}" for d in domains))
    wall = time.perf_counter() - t0
    n_tokens = int(answers["length"].sum()) if "length" in answers else 0
    print(f"{n_tokens} tokens, {len(answers)} answers in {wall:.0f} s -> {out}/ (report: {out / 'report.html'})")
