"""TRL drop-in: ``SelectiveGRPOTrainer``, a ``GRPOTrainer`` that updates only selected tokens.

Needs the optional extra ``pip install gmts_analysis[trl]`` (TRL >= 1.16). Use it exactly like
``GRPOTrainer`` with a :class:`SelectiveGRPOConfig`::

    args = SelectiveGRPOConfig(output_dir="out", token_selection="gmts", selection_rho=0.2,
                               selection_scope="group", ...)
    trainer = SelectiveGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)

Fields (on top of ``GRPOConfig``):

- ``token_selection``: ``all`` (stock TRL, bit for bit; ``none`` is accepted as its old name) | ``entropy`` | ``gmts`` | ``gmts_lgn``
  (logit_grad_norm * |omega|; TRL's fused head returns no logits, so this costs one extra
  no-grad forward of each micro-batch) | ``random`` | the masked baselines ``entropy_inf``,
  ``one_minus_prob_inf``: any arm of the registry :mod:`gmts_analysis.core.scores`, scored by its one
  function on TRL's entropies, log-probs, omega and (when it needs them) logit-gradient norms;
- ``selection_rho``: fraction kept, exact ``k = ceil(rho * n)`` per scope (TRL's own
  ``top_entropy_quantile`` keeps the tokens at or above a quantile, so ties and
  interpolation can change the count; this trainer keeps exactly ``k``);
- ``selection_scope``: ``batch`` (every completion token of the micro-batch, gathered across
  processes, as TRL's entropy mask does) | ``group`` (the generations of one prompt);
- ``rollouts_dir``: write each training generation's rollouts there, with the exact ids
  (:func:`gmts_analysis.integrations.rollout_log.log_rollouts`; works with any ``token_selection``);
- ``selection_normalizer``: ``all`` (TRL's normalizer over every completion token; dropped
  tokens count as zeros, like ``top_entropy_quantile`` and the GMTS authors' code) |
  ``selected`` (as if the selected tokens were the only ones, like the 80/20 code): the mask
  returned to TRL carries the factor ``n_all / n_selected`` (per sequence for ``grpo``/``sapo``;
  per micro-batch, gathered across processes, for the token-mean losses ``dapo``/``bnpo``/
  ``cispo``/``vespo``, which is the exact selected-token mean when one micro-batch makes an
  optimizer step). Not defined for ``dr_grpo``/``luspo``, nor with an entropy bonus.
- ``diagnostics_every``: every N optimizer steps log the live diagnostics of
  :mod:`gmts_analysis.integrations.diagnostics` (``gmts/...`` metrics) at ``selection_rho`` and
  ``selection_scope``, with exact gradient norms on at most ``diagnostics_tokens`` tokens
  (0 = off, the default).

How it hooks in: TRL's ``_compute_loss`` computes the per-token entropies and calls
``get_high_entropy_mask(entropies, mask, threshold)`` when ``top_entropy_quantile < 1``;
this trainer overrides that method and returns its own selection, made from TRL's own
entropies, advantages, log-probs (current, old, reference) and clip settings. GMTS is
entropy * |omega| with omega of the loss TRL trains with (docs/definitions.md section 4,
:func:`gmts_analysis.core.objective.trl_loss_settings`: the ``loss_type``'s token weight, PPO clipping,
the bias-corrected KL, GSPO's sequence ratio, the vLLM correction); a setting omega does not model
(cispo, sapo, vespo, luspo, ``delta``, ...) is refused for ``gmts``. Groups: TRL places the ``num_generations`` completions of a prompt consecutively in
the global generation batch, so row ``r`` of the global batch belongs to group
``r // num_generations``; the trainer records each row's global index before TRL shuffles
the batch into micro-batches, and breaks ties by (global row, position). Every micro-batch
logs ``gmts/selection/frac_selected``, ``gmts/selection/overlap_entropy`` (|S ∩ S_entropy| / |S_entropy|)
and ``gmts/selection/frac_selected_zero_adv`` (the selection's waste: picks whose advantage is 0); every
generation batch logs ``gmts/frac_tokens_zero_adv`` (completion tokens whose advantage is 0), for every arm.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

try:
    from trl import GRPOConfig, GRPOTrainer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("gmts_analysis.integrations.trl_trainer needs TRL: pip install 'gmts_analysis[trl]'") from e

from gmts_analysis.core.objective import TRL_AGGREGATION
from gmts_analysis.core.scores import SELECTION_ARMS, get_score
from gmts_analysis.core.selection import select_tokens, selection_overlap, token_scores
from gmts_analysis.core.vocabulary import DEFAULT_RHO, NORMALIZERS, SCOPES

TOKEN_SELECTIONS = SELECTION_ARMS  # the arms of the registry (live); "none": old name of "all"
#: TRL loss types by how TRL normalizes them (the ``selected`` normalizer's factor differs)
_TOKEN_MEAN = tuple(k for k, v in TRL_AGGREGATION.items() if v == "token-mean")
_SEQ_MEAN = tuple(k for k, v in TRL_AGGREGATION.items() if v == "seq-mean-token-mean")


@dataclass
class SelectiveGRPOConfig(GRPOConfig):
    """``GRPOConfig`` plus the token-selection fields (see the module docstring)."""

    token_selection: str = field(
        default="all", metadata={"help": f"Tokens kept in the policy loss: {' | '.join(SELECTION_ARMS)}."}
    )
    selection_rho: float = field(default=DEFAULT_RHO, metadata={"help": "Fraction of tokens kept per scope, in (0, 1]."})
    selection_scope: str = field(default="batch", metadata={"help": f"Selection scope: {' | '.join(SCOPES)}."})
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


class SelectiveGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose policy loss keeps only the tokens chosen by ``args.token_selection``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        a = self.args
        sel = getattr(a, "token_selection", "all")
        self.token_selection = "all" if sel == "none" else sel  # "none": the old name of the keep-all arm
        self.selection_rho = float(getattr(a, "selection_rho", DEFAULT_RHO))
        self.selection_scope = getattr(a, "selection_scope", "batch")
        self.selection_normalizer = getattr(a, "selection_normalizer", "all")
        if self.token_selection not in TOKEN_SELECTIONS:
            raise ValueError(f"token_selection must be one of {tuple(TOKEN_SELECTIONS)}, got {self.token_selection!r}")
        if not 0.0 < self.selection_rho <= 1.0:
            raise ValueError(f"selection_rho must be in (0, 1], got {self.selection_rho}")
        if self.selection_scope not in SCOPES:
            raise ValueError(f"selection_scope must be batch or group, got {self.selection_scope!r}")
        if self.selection_normalizer not in NORMALIZERS:
            raise ValueError(f"selection_normalizer must be all or selected, got {self.selection_normalizer!r}")
        if getattr(a, "rollouts_dir", None):
            from gmts_analysis.integrations.rollout_log import log_rollouts

            log_rollouts(self, a.rollouts_dir)
        self._sel_inputs: dict | None = None
        self._sel_logps: torch.Tensor | None = None
        self._sel_lgn: torch.Tensor | None = None
        every = int(getattr(a, "diagnostics_every", 0) or 0)
        if every < 0:
            raise ValueError(f"diagnostics_every must be >= 0, got {every}")
        if every:
            from gmts_analysis.integrations.diagnostics import GmtsDiagnosticsCallback

            self.diagnostics = GmtsDiagnosticsCallback(
                every=every, rho=self.selection_rho, scope=self.selection_scope,
                max_tokens=int(getattr(a, "diagnostics_tokens", 64)), seed=int(a.seed),
            ).attach(self)
        if self.token_selection != "all":
            if a.top_entropy_quantile < 1.0:
                raise ValueError("set either top_entropy_quantile (TRL's entropy mask) or token_selection, not both")
            if self.selection_normalizer == "selected":
                if a.loss_type not in _TOKEN_MEAN + _SEQ_MEAN:
                    raise ValueError(f"selection_normalizer='selected' is not defined for loss_type {a.loss_type!r}")
                if getattr(self, "_entropy_bonus_enabled", False):
                    raise ValueError("selection_normalizer='selected' cannot be combined with an entropy bonus")
            # any value below 1 makes TRL call get_high_entropy_mask, which returns our selection
            self.top_entropy_quantile = 0.5
        self._loss_settings = None
        self._score = get_score(self.token_selection)
        if "omega" in self._score.needs:  # omega of the loss TRL trains; refuses what it does not model
            from gmts_analysis.core.objective import trl_loss_settings

            self._loss_settings = trl_loss_settings(self, what=f"token_selection='{self.token_selection}'")

    # -- bookkeeping: each row's index in the global generation batch, before TRL shuffles it
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:  # the mechanism's zero-advantage token share, logged for every arm
            cm = out["completion_mask"].bool()
            zero = (out["advantages"].reshape(-1, 1) == 0).expand_as(cm) & cm
            n = self.accelerator.gather(torch.stack([zero.sum(), cm.sum()]).double().reshape(1, 2)).sum(0)
            self._metrics["train"]["gmts/frac_tokens_zero_adv"].append(float(n[0] / n[1].clamp(min=1)))
        if self.token_selection != "all":
            ids = out["completion_ids"]
            n_local = ids.shape[0]
            rows = self.accelerator.process_index * n_local + torch.arange(n_local, device=ids.device)
            out["selection_row_ids"] = rows
        return out

    def _compute_loss(self, model, inputs):
        if self.token_selection == "all":
            return super()._compute_loss(model, inputs)
        self._sel_inputs, self._sel_logps, self._sel_lgn = inputs, None, None
        if "logit_grad_norm" in self._score.needs:
            from gmts_analysis.integrations.diagnostics import completion_quantities, unwrapped_without_amp

            cm = inputs["completion_mask"]
            if "tool_mask" in inputs:
                cm = cm * inputs["tool_mask"]
            with unwrapped_without_amp(self.accelerator, model) as unwrapped:  # no autocast, wrapper put back
                self._sel_lgn = completion_quantities(
                    unwrapped, inputs["prompt_ids"], inputs["prompt_mask"],
                    inputs["completion_ids"], cm, float(self.temperature),
                )[2]
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._sel_inputs, self._sel_logps, self._sel_lgn = None, None, None

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._sel_inputs is not None and self._sel_logps is None:  # the policy forward of _compute_loss
            self._sel_logps = out[0].detach()
        return out

    # -- the selection
    def _num_generations(self) -> int:
        return self.num_generations if self.model.training else self.num_generations_eval

    def _scores(self, entropies: torch.Tensor, mask: torch.Tensor, inputs: dict) -> torch.Tensor:
        """``(B, T)`` scores of the arm (:func:`gmts_analysis.core.selection_tensor.token_scores`) from TRL's
        entropies, log-probs, advantages, loss settings and (when needed) logit-gradient norms."""
        needs = self._score.needs
        g = None
        if "uniform" in needs:
            from gmts_analysis.core.seeding import torch_generator

            g = torch_generator(int(self.args.seed), "trl-random-selection", int(self.state.global_step),
                                int(self._step), int(self.accelerator.process_index))
        omega_kw = {}
        if "omega" in needs:
            omega_kw = dict(
                settings=self._loss_settings, logprobs=self._sel_logps, old_logprobs=inputs.get("old_per_token_logps"),
                ref_logprobs=inputs.get("ref_per_token_logps"),
                sampling_logprobs=inputs.get("sampling_per_token_logps"),
            )
        s = token_scores(self.token_selection, entropies, inputs["advantages"], mask, g,
                         logit_grad_norm=self._sel_lgn, token_logprobs=self._sel_logps, **omega_kw)
        if self._score.scale == "abs_omega" and self._loss_settings.loss_agg == "token-mean":
            # w = 1/n_local differs across processes; the true w is one constant
            s = s * mask.sum().clamp(min=1).double()
        return s

    def get_high_entropy_mask(self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float) -> torch.Tensor:
        if self.token_selection == "all" or self._sel_inputs is None:
            return super().get_high_entropy_mask(entropies, mask, threshold)
        inputs = self._sel_inputs
        B, T = mask.shape
        device = mask.device
        scores = self._scores(entropies, mask, inputs)
        rows = inputs.get("selection_row_ids")
        if rows is None:  # e.g. a caller that bypassed _generate_and_score_completions
            rows = self.accelerator.process_index * B + torch.arange(B, device=device)
        G = self._num_generations()
        # gather (B, T) tensors across processes as TRL does: pad the length, then concatenate rows
        acc = self.accelerator
        adv = inputs["advantages"].reshape(-1, 1).expand(B, T)
        parts = {"scores": scores, "mask": mask.long(), "ent": entropies.detach().double(),
                 "rows": rows.long()[:, None].expand(B, T).contiguous(), "zero_adv": (adv == 0).long().contiguous()}
        if acc.num_processes > 1:
            parts = {k: acc.pad_across_processes(v, dim=1, pad_index=0) for k, v in parts.items()}
            parts = {k: acc.pad_across_processes(v, dim=0, pad_index=0) for k, v in parts.items()}
            gathered = {k: acc.gather(v) for k, v in parts.items()}
            Bl = parts["mask"].shape[0]
            mine = slice(acc.process_index * Bl, acc.process_index * Bl + B)
        else:
            gathered, mine = parts, slice(0, B)
        g_rows = gathered["rows"][:, 0]
        order = torch.argsort(g_rows, stable=True)  # ties by (global row, position)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        s_o, m_o = gathered["scores"][order], gathered["mask"][order]
        groups = torch.div(g_rows[order], G, rounding_mode="floor")
        sel_o = select_tokens(s_o, m_o, self.selection_rho, self.selection_scope, groups)
        ent_o = select_tokens(gathered["ent"][order], m_o, self.selection_rho, self.selection_scope, groups)
        sel_all, ent_all = sel_o[inv], ent_o[inv]
        selected = sel_all[mine][:, :T] & mask.bool()
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["gmts/selection/frac_selected"].append(float(sel_all.sum()) / max(int(m_o.sum()), 1))
        self._metrics[mode]["gmts/selection/overlap_entropy"].append(selection_overlap(sel_all, ent_all))
        zero_o = gathered["zero_adv"][order].bool()  # the selection's waste: picks whose advantage is 0
        self._metrics[mode]["gmts/selection/frac_selected_zero_adv"].append(
            float((sel_o & zero_o).sum()) / max(int(sel_o.sum()), 1))
        if self.selection_normalizer == "all":
            return selected
        m = mask.to(entropies.dtype)
        if self.loss_type in _SEQ_MEAN:
            n_sel = selected.sum(-1, keepdim=True).clamp(min=1).to(m.dtype)
            factor = m.sum(-1, keepdim=True) / n_sel
        else:
            factor = (gathered["mask"].sum() / sel_all.sum().clamp(min=1)).to(m.dtype)
        return selected.to(m.dtype) * factor
