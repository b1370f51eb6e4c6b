"""``SelectiveGRPOConfig``: TRL's ``GRPOConfig`` plus the token-selection fields, checked once at construction."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import GRPOConfig

from gmts_analysis.core.scores import SELECTION_ARMS
from gmts_analysis.core.vocabulary import CUTOFFS, DEFAULT_RHO, NORMALIZERS, SCOPES, TRL_AGGREGATION, check_rho
from gmts_analysis.errors import FieldError

#: the arms ``token_selection`` accepts (a live view of the registry :mod:`gmts_analysis.core.scores`;
#: ``none`` is the old name of ``all``)
TOKEN_SELECTIONS = SELECTION_ARMS
#: TRL loss types by how TRL normalizes them (the ``selected`` normalizer's factor differs)
TOKEN_MEAN_LOSSES = tuple(k for k, v in TRL_AGGREGATION.items() if v == "token-mean")
SEQ_MEAN_LOSSES = tuple(k for k, v in TRL_AGGREGATION.items() if v == "seq-mean-token-mean")


def _choice(value: str, field_name: str, choices: tuple[str, ...] | object) -> None:
    if value not in choices:  # type: ignore[operator]
        raise FieldError(field_name, value,
                         f"{field_name} must be one of {' | '.join(choices)}, got {value!r}")  # type: ignore[arg-type]


@dataclass
class SelectiveGRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus the fields that choose which completion tokens the policy loss keeps.

    Every field of ``GRPOConfig`` keeps its meaning; with the default ``token_selection="all"`` the trainer is
    TRL's ``GRPOTrainer`` bit for bit (TRL's own ``top_entropy_quantile`` included). The fields are checked
    once, here: a bad value raises a one-line ``ValueError`` naming the field.

    Args:
        token_selection: the arm, one of the selection arms of the registry :mod:`gmts_analysis.core.scores`:
            ``all`` (every token; ``none`` is accepted as its old name), ``entropy``, ``gmts`` (entropy times
            |omega|, omega the per-token coefficient of the loss TRL trains, docs/definitions.md section 4),
            ``gmts_lgn`` (logit-gradient norm times |omega|; costs one extra no-grad forward per
            micro-batch), ``random``, the masked baselines ``entropy_inf`` and ``one_minus_prob_inf``.
        selection_rho: the keep fraction, in (0, 1] (dimensionless).
        selection_scope: ``batch`` (every completion token of the micro-batch, gathered across processes, as
            TRL's entropy mask does) or ``group`` (the ``num_generations`` completions of one prompt).
        selection_cutoff: ``top_k`` (the default: exactly ``ceil(rho * n)`` tokens per scope, ties broken by
            row of the generation batch, then position; the 80/20 authors' ``topk``) or ``quantile`` (every
            token whose score is at least the scope's interpolated ``1 - rho`` quantile: TRL's
            ``top_entropy_quantile`` rule, for any arm; docs/definitions.md section 5 says where they differ).
        selection_normalizer: ``all`` (TRL's normalizer over every completion token; dropped tokens count as
            zeros) or ``selected`` (as if the kept tokens were the only ones, like the 80/20 code: the mask
            carries the factor ``n_all / n_kept``, per sequence for ``grpo``/``sapo``, per micro-batch for the
            token-mean losses). ``selected`` is refused for other loss types and with an entropy bonus.
        rollouts_dir: when set, every training generation's rollouts are written there with their exact ids
            (:func:`gmts_analysis.integrations.rollout_log.log_rollouts`), one JSONL per step.
        diagnostics_every: log the live diagnostics (``gmts/...`` metrics,
            :class:`~gmts_analysis.integrations.diagnostics.GmtsDiagnosticsCallback`) every this many optimizer
            steps, on logged steps 1, 1 + N, 1 + 2N, ...; 0 (the default) turns them off.
        diagnostics_tokens: the diagnostics' budget: at most this many completion tokens get exact per-token
            gradient norms per diagnosed step (>= 0; 0 keeps only the cheap part).

    Raises:
        ValueError: a field above (or ``max_completion_length``) out of its domain (a
            :class:`~gmts_analysis.errors.FieldError`, naming the field and the value), ``token_selection`` other than ``all`` together with TRL's
            ``top_entropy_quantile`` < 1, or ``selection_normalizer="selected"`` with a loss type or entropy
            bonus it is not defined for.
    """

    token_selection: str = field(
        default="all", metadata={"help": f"Tokens kept in the policy loss: {' | '.join(SELECTION_ARMS)}."}
    )
    selection_rho: float = field(default=DEFAULT_RHO, metadata={"help": "Fraction of tokens kept per scope, in (0, 1]."})
    selection_scope: str = field(default="batch", metadata={"help": f"Selection scope: {' | '.join(SCOPES)}."})
    selection_cutoff: str = field(
        default="top_k",
        metadata={"help": "Where the selection cuts: top_k (exactly ceil(rho n) tokens per scope) | quantile "
                  "(every token at or above the interpolated 1 - rho quantile, TRL's top_entropy_quantile rule)."},
    )
    selection_normalizer: str = field(
        default="all", metadata={"help": f"Loss normalizer after selection: {' | '.join(NORMALIZERS)}."}
    )
    rollouts_dir: str | None = field(
        default=None,
        metadata={"help": "Write every training generation's rollouts here (exact ids, rewards, TRL's advantage, "
                  "old log-probs when computed), one JSONL per step: gmts probe --rollouts DIR audits them."},
    )
    diagnostics_every: int = field(
        default=0, metadata={"help": "Log gmts/... selection diagnostics every N steps (0 = never)."}
    )
    diagnostics_tokens: int = field(
        default=64, metadata={"help": "Tokens whose exact gradient norms the diagnostics compute (bound)."}
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.token_selection == "none":  # the old name of the keep-all arm
            self.token_selection = "all"
        _choice(self.token_selection, "token_selection", TOKEN_SELECTIONS)
        try:
            self.selection_rho = check_rho(self.selection_rho, "selection_rho")
        except ValueError as e:
            raise FieldError("selection_rho", self.selection_rho, str(e)) from None
        _choice(self.selection_scope, "selection_scope", SCOPES)
        _choice(self.selection_cutoff, "selection_cutoff", CUTOFFS)
        _choice(self.selection_normalizer, "selection_normalizer", NORMALIZERS)
        for name, value in (("diagnostics_every", self.diagnostics_every),
                            ("diagnostics_tokens", self.diagnostics_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FieldError(name, value, f"{name} must be an integer >= 0, got {value!r}")
        if self.max_completion_length is not None and self.max_completion_length < 1:
            raise FieldError("max_completion_length", self.max_completion_length, "max_completion_length (the "
                             f"completion budget) must be >= 1 token, got {self.max_completion_length!r}")
        if self.token_selection == "all":
            return
        if self.top_entropy_quantile < 1.0:
            raise ValueError(f"token_selection={self.token_selection!r} and top_entropy_quantile="
                             f"{self.top_entropy_quantile}: set one of them (TRL's entropy mask, or this selection)")
        if self.selection_normalizer == "selected":
            if self.loss_type not in TOKEN_MEAN_LOSSES + SEQ_MEAN_LOSSES:
                raise ValueError(f"selection_normalizer='selected' is not defined for loss_type {self.loss_type!r} "
                                 f"(use one of {' | '.join(TOKEN_MEAN_LOSSES + SEQ_MEAN_LOSSES)})")
            if self.entropy_coef != 0.0 or self.use_adaptive_entropy:
                raise ValueError("selection_normalizer='selected' cannot be combined with an entropy bonus "
                                 "(entropy_coef / use_adaptive_entropy)")
