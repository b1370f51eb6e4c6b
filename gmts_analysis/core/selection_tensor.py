"""Token selection on training tensors (docs/definitions.md sections 4-5), in the shapes TRL and verl use.

Re-exported by :mod:`gmts_analysis.core.selection` (the DataFrame-level selection lives there).
Everything here is a pure function of tensors shaped like a trainer's micro-batch:

- ``scores``, ``mask``, ``entropy``, ``logprobs``: ``(B, T)`` over the completion
  positions, ``mask`` 1 on real response tokens and 0 on padding (TRL's
  ``completion_mask``, verl's ``response_mask``);
- ``advantages``: ``(B,)`` (TRL, one per answer) or ``(B, T)`` (verl, per token);
- ``group_ids``: ``(B,)``, one group label per row (ints, or any hashables such as
  verl's ``uid`` strings).

Selection (:func:`select_tokens`): keep the ``k = ceil(rho * n)`` highest scores of each
scope, ``n`` the number of real tokens in the scope (``batch``: every real token of the
tensors; ``group``: the rows of one group). Padding is never selected. Ties are broken
by (row index, position) ascending, i.e. among equal scores the earlier token in
row-major order wins; this is docs/definitions.md section 5's ``(answer_id, position)`` rule with rows
standing for answers (order the rows by answer id to reproduce a table's selection
exactly). NaN scores rank below every real score. ``k`` is :func:`gmts_analysis.core.rank.n_keep`,
the one top-k count of the toolkit. That is the cut-off ``top_k``; ``select_tokens(..., cutoff="quantile")``
keeps instead every token at or above the scope's interpolated ``1 - rho`` quantile, TRL's
``top_entropy_quantile`` rule (:func:`keep_at_or_above_quantile`; docs/definitions.md section 5).

Scores (:func:`token_scores`): every selection arm of the registry
:mod:`gmts_analysis.core.scores` (:data:`SELECTIONS`), computed by the arm's one function on the
quantities it needs (:class:`ScoreInputs`): ``entropy``; ``gmts`` = entropy * |omega| with the full
omega of docs/definitions.md section 4 (:func:`token_omega`); ``gmts_lgn`` = logit_grad_norm * |omega|
(``logit_grad_norm`` = ||d logprob / d z||_2, the closed form of
:func:`gmts_analysis.core.tokens.token_quantities`, passed in by the caller); ``random``
(uniform, seeded); ``all`` / ``none`` (every real token); the masked baselines ``entropy_inf`` =
entropy * 1[omega != 0] and ``one_minus_prob_inf`` = (1 - p) * 1[omega != 0] (p the sampled
token's probability, from ``token_logprobs``), which skip tokens without signal without
weighting by ``|omega|`` (:func:`masked_scores`).

Loss normalizer after selection (:func:`aggregate_loss`): ``all`` divides by the
real-token count as if nothing were dropped (TRL's ``top_entropy_quantile`` and the GMTS
authors' code: the dropped tokens count as zeros), ``selected`` divides by the selected
tokens only (the 80/20 code: the aggregation runs as if the selected tokens were the only
response tokens).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from gmts_analysis.core.loss_terms import AGGREGATIONS
from gmts_analysis.core.objective import LOSS_AGGS, LossSettings, answer_weights, omega_tensor
from gmts_analysis.core.rank import n_keep
from gmts_analysis.core.scores import MASKED_ARMS, SELECTION_ARMS, get_score
from gmts_analysis.core.vocabulary import CUTOFFS, DEFAULT_RHO, NORMALIZERS, SCOPES

#: the selection arms (live view of the registry :mod:`gmts_analysis.core.scores`)
SELECTIONS = SELECTION_ARMS
#: the masked baselines: a per-token score times 1[omega != 0] (no |omega| magnitude)
MASKED_SELECTIONS = MASKED_ARMS
TENSOR_SCOPES = SCOPES


def scope_order(scores: Tensor, scope: Tensor) -> Tensor:
    """``(n,)`` int64 indices of 1-D ``scores`` in the order a selection keeps them: by ``scope``
    code ascending, real scores before NaN, score descending, then index ascending (the
    tie-break: callers lay tokens out in ``(answer, position)`` order). The one ordering rule of
    every selection (tables call it through :func:`gmts_analysis.core.selection.selection_order`).
    """
    nan = torch.isnan(scores)
    key = torch.where(nan, torch.zeros_like(scores), -scores)
    # lexicographic (scope, isnan, -score, index) by successive stable sorts, last key first
    order = torch.argsort(key, stable=True)
    order = order[torch.argsort(nan[order].to(torch.int8), stable=True)]
    return order[torch.argsort(scope[order], stable=True)]


def keep_first(order: Tensor, scope: Tensor, rho: float) -> Tensor:
    """``(n,)`` bool: the first :func:`gmts_analysis.core.rank.n_keep` ``(rho, n_scope)`` tokens of each
    scope in ``order`` (from :func:`scope_order`); ``scope`` holds codes ``0..S-1`` per token."""
    out = torch.zeros(order.numel(), dtype=torch.bool, device=order.device)
    if order.numel() == 0:
        return out
    s_sorted = scope[order]
    sizes = torch.bincount(s_sorted, minlength=int(scope.max().item()) + 1)
    starts = torch.cumsum(sizes, 0) - sizes
    rank = torch.arange(order.numel(), device=order.device) - starts[s_sorted]
    out[order] = rank < n_keep(rho, sizes)[s_sorted]
    return out


def keep_at_or_above_quantile(scores: Tensor, scope: Tensor, rho: float) -> Tensor:
    """``(n,)`` bool: TRL's ``top_entropy_quantile`` rule in each scope of 1-D ``scores``. A token is kept when
    its score, as float32, is ``>=`` the scope's ``torch.quantile(scores.float(), 1 - rho)`` (linear
    interpolation), exactly as TRL 1.16's ``GRPOTrainer.get_high_entropy_mask`` computes it, so every token tied
    with the cut-off is kept and the count can differ from ``ceil(rho n)``. A NaN score makes the quantile
    NaN and its scope keeps nothing (TRL's behaviour). ``scope`` holds one code per token."""
    s = scores.detach().float()
    keep = torch.zeros(s.numel(), dtype=torch.bool, device=s.device)
    q = 1 - rho  # TRL: get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
    for code in torch.unique(scope).tolist():
        members = scope == code
        keep[members] = s[members] >= torch.quantile(s[members], q)
    return keep


def group_codes(group_ids: Tensor | Sequence, batch_size: int, device: torch.device | None = None) -> Tensor:
    """``(B,)`` int64 codes, equal for equal labels, numbered in order of first appearance."""
    if isinstance(group_ids, Tensor):
        if group_ids.shape != (batch_size,):
            raise ValueError(f"group_ids has shape {tuple(group_ids.shape)}, expected ({batch_size},)")
        _, inv = torch.unique(group_ids, return_inverse=True)
        return inv.to(torch.int64).to(device or group_ids.device)
    labels = list(group_ids)
    if len(labels) != batch_size:
        raise ValueError(f"group_ids has {len(labels)} labels, expected {batch_size}")
    seen: dict = {}
    codes = [seen.setdefault(g, len(seen)) for g in labels]
    return torch.tensor(codes, dtype=torch.int64, device=device)


def select_tokens(
    scores: Tensor,
    mask: Tensor,
    rho: float,
    scope: str = "batch",
    group_ids: Tensor | Sequence | None = None,
    cutoff: str = "top_k",
) -> Tensor:
    """Boolean ``(B, T)`` mask of the top-``rho`` tokens of each scope (see module docstring).

    scores: ``(B, T)`` float, higher is kept. mask: ``(B, T)`` 0/1 or bool. rho in [0, 1].
    scope ``group`` needs ``group_ids`` ``(B,)``; a group never lends its quota to another.
    cutoff (:data:`~gmts_analysis.core.vocabulary.CUTOFFS`): ``top_k`` keeps exactly ``ceil(rho n)`` tokens per
    scope; ``quantile`` keeps those at or above the scope's quantile (:func:`keep_at_or_above_quantile`).
    Works on any device; no gradient flows through the result.
    """
    if scores.dim() != 2 or scores.shape != mask.shape:
        raise ValueError(f"scores {tuple(scores.shape)} and mask {tuple(mask.shape)} must be the same (B, T)")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"selection fraction rho must be in [0, 1], got {rho}")
    if scope not in TENSOR_SCOPES:
        raise ValueError(f"unknown selection scope {scope!r}; choose from {TENSOR_SCOPES}")
    if cutoff not in CUTOFFS:
        raise ValueError(f"unknown selection cutoff {cutoff!r}; choose from {CUTOFFS}")
    B, T = scores.shape
    device = scores.device
    valid = mask.bool().reshape(-1)
    flat_idx = torch.nonzero(valid).squeeze(1)  # row-major = (row, position) ascending
    out = torch.zeros(B * T, dtype=torch.bool, device=device)
    if flat_idx.numel() == 0:
        return out.view(B, T)
    s = scores.detach().reshape(-1)[flat_idx]
    if scope == "group":
        if group_ids is None:
            raise ValueError("scope 'group' needs group_ids (one label per row)")
        gcode_row = group_codes(group_ids, B, device)
    else:
        gcode_row = torch.zeros(B, dtype=torch.int64, device=device)
    gcode = gcode_row[flat_idx // T]
    if cutoff == "quantile":
        out[flat_idx[keep_at_or_above_quantile(s, gcode, rho)]] = True
    else:
        out[flat_idx[keep_first(scope_order(s, gcode), gcode, rho)]] = True
    return out.view(B, T)


def loss_weight_tensor(mask: Tensor, loss_agg: str = "token-mean", max_len: int | None = None) -> Tensor:
    """``(B, T)`` aggregation weight ``w`` of each real token (docs/definitions.md section 3), 0 on padding.

    token-mean: ``1 / sum mask``; seq-mean-token-mean: ``1 / (B * L_i)``;
    seq-mean-token-sum-norm: ``1 / (B * L_max)``, ``L_max`` = ``max_len`` or the longest row.
    float64 (these are exact counts). The formula is :func:`gmts_analysis.core.objective.answer_weights`.
    """
    m = mask.to(torch.float64)
    return answer_weights(m.sum(-1), loss_agg, max_len).unsqueeze(1) * m


def token_omega(
    advantages: Tensor,
    mask: Tensor,
    *,
    loss_agg: str = "token-mean",
    max_len: int | None = None,
    logprobs: Tensor | None = None,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    sampling_logprobs: Tensor | None = None,
    settings: LossSettings | None = None,
    **fields,
) -> Tensor:
    """``(B, T)`` omega of docs/definitions.md section 4 for a batch, float64, detached, 0 on padding.

    The weights come from ``mask`` (:func:`loss_weight_tensor`); the loss that was trained from
    ``settings`` (a :class:`gmts_analysis.core.objective.LossSettings`) or its fields as keywords
    (``clip_low``, ``clip_high``, ``kl_beta``, ``kl_bias_correction``, ``importance_sampling_level``,
    ...; ``loss_agg`` and ``max_len`` given here win). Without ``old_logprobs`` the ratio is 1
    (on-policy); the KL term needs ``ref_logprobs`` and ``logprobs``. Computed by
    :func:`gmts_analysis.core.objective.omega_tensor` (the one formula).
    """
    if settings is None:
        settings = LossSettings(loss_agg=loss_agg, max_len=max_len, **fields)
    else:
        settings = dataclasses.replace(settings, **fields)
    if logprobs is None or old_logprobs is None:
        old_logprobs = None
    if ref_logprobs is None or not settings.kl_beta:
        settings = dataclasses.replace(settings, kl_beta=0.0) if settings.kl_beta else settings
        ref_logprobs = None
    if logprobs is None and ref_logprobs is not None:
        raise ValueError("the KL term of omega needs logprobs as well as ref_logprobs")
    w = loss_weight_tensor(mask, settings.loss_agg, settings.max_len)
    return omega_tensor(logprobs, mask, advantages, w, settings, old_logprobs=old_logprobs,
                        ref_logprobs=ref_logprobs, sampling_logprobs=sampling_logprobs)


#: what a tensor-side score is missing when a quantity was not passed (the error names it)
_MISSING = {"entropy": "the per-token entropy (B, T)", "logprob": "the sampled tokens' log-probs (B, T)",
            "prob": "the sampled tokens' log-probs (B, T)", "omega": "the advantages (omega)",
            "logit_grad_norm": "the per-token logit_grad_norm (B, T)",
            "head_grad_norm": "the per-token head_grad_norm (B, T)", "uniform": "a random generator"}


class ScoreInputs(Mapping):
    """The per-token quantities of :data:`gmts_analysis.core.scores.QUANTITIES` as ``(B, T)`` float64
    tensors on ``device``, each made on first use from what the caller passed (``omega`` from
    ``omega``, a tensor or a function returning one; ``prob`` = exp(``logprob``); ``uniform`` from
    ``generator``, :func:`random_scores`). A missing one raises ValueError naming ``what``."""

    def __init__(self, what: str, mask: Tensor, device: torch.device, *, entropy: Tensor | None = None,
                 omega: Tensor | Callable[[], Tensor] | None = None, logprob: Tensor | None = None,
                 logit_grad_norm: Tensor | None = None, head_grad_norm: Tensor | None = None,
                 generator: torch.Generator | None = None, uniform: bool = True):
        f64 = lambda x: (lambda: x.detach().to(device=device, dtype=torch.float64)) if x is not None else None  # noqa: E731
        self._what = what
        self._make: dict[str, Callable[[], Tensor] | None] = {
            "entropy": f64(entropy), "omega": omega if omega is None or callable(omega) else (lambda: omega),
            "logprob": f64(logprob), "prob": (lambda: torch.exp(self["logprob"])) if logprob is not None else None,
            "logit_grad_norm": f64(logit_grad_norm), "head_grad_norm": f64(head_grad_norm),
            "uniform": (lambda: random_scores(mask, generator)) if uniform else None,
        }
        self._done: dict[str, Tensor] = {}

    def __getitem__(self, name: str) -> Tensor:
        if name not in self._done:
            make = self._make.get(name)
            if make is None:
                raise ValueError(f"selection '{self._what}' needs {_MISSING.get(name, name)}")
            self._done[name] = make()
        return self._done[name]

    def __contains__(self, name: object) -> bool:
        return self._make.get(name) is not None  # type: ignore[call-overload]

    def __iter__(self) -> Iterator[str]:
        return (k for k, v in self._make.items() if v is not None)

    def __len__(self) -> int:
        return sum(v is not None for v in self._make.values())


def score_tensor(name: str, inputs: Mapping[str, Tensor], mask: Tensor) -> Tensor:
    """``(B, T)`` float64 score ``name`` of the registry on ``inputs`` (:class:`ScoreInputs`), 0 on padding."""
    s = get_score(name).fn(inputs)
    return torch.where(mask.bool().to(s.device), s, torch.zeros_like(s))


def gmts_scores(entropy: Tensor, advantages: Tensor, mask: Tensor, **omega_kwargs) -> Tensor:
    """``(B, T)`` GMTS score ``entropy * |omega|`` (float64; 0 on padding).

    ``omega_kwargs`` go to :func:`token_omega` (loss_agg, logprobs, old_logprobs, ref_logprobs,
    clip_low, clip_high, kl_beta). On-policy under token-mean this is ``entropy * |A| / n``.
    """
    return token_scores("gmts", entropy, advantages, mask, **omega_kwargs)


def gmts_lgn_scores(logit_grad_norm: Tensor, advantages: Tensor, mask: Tensor, **omega_kwargs) -> Tensor:
    """``(B, T)`` score ``logit_grad_norm * |omega|`` (float64; 0 on padding).

    logit_grad_norm: ``(B, T)``, ``||d logprob / d z||_2 = sqrt(1 - 2 p + sum_v p_v^2) / tau``
    (:func:`gmts_analysis.core.tokens.token_quantities`). ``omega_kwargs`` as in :func:`gmts_scores`.
    """
    return token_scores("gmts_lgn", None, advantages, mask, logit_grad_norm=logit_grad_norm, **omega_kwargs)


def masked_scores(selection: str, entropy: Tensor, advantages: Tensor, mask: Tensor,
                  token_logprobs: Tensor | None = None, **omega_kwargs) -> Tensor:
    """``(B, T)`` masked baseline (float64; 0 on padding): ``entropy_inf`` = entropy * 1[omega != 0],
    ``one_minus_prob_inf`` = (1 - exp(token_logprobs)) * 1[omega != 0]. ``token_logprobs`` ``(B, T)``:
    log p of each sampled token (default: ``omega_kwargs["logprobs"]``)."""
    if selection not in MASKED_SELECTIONS:
        raise ValueError(f"not a masked selection: {selection!r}; choose from {tuple(MASKED_SELECTIONS)}")
    return token_scores(selection, entropy, advantages, mask, token_logprobs=token_logprobs, **omega_kwargs)


def random_scores(mask: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """``(B, T)`` uniform [0, 1) scores drawn on CPU from ``generator`` (then moved to mask's device)."""
    return torch.rand(mask.shape, generator=generator, dtype=torch.float64).to(mask.device)


def token_scores(
    selection: str,
    entropy: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    generator: torch.Generator | None = None,
    logit_grad_norm: Tensor | None = None,
    token_logprobs: Tensor | None = None,
    **omega_kwargs,
) -> Tensor | None:
    """``(B, T)`` float64 score a selection ranks by (0 on padding), for any arm of :data:`SELECTIONS`;
    ``None`` for ``all``/``none``. Each quantity is made only when the arm needs it (omega from
    ``advantages`` and ``omega_kwargs``, :func:`token_omega`): ``gmts_lgn`` needs ``logit_grad_norm``
    ``(B, T)``; ``one_minus_prob_inf`` the sampled tokens' log-probs ``token_logprobs`` ``(B, T)``
    (default: ``omega_kwargs["logprobs"]``); ``random`` draws from ``generator``."""
    if selection == "none":  # the old name of the keep-all arm
        selection = "all"
    if selection not in SELECTIONS:
        raise ValueError(f"unknown token selection {selection!r}; choose from {tuple(SELECTIONS)}")
    if get_score(selection).fn is None:
        return None
    lp = token_logprobs if token_logprobs is not None else omega_kwargs.get("logprobs")
    inputs = ScoreInputs(selection, mask, mask.device, entropy=entropy,
                         omega=lambda: token_omega(advantages, mask, **omega_kwargs), logprob=lp,
                         logit_grad_norm=logit_grad_norm, generator=generator)
    return score_tensor(selection, inputs, mask)


def selection_mask(
    selection: str,
    entropy: Tensor,
    advantages: Tensor,
    mask: Tensor,
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    group_ids: Tensor | Sequence | None = None,
    generator: torch.Generator | None = None,
    logit_grad_norm: Tensor | None = None,
    token_logprobs: Tensor | None = None,
    **omega_kwargs,
) -> Tensor:
    """Boolean ``(B, T)`` tokens kept by ``selection`` (``all``/``none``: every real token)."""
    s = token_scores(selection, entropy, advantages, mask, generator, logit_grad_norm, token_logprobs,
                     **omega_kwargs)
    if s is None:
        return mask.bool().clone()
    return select_tokens(s, mask, rho, scope, group_ids)


def aggregate_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    selected: Tensor | None = None,
    normalizer: str = "all",
    loss_agg: str = "token-mean",
    max_len: int | None = None,
) -> Tensor:
    """Scalar loss from ``(B, T)`` per-token terms, keeping only ``selected`` tokens.

    normalizer ``all``: the aggregation of ``loss_agg`` over ``mask`` with unselected tokens
    counted as zeros (TRL, GMTS authors). ``selected``: the same aggregation with ``selected``
    as the mask (80/20 code); under seq-mean-token-mean a row with no selected token
    contributes 0 and still counts in the mean over rows (TRL's ``clamp(min=1)``).
    """
    if normalizer not in NORMALIZERS:
        raise ValueError(f"normalizer {normalizer!r}; choose from {NORMALIZERS}")
    m = mask.to(per_token_loss.dtype)
    sel = m if selected is None else selected.to(per_token_loss.dtype) * m
    denom_mask = m if normalizer == "all" else sel
    num = per_token_loss * sel
    if loss_agg not in AGGREGATIONS:
        raise ValueError(f"loss aggregation {loss_agg!r}; choose from {LOSS_AGGS}")
    return AGGREGATIONS[loss_agg].reduce(num, denom_mask, per_token_loss.shape[0], max_len)


def selection_overlap(a: Tensor, b: Tensor) -> float:
    """``|a ∩ b| / |b|`` for two boolean selections (NaN when ``b`` is empty)."""
    nb = int(b.sum())
    return float((a & b).sum()) / nb if nb else math.nan
