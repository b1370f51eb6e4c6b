"""The drop-in's token selection on one TRL micro-batch, in small steps: gather, select, rescale, log.

The scores themselves come from the registry (:func:`gmts_analysis.core.selection_tensor.token_scores`, called
by :meth:`~gmts_analysis.integrations.trl.trainer.SelectiveGRPOTrainer._selection_scores`). Shapes: ``B`` rows
of the micro-batch on this process, ``T`` completion positions; after :func:`gather_rows`, ``N`` rows of every
process's micro-batch (padded to a common ``T'``), in the order of the global generation batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gmts_analysis.core.selection_tensor import select_tokens, selection_overlap


@dataclass(frozen=True)
class GatheredBatch:
    """One micro-batch of every process, rows sorted by their index in the global generation batch.

    Attributes:
        scores: ``(N, T')`` the arm's scores (float64).
        mask: ``(N, T')`` 1 on completion tokens (int64).
        entropy: ``(N, T')`` TRL's per-token entropies in nats (float64), for the overlap with the entropy arm.
        zero_adv: ``(N, T')`` bool, the token's advantage is 0.
        groups: ``(N,)`` int64, each row's prompt: its global row index ``// num_generations``.
        mine: ``(B,)`` int64, where this process's rows sit among the ``N`` (in local row order).
    """

    scores: Tensor
    mask: Tensor
    entropy: Tensor
    zero_adv: Tensor
    groups: Tensor
    mine: Tensor


def gather_rows(accelerator: Any, scores: Tensor, mask: Tensor, entropies: Tensor, advantages: Tensor,
                rows: Tensor, num_generations: int) -> GatheredBatch:
    """Gather the micro-batch of every process as TRL gathers its entropies (pad the length, then concatenate
    rows) and order the rows by ``rows`` ``(B,)``, each row's global index (ties by process, then position).

    scores, mask, entropies: ``(B, T)``; advantages: ``(B,)`` or ``(B, 1)``."""
    B, T = mask.shape
    adv = advantages.reshape(-1, 1).expand(B, T)
    parts = {"scores": scores, "mask": mask.long(), "ent": entropies.detach().double(),
             "rows": rows.long()[:, None].expand(B, T).contiguous(), "zero_adv": (adv == 0).long().contiguous()}
    if accelerator.num_processes > 1:
        parts = {k: accelerator.pad_across_processes(v, dim=1, pad_index=0) for k, v in parts.items()}
        parts = {k: accelerator.pad_across_processes(v, dim=0, pad_index=0) for k, v in parts.items()}
        b_padded = parts["mask"].shape[0]
        parts = {k: accelerator.gather(v) for k, v in parts.items()}
        first = accelerator.process_index * b_padded
    else:
        first = 0
    g_rows = parts["rows"][:, 0]
    order = torch.argsort(g_rows, stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel(), device=order.device)
    return GatheredBatch(
        scores=parts["scores"][order], mask=parts["mask"][order], entropy=parts["ent"][order],
        zero_adv=parts["zero_adv"][order].bool(),
        groups=torch.div(g_rows[order], num_generations, rounding_mode="floor"),
        mine=position[first : first + B],
    )


def select(batch: GatheredBatch, rho: float, scope: str, cutoff: str) -> tuple[Tensor, Tensor]:
    """``(kept, kept_by_entropy)``, both ``(N, T')`` bool: the arm's selection and the entropy arm's, with the
    same ``rho``, ``scope`` and ``cutoff`` (:func:`gmts_analysis.core.selection.select_tokens`)."""
    kept = select_tokens(batch.scores, batch.mask, rho, scope, batch.groups, cutoff=cutoff)
    by_entropy = select_tokens(batch.entropy, batch.mask, rho, scope, batch.groups, cutoff=cutoff)
    return kept, by_entropy


def local_mask(batch: GatheredBatch, kept: Tensor, mask: Tensor) -> Tensor:
    """``(B, T)`` bool: this process's rows of ``kept``, on its completion tokens."""
    B, T = mask.shape
    return kept[batch.mine][:, :T] & mask.bool()


def rescale(selected: Tensor, mask: Tensor, batch: GatheredBatch, kept: Tensor, *, normalizer: str,
            per_sequence: bool, dtype: torch.dtype) -> Tensor:
    """The mask handed to TRL's loss, ``(B, T)``: ``selected`` itself (bool) for the normalizer ``all``; for
    ``selected``, ``selected * n_all / n_kept`` in ``dtype``, counted per sequence (``per_sequence``: TRL's
    ``grpo``/``sapo``) or over the gathered micro-batch (the token-mean losses)."""
    if normalizer == "all":
        return selected
    m = mask.to(dtype)
    if per_sequence:
        factor = m.sum(-1, keepdim=True) / selected.sum(-1, keepdim=True).clamp(min=1).to(m.dtype)
    else:
        factor = (batch.mask.sum() / kept.sum().clamp(min=1)).to(m.dtype)
    return selected.to(m.dtype) * factor


def log_selection(metrics: defaultdict, batch: GatheredBatch, kept: Tensor, by_entropy: Tensor,
                  cutoff: str) -> None:
    """Append the selection's metrics of this micro-batch to ``metrics`` (TRL's ``_metrics[mode]``):
    ``gmts/selection/frac_selected`` (kept tokens over completion tokens), ``gmts/selection/overlap_entropy``
    (|S ∩ S_entropy| / |S_entropy|), ``gmts/selection/frac_selected_zero_adv`` (kept tokens whose advantage is
    0, over kept tokens) and ``gmts/selection/cutoff_quantile`` (1 when the quantile cutoff ran, 0 for
    ``top_k``)."""
    n_kept = int(kept.sum())
    metrics["gmts/selection/frac_selected"].append(float(n_kept) / max(int(batch.mask.sum()), 1))
    metrics["gmts/selection/overlap_entropy"].append(selection_overlap(kept, by_entropy))
    metrics["gmts/selection/frac_selected_zero_adv"].append(float((kept & batch.zero_adv).sum()) / max(n_kept, 1))
    metrics["gmts/selection/cutoff_quantile"].append(1.0 if cutoff == "quantile" else 0.0)
