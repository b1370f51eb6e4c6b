"""The per-answer kernel: one answer's per-token quantities (SPEC section 2), nothing else.

``probe_answer`` computes, for one answer, the closed forms (log-prob, entropy, logit-gradient
norm, head norm), omega from the answer's batch-level coefficients, and the exact (or
sketched) per-token gradient norm; ``probe_answers`` loops over a list of answers in memory.
Neither knows of files, figures or toy domains: :mod:`gmts_analysis.job` and
:mod:`gmts_analysis.sharding` orchestrate them.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from gmts_analysis import advantages as adv_mod
from gmts_analysis.config import ProbeConfig
from gmts_analysis.errors import GmtsError
from gmts_analysis.estimators import add_estimator_columns
from gmts_analysis.objective import settings_of
from gmts_analysis.rollouts import Answer
from gmts_analysis.tables import answers_table, concat_columns, id_column

log = logging.getLogger("gmts_analysis.kernel")


@dataclass
class ProbeResult:
    """Tables of one probe: ``tokens`` (one row per response token), ``answers`` (one per answer),
    ``grad_groups`` (with ``--grad-groups``), and timings in seconds."""

    tokens: pd.DataFrame
    answers: pd.DataFrame
    grad_groups: pd.DataFrame | None = None
    timings: dict = field(default_factory=dict)


@dataclass
class AnswerCoefficients:
    """Batch-level quantities of one answer (computed before any sharding)."""

    advantage: float
    loss_weight: float


def answer_coefficients(answers: Sequence[Answer], cfg: ProbeConfig) -> list[AnswerCoefficients]:
    """Advantages and aggregation weights from the whole batch (SPEC section 3)."""
    steps = [a.step for a in answers]
    has_steps = any(s is not None for s in steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", adv_mod.SingletonGroupWarning)
        adv = adv_mod.compute_advantages(
            [a.reward for a in answers], [a.group_id for a in answers], cfg.advantage,
            steps if has_steps else None,
            logged=[getattr(a, "logged_advantage", None) for a in answers] if cfg.advantage == "logged" else None,
        )
    for w in caught:
        log.warning("%s", w.message)
    loss = settings_of(cfg)  # refuses a loss it does not model before any work
    weights = adv_mod.loss_weights(
        [a.length for a in answers], loss.loss_agg, steps if has_steps else None, loss.max_len
    )
    return [AnswerCoefficients(float(a), float(w)) for a, w in zip(adv, weights)]


class TokenText:
    """Decode single tokens for display, cached by id."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            s = self.cache.get(i)
            if s is None:
                s = self.tok.decode([i]) if self.tok is not None else str(i)
                self.cache[i] = s
            out.append(s)
        return out


def _chunk_size(cfg: ProbeConfig) -> int | str:
    cs = cfg.chunk_size
    if cs in (None, "auto"):
        return "auto"
    try:
        v = int(cs)
    except (TypeError, ValueError):
        raise GmtsError(f"--chunk-size: expected an integer or 'auto', got '{cs}'") from None
    if v < 1:
        raise GmtsError(f"--chunk-size: must be at least 1, got {v}")
    return v


