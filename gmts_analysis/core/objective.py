"""The one home of the loss weights ``w`` and of omega (docs/definitions.md sections 3 and 4).

omega is defined by the gradient of the training objective ``J = -loss``::

    grad_theta J = sum_{i,t} omega_{i,t} * grad_theta logprob_{i,t}

so ``omega_{i,t} = -d loss / d logprob_{i,t}`` with every log-prob treated as an independent
variable (old, reference and sampling log-probs are constants). This module computes it for
the losses TRL 1.16 and verl train with, and refuses every setting it does not model
(:class:`LossSettings`, :func:`trl_loss_settings`, :func:`verl_loss_settings`).

Notation for answer ``i`` with response mask ``m`` (``L_i = sum_t m_t`` tokens), aggregation
weight ``W_t = w_i m_t`` (:func:`answer_weights`), advantage ``A`` (per answer or per token),
``r_t = exp(lp_t - old_t)``, the vLLM importance-sampling factor ``c_t`` (1 when off) and the
trust indicator ``I`` (0 where the clipped surrogate is flat: ``A > 0`` and ratio ``> 1 +
clip_high``; ``A < 0`` and ratio ``< 1 - clip_low``; with verl's dual clip also ``A < 0`` and
ratio ``> clip_ratio_c``).

Policy term, ``importance_sampling_level="token"`` (PPO/GRPO/DAPO)::

    omega_t = W_t * c_t * r_t * A_t * I_t

Policy term, ``importance_sampling_level="sequence"`` (GSPO): one ratio per answer
``s = exp(sum_t m_t (lp_t - old_t) / L_i)``, broadcast to every token, so each token's loss
``-min(s A_u, clip(s) A_u)`` depends on *every* log-prob of the answer through ``s``
(``d s / d lp_t = s m_t / L_i``). Collecting the coefficient of ``grad lp_t`` in the total
gradient::

    omega_t = (s / L_i) * sum_u W_u c_u A_u I_u      (the same for every real token t)

which is ``w_i * s * A_i * I_i * mean_u c_u`` for an answer-level advantage.

KL term (k3 estimator ``k_t = exp(ref_t - lp_t) - (ref_t - lp_t) - 1``, ``g_t = d k_t / d lp_t
= 1 - exp(ref_t - lp_t)``), weight ``beta``. It is never multiplied by ``c`` (TRL adds it
after the vLLM correction)::

    plain (verl, definitions):                 omega_t += -beta * W_t * g_t  = beta W_t (pi_ref/pi - 1)
    TRL use_bias_correction_kl, token:   loss term k_t * r_t:  omega_t += -beta * W_t * r_t * (g_t + k_t)
    TRL use_bias_correction_kl, sequence: loss term k_t * s:
                                         omega_t += -beta * s * (W_t g_t + sum_u W_u k_u / L_i)

verl's ``low_var_kl`` clamps ``ref - lp`` to [-20, 20] and ``k`` to [-10, 10]; a clamped value has
zero gradient (``kl_clamp``); its policy ratio clamps ``lp - old`` to [-20, 20] (``log_ratio_clamp``).

vLLM importance sampling (TRL ``vllm_importance_sampling_correction``, computed in
``_generate_and_score_completions``): ``d_t = m_t * (old_t - sampling_t)`` (NaN -> 0); token modes
use ``exp(d_t)``, sequence modes ``exp(sum_t d_t)`` for every token; ``*_truncate`` clamps to
``[clip_min, clip_max]``, ``*_mask`` sets values outside to 0. It carries no gradient.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from gmts_analysis.core.loss_settings import LossSettings  # noqa: F401 - re-exported (its home)
from gmts_analysis.core.loss_terms import (  # noqa: F401 - k3_kl, k3_kl_grad re-exported (the KL term's)
    AGGREGATIONS,
    OmegaParts,
    _exp,
    k3_kl,
    k3_kl_grad,
    omega_sum,
)
from gmts_analysis.core.trl_args import TrlLossArgs
from gmts_analysis.core.vocabulary import (  # noqa: F401 - the loss names, re-exported
    DEFAULT_CLIP,
    DEFAULT_VLLM_IS_MAX,
    IS_LEVELS,
    LOSS_AGGS,
    LOSS_TYPES,
    REFUSED_LOSS_TYPES,
    TRL_AGGREGATION,
    VLLM_IS_MODES,
)
from gmts_analysis.errors import GmtsError

#: TRL 1.16 ``loss_type`` -> aggregation, for the loss types omega models (grpo: per-answer mean then
#: mean over answers; bnpo: local micro-batch token mean; dapo: token mean over the generation batch,
#: ``num_items_in_batch``; dr_grpo: sum / (answers * max_completion_length)); the names are listed in
#: :mod:`gmts_analysis.core.vocabulary`
TRL_LOSS_AGG = {k: TRL_AGGREGATION[k] for k in LOSS_TYPES}


def loss_settings(
    loss_type: str | None = None,
    loss_agg: str | None = None,
    *,
    kl_bias_correction: str | bool = "auto",
    **fields: Any,
) -> LossSettings:
    """:class:`LossSettings` from CLI-style options, mapping TRL's ``loss_type`` onto ``loss_agg``.

    ``loss_type`` (grpo | bnpo | dapo | dr_grpo) fixes the aggregation (a different explicit
    ``loss_agg`` is refused) and, with ``kl_bias_correction="auto"``, turns on TRL 1.16's default
    bias-corrected KL; ``dr_grpo`` needs ``max_len`` (TRL's ``max_completion_length``). Other
    TRL loss types are refused by name.
    """
    agg = loss_agg
    if loss_type is not None:
        if loss_type in REFUSED_LOSS_TYPES:
            raise GmtsError(f"loss_type={loss_type}: TRL's '{loss_type}' loss is not modelled by omega "
                            f"(modelled: {', '.join(LOSS_TYPES)})")
        if loss_type not in TRL_LOSS_AGG:
            raise GmtsError(f"loss_type: unknown loss type '{loss_type}' (choose from {', '.join(LOSS_TYPES)})")
        agg = TRL_LOSS_AGG[loss_type]
        if loss_agg not in (None, agg):
            raise GmtsError(f"loss_type={loss_type} aggregates as '{agg}', but loss_agg={loss_agg} was given")
        if loss_type == "dr_grpo" and not fields.get("max_len"):
            raise GmtsError("loss_type=dr_grpo divides by TRL's max_completion_length: "
                            "pass max_completion_length= (or max_len=)")
    if kl_bias_correction in ("auto", None):
        bias = loss_type is not None
    elif kl_bias_correction in ("on", True):
        bias = True
    elif kl_bias_correction in ("off", False):
        bias = False
    else:
        raise GmtsError(f"kl_bias_correction: expected auto, on or off, got '{kl_bias_correction}'")
    return LossSettings(loss_agg=agg or "token-mean", kl_bias_correction=bias, **fields)


class LossOptions(Protocol):
    """The loss options :func:`settings_of` reads: the RL objective fields of
    :class:`gmts_analysis.options.config.ProbeOptions` (a :class:`~gmts_analysis.options.settings.RunSettings`
    has them too), as a type this layer can name without importing the options."""

    loss_type: str | None
    loss_agg: str
    kl_bias_correction: str
    max_len: int | None
    max_completion_length: int | None
    clip_low: float
    clip_high: float
    clip_ratio_c: float | None
    kl_beta: float
    importance_sampling_level: str
    vllm_is_mode: str | None
    vllm_is_min: float | None
    vllm_is_max: float


def settings_of(opts: LossOptions) -> LossSettings:
    """:class:`LossSettings` of the loss options of a :class:`gmts_analysis.options.config.ProbeOptions`."""
    loss_type = opts.loss_type
    agg: str | None = opts.loss_agg
    if loss_type is not None and agg == "token-mean":  # the option's default: let loss_type decide
        agg = None
    return loss_settings(
        loss_type, agg, kl_bias_correction=opts.kl_bias_correction,
        max_len=opts.max_len or opts.max_completion_length,
        clip_low=opts.clip_low, clip_high=opts.clip_high,
        clip_ratio_c=opts.clip_ratio_c, kl_beta=float(opts.kl_beta or 0.0),
        importance_sampling_level=opts.importance_sampling_level or "token",
        vllm_is_mode=opts.vllm_is_mode, vllm_is_min=opts.vllm_is_min,
        vllm_is_max=opts.vllm_is_max,
    )


# --- TRL and verl configurations ------------------------------------------------------------

def trl_loss_settings(args: TrlLossArgs, *, what: str = "omega") -> LossSettings:
    """:class:`LossSettings` of the loss a TRL 1.16 ``GRPOConfig`` trains, from its typed loss arguments
    (:class:`~gmts_analysis.core.trl_args.TrlLossArgs`: ``TrlLossArgs.of(config)``, or
    ``TrlLossArgs.of_trainer(trainer)``, which adds whether the trainer adds the MoE router's auxiliary
    loss: ``aux_loss_enabled``, on by default for a mixture-of-experts model whose config declares a
    ``router_aux_loss_coef``).

    Refuses (GmtsError naming the field) every setting whose gradient omega does not model:
    ``loss_type`` cispo/sapo/vespo/luspo, two-sided clipping ``delta``, ``off_policy_mask_threshold``,
    ``top_entropy_quantile < 1``, an entropy bonus (``entropy_coef`` / ``use_adaptive_entropy``),
    ``mask_truncated_completions``, the MoE router's auxiliary loss (``router_aux_loss_coef``). The vLLM correction is modelled when ``use_vllm`` and
    ``vllm_importance_sampling_correction`` are both on (it then needs sampling log-probs).
    """
    a = args
    lt = a.loss_type
    refuse = []
    if lt in REFUSED_LOSS_TYPES or lt not in TRL_LOSS_AGG:
        refuse.append(f"loss_type='{lt}'")
    if a.delta is not None:
        refuse.append(f"delta={a.delta} (two-sided clipping)")
    if a.off_policy_mask_threshold is not None:
        refuse.append(f"off_policy_mask_threshold={a.off_policy_mask_threshold}")
    if a.top_entropy_quantile < 1.0:
        refuse.append(f"top_entropy_quantile={a.top_entropy_quantile}")
    if a.entropy_coef or a.use_adaptive_entropy:
        refuse.append("entropy_coef / use_adaptive_entropy (entropy bonus)")
    if a.mask_truncated_completions:
        refuse.append("mask_truncated_completions=True")
    if a.aux_loss_enabled or (a.router_aux_loss_coef or 0.0):
        refuse.append("router_aux_loss_coef (the MoE load-balancing loss TRL adds; set router_aux_loss_coef=0.0)")
    if refuse:
        raise GmtsError(f"{what}: TRL setting(s) not modelled: {'; '.join(refuse)} "
                        f"(modelled: loss_type {', '.join(LOSS_TYPES)}, PPO clipping, KL, GSPO, vLLM IS correction)")
    eps = float(a.epsilon)
    vllm = bool(a.use_vllm) and bool(a.vllm_importance_sampling_correction)
    clip_max = a.vllm_importance_sampling_clip_max
    if a.vllm_importance_sampling_cap is not None:
        clip_max = a.vllm_importance_sampling_cap
    return LossSettings(
        loss_agg=TRL_LOSS_AGG[lt],
        max_len=a.max_completion_length if lt == "dr_grpo" else None,
        clip_low=eps, clip_high=float(a.epsilon_high) if a.epsilon_high is not None else eps,
        kl_beta=float(a.beta), kl_bias_correction=bool(a.use_bias_correction_kl),
        importance_sampling_level=a.importance_sampling_level,
        vllm_is_mode=a.vllm_importance_sampling_mode if vllm else None,
        vllm_is_min=a.vllm_importance_sampling_clip_min, vllm_is_max=clip_max,
    )


#: verl's ``loss_agg_mode`` values (verl/workers/config/actor.py): the four of every release
#: through v0.7.0, and ``token-sum`` (verl-project/verl#7197, merged 2026-07-30: the masked token
#: sum, scaled by the data-parallel size so the reduced gradient is the global sum: w = 1); from the
#: aggregation table (:data:`gmts_analysis.core.loss_terms.AGGREGATIONS`, each entry's ``verl`` name)
VERL_LOSS_AGG = {a.verl: a.name for a in AGGREGATIONS.values()}


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if obj is None:
        return default
    if isinstance(obj, dict):
        return obj.get(name, default)
    try:
        return obj.get(name, default) if hasattr(obj, "get") else getattr(obj, name, default)
    except Exception:
        return getattr(obj, name, default)


def verl_loss_settings(actor: Any, algorithm: Any = None, *, horizon: int | None = None) -> LossSettings:
    """:class:`LossSettings` of a verl actor config (``actor_rollout_ref.actor``; dict-like or attributes).

    Modelled: ``policy_loss.loss_mode`` vanilla (PPO clip with ``clip_ratio_low/high`` defaulting to
    ``clip_ratio`` and the dual clip ``clip_ratio_c``, default 3.0, verl's ``core_algos.
    compute_policy_loss_vanilla``), ``use_kl_loss`` with ``kl_loss_type`` low_var_kl / k3 (clamped as
    verl clamps), ``loss_agg_mode`` token-mean, seq-mean-token-mean, seq-mean-token-sum,
    seq-mean-token-sum-norm and token-sum.

    ``seq-mean-token-sum-norm``: verl 0.9.1's ``agg_loss`` sums each answer's tokens, divides by the
    number of answers (``global_batch_size``, the mini-batch's) and then by ``loss_scale_factor``, or, when
    that is unset, by the padded response width ``loss_mask.shape[-1]`` (the horizon). Our weight
    ``1 / (N L_max)`` takes ``L_max`` = the actor's ``loss_scale_factor`` when set, else ``horizon`` (the
    padded response length of the batch the loss sees: ``data.batch["response_mask"].shape[-1]`` in
    ``RayPPOTrainer``, i.e. ``rollout.response_length``); with neither it is refused, since the longest
    answer is not verl's divisor unless an answer reaches the horizon. (verl's V1 trainer keeps answers
    unpadded, so its horizon is each micro-batch's longest answer: set ``loss_scale_factor`` there.) ``N``
    is the number of answers given, verl's is the mini-batch's: equal with one mini-batch per step, else
    one constant per optimizer step.

    Refused (GmtsError naming it): any other loss mode, loss_agg_mode or KL type (the straight-through
    ``k3+``/``low_var_kl+`` included), an entropy bonus (``entropy_coeff != 0``), and rollout-correction
    weights (``algorithm.rollout_correction.rollout_is``; pass ``algorithm=`` the algorithm config).
    """
    def g(name: str, default: Any = None) -> Any:
        return _get(actor, name, default)

    mode = _get(g("policy_loss"), "loss_mode") or "vanilla"
    if mode != "vanilla":
        raise GmtsError(f"verl policy_loss.loss_mode='{mode}' is not modelled by omega (modelled: vanilla)")
    agg = g("loss_agg_mode", "token-mean")
    if agg not in VERL_LOSS_AGG:
        raise GmtsError(f"verl loss_agg_mode='{agg}' is not modelled (choose from {', '.join(VERL_LOSS_AGG)})")
    if float(g("entropy_coeff", 0.0) or 0.0) != 0.0:
        raise GmtsError(f"verl entropy_coeff={g('entropy_coeff')} (entropy bonus) is not modelled by omega "
                        "(its gradient is not a multiple of grad logprob)")
    rc = _get(algorithm, "rollout_correction") if algorithm is not None else None
    rc_is = _get(rc, "rollout_is") if rc is not None else _get(algorithm, "rollout_is")
    if rc_is:
        raise GmtsError(f"verl rollout correction (algorithm.rollout_correction.rollout_is={rc_is!r}) is not "
                        "modelled by omega (its per-token weights are not in the rollout dumps)")
    clip = float(g("clip_ratio", 0.2))
    lo, hi = g("clip_ratio_low"), g("clip_ratio_high")
    beta = 0.0
    if g("use_kl_loss", False):
        kt = g("kl_loss_type", "low_var_kl")
        if kt not in ("low_var_kl", "k3"):
            raise GmtsError(f"verl kl_loss_type='{kt}' is not modelled by omega (modelled: low_var_kl, k3)")
        beta = float(g("kl_loss_coef", 0.001))
    max_len = None
    if VERL_LOSS_AGG[agg] == "seq-mean-token-sum-norm":
        lsf = g("loss_scale_factor")
        max_len = int(lsf) if lsf is not None else horizon
        if max_len is None:
            raise GmtsError("verl loss_agg_mode='seq-mean-token-sum-norm' divides by the response horizon: set "
                            "actor_rollout_ref.actor.loss_scale_factor (verl's constant divisor), or pass horizon= "
                            "the padded response length (rollout.response_length)")
    return LossSettings(max_len=max_len,
        loss_agg=VERL_LOSS_AGG[agg], clip_low=float(lo) if lo is not None else clip,
        clip_high=float(hi) if hi is not None else clip, clip_ratio_c=float(g("clip_ratio_c", 3.0)),
        kl_beta=beta, kl_bias_correction=False, log_ratio_clamp=20.0, kl_clamp=10.0 if beta else None,
    )


# --- weights and omega -----------------------------------------------------------------------

def answer_weights(lengths: Tensor, loss_agg: str = "token-mean", max_len: int | None = None) -> Tensor:
    """``(N,)`` float64 aggregation weight ``w_i`` of each token of answer ``i``, for one batch.

    lengths: ``(N,)`` response-token counts of the batch. token-mean ``1 / sum_j L_j``;
    seq-mean-token-mean ``1 / (N L_i)``; seq-mean-token-sum-norm ``1 / (N L_max)``, ``L_max`` =
    ``max_len`` or the longest answer; verl's seq-mean-token-sum ``1 / N`` (sum over each answer,
    mean over answers) and token-sum ``1`` (plain sum). Counts below 1 are taken as 1 (as TRL's
    ``clamp(min=1)``).
    """
    if loss_agg not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {loss_agg!r}; choose from {LOSS_AGGS}")
    L = torch.as_tensor(lengths).to(torch.float64)
    n = L.numel()
    if n == 0:
        return L.clone()
    return AGGREGATIONS[loss_agg].weights(L, n, max_len)


def vllm_is_ratio(old_logprobs: Tensor, sampling_logprobs: Tensor, mask: Tensor, mode: str,
                  clip_min: float | None = None, clip_max: float | None = DEFAULT_VLLM_IS_MAX) -> Tensor:
    """TRL 1.16's vLLM importance-sampling factor, ``(B, T)`` (sequence modes broadcast), float64, no grad."""
    m = mask.to(torch.float64)
    d = (old_logprobs.detach().to(torch.float64) - sampling_logprobs.detach().to(torch.float64)) * m
    d = torch.nan_to_num(d, nan=0.0)
    if mode.startswith("sequence"):
        d = d.sum(-1, keepdim=True)
    ratio = torch.exp(d)
    if mode.endswith("truncate"):
        ratio = torch.clamp(ratio, min=clip_min, max=clip_max)
    else:
        lo = clip_min if clip_min is not None else -math.inf
        hi = clip_max if clip_max is not None else math.inf
        ratio = ratio.masked_fill((ratio < lo) | (ratio > hi), 0.0)
    return ratio.expand_as(m)


