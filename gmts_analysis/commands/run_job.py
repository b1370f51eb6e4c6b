"""``gmts run``: what it does (declared in :mod:`gmts_analysis.commands.run`)."""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Any

from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.analysis.summary import summary_text
from gmts_analysis.commands.probe_job import exit_status
from gmts_analysis.commands.run import DEFAULT_DOMAINS, TOY_DEFAULTS, WORD_DEFAULTS, is_toy_policy
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ProbeConfig, RunControl, SamplingOptions, default_out
from gmts_analysis.readers.models import resolve_device, resolve_model_path
from gmts_analysis.run.job import sample_and_probe
from gmts_analysis.run.sharding.merge import skipped_line
from gmts_analysis.run.stats_job import warn_few_groups
from gmts_analysis.sampling.domains import (
    WORD_DOMAIN,
    WORD_VERIFIER,
    check_verifiers_installed,
    check_word_verifier,
    domain_list,
)
from gmts_analysis.sampling.signal import signal_warning
from gmts_analysis.util import io


def run(s: SamplingOptions, cfg: ProbeConfig, control: RunControl) -> int:
    """``gmts run``: sample, probe (resumable), print the results; the exit status of :func:`gmts_analysis.commands.probe.exit_status`.
    ``s``: the sampling half's options, ``cfg``: the probe half's (the world's defaults are filled in where not given)."""
    t0 = time.perf_counter()
    domains, s, cfg = _domains_and_defaults(s, cfg)
    out, cfg = _checked_probe_config(s, cfg, domains)
    sample_and_probe(cfg, _sampling_record(s, domains))
    _print_statistics(out, domains)
    _print_answers(out, domains, t0)
    line = skipped_line(out)  # never only in errors.jsonl
    if line:
        print(line)
    return exit_status([out], quiet=True)


def _domains_and_defaults(s: SamplingOptions, cfg: ProbeConfig) -> tuple[list[str], SamplingOptions, ProbeConfig]:
    """The domains to sample (``--domains``, else the model's world: the toy domains for a toy policy,
    ``word`` otherwise), checked; the world's sampling defaults filled into ``s`` and ``cfg`` where not given,
    then the group sizes and ``--max-completion-length`` checked."""
    given = s.domains
    if given is None:
        given = [DEFAULT_DOMAINS if is_toy_policy(s.model) else WORD_DOMAIN]
    domains = domain_list(given, flag="--domains")
    check_verifiers_installed(domains)  # before the model is loaded (or a GGUF file converted)
    world = WORD_DEFAULTS if domains == [WORD_DOMAIN] else TOY_DEFAULTS
    s, cfg = (dataclasses.replace(x, **{f.name: world[f.name] for f in dataclasses.fields(x)
                                        if f.name in world and getattr(x, f.name) is None}) for x in (s, cfg))
    if s.num_prompts < 1 or s.num_generations < 2:
        raise GmtsError("--num-prompts must be >= 1 and --num-generations >= 2 (a group needs a baseline)")
    if s.max_completion_length is not None and s.max_completion_length < 1:
        raise GmtsError(f"--max-completion-length: must be an integer >= 1, got {s.max_completion_length}")
    return domains, s, cfg


def _checked_probe_config(s: SamplingOptions, cfg: ProbeConfig, domains: list[str]) -> tuple[Path, ProbeConfig]:
    """The run directory (``--out``, default ``runs/run-<time>``) and the probe half's configuration
    (every gmts probe option); the options are checked once, by the job, before anything is sampled
    (:func:`gmts_analysis.run.job.sample_and_probe`)."""
    out = Path(cfg.out or default_out("run"))
    # num_generations is the sampling's (the rows carry group ids); the verifier scores the sampled
    # answers (word problems only); the probe reads their rewards as sampled
    check_word_verifier(s.verifier, domains)
    cfg = dataclasses.replace(cfg, rollouts=None, out=str(out), num_generations=None, verifier=None,
                              aliases=dict(cfg.aliases or {}))
    io.check_output_location(out, {"--model": resolve_model_path(s.model)})
    io.check_ours(out)  # someone else's files are never replaced, --overwrite or not
    return out, cfg


def _sampling_record(s: SamplingOptions, domains: list[str]) -> dict[str, Any]:
    """The sampling half's settings as the job takes and records them (``manifest.json`` ``sampling``)."""
    sampling = {"domains": domains, "num_prompts": s.num_prompts, "group_size": s.num_generations,
                "temperature": s.temperature, "max_new_tokens": s.max_completion_length, "seed": s.seed,
                "device": str(resolve_device(s.device))}  # the device sampled on (auto resolved)
    if WORD_DOMAIN in domains:  # the word problems' verifier is part of the sampling (toy runs' keys unchanged)
        sampling["verifier"] = s.verifier or WORD_VERIFIER
    return sampling


def _print_statistics(out: Path, domains: list[str]) -> None:
    """The results table of the finished run ``out`` (overall and per domain, stdout), then its warnings:
    too few groups, and (logged) too many groups whose rewards are all equal."""
    st = Statistics.read(out / "stats.json")  # parsed once for the table and the warning
    print(summary_text(st, domains))
    warn_few_groups(st)
    za = st.zero_advantage  # groups without an informative token: all their rewards equal
    flat = signal_warning(za.groups, st.meta.n_groups) if za is not None and isinstance(za.groups, int) \
        and isinstance(st.meta.n_groups, int) else None
    if flat is not None:
        logging.getLogger("gmts_analysis.sampling").warning("%s: %s", out, flat)


def _print_answers(out: Path, domains: list[str], t0: float) -> None:
    """The sampled answers' pass@1 per domain, then the run's size and wall time since ``t0``
    (``time.perf_counter()`` seconds) and where it is (stdout)."""
    answers = io.read_parquet(out / "answers.parquet")
    if "domain" in answers:
        rewards = answers.groupby("domain")["reward"].mean()
        print("pass@1 of the sampled answers: " + ", ".join(f"{d} {rewards.get(d, float('nan')):.2f}" for d in domains))
    wall = time.perf_counter() - t0
    n_tokens = int(answers["length"].sum()) if "length" in answers else 0
    print(f"{n_tokens} tokens, {len(answers)} answers in {wall:.0f} s -> {out}/ (report: {out / 'report.html'})")