def probe_answer(
    model: torch.nn.Module,
    answer: Answer,
    coef: AnswerCoefficients,
    cfg: ProbeConfig,
    token_text: TokenText | None = None,
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """Probe one answer: returns its token columns (dict of equal-length arrays) and group norms."""
    from gmts_analysis.tokens import response_logits, response_targets, token_quantities

    device = next(model.parameters()).device
    ids = torch.tensor(answer.prompt_ids + answer.response_ids, dtype=torch.long, device=device)
    P, T = len(answer.prompt_ids), len(answer.response_ids)
    tau = float(cfg.temperature)
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    logits = out.logits[0]
    if not torch.isfinite(logits).all():
        raise GmtsError(f"{answer.where}: answer '{answer.answer_id}': the model produced non-finite logits")
    q = token_quantities(response_logits(logits, P), response_targets(ids, P), tau)
    hidden = out.hidden_states[-1][0, P - 1 : -1].float()
    h_sq = (hidden * hidden).sum(-1)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and getattr(head, "bias", None) is not None:
        h_sq = h_sq + 1.0  # d logprob / d bias = (e_y - p) / tau
    head_gn = q.logit_grad_norm.float() * h_sq.sqrt()

    logprob = q.logprob.double().cpu().numpy()
    om = adv_mod.omega(
        coef.loss_weight, coef.advantage, logprob,
        old_logprob=None if answer.old_logprobs is None else np.asarray(answer.old_logprobs),
        ref_logprob=None if answer.ref_logprobs is None else np.asarray(answer.ref_logprobs),
        settings=settings_of(cfg), sampling_logprob=getattr(answer, "sampling_logprobs", None),
    )
    entropy = q.entropy.double().cpu().numpy()
    cols: dict[str, Any] = {
        "answer_id": [answer.answer_id] * T,
        "group_id": [answer.group_id] * T,
        "position": np.arange(T, dtype=np.int64),
        "token_id": np.asarray(answer.response_ids, dtype=np.int64),
        "token": (token_text or TokenText(None))(answer.response_ids),
        "logprob": logprob,
        "prob": q.prob.double().cpu().numpy(),
        "entropy": entropy,
        "logit_grad_norm": q.logit_grad_norm.double().cpu().numpy(),
        "advantage": np.full(T, coef.advantage),
        "loss_weight": np.full(T, coef.loss_weight),
        "omega": om,
        "gmts": entropy * np.abs(om),
        "head_grad_norm": head_gn.double().cpu().numpy(),
        "reward": np.full(T, answer.reward),
    }
    if answer.old_logprobs is not None:
        cols["ratio"] = np.exp(logprob - np.asarray(answer.old_logprobs))
    groups_df = None
    if cfg.grad_norm == "none" or T == 0:
        cols["grad_norm_logp"] = np.full(T, np.nan)
    else:
        from gmts_analysis.grads import grad_norms

        gn = grad_norms(
            model, ids, P, temperature=tau, method=cfg.grad_norm, chunk_size=_chunk_size(cfg),
            max_memory=None if cfg.max_memory is None else int(cfg.max_memory) * 2**20,
            probes=int(cfg.probes), seed=int(cfg.seed), groups=cfg.grad_groups,
        )
        cols["grad_norm_logp"] = gn.norms.double().cpu().numpy()
        if gn.lo is not None:
            cols["grad_norm_logp_lo"] = gn.lo.double().cpu().numpy()
            cols["grad_norm_logp_hi"] = gn.hi.double().cpu().numpy()
        if gn.groups:
            names = list(gn.groups)
            sq = np.stack([gn.groups[n].double().cpu().numpy() for n in names], axis=1)  # (T, G)
            groups_df = pd.DataFrame({
                "answer_id": [answer.answer_id] * (T * len(names)),
                "position": np.repeat(np.arange(T), len(names)),
                "group": names * T,
                "grad_norm_logp": np.sqrt(sq).reshape(-1),
            })
    cols["grad_norm"] = np.abs(om) * cols["grad_norm_logp"]
    for k in ("domain", "step"):
        v = getattr(answer, k)
        if v is not None:
            cols[k] = [v] * T
    return cols, groups_df


def probe_answers(
    model: torch.nn.Module,
    tokenizer: Any,
    answers: Sequence[Answer],
    cfg: ProbeConfig,
    coefs: Sequence[AnswerCoefficients] | None = None,
    progress: bool = True,
) -> ProbeResult:
    """Probe every answer; returns the tables (nothing is written).

    ``coefs`` (advantages and weights) default to those of ``answers`` as one batch; pass
    them to probe a subset with batch-wide values. Rows come in input order, by position.
    """
    from tqdm.auto import tqdm

    if coefs is None:
        coefs = answer_coefficients(answers, cfg)
    token_text = TokenText(tokenizer)
    parts: list[dict] = []
    gparts: list[pd.DataFrame] = []
    t0 = time.perf_counter()
    n_tok = 0
    bar = tqdm(total=len(answers), desc="probe", unit="answer", disable=not progress, dynamic_ncols=True)
    try:
        for a, c in zip(answers, coefs):
            cols, g = probe_answer(model, a, c, cfg, token_text)
            parts.append(cols)
            if g is not None:
                gparts.append(g)
            n_tok += a.length
            bar.update(1)
            bar.set_postfix(tok_s=f"{n_tok / max(time.perf_counter() - t0, 1e-9):.1f}")
    finally:
        bar.close()
    elapsed = time.perf_counter() - t0
    tokens = concat_columns(parts)
    add_estimator_columns(tokens)
    groups = pd.concat(gparts, ignore_index=True) if gparts else None
    if groups is not None:
        groups["answer_id"] = id_column(list(groups["answer_id"]))
    return ProbeResult(
        tokens=tokens, answers=answers_table(answers, coefs), grad_groups=groups,
        timings={"probe_s": elapsed, "tokens_per_s": n_tok / elapsed if elapsed > 0 else float("nan")},
    )

