"""The per-answer kernel: one answer's per-token quantities (docs/definitions.md section 2), nothing else.

``probe_answer`` computes, for one answer, the closed forms (log-prob, entropy, logit-gradient
norm, head norm), omega from the answer's batch-level coefficients, and the exact (or
sketched) per-token gradient norm. The gradient engine's own forwards give the closed forms
(no separate forward); with ``--grad-norm none`` one no-grad forward does.
``probe_answers`` loops over a list of answers in memory.
Neither knows of files, figures or toy domains: :mod:`gmts_analysis.run.job` and
:mod:`gmts_analysis.run.sharding` orchestrate them.
"""

from __future__ import annotations

import logging
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch

from gmts_analysis.core import advantages as adv_mod
from gmts_analysis.core.estimators import add_estimator_columns, gmts_score, times_abs_omega
from gmts_analysis.core.objective import clipped_mask, k3_kl, policy_ratio
from gmts_analysis.core.tokens import TokenQuantities
from gmts_analysis.engine import forward_quantities, grad_norms
from gmts_analysis.errors import GmtsError
from gmts_analysis.probing.settings import KernelSettings
from gmts_analysis.probing.tables import answers_table, concat_columns, id_column
from gmts_analysis.probing.validate import check_finite, check_finite_scalars
from gmts_analysis.readers.rollouts import Answer
from gmts_analysis.util.interrupt import raise_if_interrupted
from gmts_analysis.util.progress import tqdm

log = logging.getLogger("gmts_analysis.probing.kernel")


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


