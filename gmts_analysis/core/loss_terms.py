"""The loss's parts as entries: the aggregations (one table) and the terms of omega (one entry each).

**Aggregations** (:data:`AGGREGATIONS`, docs/definitions.md section 3): each entry says, once, how the
per-token losses of a batch are combined: ``weights`` (each answer's token weight ``w_i``, for omega:
:func:`gmts_analysis.core.objective.answer_weights`), ``reduce`` (the scalar loss of ``(B, T)`` terms,
for training: :func:`gmts_analysis.core.selection_tensor.aggregate_loss`), ``selected_factor`` (the
rescaling of the ``selected`` normalizer, for the verl recipe:
:func:`gmts_analysis.integrations.verl_recipe.selected_normalizer_factor`; None where it is not defined),
and how verl's ``loss_agg_mode`` and TRL's ``loss_type`` spell it.

**Terms** (:data:`LOSS_TERMS`): each term of the objective is an entry with the
:class:`~gmts_analysis.core.loss_settings.LossSettings` fields it reads, its TRL ``GRPOConfig`` and verl
actor names, when it is on, and its contribution to omega (:class:`OmegaParts` holds what the terms
share: weights, advantages, ratios, the trust and vLLM factors). omega is the sum of the active terms'
contributions (:func:`gmts_analysis.core.objective.omega_tensor`).

Every term here contributes ``omega_t * grad logprob_t``: the exact engine computes each token's
``||grad logprob_t||`` once and the statistics rest on ``grad_norm = |omega| * grad_norm_logp``. A term
whose gradient is not a multiple of ``grad logprob_t`` cannot be an entry: an entropy bonus
(TRL ``entropy_coef``, verl ``entropy_coeff``) has the cotangent ``dH_t / dz_t`` on the logits, a second
vector per token, so its per-token gradient norm needs another VJP per token and breaks that identity.
It is refused by name where TRL's and verl's configs are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gmts_analysis.core.loss_settings import LossSettings
from gmts_analysis.errors import GmtsError

# --- aggregations -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Aggregation:
    """One aggregation of the per-token loss (module docstring), registered in :data:`AGGREGATIONS`.

    Attributes:
        name: the ``--loss-agg`` value (verl's ``loss_agg_mode``).
        weights: ``(L, n_rows, max_len) -> w``: each answer's token weight ``w_i``, from its real-token count
            in ``L`` ``(B, 1)`` (for omega: :func:`gmts_analysis.core.objective.answer_weights`).
        reduce: ``(num, den, n_rows, max_len) -> loss``: the scalar loss of ``(B, T)`` per-token terms.
        selected_factor: the rescaling of the ``selected`` normalizer (the verl recipe); None where it is not
            defined.
        doc: one line for the docs.
        verl: verl's name of it.
        trl: the TRL ``loss_type`` values that train it.
    """

    name: str
    weights: Callable[[Tensor, int, float | None], Tensor]
    reduce: Callable[[Tensor, Tensor, int, float | None], Tensor]
    selected_factor: Callable[[Tensor, Tensor], Tensor] | None
    doc: str
    verl: str
    trl: tuple[str, ...] = ()


def _lmax_weights(L: Tensor, n: int, max_len: float | None) -> Tensor:
    lmax = float(max_len) if max_len else float(L.max().clamp(min=1.0))
    return torch.full_like(L, 1.0 / (n * lmax))


def _lmax_reduce(num: Tensor, den: Tensor, n_rows: int, max_len: float | None) -> Tensor:
    lmax = float(max_len) if max_len else float(den.sum(-1).max().clamp(min=1.0))
    return num.sum() / (n_rows * lmax)


#: the aggregations, in the order of :data:`gmts_analysis.core.vocabulary.LOSS_AGGS`
AGGREGATIONS: dict[str, Aggregation] = {a.name: a for a in (
    Aggregation("token-mean", lambda L, n, mx: torch.full_like(L, 1.0) / L.sum().clamp(min=1.0),
                lambda num, den, n, mx: num.sum() / den.sum().clamp(min=1.0),
                lambda m, s: m.sum() / s.sum().clamp(min=1.0),
                "1 / sum_j L_j", verl="token-mean", trl=("bnpo", "dapo")),
    Aggregation("seq-mean-token-mean", lambda L, n, mx: 1.0 / (n * L.clamp(min=1.0)),
                lambda num, den, n, mx: (num.sum(-1) / den.sum(-1).clamp(min=1.0)).mean(),
                lambda m, s: m.sum(-1, keepdim=True) / s.sum(-1, keepdim=True).clamp(min=1.0),
                "1 / (N L_i)", verl="seq-mean-token-mean", trl=("grpo",)),
    Aggregation("seq-mean-token-sum-norm", _lmax_weights, _lmax_reduce, None, "1 / (N L_max)",
                verl="seq-mean-token-sum-norm", trl=("dr_grpo",)),
    Aggregation("seq-mean-token-sum", lambda L, n, mx: torch.full_like(L, 1.0 / n),
                lambda num, den, n, mx: num.sum() / n, None, "1 / N", verl="seq-mean-token-sum"),
    Aggregation("token-sum", lambda L, n, mx: torch.ones_like(L), lambda num, den, n, mx: num.sum(), None, "1",
                verl="token-sum"),
)}


# --- terms of omega ------------------------------------------------------------------------------

@dataclass
class OmegaParts:
    """What the terms of omega share, ``(B, T)`` float64 (see :mod:`gmts_analysis.core.objective`):
    mask ``m``, token weights ``W``, advantages ``A``, current log-probs ``lp``, real-token counts ``L``
    ``(B, 1)``, the importance ratio, the trust indicator, the vLLM factor ``c``, where verl's ratio clamp
    passes the gradient (``live``), the settings, and the reference log-probs (None: not given)."""

    m: Tensor
    W: Tensor
    A: Tensor
    lp: Tensor
    L: Tensor
    ratio: Tensor
    trust: Tensor
    c: Tensor
    live: Tensor
    settings: LossSettings
    ref: Tensor | None


@dataclass(frozen=True)
class LossTerm:
    """One term of the objective (module docstring), registered in :data:`LOSS_TERMS`; omega is the sum of the
    active terms' contributions.

    Attributes:
        name: the term's name (``policy``, ``kl``).
        fields: the :class:`~gmts_analysis.core.loss_settings.LossSettings` fields it reads.
        trl: the TRL ``GRPOConfig`` arguments that set it.
        verl: the verl settings that set it.
        active: ``settings -> bool``: whether the term is in the loss.
        omega: ``parts -> (B, T)`` float64 tensor: its contribution to each token's coefficient omega
            (``grad(term_t) = omega_t * grad(logprob_t)``), from :class:`OmegaParts`.
        doc: one line for the docs.
    """

    name: str
    fields: tuple[str, ...]
    trl: tuple[str, ...]
    verl: tuple[str, ...]
    active: Callable[[LossSettings], bool]
    omega: Callable[[OmegaParts], Tensor]
    doc: str


def _policy_omega(p: OmegaParts) -> Tensor:
    if p.settings.importance_sampling_level == "sequence":
        pol = p.ratio * (p.W * p.c * p.A * p.trust).sum(-1, keepdim=True) / p.L
    else:
        pol = p.W * p.c * p.ratio * p.A * p.trust
    return pol * p.live


def _exp(x: Any) -> Any:
    return torch.exp(x) if isinstance(x, Tensor) else np.exp(x)


def k3_kl(x: Any) -> Any:
    """The k3 estimate of the per-token KL to the reference, ``exp(x) - x - 1`` in nats, with
    ``x = ref_logprob - logprob`` (tensors or arrays)."""
    return _exp(x) - x - 1.0


def k3_kl_grad(x: Any) -> Any:
    """``d k3 / d logprob = 1 - exp(x)``, ``x = ref_logprob - logprob`` (tensors or arrays)."""
    return 1.0 - _exp(x)


def _kl_omega(p: OmegaParts) -> Tensor:
    s = p.settings
    if p.ref is None:
        raise GmtsError(f"kl_beta={s.kl_beta}: the KL term of omega needs ref_logprobs for every answer")
    x = p.ref - p.lp
    kl_live = torch.ones_like(p.m)
    if s.log_ratio_clamp is not None:
        kl_live = (x.abs() <= s.log_ratio_clamp).to(torch.float64)
        x = x.clamp(-s.log_ratio_clamp, s.log_ratio_clamp)
    k = k3_kl(x)
    gk = k3_kl_grad(x) * kl_live  # d k / d lp
    if s.kl_clamp is not None:
        gk = gk * (k.abs() <= s.kl_clamp).to(torch.float64)
        k = k.clamp(-s.kl_clamp, s.kl_clamp)
    if not s.kl_bias_correction:
        kl = -p.W * gk
    elif s.importance_sampling_level == "sequence":
        kl = -p.ratio * (p.W * gk + (p.W * k).sum(-1, keepdim=True) / p.L)
    else:
        kl = -p.W * p.ratio * (gk + k)
    return s.kl_beta * kl


#: the terms of omega, summed in this order
LOSS_TERMS: dict[str, LossTerm] = {t.name: t for t in (
    LossTerm("policy", ("clip_low", "clip_high", "clip_ratio_c", "importance_sampling_level", "vllm_is_mode",
                        "vllm_is_min", "vllm_is_max", "log_ratio_clamp"),
             trl=("epsilon", "epsilon_high", "importance_sampling_level", "vllm_importance_sampling_mode",
                  "vllm_importance_sampling_clip_min", "vllm_importance_sampling_clip_max"),
             verl=("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c"),
             active=lambda s: True, omega=_policy_omega,
             doc="the clipped policy-gradient surrogate (PPO/GRPO/DAPO per token, GSPO per answer)"),
    LossTerm("kl", ("kl_beta", "kl_bias_correction", "kl_clamp"), trl=("beta", "use_bias_correction_kl"),
             verl=("use_kl_loss", "kl_loss_coef", "kl_loss_type"), active=lambda s: bool(s.kl_beta),
             omega=_kl_omega, doc="the k3 KL penalty to the reference policy"),
)}


def omega_sum(parts: OmegaParts) -> Tensor:
    """The sum of the active terms' contributions, in :data:`LOSS_TERMS` order."""
    om = None
    for term in LOSS_TERMS.values():
        if term.active(parts.settings):
            part = term.omega(parts)
            om = part if om is None else om + part
    return om if om is not None else torch.zeros_like(parts.m)
