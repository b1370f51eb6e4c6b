"""The names every layer shares, each listed once (no imports: the command line's --help reads them).

- selection: :data:`DEFAULT_RHO` (keep fraction of every top-k selection unless a caller says
  otherwise), :data:`RHOS` (the statistics' grid), :data:`DEFAULT_UNCERTAIN_BELOW`
  (the uncertain-token view), :data:`DEFAULT_N_BOOT` (the statistics' bootstrap resamples),
  :data:`SCOPES` (docs/definitions.md section 5), :data:`NORMALIZERS` (loss
  normalizer after selection: ``all`` counts the dropped tokens as zeros, ``selected`` divides by
  the kept ones only; :func:`gmts_analysis.core.selection_tensor.aggregate_loss`), :data:`CUTOFFS` (exact
  ``k`` or TRL's quantile), :func:`check_rho` (the one check of a keep fraction's domain (0, 1]);
- the loss (docs/definitions.md sections 3 and 4, :mod:`gmts_analysis.core.objective`):
  :data:`ADVANTAGE_MODES`, :data:`LOSS_AGGS`, :data:`TRL_AGGREGATION` (each TRL 1.16 ``loss_type``'s aggregation),
  :data:`REFUSED_LOSS_TYPES`, :data:`LOSS_TYPES`, :data:`IS_LEVELS`, :data:`VLLM_IS_MODES`.

The per-token scores (estimators and selection arms) are a registry, not a list:
:mod:`gmts_analysis.core.scores`.
"""

from __future__ import annotations

import math

#: keep fraction of a top-``rho`` selection when none is given (TRL's ``top_entropy_quantile``)
DEFAULT_RHO = 0.2
#: the keep fractions the statistics report (their grid)
RHOS = (0.05, 0.1, 0.2, 0.3, 0.5)
#: the statistics' uncertain-token view: tokens whose probability under the policy is below this
DEFAULT_UNCERTAIN_BELOW = 0.9
#: PPO clip epsilon on each side of 1 when none is given (TRL's ``epsilon``; ``epsilon_high`` defaults to it)
DEFAULT_CLIP = 0.2
#: upper bound C_max of TRL's vLLM importance-sampling correction when none is given
DEFAULT_VLLM_IS_MAX = 3.0
#: cluster-bootstrap resamples of the statistics' confidence intervals when none is given (0: no intervals)
DEFAULT_N_BOOT = 1000
#: selection scopes: every response token of the batch pooled, or each group (answers to one prompt)
SCOPES = ("batch", "group")
#: loss normalizer after selection: ``all`` (dropped tokens count as zeros) | ``selected``
NORMALIZERS = ("all", "selected")
#: where a top-``rho`` selection cuts (docs/definitions.md section 5): ``top_k`` keeps exactly ``ceil(rho n)``
#: tokens per scope (ties broken by row, then position; the 80/20 authors' ``topk``), ``quantile`` keeps every
#: token whose score is at least the scope's interpolated ``1 - rho`` quantile (TRL's ``top_entropy_quantile``)
CUTOFFS = ("top_k", "quantile")


def check_rho(value: object, field: str = "rho", *, error: type[Exception] = ValueError) -> float:
    """``value`` as a float keep fraction, or ``error`` naming ``field`` when it is not in (0, 1].

    The one statement of the domain of every keep fraction ``rho`` (a selection keeps at least one token
    and at most all of them)."""
    try:
        rho = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise error(f"{field} must be a number in (0, 1], got {value!r}") from None
    if not 0.0 < rho <= 1.0:
        raise error(f"{field} must be in (0, 1], got {value}")
    return rho


def is_probability(x: float) -> bool:
    """``x`` is a probability threshold: finite and in (0, 1] (``uncertain_below``: the uncertain-token view keeps
    the tokens whose probability is below it). The one statement of that domain."""
    return math.isfinite(x) and 0.0 < x <= 1.0

#: fewer groups than this: a bootstrap interval over them is not trusted. A block of the statistics with fewer
#: *informative* groups writes no interval and states no win (``meta.min_groups``); a table row or run with
#: fewer groups in all is flagged. A percentile bootstrap over 5 clusters gives intervals that end exactly at
#: one resample's value (0.000), over 1 a point "interval".
MIN_GROUPS = 10

#: contract columns of tokens.parquet, in order (docs/definitions.md section 2)
TOKEN_COLUMNS = (
    "answer_id", "group_id", "position", "token_id", "token", "logprob", "prob", "entropy",
    "logit_grad_norm", "advantage", "loss_weight", "omega", "grad_norm_logp", "grad_norm", "gmts",
)

#: advantage estimators (docs/definitions.md section 3)
ADVANTAGE_MODES = ("group", "batch", "none", "logged")
#: aggregations of the per-token loss (token weight ``w``, docs/definitions.md section 3)
LOSS_AGGS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum", "token-sum")
#: TRL 1.16 ``loss_type`` -> how TRL aggregates its per-token terms (grpo, sapo: per-answer mean then
#: mean over answers; bnpo: local micro-batch token mean; dapo, cispo, vespo: token mean over the
#: generation batch, ``num_items_in_batch``; dr_grpo: sum / (answers * max_completion_length)).
#: luspo is absent: it has no token normalizer of these kinds.
TRL_AGGREGATION = {"grpo": "seq-mean-token-mean", "bnpo": "token-mean", "dapo": "token-mean",
                   "dr_grpo": "seq-mean-token-sum-norm", "sapo": "seq-mean-token-mean", "cispo": "token-mean",
                   "vespo": "token-mean"}
#: loss types TRL 1.16 offers that omega does not model (their gradient is not the clipped surrogate)
REFUSED_LOSS_TYPES = ("cispo", "sapo", "vespo", "luspo")
#: loss types whose omega is modelled, in TRL's order
LOSS_TYPES = tuple(k for k in TRL_AGGREGATION if k not in REFUSED_LOSS_TYPES)
#: importance ratio per token (PPO/GRPO/DAPO) or one per answer (GSPO)
IS_LEVELS = ("token", "sequence")
#: TRL's vLLM importance-sampling correction modes
VLLM_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: the probe's ``--grad-norm`` methods -> what the help says of each ("" for nothing): the registered
#: methods of :data:`gmts_analysis.engine.methods.GRAD_METHODS` a user may choose (``loop`` is the
#: tests' reference, not offered), and ``none`` (no gradient, no engine); a test ties the two
GRAD_NORM_METHODS = {"exact": "", "sketch": "Gaussian JVP", "none": ""}