def answer_coefficients(answers: Sequence[Answer], settings: KernelSettings) -> list[AnswerCoefficients]:
    """Advantages and aggregation weights from the whole batch (docs/definitions.md section 3), under
    ``settings.advantage`` and ``settings.loss``."""
    steps = [a.step for a in answers]
    has_steps = any(s is not None for s in steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", adv_mod.SingletonGroupWarning)
        adv = adv_mod.compute_advantages(
            [a.reward for a in answers], [a.group_id for a in answers], settings.advantage,
            steps if has_steps else None,
            logged=[getattr(a, "logged_advantage", None) for a in answers] if settings.advantage == "logged" else None,
        )
    for w in caught:
        log.warning("%s", w.message)
    loss = settings.loss
    if loss.kl_beta and answers and all(a.ref_logprobs is None for a in answers):
        # one error before any work, not one failed answer per row (objective.omega_tensor refuses per answer)
        raise GmtsError(f"--kl-beta {loss.kl_beta} (TRL beta, verl kl_loss_coef): the KL term of omega needs "
                        "ref_logprobs, and no answer has them; pass --kl-beta 0 to probe the policy term alone")
    truncated = None
    if settings.mask_truncated_completions:
        unknown = [a for a in answers if "unterminated" not in a.extra]
        if unknown:
            raise GmtsError(f"--mask-truncated-completions: {unknown[0].where or 'answer ' + str(unknown[0].answer_id)}: "
                            "not checked for a stop token (mark_unterminated was not run)")
        truncated = [bool(a.extra["unterminated"]) for a in answers]
    weights = adv_mod.loss_weights(
        [a.length for a in answers], loss.loss_agg, steps if has_steps else None, loss.max_len, truncated=truncated
    )
    return [AnswerCoefficients(float(a), float(w)) for a, w in zip(adv, weights)]


def stop_token_ids(tokenizer: Any, model: Any = None) -> set[int]:
    """The ids that end a completion as TRL counts them: EOS (tokenizer and generation config) and pad."""
    ids: set[int] = set()
    for src in (tokenizer, getattr(model, "generation_config", None)):
        for name in ("eos_token_id", "pad_token_id"):
            v = getattr(src, name, None) if src is not None else None
            for x in (v if isinstance(v, (list, tuple)) else [v]):
                if isinstance(x, int):
                    ids.add(x)
    return ids


def mark_unterminated(answers: Sequence[Answer], tokenizer: Any, model: Any = None) -> int:
    """Set ``answer.extra["unterminated"]``: the response does not end with a stop token
    (:func:`stop_token_ids`), TRL's test for a truncated completion. Returns how many are.
    Raises :class:`GmtsError` when neither the tokenizer nor the model names a stop token."""
    stops = stop_token_ids(tokenizer, model)
    if not stops:
        raise GmtsError("--mask-truncated-completions: the tokenizer and the model's generation config "
                        "name no EOS or pad token, so truncated answers cannot be told apart")
    n = 0
    for a in answers:
        cut = not a.response_ids or a.response_ids[-1] not in stops
        a.extra["unterminated"] = cut
        n += cut
    return n


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


def probe_answer(
    model: torch.nn.Module,
    answer: Answer,
    coef: AnswerCoefficients,
    settings: KernelSettings,
    token_text: TokenText | None = None,
) -> tuple[dict[str, Any], pd.DataFrame | None]:
    """Probe one answer: returns its token columns (dict of equal-length arrays) and group norms.

    ``settings.engine.strict`` (a job setting, :attr:`~gmts_analysis.options.config.JobSettings.strict`): refuse,
    with a :class:`GmtsError`, an answer the exact engine refuses instead of sending it to the
    per-token loop. The column ``grad_norm_method`` says which method gave each answer's norms."""
    where = f"{answer.where}: answer '{answer.answer_id}'"
    check_finite_scalars({"reward": answer.reward, "advantage": coef.advantage, "loss_weight": coef.loss_weight},
                         where)
    T = len(answer.response_ids)
    q, gn = _answer_quantities(model, answer, settings, where)
    head_gn = q.head_grad_norm if q.head_grad_norm is not None else torch.full((T,), float("nan"))
    logprob = q.logprob.double().cpu().numpy()
    om = adv_mod.omega(
        coef.loss_weight, coef.advantage, logprob,
        old_logprob=None if answer.old_logprobs is None else np.asarray(answer.old_logprobs),
        ref_logprob=None if answer.ref_logprobs is None else np.asarray(answer.ref_logprobs),
        settings=settings.loss, sampling_logprob=getattr(answer, "sampling_logprobs", None),
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
        "gmts": gmts_score(entropy, om),
        "head_grad_norm": head_gn.double().cpu().numpy(),
        "reward": np.full(T, answer.reward),
    }
    if answer.old_logprobs is not None:  # off-policy: the ratio and whether the clip silences the token
        log_ratio = logprob - np.asarray(answer.old_logprobs, dtype=np.float64)
        cols["ratio"] = policy_ratio(log_ratio)
        loss = settings.loss
        seq = loss.importance_sampling_level == "sequence" and T > 0
        r_eff = policy_ratio(log_ratio, "sequence") if seq else cols["ratio"]
        cols["clipped"] = clipped_mask(torch.from_numpy(r_eff), torch.full((T,), float(coef.advantage),
                                                                           dtype=torch.float64), loss).numpy()
    if answer.ref_logprobs is not None:  # the reference log-prob and TRL's per-token k3 KL estimate (nats)
        ref = np.asarray(answer.ref_logprobs, dtype=np.float64)
        cols["ref_logprob"] = ref
        cols["kl_k3"] = k3_kl(ref - logprob)
    groups_df = None
    if gn is None:
        cols["grad_norm_logp"] = np.full(T, np.nan)
    else:
        norm_cols, groups_df = _grad_norm_columns(answer, gn)
        cols.update(norm_cols)
    cols["grad_norm_method"] = [gn.method if gn is not None else settings.engine.method] * T
    cols["grad_norm"] = times_abs_omega(cols["grad_norm_logp"], om)
    for k in ("domain", "step"):
        v = getattr(answer, k)
        if v is not None:
            cols[k] = [v] * T
    _check_finite(cols, groups_df, settings.engine.method, where)
    return cols, groups_df


def _answer_quantities(model: torch.nn.Module, answer: Answer, settings: KernelSettings, where: str):
    """``(q, gn)``: the answer's :class:`~gmts_analysis.core.tokens.TokenQuantities` and its
    gradient norms (``None`` under ``--grad-norm none``, where one no-grad forward gives ``q``).
    Raises :class:`GmtsError` when the model produced non-finite logits."""
    device = next(model.parameters()).device
    ids = torch.tensor(answer.prompt_ids + answer.response_ids, dtype=torch.long, device=device)
    P, T = len(answer.prompt_ids), len(answer.response_ids)
    tau = settings.temperature
    engine = settings.engine
    gn = None
    if T == 0:
        z = torch.zeros(0, dtype=torch.float64)
        q = TokenQuantities(z, z, z, z, z, head_grad_norm=z)
    elif engine.method == "none":
        q = forward_quantities(model, ids, P, tau)  # the one forward: closed forms only
    else:  # the engine's forwards also give the closed forms
        gn = grad_norms(
            model, ids, P, temperature=tau, method=engine.method, chunk_size=engine.chunk_size,
            max_memory=engine.max_memory_bytes, probes=engine.probes, seed=engine.seed, groups=engine.groups,
            strict=engine.strict, where=where,
        )
        q = gn.quantities
    if not q.finite:
        raise GmtsError(f"{where}: the model produced non-finite logits")
    return q, gn


def _grad_norm_columns(answer: Answer, gn) -> tuple[dict[str, np.ndarray], pd.DataFrame | None]:
    """The columns of the answer's gradient norms ``gn`` (:class:`gmts_analysis.engine.GradNorms`):
    ``grad_norm_logp`` and the sketch's interval ``_lo``/``_hi``; with ``--grad-groups`` also its
    rows of the group table (one per token and group, norms not squared)."""
    T = len(answer.response_ids)
    cols: dict[str, np.ndarray] = {"grad_norm_logp": gn.norms.double().cpu().numpy()}
    groups_df = None
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
    return cols, groups_df

def _check_finite(cols: dict[str, Any], groups_df: pd.DataFrame | None, method: str, where: str) -> None:
    """Finite or nothing: a non-finite value in any float column fails the answer (errors.jsonl);
    grad_norm_logp (and so grad_norm) is NaN by design under --grad-norm none."""
    check_finite(cols, where, allow_nan=("grad_norm_logp", "grad_norm") if method == "none" else ())
    if groups_df is not None:
        check_finite({"grad_norm_logp of a group": groups_df["grad_norm_logp"].to_numpy()}, where)

def probe_answers(
    model: torch.nn.Module,
    tokenizer: Any,
    answers: Sequence[Answer],
    settings: KernelSettings,
    coefs: Sequence[AnswerCoefficients] | None = None,
    progress: bool = True,
    probe_one: Callable[..., tuple[dict[str, Any], pd.DataFrame | None]] | None = None,
) -> ProbeResult:
    """Probe every answer; returns the tables (nothing is written).

    ``coefs`` (advantages and weights) default to those of ``answers`` as one batch; pass
    them to probe a subset with batch-wide values. Rows come in input order, by position.
    ``probe_one``: how one answer is probed (default
    :func:`probe_answer`, same arguments; :func:`gmts_analysis.probe` passes the out-of-memory back-off).
    """
    if coefs is None:
        coefs = answer_coefficients(answers, settings)
    token_text = TokenText(tokenizer)
    parts: list[dict] = []
    gparts: list[pd.DataFrame] = []
    t0 = time.perf_counter()
    n_tok = 0
    bar = tqdm(total=len(answers), desc="probe", unit="answer", disable=not progress, dynamic_ncols=True)
    try:
        for a, c in zip(answers, coefs):
            cols, g = (probe_one or probe_answer)(model, a, c, settings, token_text)
            raise_if_interrupted()  # a Ctrl-C whose KeyboardInterrupt was lost on the way
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

