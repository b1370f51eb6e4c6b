"""Sampling answer groups on the named worlds: the toy domains and the word problems (``gmts sample``,
``gmts run`` and :func:`gmts_analysis.api.sample` share it)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.options import resolve_aliases
from gmts_analysis.options.config import SamplingOptions, check_values
from gmts_analysis.readers import models
from gmts_analysis.readers.verifiers import resolve_verifier
from gmts_analysis.sampling.names import ALL_DOMAINS, DEFAULT_DOMAINS, WORD_DOMAIN, domain_list  # noqa: F401
from gmts_analysis.sampling.signal import warn_if_no_signal
from gmts_analysis.sampling.wordproblems import word_problems

#: the word world's defaults (``gmts run --model smollm2``, ``gmts sample --domains word``), sized for
#: SmolLM2-135M-Instruct on 2 CPU cores (README, "A real model"): a budget that lets at least 90% of its
#: answers finish (measured by benchmarks/word_design.py; docs/studies/smollm2.md)
WORD_DEFAULTS = {"num_prompts": 8, "num_generations": 4, "temperature": 0.7, "max_completion_length": 256,
                 "grad_norm": "exact"}
#: the word problems' verifier: the last \boxed{} only (``math`` adds the fallback, counted by the reward audit)
WORD_VERIFIER = "math_boxed"
WORD_VERIFIERS = ("math_boxed", "math")


def card_max_new_tokens(model_path: str, default: int = 96) -> int:
    """The generation budget recorded in a shipped policy's ``card.json`` (else ``default``)."""
    import json

    card = Path(model_path) / "card.json"
    if card.exists():
        try:
            v = json.loads(card.read_text()).get("max_new_tokens")
            if isinstance(v, int) and v > 0:
                return v
        except (ValueError, OSError):
            pass
    return default


