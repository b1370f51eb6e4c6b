"""``SelectiveGRPOTrainer``: TRL's ``GRPOTrainer`` whose policy loss keeps only the selected completion tokens.

How the selection enters: through one override, :meth:`SelectiveGRPOTrainer._compute_loss`. With
``token_selection="all"`` it is TRL's own method (TRL's ``top_entropy_quantile`` included). Otherwise it runs
TRL's policy forward and TRL's loss (:mod:`.loss`, TRL 1.16's ``_compute_loss`` split in two) with the
selection's mask where TRL puts its entropy mask; the mask is made in between, from values passed as
arguments: TRL's entropies and current log-probs, the micro-batch's advantages, old, reference and sampling
log-probs, and (``gmts_lgn``) the logit-gradient norms of one extra no-grad forward.

Groups: TRL places the ``num_generations`` completions of a prompt consecutively in the global generation
batch, so row ``r`` of it belongs to group ``r // num_generations``. :meth:`_generate_and_score_completions`
records each row's global index (``selection_row_ids``) before TRL shuffles the batch into micro-batches;
ties of the ``top_k`` cutoff are broken by (global row, position).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from trl import GRPOTrainer

from gmts_analysis.core.objective import trl_loss_settings
from gmts_analysis.core.scores import get_score
from gmts_analysis.core.seeding import torch_generator
from gmts_analysis.core.selection_tensor import token_scores
from gmts_analysis.core.trl_args import TrlLossArgs
from gmts_analysis.integrations import diagnostics  # through its module: tests replace its functions there
from gmts_analysis.integrations.rollout_log import log_rollouts
from gmts_analysis.integrations.trl import loss, selection
from gmts_analysis.integrations.trl.config import SEQ_MEAN_LOSSES, SelectiveGRPOConfig


class SelectiveGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose policy loss keeps only the tokens chosen by ``args.token_selection``.

    Use it exactly like ``GRPOTrainer``::

        args = SelectiveGRPOConfig(output_dir="out", token_selection="gmts", selection_rho=0.2,
                                   selection_scope="group")
        trainer = SelectiveGRPOTrainer(model=..., reward_funcs=..., args=args, train_dataset=...)
        trainer.train()

    Args:
        *args: ``GRPOTrainer``'s positional arguments (``model``, ``reward_funcs``, ``args``, ...).
        **kwargs: ``GRPOTrainer``'s keyword arguments. ``args`` must be a :class:`SelectiveGRPOConfig` (a plain
            ``GRPOConfig`` is refused: its selection fields would be unknown).

    Raises:
        TypeError: ``args`` is not a :class:`SelectiveGRPOConfig`.
        gmts_analysis.errors.GmtsError: ``token_selection`` needs omega (``gmts``, ``gmts_lgn``, the masked
            arms) and the TRL settings give a loss omega does not model (``cispo``, ``sapo``, ``vespo``,
            ``luspo``, ``delta``, ...; :func:`gmts_analysis.core.objective.trl_loss_settings`).

    Every micro-batch of a selecting arm logs ``gmts/selection/frac_selected``,
    ``gmts/selection/overlap_entropy``, ``gmts/selection/frac_selected_zero_adv`` and
    ``gmts/selection/cutoff_quantile`` (:func:`.selection.log_selection`); every generation batch logs
    ``gmts/frac_tokens_zero_adv`` (completion tokens whose advantage is 0), for every arm. With
    ``diagnostics_every=N`` the live diagnostics run on steps 1, 1 + N, ... (attribute ``diagnostics``).
    """

    args: SelectiveGRPOConfig

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        a = self.args
        if not isinstance(a, SelectiveGRPOConfig):
            raise TypeError(f"SelectiveGRPOTrainer needs a SelectiveGRPOConfig, got {type(a).__name__}")
        self._score = get_score(a.token_selection)
        self._loss_settings = None
        if "omega" in self._score.needs:  # omega of the loss TRL trains; refuses what it does not model
            self._loss_settings = trl_loss_settings(TrlLossArgs.of_trainer(self), what=f"token_selection='{a.token_selection}'")
        if a.token_selection != "all":
            loss.check_trl_version()
        if a.rollouts_dir:
            log_rollouts(self, a.rollouts_dir)
        self.diagnostics = None
        if a.diagnostics_every:
            self.diagnostics = diagnostics.GmtsDiagnosticsCallback(
                every=a.diagnostics_every, rho=a.selection_rho, scope=a.selection_scope, cutoff=a.selection_cutoff,
                max_tokens=a.diagnostics_tokens, seed=a.seed,
            ).attach(self)

    # the public names of the settings, as before (read-only views of args)
    @property
    def token_selection(self) -> str:
        return self.args.token_selection

    @property
    def selection_rho(self) -> float:
        return self.args.selection_rho

    @property
    def selection_scope(self) -> str:
        return self.args.selection_scope

    @property
    def selection_cutoff(self) -> str:
        return self.args.selection_cutoff

    @property
    def selection_normalizer(self) -> str:
        return self.args.selection_normalizer

    # -- bookkeeping: each row's index in the global generation batch, before TRL shuffles it
    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        if self.model.training:  # the mechanism's zero-advantage token share, logged for every arm
            cm = out["completion_mask"].bool()
            zero = (out["advantages"].reshape(-1, 1) == 0).expand_as(cm) & cm
            n = self.accelerator.gather(torch.stack([zero.sum(), cm.sum()]).double().reshape(1, 2)).sum(0)
            self._metrics["train"]["gmts/frac_tokens_zero_adv"].append(float(n[0] / n[1].clamp(min=1)))
        if self.args.token_selection != "all":
            ids = out["completion_ids"]
            n_local = ids.shape[0]
            out["selection_row_ids"] = self.accelerator.process_index * n_local + torch.arange(n_local, device=ids.device)
        return out

    # -- the one override through which the selection enters
    def _compute_loss(self, model, inputs):
        """TRL's loss of one micro-batch with the selection's mask in place of TRL's entropy mask (module
        docstring); TRL's own ``_compute_loss`` for ``token_selection="all"``."""
        if self.args.token_selection == "all":
            return super()._compute_loss(model, inputs)
        lgn = self._logit_grad_norms(model, inputs) if "logit_grad_norm" in self._score.needs else None
        logps, entropies, aux_loss, mask = loss.policy_forward(self, model, inputs)
        token_mask = self._selection_mask(inputs, entropies, logps.detach(), lgn, mask)
        return loss.policy_loss(self, inputs, logps, entropies, aux_loss, mask, token_mask)

    def _selection_mask(self, inputs: dict, entropies: Tensor, logps: Tensor, lgn: Tensor | None,
                        mask: Tensor) -> Tensor:
        """``(B, T)``: the selection of this micro-batch as TRL's loss takes it (bool, or scaled by the
        ``selected`` normalizer), from the arm's scores over every process's micro-batch."""
        a = self.args
        scores = self._selection_scores(inputs, entropies, logps, lgn, mask)
        B = mask.shape[0]
        rows = inputs.get("selection_row_ids")
        if rows is None:  # e.g. a caller that bypassed _generate_and_score_completions
            rows = self.accelerator.process_index * B + torch.arange(B, device=mask.device)
        G = self.num_generations if self.model.training else self.num_generations_eval
        batch = selection.gather_rows(self.accelerator, scores, mask, entropies, inputs["advantages"], rows, G)
        kept, by_entropy = selection.select(batch, a.selection_rho, a.selection_scope, a.selection_cutoff)
        mode = "train" if self.model.training else "eval"
        selection.log_selection(self._metrics[mode], batch, kept, by_entropy, a.selection_cutoff)
        return selection.rescale(selection.local_mask(batch, kept, mask), mask, batch, kept,
                                 normalizer=a.selection_normalizer, per_sequence=self.loss_type in SEQ_MEAN_LOSSES,
                                 dtype=entropies.dtype)

    def _selection_scores(self, inputs: dict, entropies: Tensor, logps: Tensor, lgn: Tensor | None,
                          mask: Tensor) -> Tensor:
        """``(B, T)`` float64 scores of the arm (:func:`gmts_analysis.core.selection_tensor.token_scores`) from
        TRL's entropies (nats), current log-probs ``logps``, the advantages, old/reference/sampling log-probs of
        ``inputs``, the loss settings and (``gmts_lgn``) the logit-gradient norms ``lgn``."""
        needs = self._score.needs
        generator = None
        if "uniform" in needs:
            generator = torch_generator(int(self.args.seed), "trl-random-selection", int(self.state.global_step),
                                        int(self._step), int(self.accelerator.process_index))
        omega_kw = {}
        if "omega" in needs:
            omega_kw = dict(
                settings=self._loss_settings, logprobs=logps, old_logprobs=inputs.get("old_per_token_logps"),
                ref_logprobs=inputs.get("ref_per_token_logps"),
                sampling_logprobs=inputs.get("sampling_per_token_logps"),
            )
        s = token_scores(self.args.token_selection, entropies, inputs["advantages"], mask, generator,
                         logit_grad_norm=lgn, token_logprobs=logps, **omega_kw)
        if self._score.scale == "abs_omega" and self._loss_settings.loss_agg == "token-mean":
            # w = 1/n_local differs across processes; the true w is one constant
            s = s * mask.sum().clamp(min=1).double()
        return s

    def _logit_grad_norms(self, model: torch.nn.Module, inputs: dict) -> Tensor:
        """``(B, T)`` logit-gradient norms ``||d logprob / d z||_2`` of the completion tokens, from one no-grad
        forward without accelerate's mixed-precision wrapper (TRL's fused head returns no logits)."""
        cm = inputs["completion_mask"]
        if "tool_mask" in inputs:
            cm = cm * inputs["tool_mask"]
        with diagnostics.unwrapped_without_amp(self.accelerator, model) as unwrapped:  # no autocast, wrapper put back
            return diagnostics.completion_quantities(unwrapped, inputs["prompt_ids"], inputs["prompt_mask"],
                                         inputs["completion_ids"], cm, float(self.temperature))[2]
