"""``gmts sample``: what it does (declared in :mod:`gmts_analysis.commands.sample`)."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import torch

from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import OutputOptions, RunControl, SamplingOptions, default_out
from gmts_analysis.readers import models
from gmts_analysis.readers.models import resolve_model_path
from gmts_analysis.readers.verifiers import resolve_verifier
from gmts_analysis.sampling import domains as sampling_domains
from gmts_analysis.sampling.domains import (
    DEFAULT_DOMAINS,
    WORD_DEFAULTS,
    WORD_DOMAIN,
    card_max_new_tokens,
    check_verifiers_installed,
    domain_list,
)
from gmts_analysis.sampling.generate import read_prompts, sample_prompts
from gmts_analysis.sampling.signal import warn_if_no_signal
from gmts_analysis.toy.sample import write_rollouts
from gmts_analysis.util.io import check_output_file, check_output_location


def _out_file(o: OutputOptions) -> str:
    """The rollouts file to write: --out itself when it names a .jsonl file, else OUT/rollouts.jsonl
    (a directory, as TRL's output_dir; default: a new folder under runs/)."""
    out = Path(o.out or default_out("sample"))
    return str(out if out.suffix.lower() in (".jsonl", ".json") and not out.is_dir() else out / "rollouts.jsonl")


def _check_out(s: SamplingOptions, o: OutputOptions) -> str:
    path = Path(_out_file(o))
    # never --prompts itself; an existing file only when gmts sample wrote it (or --overwrite)
    check_output_file(path, "--out", _is_sampled_rollouts, overwrite=o.overwrite,
                      inputs={"--prompts": s.prompts})
    check_output_location(path.parent, flag=f"--out {o.out or path.parent}: directory", whole_dir=False)
    return str(path)


def sample(s: SamplingOptions, o: OutputOptions, rc: RunControl) -> int:
    """Sample, verify and write the rollouts (:mod:`gmts_analysis.commands.sample`): on the toy domains, or on ``s.prompts``."""
    if s.domains is not None and s.prompts is not None:
        raise GmtsError("gmts sample: give one of --domains (toy domains) or --prompts FILE, not both")
    _check_sampling(s)
    if s.prompts is not None:
        return _run_prompts(s, o, rc)
    if s.num_prompts is None:
        s.num_prompts = 8
    given = s.domains if s.domains is not None else [",".join(DEFAULT_DOMAINS)]
    domains = domain_list(given, flag="--domains")
    check_verifiers_installed(domains)  # before the model is loaded (or a GGUF file converted)
    if s.num_prompts < 1:
        raise GmtsError("--num-prompts must be >= 1")
    out = _check_out(s, o)
    model, tokenizer = models.load_model(s.model, s.device, s.dtype, offline=rc.offline)
    if tokenizer is None:
        raise GmtsError(f"--model {s.model}: no tokenizer saved with the checkpoint (sampling needs one)")
    budget = s.max_completion_length or (WORD_DEFAULTS["max_completion_length"] if domains == [WORD_DOMAIN]
                                            else card_max_new_tokens(resolve_model_path(s.model)))
    with torch.inference_mode():
        rows = sampling_domains.sample_domains(model, tokenizer, domains, s.num_prompts, s.num_generations, s.temperature,
                              budget, s.seed, difficulty=s.difficulty, batch_size=s.batch_size,
                              progress=not rc.quiet, verifier=s.verifier)
    write_rollouts(out, rows)
    mean = sum(r["reward"] for r in rows) / len(rows)
    logging.getLogger("gmts").info("%s: %d answers in %d groups, mean reward %.3f",
                                   out, len(rows), s.num_prompts * len(domains), mean)
    warn_if_no_signal(rows, str(out))  # all rewards of a group equal: no gradient there
    return 0


def _is_sampled_rollouts(path) -> bool:
    """Whether ``path`` is a rollouts file as gmts sample writes it (first row: ids, reward)."""
    with open(path, encoding="utf-8") as f:
        row = json.loads(f.readline())
    return isinstance(row, dict) and {"prompt_ids", "response_ids", "reward"} <= set(row)


def _check_sampling(s: SamplingOptions) -> None:
    """The checks of :class:`SamplingOptions` values that argparse does not make (one line each)."""
    if s.num_generations < 2:
        raise GmtsError(f"--num-generations must be >= 2 (a group needs a baseline), got {s.num_generations}")
    if s.batch_size < 1:
        raise GmtsError("--batch-size must be >= 1")
    if not (s.temperature >= 0 and math.isfinite(s.temperature)):
        raise GmtsError(f"--temperature must be a finite number >= 0, got {s.temperature}")
    if s.max_completion_length is not None and s.max_completion_length < 1:
        raise GmtsError(f"--max-completion-length must be >= 1, got {s.max_completion_length}")


def _run_prompts(s: SamplingOptions, o: OutputOptions, rc: RunControl) -> int:
    """``gmts sample --prompts FILE``: any checkpoint, its chat template, a TRL-style verifier."""
    if s.num_prompts is not None and s.num_prompts < 1:
        raise GmtsError("--num-prompts must be >= 1")
    out = _check_out(s, o)
    rows = read_prompts(s.prompts, s.num_prompts)
    verifier = resolve_verifier(s.verifier)
    model, tokenizer = models.load_model(s.model, s.device, s.dtype, offline=rc.offline)
    if tokenizer is None:
        raise GmtsError(f"--model {s.model}: no tokenizer saved with the checkpoint (sampling needs one)")
    budget = s.max_completion_length or card_max_new_tokens(resolve_model_path(s.model))
    with torch.inference_mode():
        answers = sample_prompts(model, tokenizer, rows, s.num_generations, verifier=verifier,
                                 temperature=s.temperature, max_new_tokens=budget,
                                 seed=s.seed,
                                 chat_template=s.chat_template, batch_size=s.batch_size,
                                 progress=not rc.quiet, where=str(s.prompts))
    write_rollouts(out, answers)
    msg = f"{out}: {len(answers)} answers to {len(rows)} prompts"
    if verifier is not None:
        msg += f", mean reward {sum(a['reward'] for a in answers) / len(answers):.3f}"
    logging.getLogger("gmts").info("%s", msg)
    if verifier is not None:
        warn_if_no_signal(answers, str(out))  # after the mean reward, the last line a user reads
    return 0
