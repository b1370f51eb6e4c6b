"""Held-out answers of a checkpoint: sampled once per sampling key and cached, and their pass@1 with a CI.

The series audit (:mod:`gmts_analysis.run.trl_series`) and the real-model training study use one code path:
:func:`sample_answers` writes a checkpoint's answers to a JSONL file (with its sampling key beside it, so the
same command reuses it), :func:`pass_at_1` gives pass@1 with a 95% CI over prompts, and :func:`evaluate_pass1`
does both for a held-out set with one answer or more per prompt (the study's evaluations). Beside pass@1 they
carry the reward audit's answer shares (:func:`answer_audit`: ``boxed_share``, ``truncated_share``,
``modal_answer``, ``modal_answer_share``, ``modal_solution_share``: a constant-answer collapse), computed by
:func:`gmts_analysis.analysis.reward_audit.reward_audit`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from gmts_analysis.analysis.bootstrap import block_rng, multiplicities, quantile_ci, resampled_means
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers import models
from gmts_analysis.readers.audit import final_answer
from gmts_analysis.readers.verifiers import resolve_verifier
from gmts_analysis.util.atomic import atomic_write_jsonl
from gmts_analysis.util.files import jsonl_objects
from gmts_analysis.util.io import atomic_write_json


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects, one per line, of ``path`` (answers this module wrote, or a run's logged batch): a line
    that is not a JSON object is one error naming the file and the line
    (:func:`gmts_analysis.util.files.jsonl_objects`)."""
    return [obj for _, obj in jsonl_objects(path)]