def sampling_options(model: Any, domains: Any, options: dict[str, Any], where: str = "gmts.sample") -> SamplingOptions:
    """:class:`SamplingOptions` from keywords (aliases resolved; unknown names refused, named as ``where``)."""
    import difflib

    names = tuple(f.name for f in dataclasses.fields(SamplingOptions))
    kw = resolve_aliases(options, names)
    for k in kw:
        if k not in names or k in ("model", "domains", "prompts", "chat_template"):
            close = difflib.get_close_matches(k, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise GmtsError(f"{where}: unknown option '{k}'{hint}")
    if isinstance(model, (str, os.PathLike)):
        kw["model"] = os.fspath(model)
    kw["domains"] = domains if domains is not None else ",".join(DEFAULT_DOMAINS)
    opts = SamplingOptions(**kw)
    check_values(opts, skip=("model", "domains"))
    return opts


def check_verifiers_installed(domains: list[str]) -> None:
    """The word problems are scored by math-verify (``math_boxed``, or ``math``): refuse its absence before any
    model is loaded (or a GGUF file converted), in the verifier's own words."""
    if WORD_DOMAIN in domains:
        import importlib.util

        if importlib.util.find_spec("math_verify") is None:
            raise GmtsError(f"--domains {WORD_DOMAIN}: the word problems are scored by the math verifier, which "
                            "needs the math-verify package: pip install 'gmts_analysis[math]' (or pip install "
                            "'math-verify>=0.5')")


def sample_rows(model: Any, opts: SamplingOptions, *, tokenizer: Any = None, progress: bool = True,
                offline: bool = False) -> list[dict]:
    """Rollout rows of ``opts`` (docs/definitions.md section 7) from ``model``: a name or path (loaded on
    ``opts.device``; no hub download when ``offline``) or a loaded model with ``tokenizer``. Warns when most
    groups have no reward variance (:func:`gmts_analysis.sampling.signal.warn_if_no_signal`)."""
    doms = domain_list(opts.domains)
    check_word_verifier(opts.verifier, doms)
    check_verifiers_installed(doms)
    n_prompts = 8 if opts.num_prompts is None else opts.num_prompts
    if n_prompts < 1 or opts.num_generations < 2:
        raise GmtsError("sample: num_prompts must be >= 1 and num_generations >= 2 (a group needs a baseline)")
    if opts.max_completion_length is not None and opts.max_completion_length < 1:
        raise GmtsError(f"sample: max_completion_length must be >= 1, got {opts.max_completion_length}")
    if isinstance(model, (str, os.PathLike)):
        path = models.resolve_model_path(os.fspath(model))
        model, tok = models.load_model(os.fspath(model), opts.device, opts.dtype, offline=offline)
        tokenizer = tokenizer if tokenizer is not None else tok
    else:
        path = str(getattr(model, "name_or_path", "") or "")
    if tokenizer is None:
        raise GmtsError("sample: the model has no tokenizer (pass tokenizer=)")
    budget = opts.max_completion_length or card_max_new_tokens(path)
    rows = sample_domains(model, tokenizer, doms, n_prompts, opts.num_generations, opts.temperature, budget,
                          opts.seed, difficulty=opts.difficulty, batch_size=opts.batch_size, progress=progress,
                          verifier=opts.verifier)
    warn_if_no_signal(rows, "sample")  # all rewards of a group equal: no gradient there (one line on stderr)
    return rows


def check_word_verifier(verifier: str | None, domains: list[str]) -> None:
    """A verifier is chosen for the word problems only (each toy domain is scored by its own), and is one of
    :data:`WORD_VERIFIERS`; anything else is refused with one line naming ``--verifier``."""
    if verifier is None:
        return
    if WORD_DOMAIN not in domains:
        raise GmtsError(f"--verifier {verifier}: only the word problems take a verifier here (each toy domain is "
                        "scored by its own; gmts sample --prompts FILE takes any verifier)")
    if verifier not in WORD_VERIFIERS:
        raise GmtsError(f"--verifier {verifier}: the word problems are scored by {' or '.join(WORD_VERIFIERS)} "
                        f"({WORD_VERIFIER}, the default, reads the last \\boxed{{}} only; math adds its fallback)")


def sample_domains(model: Any, tokenizer: Any, domains: list[str], num_prompts: int, num_generations: int,
                   temperature: float, max_new_tokens: int, seed: int, *, difficulty: Any = None,
                   batch_size: int = 64, progress: bool = False, verifier: str | None = None) -> list[dict]:
    """``num_generations`` answers to ``num_prompts`` prompts of each domain, domain-major then prompt-major;
    ``verifier``: the word problems' (default :data:`WORD_VERIFIER`)."""
    check_word_verifier(verifier, domains)
    from gmts_analysis.toy.sample import sample_rollouts  # deferred: torch

    rows: list[dict] = []
    for d in domains:
        if d == WORD_DOMAIN:
            rows += sample_word_problems(model, tokenizer, num_prompts, num_generations, temperature,
                                         max_new_tokens, seed, progress, verifier=verifier or WORD_VERIFIER)
        else:
            rows += sample_rollouts(model, tokenizer, d, num_prompts, num_generations, temperature=temperature,
                                    max_new_tokens=max_new_tokens, seed=seed, difficulty=difficulty,
                                    batch_size=batch_size, progress=progress)
    return rows


def sample_word_problems(model: Any, tokenizer: Any, num_prompts: int, group_size: int, temperature: float,
                         max_new_tokens: int, seed: int, progress: bool = False,
                         verifier: str = WORD_VERIFIER) -> list[dict]:
    """``group_size`` answers to each of ``num_prompts`` word problems (:mod:`gmts_analysis.sampling.wordproblems`):
    the chat template, scored by ``verifier`` (:data:`WORD_VERIFIER`, boxed-only, unless ``math`` asks for the
    fallback); ids ``word-<i:04d>`` and ``word-<i:04d>-<j>``, ``domain`` word."""
    from gmts_analysis.sampling.generate import sample_prompts  # deferred: torch

    check_word_verifier(verifier, [WORD_DOMAIN])
    rows = sample_prompts(model, tokenizer, word_problems(num_prompts, seed), group_size,
                          verifier=resolve_verifier(verifier),
                          temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                          chat_template="auto", progress=progress, where="word problems")
    for r in rows:
        i, j = (int(x) for x in r["answer_id"][1:].split("-"))
        r["group_id"], r["answer_id"], r["domain"] = f"{WORD_DOMAIN}-{i:04d}", f"{WORD_DOMAIN}-{i:04d}-{j}", WORD_DOMAIN
    return rows