def policy_ratio(log_ratio: Any, level: str = "token", lengths: Any = None) -> Any:
    """The importance ratio of each token (module docstring), a tensor or array shaped like ``log_ratio``.

    log_ratio: ``(..., T)`` ``lp - old`` (0 on padding). ``level="token"``: ``r_t = exp(log_ratio_t)``;
    ``"sequence"`` (GSPO): one ratio per answer, ``s = exp(sum_t log_ratio_t / L)`` over the last axis,
    broadcast to every token; ``lengths``: ``L``, ``(..., 1)`` real-token counts (default: ``T``).
    """
    if level == "token":
        return _exp(log_ratio)
    if isinstance(log_ratio, Tensor):
        total = log_ratio.sum(-1, keepdim=True)
        return torch.exp(total / (log_ratio.shape[-1] if lengths is None else lengths)).expand_as(log_ratio)
    total = np.sum(log_ratio, axis=-1, keepdims=True)
    r = np.exp(total / (log_ratio.shape[-1] if lengths is None else lengths))
    return np.broadcast_to(r, np.shape(log_ratio)).copy()


def clipped_mask(ratio: Tensor, advantages: Tensor, settings: LossSettings = LossSettings()) -> Tensor:
    """Boolean, same shape: where the clipped surrogate is flat, so the policy term has no gradient
    (``A > 0`` and ratio ``> 1 + clip_high``, or ``A < 0`` and ratio ``< 1 - clip_low``; with verl's
    dual clip also ``A < 0`` and ratio ``> clip_ratio_c``). ``ratio`` and ``advantages`` broadcast."""
    s = settings
    A = advantages
    flat = ((A > 0) & (ratio > 1.0 + s.clip_high)) | ((A < 0) & (ratio < 1.0 - s.clip_low))
    if s.clip_ratio_c is not None:
        flat = flat | ((A < 0) & (ratio > s.clip_ratio_c))
    return flat


