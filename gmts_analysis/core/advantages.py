"""Advantages, aggregation weights and omega on tables (docs/definitions.md sections 3 and 4).

The one place that turns rewards into advantages. Loss weights and omega are computed by
:mod:`gmts_analysis.core.objective` (one implementation for tables and tensors); the functions
here take and return numpy arrays, per answer unless noted.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Sequence

import numpy as np
import torch

from gmts_analysis.core.objective import LossSettings, answer_weights, omega_tensor
from gmts_analysis.core.vocabulary import ADVANTAGE_MODES, LOSS_AGGS
from gmts_analysis.errors import GmtsError

LOSS_AGG_MODES = LOSS_AGGS  # the aggregations of docs/definitions.md section 3 (core.vocabulary)
STD_EPS = 1e-4


class SingletonGroupWarning(UserWarning):
    """A group with one answer has no baseline: its advantage is 0."""


def _batch_keys(steps: Sequence | None, n: int) -> np.ndarray:
    if steps is None:
        return np.zeros(n, dtype=np.int64)
    _, inv = np.unique(np.asarray([str(s) for s in steps], dtype=object), return_inverse=True)
    return inv.reshape(-1)


def compute_advantages(
    rewards: Sequence[float],
    group_ids: Sequence,
    mode: str = "group",
    steps: Sequence | None = None,
    logged: Sequence[float | None] | None = None,
) -> np.ndarray:
    """Answer-level advantages ``A_i`` (float64, shape ``(N,)``).

    - ``group`` (GRPO): ``(r - mean_g) / (std_g + 1e-4)``, Bessel-corrected std (as TRL).
    - ``batch``: group mean, std of all rewards of the batch (answers sharing a step).
    - ``none`` (Dr. GRPO): ``r - mean_g``.
    - ``logged``: the advantages the trainer logged (TRL's ``advantage`` column), one per
      answer in ``logged``, used as they are; a missing or non-finite one is refused.
    A group of one answer gets ``A = 0`` and a :class:`SingletonGroupWarning`. A NaN reward
    (unscorable: every reward function skipped it) is left out of its group's mean and std and
    gets ``A = 0``, as TRL 1.16 does.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode {mode!r}; choose from {ADVANTAGE_MODES}")
    if mode == "logged":
        if logged is None:
            raise GmtsError("advantage=logged: the rollouts have no logged advantage (TRL's 'advantage' column)")
        vals = np.asarray([np.nan if v is None else float(v) for v in logged], dtype=np.float64)
        if len(vals) != len(group_ids):
            raise ValueError(f"{len(vals)} logged advantages for {len(group_ids)} answers")
        bad = np.flatnonzero(~np.isfinite(vals))
        if len(bad):
            raise GmtsError(f"advantage=logged: {len(bad)} answer(s) have no finite logged advantage "
                            f"(first: row {int(bad[0])})")
        return vals
    r = np.asarray(rewards, dtype=np.float64)
    n = len(r)
    finite = np.isfinite(r)  # NaN: unscorable (TRL: out of the group's mean and std, advantage 0)
    batch = _batch_keys(steps, n)
    gkeys = np.asarray([f"{b}\x00{g}" for b, g in zip(batch, group_ids)], dtype=object)
    _, ginv = np.unique(gkeys, return_inverse=True)
    ginv = ginv.reshape(-1)
    adv = np.zeros(n, dtype=np.float64)
    singletons = 0
    batch_std = {}
    if mode == "batch":
        for b in np.unique(batch):
            rb = r[(batch == b) & finite]
            batch_std[b] = rb.std(ddof=1) if len(rb) > 1 else 0.0
    for g in np.unique(ginv):
        idx = np.flatnonzero(ginv == g)
        if len(idx) == 1:
            singletons += 1
            continue
        idx = idx[finite[idx]]
        if len(idx) < 2:  # no baseline among the scored answers: TRL's NaN std gives advantage 0
            continue
        rg = r[idx]
        centred = rg - rg.mean()
        if mode == "group":
            adv[idx] = centred / (rg.std(ddof=1) + STD_EPS)
        elif mode == "batch":
            adv[idx] = centred / (batch_std[batch[idx[0]]] + STD_EPS)
        else:
            adv[idx] = centred
    if singletons:
        warnings.warn(
            f"{singletons} group(s) have a single answer: no baseline, advantage set to 0",
            SingletonGroupWarning,
            stacklevel=2,
        )
    return adv


def loss_weights(
    lengths: Sequence[int],
    mode: str = "token-mean",
    steps: Sequence | None = None,
    max_len: int | None = None,
    truncated: Sequence[bool] | None = None,
) -> np.ndarray:
    """Per-answer aggregation weight ``w_i`` of each of its tokens (float64, ``(N,)``).

    With ``N`` answers and ``sum_j L_j`` tokens in the batch (answers sharing a step):
    ``token-mean``: ``1 / sum_j L_j``; ``seq-mean-token-mean``: ``1 / (N L_i)``;
    ``seq-mean-token-sum-norm``: ``1 / (N L_max)``, ``L_max`` = ``max_len`` (the
    generation budget) or the longest answer of the batch. One batch at a time through
    :func:`gmts_analysis.core.objective.answer_weights` (the one formula). verl's
    ``seq-mean-token-sum``: ``1 / N``; ``token-sum``: 1.

    ``truncated`` (TRL's ``mask_truncated_completions``): those answers get ``w = 0`` and their
    tokens leave the token count of ``token-mean``, while ``N`` still counts them (TRL zeroes
    their completion mask; its per-answer means still divide by the number of answers).
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss aggregation {mode!r}; choose from {LOSS_AGG_MODES}")
    L = np.asarray(lengths, dtype=np.float64)
    batch = _batch_keys(steps, len(L))
    w = np.zeros(len(L), dtype=np.float64)
    for b in np.unique(batch):
        idx = np.flatnonzero(batch == b)
        Lb = L[idx].copy()
        if truncated is not None and mode == "token-mean":
            Lb[np.asarray(truncated, dtype=bool)[idx]] = 0.0
        w[idx] = answer_weights(torch.from_numpy(Lb), mode, max_len).numpy()
    if truncated is not None:
        w[np.asarray(truncated, dtype=bool)] = 0.0
    return w


def omega(
    weight: float,
    advantage: float,
    logprob: np.ndarray,
    old_logprob: np.ndarray | None = None,
    ref_logprob: np.ndarray | None = None,
    settings: LossSettings | None = None,
    sampling_logprob: np.ndarray | None = None,
    **fields: Any,
) -> np.ndarray:
    """One answer's per-token omega, ``(T,)`` float64: the coefficient of ``grad logprob_t`` in the
    gradient of the training objective (docs/definitions.md section 4).

    ``weight``: the answer's ``w_i``; ``advantage``: ``A_i``; ``logprob`` (and the optional old,
    reference and sampling log-probs): ``(T,)``. ``settings`` (or :class:`LossSettings` fields as
    keywords, e.g. ``clip_high=0.28, kl_beta=0.04``) say which loss was trained. On-policy under
    the default settings this is ``weight * advantage`` for every token. Computed by
    :func:`gmts_analysis.core.objective.omega_tensor` (the one formula) on a batch of one answer.
    """
    if settings is None:
        settings = LossSettings(**fields)
    elif fields:
        settings = dataclasses.replace(settings, **fields)
    lp = torch.as_tensor(np.asarray(logprob, dtype=np.float64))[None]
    opt = lambda x: None if x is None else torch.as_tensor(np.asarray(x, dtype=np.float64))[None]  # noqa: E731
    om = omega_tensor(
        lp, torch.ones_like(lp), torch.tensor([float(advantage)], dtype=torch.float64),
        torch.tensor([float(weight)], dtype=torch.float64), settings,
        old_logprobs=opt(old_logprob), ref_logprobs=opt(ref_logprob), sampling_logprobs=opt(sampling_logprob),
    )
    return om[0].numpy()
