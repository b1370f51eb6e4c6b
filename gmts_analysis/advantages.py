"""Advantages, aggregation weights and omega (SPEC sections 3 and 4).

The one place that turns rewards into advantages and token counts into loss
weights. All functions are pure numpy; arrays are per answer unless noted.
"""

from __future__ import annotations

import warnings
from typing import Sequence

import numpy as np

ADVANTAGE_MODES = ("group", "batch", "none")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
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
) -> np.ndarray:
    """Answer-level advantages ``A_i`` (float64, shape ``(N,)``).

    - ``group`` (GRPO): ``(r - mean_g) / (std_g + 1e-4)``, Bessel-corrected std (as TRL).
    - ``batch``: group mean, std of all rewards of the batch (answers sharing a step).
    - ``none`` (Dr. GRPO): ``r - mean_g``.
    A group of one answer gets ``A = 0`` and a :class:`SingletonGroupWarning`.
    """
    if mode not in ADVANTAGE_MODES:
        raise ValueError(f"advantage mode {mode!r}; choose from {ADVANTAGE_MODES}")
    r = np.asarray(rewards, dtype=np.float64)
    n = len(r)
    batch = _batch_keys(steps, n)
    gkeys = np.asarray([f"{b}\x00{g}" for b, g in zip(batch, group_ids)], dtype=object)
    _, ginv = np.unique(gkeys, return_inverse=True)
    ginv = ginv.reshape(-1)
    adv = np.zeros(n, dtype=np.float64)
    singletons = 0
    batch_std = {}
    if mode == "batch":
        for b in np.unique(batch):
            rb = r[batch == b]
            batch_std[b] = rb.std(ddof=1) if len(rb) > 1 else 0.0
    for g in np.unique(ginv):
        idx = np.flatnonzero(ginv == g)
        if len(idx) == 1:
            singletons += 1
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
) -> np.ndarray:
    """Per-answer aggregation weight ``w_i`` of each of its tokens (float64, ``(N,)``).

    With ``N`` answers and ``sum_j L_j`` tokens in the batch (answers sharing a step):
    ``token-mean``: ``1 / sum_j L_j``; ``seq-mean-token-mean``: ``1 / (N L_i)``;
    ``seq-mean-token-sum-norm``: ``1 / (N L_max)``, ``L_max`` = ``max_len`` (the
    generation budget) or the longest answer of the batch.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss aggregation {mode!r}; choose from {LOSS_AGG_MODES}")
    L = np.asarray(lengths, dtype=np.float64)
    batch = _batch_keys(steps, len(L))
    w = np.zeros(len(L), dtype=np.float64)
    for b in np.unique(batch):
        idx = np.flatnonzero(batch == b)
        Lb = L[idx]
        nb = len(idx)
        if mode == "token-mean":
            w[idx] = 1.0 / max(Lb.sum(), 1.0)
        elif mode == "seq-mean-token-mean":
            w[idx] = 1.0 / (nb * np.maximum(Lb, 1.0))
        else:
            lmax = float(max_len) if max_len else float(Lb.max())
            w[idx] = 1.0 / (nb * max(lmax, 1.0))
    return w


def omega(
    weight: float,
    advantage: float,
    logprob: np.ndarray,
    old_logprob: np.ndarray | None = None,
    ref_logprob: np.ndarray | None = None,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    kl_beta: float = 0.0,
) -> np.ndarray:
    """Per-token coefficient with ``grad(term_t) = omega_t * grad(logprob_t)``; ``(T,)``.

    ``omega = w * (rho * A * I + beta * (pi_ref / pi_theta - 1))`` with ``rho = exp(logprob -
    old_logprob)`` (1 on-policy) and ``I = 0`` where the clipped surrogate is flat
    (``A > 0`` and ``rho > 1 + clip_high``, or ``A < 0`` and ``rho < 1 - clip_low``).
    The KL term is the k3 estimator's gradient; it needs ``ref_logprob`` and ``kl_beta > 0``.
    """
    lp = np.asarray(logprob, dtype=np.float64)
    if old_logprob is None:
        rho = np.ones_like(lp)
    else:
        rho = np.exp(lp - np.asarray(old_logprob, dtype=np.float64))
    trust = np.ones_like(lp)
    if advantage > 0:
        trust[rho > 1.0 + clip_high] = 0.0
    elif advantage < 0:
        trust[rho < 1.0 - clip_low] = 0.0
    coef = rho * advantage * trust
    if ref_logprob is not None and kl_beta:
        coef = coef + kl_beta * (np.exp(np.asarray(ref_logprob, dtype=np.float64) - lp) - 1.0)
    return weight * coef
