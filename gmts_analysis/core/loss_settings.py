"""What omega depends on, besides the tensors: :class:`LossSettings`, checked as it is built.

Its own module, below both :mod:`gmts_analysis.core.objective` (which resolves TRL's and verl's configurations
into it and computes omega under it) and :mod:`gmts_analysis.core.loss_terms` (whose entries read its fields),
so that neither imports the other for it. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.core.vocabulary import DEFAULT_CLIP, DEFAULT_VLLM_IS_MAX, IS_LEVELS, LOSS_AGGS, VLLM_IS_MODES
from gmts_analysis.errors import GmtsError


@dataclass(frozen=True)
class LossSettings:
    """What omega depends on, besides the tensors (see :mod:`gmts_analysis.core.objective`).

    loss_agg: aggregation of docs/definitions.md section 3; max_len: ``L_max`` of
    ``seq-mean-token-sum-norm`` (TRL's ``max_completion_length``); clip_low / clip_high: PPO
    epsilons (TRL: ``epsilon``, ``epsilon_high`` defaulting to ``epsilon``; verl
    ``clip_ratio_low/high``); clip_ratio_c: verl's dual clip (None: off); kl_beta: KL weight;
    kl_bias_correction: TRL's ``use_bias_correction_kl``; importance_sampling_level: token | sequence
    (GSPO); vllm_is_mode / vllm_is_min / vllm_is_max: TRL's vLLM importance-sampling correction
    (None: off); log_ratio_clamp / kl_clamp: verl's clamps (None: off).
    """

    loss_agg: str = "token-mean"
    max_len: int | None = None
    clip_low: float = DEFAULT_CLIP
    clip_high: float = DEFAULT_CLIP
    clip_ratio_c: float | None = None
    kl_beta: float = 0.0
    kl_bias_correction: bool = False
    importance_sampling_level: str = "token"
    vllm_is_mode: str | None = None
    vllm_is_min: float | None = None
    vllm_is_max: float | None = DEFAULT_VLLM_IS_MAX
    log_ratio_clamp: float | None = None
    kl_clamp: float | None = None

    def __post_init__(self) -> None:
        if self.loss_agg not in LOSS_AGGS:
            raise GmtsError(f"loss_agg: unknown aggregation '{self.loss_agg}' (choose from {', '.join(LOSS_AGGS)})")
        if self.importance_sampling_level not in IS_LEVELS:
            raise GmtsError(f"importance_sampling_level: unknown '{self.importance_sampling_level}' "
                            f"(choose from {', '.join(IS_LEVELS)})")
        if self.vllm_is_mode is not None and self.vllm_is_mode not in VLLM_IS_MODES:
            raise GmtsError(f"vllm_is_mode: unknown '{self.vllm_is_mode}' (choose from {', '.join(VLLM_IS_MODES)})")
        if not (self.clip_low >= 0 and self.clip_high >= 0):
            raise GmtsError(f"clip_low={self.clip_low}, clip_high={self.clip_high}: both must be >= 0")
        if self.clip_ratio_c is not None and not self.clip_ratio_c > 1.0:
            raise GmtsError(f"clip_ratio_c={self.clip_ratio_c}: must be > 1 (verl's dual clip)")
        if self.max_len is not None and self.max_len < 1:
            raise GmtsError(f"max_len={self.max_len}: must be >= 1")
