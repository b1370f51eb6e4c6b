"""verl recipe: token selection (any arm of :mod:`gmts_analysis.core.scores`) from the old-policy entropies.

Supported: verl 0.9.1 (the version the tests run against, in CI's own venv; docs/rl.md section 3 has the
install steps). verl's policy-loss functions (``@register_policy_loss``) receive ``old_log_prob``,
``log_prob``, ``advantages``, ``response_mask``, ``loss_agg_mode`` and the actor config, but no
entropies, so a GMTS or entropy selection cannot be made inside one. What verl does have is the
old-policy entropy of every response token, computed with the old log-probs. The recipe keeps them and
selects after the advantages are computed, before the actor update, through verl's own extension points
(:mod:`gmts_analysis.integrations.verl_trainer`, which imports verl):

* **V1 trainer** (``trainer.use_v1=true``, verl 0.9.1's default): a trainer registered with verl's
  ``register_trainer`` (``trainer.v1.trainer_mode=gmts_sync``, :class:`~gmts_analysis.integrations.
  verl_trainer.GmtsPPOTrainerSync`) whose ``_compute_advantage`` runs verl's own, then reads
  ``entropy``/``advantages``/``response_mask``/``old_log_probs``/``uid`` back from the TransferQueue,
  calls :func:`apply_token_selection` and writes the advantages back.
  ``python -m gmts_analysis.integrations.verl_trainer <verl's hydra overrides> +gmts.selection=gmts``.
* **Legacy** ``RayPPOTrainer`` (``trainer.use_v1=false``, deprecated by verl): the subclass
  :class:`~gmts_analysis.integrations.verl_trainer.GmtsRayPPOTrainer` keeps the entropies that ``fit``
  pops (``old_log_prob.batch.pop("entropys")``) as ``old_entropys`` and selects in ``_update_actor``,
  i.e. after ``compute_advantage`` and before the update. By hand, in ``RayPPOTrainer.fit``::

    old_log_prob, old_log_prob_mfu = self._compute_old_log_prob(batch)
    entropys = old_log_prob.batch["entropys"]
    ...
    batch.batch["old_entropys"] = entropys          # gmts recipe: keep them
    old_log_prob.batch.pop("entropys")
    batch = batch.union(old_log_prob)
    ...
    batch = compute_advantage(batch, ...)            # unchanged
    from gmts_analysis.integrations.verl_recipe import apply_token_selection
    metrics.update(apply_token_selection(batch, selection="gmts", rho=0.2, scope="group", normalizer="all",
                                         actor=self.config.actor_rollout_ref.actor,
                                         algorithm=self.config.algorithm))
    ...
    actor_output = self._update_actor(batch)   # any policy loss, e.g. "vanilla"

Pass ``actor=`` (and ``algorithm=``): the loss is then read from verl's own config (``loss_agg_mode``,
clip ratios, ``use_kl_loss``/``kl_loss_coef``/``kl_loss_type``, ``entropy_coeff``,
``loss_scale_factor``), and what omega does not model is refused.

How the selection reaches the loss: :func:`apply_token_selection` multiplies the token-level
``advantages`` (verl broadcasts the answer's advantage to ``(bs, response_length)``) by the
selection mask (times ``n_all / n_selected`` for ``normalizer="selected"``). verl's clipped
surrogate ``max(-A r, -A clip(r))`` (and its dual clip ``-A c`` for A < 0) is positively
homogeneous in A and zero at A = 0, so a token with A set to 0 drops out of the policy-gradient
term exactly, and a token with A scaled by ``c > 0`` has its term scaled by ``c``. The
``token-mean`` normalizer still counts every response token (``normalizer="all"``, TRL's and
the GMTS authors' convention); ``normalizer="selected"`` rescales so the policy term is the
mean over the selected tokens (the 80/20 code), exactly when verl normalizes over the same
batch (one mini-batch per step); with several mini-batches the factor is the batch's, not each
mini-batch's. The KL loss is left on every token (as TRL does).

The loss the scores are computed under is read from verl's actor config by
:func:`gmts_analysis.core.objective.verl_loss_settings`, the same reader the verl diagnostics use
(:func:`verl_settings`: pass ``actor=`` the ``actor_rollout_ref.actor`` config, or the
``loss_agg_mode`` / ``kl_beta`` / ``entropy_coeff`` keywords). An entropy bonus (``entropy_coeff != 0``)
is refused: its gradient is not a multiple of ``grad logprob``, so omega, and every score built on it,
does not describe the update it trains (:mod:`gmts_analysis.core.loss_terms`). ``seq-mean-token-sum-norm``
needs verl's horizon (``loss_scale_factor``, else the padded response width ``response_mask.shape[-1]``, which
:func:`apply_token_selection` reads from the batch).

Differences from selecting inside the update, stated plainly: the scores are the *old*
policy's (the same for every PPO epoch and mini-batch), which is what on-policy GMTS
means (ratio 1, omega = w * A, plus the k3 KL term when ``kl_beta`` and ``ref_log_prob`` are
given); the 80/20 code ranks by the current policy's entropies in each micro-batch.

``gmts_lgn`` (logit_grad_norm * |omega|) needs the old policy's per-token logit-gradient norm
``sqrt(1 - 2 p + sum_v p_v^2) / tau``, which verl does not compute: add it where the actor
computes ``entropys`` from the logits (the same softmax) and store it as
``batch["old_logit_grad_norm"]`` (``lgn_key``); without it ``gmts_lgn`` is refused. The masked baseline
``one_minus_prob_inf`` reads the old policy's log-probs (``old_log_probs``).
Live diagnostics from the same batch: :func:`gmts_analysis.integrations.diagnostics.verl_diagnostics`.

Shapes (verl's): ``old_entropys``, ``advantages``, ``response_mask``, ``old_log_probs``,
``ref_log_prob``: ``(bs, response_length)``; ``uid``: ``(bs,)`` labels of the prompt groups
(``batch.non_tensor_batch["uid"]``). verl itself is not imported.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from gmts_analysis.core.loss_terms import AGGREGATIONS
from gmts_analysis.core.objective import VERL_LOSS_AGG, LossSettings, verl_loss_settings
from gmts_analysis.core.scores import SELECTION_ARMS, get_score
from gmts_analysis.core.selection_tensor import select_tokens, selection_overlap, token_scores
from gmts_analysis.core.vocabulary import DEFAULT_RHO, NORMALIZERS


def verl_settings(actor: Any = None, algorithm: Any = None, *, loss_agg_mode: str = "token-mean",
                  kl_beta: float = 0.0, entropy_coeff: float = 0.0, horizon: int | None = None) -> LossSettings:
    """The :class:`~gmts_analysis.core.objective.LossSettings` of verl's actor config (``actor``), or of
    the recipe's keywords when no config is given, through :func:`~gmts_analysis.core.objective.verl_loss_settings`
    (which refuses what omega does not model: an entropy bonus, other loss modes, rollout correction).
    ``horizon``: the padded response width verl's ``seq-mean-token-sum-norm`` divides by when the actor's
    ``loss_scale_factor`` is unset."""
    if actor is None:
        if loss_agg_mode not in VERL_LOSS_AGG:
            raise ValueError(f"loss_agg_mode {loss_agg_mode!r}; choose from {tuple(VERL_LOSS_AGG)}")
        actor = {"loss_agg_mode": loss_agg_mode, "use_kl_loss": bool(kl_beta), "kl_loss_coef": kl_beta,
                 "kl_loss_type": "low_var_kl", "entropy_coeff": entropy_coeff}
    return verl_loss_settings(actor, algorithm, horizon=horizon)


def verl_selection_mask(
    old_entropys: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    selection: str = "gmts",
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    uid: Sequence | None = None,
    loss_agg_mode: str = "token-mean",
    old_log_probs: torch.Tensor | None = None,
    ref_log_prob: torch.Tensor | None = None,
    kl_beta: float = 0.0,
    seed: int = 0,
    logit_grad_norm: torch.Tensor | None = None,
    settings: LossSettings | None = None,
) -> torch.Tensor:
    """Boolean ``(bs, response_length)`` selection on verl-shaped tensors (see module docstring).

    GMTS uses the token-level advantages as A (so it also works with GAE) and the token weight
    of the loss (``settings``, default :func:`verl_settings` of ``loss_agg_mode`` and ``kl_beta``);
    ``selection="all"`` keeps every response token.
    """
    if settings is None:
        settings = verl_settings(loss_agg_mode=loss_agg_mode, kl_beta=kl_beta, horizon=response_mask.shape[-1])
    g = torch.Generator().manual_seed(int(seed))
    s = token_scores(
        selection, old_entropys, advantages, response_mask, g, settings=settings,
        logprobs=old_log_probs if ref_log_prob is not None else None, ref_logprobs=ref_log_prob,
        logit_grad_norm=logit_grad_norm, token_logprobs=old_log_probs,
    )
    if s is None:
        return response_mask.bool().clone()
    return select_tokens(s, response_mask, rho, scope, uid)


def apply_token_selection(
    data: Any,
    *,
    selection: str = "gmts",
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    normalizer: str = "all",
    loss_agg_mode: str = "token-mean",
    entropy_key: str = "old_entropys",
    kl_beta: float = 0.0,
    seed: int = 0,
    lgn_key: str = "old_logit_grad_norm",
    actor: Any = None,
    algorithm: Any = None,
    entropy_coeff: float = 0.0,
) -> dict[str, float]:
    """Select tokens of a verl ``DataProto`` in place; returns metrics for verl's logger.

    Reads ``data.batch[entropy_key]``, ``["advantages"]``, ``["response_mask"]`` (and
    ``["old_log_probs"]``, ``["ref_log_prob"]`` when present and the KL loss is on) and
    ``data.non_tensor_batch["uid"]`` for ``scope="group"``. Writes ``advantages * mask * factor``
    back to ``data.batch["advantages"]`` and the mask to ``data.batch["token_selection_mask"]``.
    The loss: ``actor`` (verl's ``actor_rollout_ref.actor`` config, and ``algorithm``) when given, else
    ``loss_agg_mode``, ``kl_beta`` and ``entropy_coeff`` (:func:`verl_settings`; a nonzero entropy
    bonus is refused). verl's horizon for ``seq-mean-token-sum-norm`` is the batch's padded width
    ``response_mask.shape[-1]`` unless the actor sets ``loss_scale_factor``. The ``selected`` factor is
    computed in the advantages' dtype.
    """
    if normalizer not in NORMALIZERS:
        raise ValueError(f"normalizer must be {' or '.join(NORMALIZERS)}, got {normalizer!r}")
    b = data.batch
    settings = verl_settings(actor, algorithm, loss_agg_mode=loss_agg_mode, kl_beta=kl_beta,
                             entropy_coeff=entropy_coeff, horizon=b["response_mask"].shape[-1])
    loss_agg_mode, kl_beta = settings.loss_agg, settings.kl_beta
    ent, adv, mask = b[entropy_key], b["advantages"], b["response_mask"]
    uid = data.non_tensor_batch.get("uid") if scope == "group" else None
    keys = set(b.keys())
    ref = b["ref_log_prob"] if kl_beta and "ref_log_prob" in keys else None
    old = b["old_log_probs"] if "old_log_probs" in keys else None
    needs_lgn = selection in SELECTION_ARMS and "logit_grad_norm" in get_score(selection).needs
    if needs_lgn and lgn_key not in keys:
        raise ValueError(f"selection '{selection}' needs batch[{lgn_key!r}] (the old policy's logit-gradient norms)")
    lgn = b[lgn_key] if needs_lgn else None
    sel = verl_selection_mask(ent, adv, mask, selection=selection, rho=rho, scope=scope, uid=uid,
                              old_log_probs=old, ref_log_prob=ref, seed=seed, logit_grad_norm=lgn,
                              settings=settings)
    factor = selected_normalizer_factor(mask, sel, loss_agg_mode, adv.dtype) if normalizer == "selected" else 1.0
    b["advantages"] = adv * sel.to(adv.dtype) * factor
    b["token_selection_mask"] = sel
    ent_sel = select_tokens(ent, mask, rho, scope, uid)
    return {
        "gmts/selection/frac_selected": float(sel.sum()) / max(int(mask.sum()), 1),
        "gmts/selection/overlap_entropy": selection_overlap(sel, ent_sel),
    }


def selected_normalizer_factor(mask: torch.Tensor, selected: torch.Tensor, loss_agg_mode: str,
                               dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``n_all / n_selected`` in ``dtype`` (the advantages'): a scalar (token-mean) or ``(bs, 1)`` per row
    (seq-mean-token-mean)."""
    m = mask.to(dtype)
    s = selected.to(dtype) * m
    agg = AGGREGATIONS.get(VERL_LOSS_AGG.get(loss_agg_mode, ""))
    if agg is None or agg.selected_factor is None:
        raise ValueError(f"normalizer 'selected' is not defined for loss_agg_mode {loss_agg_mode!r}")
    return agg.selected_factor(m, s)