def sampling_key(model_path: str, rows: list[dict], n: int, *, temperature: float, max_new_tokens: int,
                 seed: int, verifier: str | None) -> dict:
    """What determines the answers :func:`sample_answers` samples (its cache is reused only for an equal key)."""
    return {"model": str(model_path), "prompts": [r["prompt"] for r in rows], "num_generations": n,
            "temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed, "verifier": verifier}


def key_path(answers_path: Path) -> Path:
    """Where :func:`sample_answers` keeps the sampling key of the answers at ``answers_path``."""
    return Path(answers_path).with_suffix(".key.json")


def cached_key(answers_path: Path) -> dict | None:
    """The sampling key of the answers cached at ``answers_path`` (None: no answers or no key there)."""
    kfile = key_path(answers_path)
    if not (Path(answers_path).is_file() and kfile.is_file()):
        return None
    return json.loads(kfile.read_text(encoding="utf-8"))


def sample_answers(model_path: str, rows: list[dict], n: int, *, temperature: float, max_new_tokens: int,
                   seed: int, verifier: str | None, batch_size: int = 32, progress: bool = False,
                   path: Path, device: str = "cpu") -> list[dict]:
    """``n`` answers of the checkpoint ``model_path`` to each prompt row (rollout rows of
    :func:`gmts_analysis.sampling.generate.sample_prompts`, scored by ``verifier``), written to ``path`` with the
    sampling key in ``path.key.json``; reused when ``path`` holds the same sampling."""
    key = sampling_key(model_path, rows, n, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                       verifier=verifier)
    path = Path(path)
    kfile = key_path(path)
    if cached_key(path) == key:
        return read_jsonl(path)
    from gmts_analysis.sampling.generate import sample_prompts  # deferred: torch

    model, tok = models.load_model(str(model_path), device)
    out = sample_prompts(model, tok, rows, n, verifier=resolve_verifier(verifier) if verifier else None,
                         temperature=temperature, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                         progress=progress, where=str(path))
    del model
    atomic_write_jsonl(path, out)
    atomic_write_json(kfile, key)
    return out


#: the reward audit's keys that :func:`pass_at_1` carries (the answers' shares; the rest is run-level)
ANSWER_AUDIT_KEYS = ("boxed_share", "truncated_share", "modal_answer", "modal_answer_share", "modal_solution_share")


def answer_audit(rows: list[dict]) -> dict:
    """:data:`ANSWER_AUDIT_KEYS` of the answer ``rows``, from
    :func:`gmts_analysis.analysis.reward_audit.reward_audit` (the one place that computes them; a share is
    ``None`` where no answer records its field). A row sampled before answers recorded their ``final_answer``
    gets the one its verifier scores in its response (the same extraction)."""
    import pandas as pd

    from gmts_analysis.analysis.reward_audit import REFERENCE_COLUMNS, reward_audit  # deferred: pandas

    table: dict[str, list] = {"final_answer": [r["final_answer"] if "final_answer" in r
                                               else final_answer(r.get("verifier"), r.get("response")) for r in rows]}
    for c in ("boxed", "truncated"):
        table[c] = [r.get(c) for r in rows]
    for c in REFERENCE_COLUMNS:
        if rows and any(c in r for r in rows):
            table[c] = [r.get(c) for r in rows]
            break
    audit = reward_audit(pd.DataFrame(table)) if rows else reward_audit(None, 0)
    return {k: audit[k] for k in ANSWER_AUDIT_KEYS}


#: below this many prompts a pass@1 carries :data:`SMALL_CAUTION`: at pass@1 = 0.5 its 95% CI's half-width
#: (1.96 x sqrt(0.25 / prompts)) exceeds 0.2, too wide to tell checkpoints apart
MIN_PASS1_PROMPTS = 25
SMALL_CAUTION = ("too small: {n} prompts (fewer than {m}); at pass@1 0.5 the 95% CI is wider than +-0.2, so "
                 "checkpoints cannot be told apart (more --num-prompts)")


def pass_at_1(rows: list[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """pass@1 (mean reward of binary-scored answers) with a 95% percentile CI from ``n_boot`` resamples of the
    prompts (the answers of one prompt resampled together), the binomial SE, the share of prompts whose
    answers all got the same reward (``zero_variance_groups``; 1.0 when each prompt has one answer), and the
    answers' :func:`answer_audit` (``boxed_share``, ``truncated_share``, the modal answer's shares).

    Answers the verifier could not score (``unscorable``) are counted (``n_unscorable``) and left out of pass@1;
    where none can be scored, pass@1 and its CI are ``None`` with ``pass1_refused`` saying why (never 0.0).
    Fewer than :data:`MIN_PASS1_PROMPTS` prompts add a ``caution``."""
    n_unscorable = sum(1 for r in rows if r.get("unscorable") is True)
    scored = [r for r in rows if r.get("unscorable") is not True]
    groups = sorted({r["group_id"] for r in scored})
    n_prompts = len({r["group_id"] for r in rows})
    extra: dict[str, Any] = {"n_unscorable": n_unscorable}
    if not scored:
        p = lo = hi = se = same = None
        extra["pass1_refused"] = f"none of the {len(rows)} answers could be scored by the verifier"
    else:
        index = {g: i for i, g in enumerate(groups)}
        codes = np.array([index[r["group_id"]] for r in scored])
        v = np.array([float(r.get("reward", 0.0)) for r in scored])
        counts = multiplicities(len(groups), n_boot, block_rng(seed, "heldout-pass1"))
        lo, hi = (float(x) for x in quantile_ci(resampled_means(v, codes, counts)))
        same = sum(1 for g in range(len(groups)) if np.ptp(v[codes == g]) == 0) / len(groups)
        p = float(v.mean())
        se = float(np.sqrt(p * (1 - p) / len(v)))
    if n_prompts < MIN_PASS1_PROMPTS:
        extra["caution"] = SMALL_CAUTION.format(n=n_prompts, m=MIN_PASS1_PROMPTS)
    return {"pass1": p, "ci_low": lo, "ci_high": hi, "se": se, "n_answers": len(rows), "n_prompts": n_prompts,
            "zero_variance_groups": same, **answer_audit(rows), **extra}


def evaluate_pass1(model_path: str, rows: list[dict], *, temperature: float, max_new_tokens: int, seed: int,
                   verifier: str = "math_boxed", path: Path, batch_size: int = 32, progress: bool = False,
                   answers_per_problem: int = 1) -> dict:
    """pass@1 of ``model_path`` on the held-out prompt ``rows``, ``answers_per_problem`` answers each
    (:func:`sample_answers` cached at ``path``; :func:`pass_at_1`: the mean over every answer, its CI resampling
    problems with their answers), with the mean answer length. More answers per problem shrink the sampling noise
    of the estimate, never the problems' own spread."""
    import time

    if answers_per_problem < 1:
        raise GmtsError(f"answers_per_problem: need >= 1, got {answers_per_problem}")
    t0 = time.perf_counter()
    answers = sample_answers(model_path, rows, answers_per_problem, temperature=temperature, max_new_tokens=max_new_tokens,
                             seed=seed, verifier=verifier, batch_size=batch_size, progress=progress, path=path)
    out: dict[str, Any] = pass_at_1(answers, seed=seed)
    out["mean_answer_tokens"] = float(np.mean([len(a["response_ids"]) for a in answers]))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out