def omega_tensor(
    logprobs: Tensor | None,
    mask: Tensor,
    advantages: Tensor,
    weights: Tensor,
    settings: LossSettings = LossSettings(),
    *,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    sampling_logprobs: Tensor | None = None,
) -> Tensor:
    """``(B, T)`` float64 omega (module docstring), detached; 0 on padding.

    logprobs: ``(B, T)`` current log-probs (needed off-policy and for the KL term); mask ``(B, T)``;
    advantages ``(B,)`` or ``(B, T)``; weights ``(B,)`` (one ``w_i`` per answer) or ``(B, T)``.
    Without ``old_logprobs`` the ratio is 1 (on-policy: TRL's ``old = logprobs.detach()``); the KL term
    needs ``ref_logprobs`` when ``kl_beta > 0``; the vLLM correction needs ``old_logprobs`` and
    ``sampling_logprobs`` (refused otherwise).
    """
    s = settings
    m = mask.to(torch.float64)
    dev = m.device
    f64 = lambda x: x.detach().to(device=dev, dtype=torch.float64)  # noqa: E731
    A = f64(advantages)
    A = A.unsqueeze(1).expand_as(m) if A.dim() == 1 else A.expand_as(m)
    W = f64(weights)
    W = (W.unsqueeze(1) if W.dim() == 1 else W) * m
    W = W.expand_as(m)
    if logprobs is None and (old_logprobs is not None or (s.kl_beta and ref_logprobs is not None)):
        raise ValueError("omega off-policy or with a KL term needs the current logprobs")
    lp = f64(logprobs) if logprobs is not None else torch.zeros_like(m)
    if old_logprobs is not None:
        log_ratio = (lp - f64(old_logprobs)) * m
    else:
        log_ratio = torch.zeros_like(m)
    live = torch.ones_like(m)  # where the ratio's clamp (verl) passes the gradient
    if s.log_ratio_clamp is not None:
        live = (log_ratio.abs() <= s.log_ratio_clamp).to(torch.float64)
        log_ratio = log_ratio.clamp(-s.log_ratio_clamp, s.log_ratio_clamp)
    L = m.sum(-1, keepdim=True).clamp(min=1.0)
    ratio = policy_ratio(log_ratio, s.importance_sampling_level, L)
    trust = (~clipped_mask(ratio, A, s)).to(torch.float64)
    if s.vllm_is_mode is not None:
        if old_logprobs is None or sampling_logprobs is None:
            raise GmtsError(f"the vLLM importance-sampling correction ({s.vllm_is_mode}) needs old_logprobs and "
                            "sampling_logprobs (the rollout engine's log-probs) for every answer")
        c = vllm_is_ratio(f64(old_logprobs), f64(sampling_logprobs), m, s.vllm_is_mode, s.vllm_is_min, s.vllm_is_max)
    else:
        c = torch.ones_like(m)
    parts = OmegaParts(m=m, W=W, A=A, lp=lp, L=L, ratio=ratio, trust=trust, c=c, live=live, settings=s,
                       ref=f64(ref_logprobs) if ref_logprobs is not None else None)
    om = omega_sum(parts)  # the terms of core/loss_terms.py: policy, then KL
    return torch.where(m > 0, om, torch.zeros_like(om))
