"""The arguments of a TRL ``GRPOConfig`` that set the trained loss, typed: :class:`TrlLossArgs`.

TRL's ``GRPOTrainer`` trains the loss its ``GRPOConfig`` describes. The toolkit reads that loss from a live
config (or trainer) during training, and from the arguments a finished run saved
(:mod:`gmts_analysis.readers.saved_args`: ``training_args.bin`` rebuilt without unpickling, or the example
script's ``gmts_training_args.json``). A saved record may come from an older TRL that lacked some fields, or
from a plain ``TrainingArguments`` that has none of them. :meth:`TrlLossArgs.of` is the one place any of these
objects is read: it takes each field the object holds and leaves the declared default, TRL 1.16's, for every
field it does not hold, remembering which (:attr:`TrlLossArgs.missing`).

Every default below is TRL 1.16.0's ``GRPOConfig`` default (``trl/trainer/grpo_config.py``), stated here once
(``epsilon`` and ``vllm_importance_sampling_clip_max`` through :mod:`gmts_analysis.core.vocabulary`'s
:data:`DEFAULT_CLIP` and :data:`DEFAULT_VLLM_IS_MAX`, which are TRL's values), with one exception:
``max_completion_length`` defaults to ``None`` (none recorded) rather than TRL's 512, since a run whose
arguments do not record it (a plain ``TrainingArguments``) says nothing of its completion budget; a series
then uses its own (``gmts series --max-completion-length``).

No torch, TRL or transformers here: the readers import it at their top.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gmts_analysis.core.vocabulary import DEFAULT_CLIP, DEFAULT_VLLM_IS_MAX

#: the fields that set the trained loss as the probe reads it (a series reports which of them a run's saved
#: arguments lacked: ``series.json``'s ``loss_defaulted``)
LOSS_FIELDS = ("loss_type", "epsilon", "epsilon_high", "beta", "importance_sampling_level", "temperature",
               "max_completion_length")


@dataclass(frozen=True)
class TrlLossArgs:
    """The ``GRPOConfig`` fields that set (or would change) the trained loss, under TRL's names, with TRL
    1.16's defaults (module docstring); build it with :meth:`of` or :meth:`of_trainer`.

    ``aux_loss_enabled`` is not a config field: it is the trainer's (``GRPOTrainer`` sets it when the model's
    config declares a MoE router auxiliary loss). ``missing``: the fields the object read did not hold (their
    defaults stand in).
    """

    loss_type: str = "dapo"
    epsilon: float = DEFAULT_CLIP
    epsilon_high: float | None = None  # None: epsilon
    delta: float | None = None
    beta: float = 0.0
    use_bias_correction_kl: bool = True
    importance_sampling_level: str = "token"
    temperature: float = 1.0
    max_completion_length: int | None = None  # TRL: 512 (module docstring)
    off_policy_mask_threshold: float | None = None
    top_entropy_quantile: float = 1.0
    entropy_coef: float = 0.0
    use_adaptive_entropy: bool = False
    mask_truncated_completions: bool = False
    router_aux_loss_coef: float | None = None
    use_vllm: bool = False
    vllm_importance_sampling_correction: bool = True
    vllm_importance_sampling_mode: str = "sequence_mask"
    vllm_importance_sampling_clip_min: float | None = None
    vllm_importance_sampling_clip_max: float | None = DEFAULT_VLLM_IS_MAX
    vllm_importance_sampling_cap: float | None = None  # TRL's deprecated name of the clip max; wins when set
    aux_loss_enabled: bool = False
    missing: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def of(cls, args: object, *, aux_loss_enabled: bool = False) -> TrlLossArgs:
        """The loss arguments of ``args``: a ``GRPOConfig`` (or subclass), a ``TrainingArguments``, or the inert
        record :mod:`gmts_analysis.readers.saved_args` rebuilds; any object holding TRL's fields as attributes.
        Each field ``args`` holds is taken as it is (a value TRL's loss cannot use is refused where the loss is
        built: :func:`gmts_analysis.core.objective.trl_loss_settings`); the others keep their default and are
        listed in :attr:`missing`."""
        held, missing = {}, set()
        for f in dataclasses.fields(cls):
            if f.name in _NOT_CONFIG:
                continue
            if hasattr(args, f.name):
                held[f.name] = getattr(args, f.name)
            else:
                missing.add(f.name)
        return cls(**held, aux_loss_enabled=aux_loss_enabled, missing=frozenset(missing))

    @classmethod
    def of_trainer(cls, trainer: object) -> TrlLossArgs:
        """The loss arguments of a TRL ``GRPOTrainer`` (or subclass), after its ``__init__``: its ``args`` and
        whether it adds the MoE router's auxiliary loss (``aux_loss_enabled``, which ``GRPOTrainer`` sets)."""
        return cls.of(trainer.args, aux_loss_enabled=bool(trainer.aux_loss_enabled))  # type: ignore[attr-defined]

    def defaulted(self) -> list[str]:
        """The :data:`LOSS_FIELDS` the arguments read did not hold (TRL's defaults stand in for them), in
        :data:`LOSS_FIELDS`' order."""
        return [f for f in LOSS_FIELDS if f in self.missing]


#: the fields :meth:`TrlLossArgs.of` does not read from a config
_NOT_CONFIG = frozenset({"aux_loss_enabled", "missing"})
