"""Live selection diagnostics while training (TRL, ``SelectiveGRPOTrainer``, verl, ``gmts rl``).

Every ``N`` steps, on one micro-batch of the update, the same dictionary of metrics, all named
``gmts/...`` so TRL's and verl's loggers (and whatever ``report_to`` is set) receive them
under one namespace:

Cheap part (:func:`selection_diagnostics`, tensors only, no model call):

- ``gmts/zero_advantage/token_share``: tokens with omega = 0 over all response tokens
  (``zero_advantage.token_share`` of ``stats.json``, docs/definitions.md section 6);
  ``gmts/zero_advantage/answer_share`` and, with group labels, ``gmts/zero_advantage/group_share``
  (answers / groups without a token with omega != 0);
- ``gmts/selection_waste/<s>`` for ``s`` in the diagnostic scores of the registry
  (:data:`gmts_analysis.core.scores.DIAGNOSTIC_SCORES`: entropy, gmts, and gmts_lgn when the
  logit-gradient norms are known; a score is logged when its quantities are, and a warning names each
  one left out for want of a quantity): the share of the top-``rho`` selection by ``s`` (exact ``k = ceil(rho n)``
  per scope, or TRL's quantile rule with ``cutoff="quantile"``,
  :func:`gmts_analysis.core.selection.select_tokens`) made of omega = 0 tokens
  (``selection_waste.<scope>.<s>.<rho>`` of ``stats.json``);
- ``gmts/overlap/<a>_<b>`` = |S_a ∩ S_b| / |S_b| for every pair of logged diagnostic scores, ``a``
  registered before ``b`` (:func:`gmts_analysis.core.scores.diagnostic_pairs`: ``entropy_gmts``,
  ``entropy_gmts_lgn``, ``gmts_gmts_lgn``).

Gradient part (:func:`gradient_diagnostics`, needs the model): exact per-token gradient norms
(:func:`gmts_analysis.engine.grad_norms`, method ``exact``) on a seeded sample of informative
answers, at most ``max_tokens`` response tokens in all (the last answer is cut to a prefix,
which is exact for a causal LM: a token's gradient depends only on its prefix):

- ``gmts/grad/within_answer/<s>``: mean over the sampled answers with >= 5 tokens of
  Spearman(s, grad_norm_logp) inside the answer (:func:`gmts_analysis.core.rank.within_spearman`);
- ``gmts/grad/cross_answer_informative/<s>``: Spearman(s, grad_norm) pooled over the sampled
  tokens with omega != 0, ``grad_norm = |omega| * grad_norm_logp``
  (:func:`gmts_analysis.core.rank.spearman`);
- ``gmts/grad/n_tokens``, ``gmts/grad/n_answers``, ``gmts/grad/seconds``: the wall time in seconds of the
  whole diagnostic at its entry point (for TRL, everything :class:`GmtsDiagnosticsCallback` adds to the
  diagnosed step: the no-grad forward, omega, the cheap part and the gradient part; for
  :func:`diagnose_batch` and :func:`verl_diagnostics`, the call).

TRL also gets ``gmts/cutoff_quantile``: 1 when the selections were cut at TRL's quantile
(``cutoff="quantile"``), 0 for the exact ``top_k``.

Cost: the cheap part is a few sorts of the micro-batch's scores (negligible next to a forward).
The gradient part is bounded by ``max_tokens``: one forward and one backward through each sampled answer's
prompt and prefix per token (the exact engine), so it grows with the prompt length, not only with
``max_tokens``. The TRL paths also run one no-grad forward of the diagnosed micro-batch (entropy and the
logit-gradient norm of ``softmax(z / tau)``, which TRL's fused head does not return). On a real model this
is not small next to a step: ``gmts/grad/seconds`` logs each diagnosed step's cost (docs/rl.md gives measured
figures).

Entry points: :func:`diagnose_batch` (both parts on ``(B, T)`` tensors), :class:`GmtsDiagnosticsCallback`
(stock TRL ``GRPOTrainer``; ``SelectiveGRPOTrainer(diagnostics_every=N)`` uses the same),
:func:`verl_diagnostics` (a verl ``DataProto``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from gmts_analysis.core.objective import trl_loss_settings
from gmts_analysis.core.rank import spearman, within_spearman
from gmts_analysis.core.scores import DIAGNOSTIC_SCORES, diagnostic_pairs, get_score, times_abs_omega
from gmts_analysis.core.seeding import derive_seed
from gmts_analysis.core.selection_tensor import (
    ScoreInputs,
    group_codes,
    score_tensor,
    select_tokens,
    selection_overlap,
    token_omega,
)
from gmts_analysis.core.tokens import token_quantities
from gmts_analysis.core.trl_args import TrlLossArgs
from gmts_analysis.core.vocabulary import CUTOFFS, DEFAULT_RHO, SCOPES, check_rho
from gmts_analysis.engine import grad_norms
from gmts_analysis.errors import GmtsError
from gmts_analysis.integrations.verl_recipe import verl_settings

PREFIX = "gmts/"
SCORES = DIAGNOSTIC_SCORES  # live view of the registry
DEFAULT_MAX_TOKENS = 64


def _share(num: Tensor, den: Tensor) -> float:
    d = int(den)
    return float(num) / d if d else math.nan


#: the per-token quantities the live diagnostics can be given (entropy and omega always; the others
#: when the caller has them: log-probs from TRL's or verl's forward, logit-gradient norms)
DIAGNOSTIC_QUANTITIES = ("entropy", "omega", "logprob", "prob", "logit_grad_norm")


def diagnostic_scores(entropy: Tensor, omega: Tensor, mask: Tensor,
                      logit_grad_norm: Tensor | None = None, logprob: Tensor | None = None) -> dict[str, Tensor]:
    """``{name: (B, T) float64 score}`` (0 on padding) for every score of :data:`SCORES` whose quantities
    are given (entropy, omega, and ``logprob`` / ``logit_grad_norm`` when given): ``entropy``, ``gmts`` =
    entropy * |omega| and, with ``logit_grad_norm``, ``gmts_lgn`` = logit_grad_norm * |omega|.

    A diagnostic score is never dropped silently: one that needs a quantity the diagnostics cannot
    have (:data:`DIAGNOSTIC_QUANTITIES`) is refused with a :class:`~gmts_analysis.errors.GmtsError`, and
    one whose quantity this caller did not give is left out with a warning (once per score)."""
    inputs = ScoreInputs("diagnostics", mask, omega.device, entropy=entropy, omega=omega, logprob=logprob,
                         logit_grad_norm=logit_grad_norm, uniform=False)
    out = {}
    for k in SCORES:
        needs = get_score(k).needs
        impossible = [q for q in needs if q not in DIAGNOSTIC_QUANTITIES]
        if impossible:
            raise GmtsError(f"score '{k}' is registered with diagnostic=True but needs {', '.join(impossible)}, "
                            f"which the live diagnostics do not have ({', '.join(DIAGNOSTIC_QUANTITIES)})")
        missing = tuple(q for q in needs if q not in inputs)
        if missing:
            _warn_left_out(k, missing)
            continue
        out[k] = score_tensor(k, inputs, mask)
    return out


@functools.lru_cache(maxsize=None)
def _warn_left_out(score: str, missing: tuple[str, ...]) -> None:
    logging.getLogger("gmts").warning("gmts diagnostics: score '%s' left out: this trainer gives no %s",
                                      score, ", ".join(missing))


def selection_diagnostics(
    entropy: Tensor,
    omega: Tensor,
    mask: Tensor,
    *,
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    group_ids: Tensor | Sequence | None = None,
    logit_grad_norm: Tensor | None = None,
    logprob: Tensor | None = None,
    cutoff: str = "top_k",
) -> dict[str, float]:
    """The cheap metrics of the module docstring on ``(B, T)`` tensors.

    Args:
        entropy: ``(B, T)`` per-token entropy in nats, 0 on padding.
        omega: ``(B, T)`` per-token coefficient (:func:`gmts_analysis.core.selection.token_omega`), 0 on padding.
        mask: ``(B, T)`` 1 on response tokens.
        rho: keep fraction of the selections, in (0, 1].
        scope: ``batch`` or ``group``.
        group_ids: ``(B,)`` group labels (needed for scope ``group``; gives ``zero_advantage/group_share``
            whatever the scope).
        logit_grad_norm: ``(B, T)`` logit-gradient norms (adds the ``gmts_lgn`` score), or None.
        logprob: ``(B, T)`` log-probs of the sampled tokens, or None.
        cutoff: ``top_k`` (exactly ``ceil(rho n)`` per scope) or ``quantile`` (TRL's rule).

    Returns:
        ``{"gmts/<metric>": value}``: shares in [0, 1] (NaN where undefined).
    """
    m = mask.bool()
    informative = m & (omega != 0)
    out: dict[str, float] = {
        PREFIX + "zero_advantage/token_share": _share((m & ~informative).sum(), m.sum()),
    }
    has_tok = m.any(-1)
    row_inf = informative.any(-1)
    out[PREFIX + "zero_advantage/answer_share"] = _share((has_tok & ~row_inf).sum(), has_tok.sum())
    if group_ids is not None:
        codes = group_codes(group_ids, m.shape[0], m.device)
        n_groups = int(codes.max()) + 1 if codes.numel() else 0
        g_inf = torch.zeros(n_groups, device=m.device).index_add_(0, codes, row_inf.float()) > 0
        g_tok = torch.zeros(n_groups, device=m.device).index_add_(0, codes, has_tok.float()) > 0
        out[PREFIX + "zero_advantage/group_share"] = _share((g_tok & ~g_inf).sum(), g_tok.sum())
    scores = diagnostic_scores(entropy, omega, mask, logit_grad_norm, logprob)
    sels = {k: select_tokens(v, mask, rho, scope, group_ids, cutoff=cutoff) for k, v in scores.items()}
    for k, sel in sels.items():
        out[PREFIX + f"selection_waste/{k}"] = _share((sel & ~informative).sum(), sel.sum())
    for a, b in diagnostic_pairs(list(sels)):
        out[PREFIX + f"overlap/{a}_{b}"] = selection_overlap(sels[a], sels[b])
    return out


def sample_answers(omega: Tensor, mask: Tensor, max_tokens: int, seed: int) -> list[tuple[int, int]]:
    """``[(row, n_tokens)]``: informative rows in a seeded random order, each contributing its
    first ``n_tokens`` response tokens, at most ``max_tokens`` in all (the last one cut)."""
    m = mask.bool()
    lengths = m.sum(-1).cpu()
    cand = torch.nonzero((m & (omega != 0)).any(-1).cpu()).squeeze(1).tolist()
    rng = np.random.default_rng(seed)
    out, left = [], int(max_tokens)
    for r in rng.permutation(cand).tolist() if cand else []:
        if left <= 0:
            break
        n = min(int(lengths[r]), left)
        out.append((int(r), n))
        left -= n
    return out


def gradient_diagnostics(
    model: torch.nn.Module,
    sequences: Sequence[tuple[Tensor, int]],
    picks: Sequence[tuple[int, int]],
    scores: dict[str, Tensor],
    omega: Tensor,
    *,
    temperature: float = 1.0,
) -> dict[str, float]:
    """The gradient metrics of the module docstring.

    sequences: per row of the batch, ``(ids (S_i,), prompt_len)`` with the response tokens at
    ``ids[prompt_len:]`` in the order of the ``(B, T)`` tensors' positions (left-aligned).
    picks: ``[(row, n)]`` from :func:`sample_answers`. scores/omega: ``(B, T)``.
    """
    t0 = time.perf_counter()
    device = next(model.parameters()).device
    within: dict[str, list[float]] = {k: [] for k in scores}
    pooled: dict[str, list[np.ndarray]] = {k: [] for k in scores}
    target: list[np.ndarray] = []
    was_training = model.training
    model.eval()
    # TRL's gradient checkpointing makes the input embeddings require grad through forward hooks
    # (transformers' enable_input_require_grads, possibly registered more than once), which
    # function transforms refuse: taken off the embedding module for the call, then put back
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    hooks = getattr(emb, "_forward_hooks", {})
    saved = {k: h for k, h in hooks.items() if getattr(h, "__name__", "") == "make_inputs_require_grads"}
    for k in saved:
        del hooks[k]
    try:
        for row, n in picks:
            ids, P = sequences[row]
            ids = ids[: P + n].to(device)
            gn_logp = grad_norms(model, ids, P, temperature=temperature, method="exact").norms.numpy()
            om = omega[row, :n].detach().double().cpu().numpy()
            inf = om != 0
            gn = times_abs_omega(gn_logp, om)
            for k, s in scores.items():
                sv = s[row, :n].detach().double().cpu().numpy()
                within[k].append(within_spearman(sv, gn_logp))
                pooled[k].append(sv[inf])
            target.append(gn[inf])
    finally:
        model.train(was_training)
        hooks.update(saved)
    out: dict[str, float] = {}
    y = np.concatenate(target) if target else np.zeros(0)
    for k in scores:
        w = np.asarray([v for v in within[k] if not math.isnan(v)])
        out[PREFIX + f"grad/within_answer/{k}"] = float(w.mean()) if len(w) else math.nan
        x = np.concatenate(pooled[k]) if pooled[k] else np.zeros(0)
        out[PREFIX + f"grad/cross_answer_informative/{k}"] = spearman(x, y)
    out[PREFIX + "grad/n_answers"] = float(len(picks))
    out[PREFIX + "grad/n_tokens"] = float(sum(n for _, n in picks))
    out[PREFIX + "grad/seconds"] = time.perf_counter() - t0
    return out


def diagnose_batch(
    entropy: Tensor,
    omega: Tensor,
    mask: Tensor,
    *,
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    group_ids: Tensor | Sequence | None = None,
    logit_grad_norm: Tensor | None = None,
    logprob: Tensor | None = None,
    model: torch.nn.Module | None = None,
    sequences: Sequence[tuple[Tensor, int]] | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    temperature: float = 1.0,
    cutoff: str = "top_k",
) -> dict[str, float]:
    """:func:`selection_diagnostics`, plus :func:`gradient_diagnostics` when ``model`` and
    ``sequences`` are given and ``max_tokens > 0``; then ``gmts/grad/seconds`` is the wall time of this
    whole call."""
    t0 = time.perf_counter()
    out = selection_diagnostics(entropy, omega, mask, rho=rho, scope=scope, group_ids=group_ids,
                                logit_grad_norm=logit_grad_norm, logprob=logprob, cutoff=cutoff)
    if model is not None and sequences is not None and max_tokens > 0:
        picks = sample_answers(omega, mask, max_tokens, seed)
        scores = diagnostic_scores(entropy, omega, mask, logit_grad_norm, logprob)
        out.update(gradient_diagnostics(model, sequences, picks, scores, omega, temperature=temperature))
        out[PREFIX + "grad/seconds"] = time.perf_counter() - t0
    return out


# ----------------------------------------------------------------------------- TRL


@torch.no_grad()
def completion_quantities(model: torch.nn.Module, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                          completion_mask: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor]:
    """``(logprob, entropy, logit_grad_norm)``, each ``(B, C)`` over TRL's completion positions,
    from one no-grad forward of ``[prompt_ids, completion_ids]`` (TRL's left-padded prompts)."""

    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    att = torch.cat([prompt_mask, completion_mask], dim=1)
    C = completion_ids.shape[1]
    logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits[:, -C - 1 : -1, :].float()
    q = token_quantities(logits, completion_ids, temperature)
    m = completion_mask.to(q.entropy.dtype)
    return q.logprob * m, q.entropy * m, q.logit_grad_norm * m


def trl_sequences(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                  completion_mask: Tensor) -> list[tuple[Tensor, int]]:
    """Per row ``(ids, prompt_len)``: the prompt without its left padding, then the completion."""
    out = []
    for i in range(prompt_ids.shape[0]):
        p = prompt_ids[i][prompt_mask[i].bool()]
        c = completion_ids[i][: int(completion_mask[i].sum())]
        out.append((torch.cat([p, c]).detach().cpu(), int(p.numel())))
    return out


@contextlib.contextmanager
def unwrapped_without_amp(accelerator: Any, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model inside ``accelerator``'s wrappers (DDP, ...) without its mixed-precision forward wrapper
    (``accelerator.unwrap_model(model, keep_fp32_wrapper=False)``): a bf16 run's autocast must not reach
    the gradient-norm engine or the closed forms. Accelerate strips that wrapper from the model object
    itself, which is also the model training runs, so it is put back on exit (exception or not)."""
    inner = accelerator.unwrap_model(model, keep_torch_compile=False)
    keys = ("forward", "_original_forward")
    saved = {k: inner.__dict__[k] for k in keys if k in inner.__dict__}
    try:
        yield accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    finally:
        for k in keys:
            inner.__dict__.pop(k, None)
        inner.__dict__.update(saved)


def trl_batch_diagnostics(trainer: Any, model: torch.nn.Module, inputs: dict, *, rho: float, scope: str = "batch",
                          max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, cutoff: str = "top_k") -> dict[str, float]:
    """The metrics on one TRL ``GRPOTrainer`` micro-batch (``inputs`` of ``_compute_loss``).

    omega of the loss TRL trains (:func:`gmts_analysis.core.objective.trl_loss_settings` of
    ``trainer.args`` and ``trainer.aux_loss_enabled``, which refuses a setting omega does not model): advantages, the token weight
    of ``loss_type``, clipping, old, reference and sampling log-probs when present.
    Group labels come from each row's index in the global generation batch
    (``selection_row_ids``, written by ``SelectiveGRPOTrainer``, or ``gmts_row_ids``, written by
    :meth:`GmtsDiagnosticsCallback.attach`): row ``r`` is in group ``r // num_generations``.
    Scope ``batch`` is the micro-batch on this process. The model runs without accelerate's
    mixed-precision wrapper (:func:`unwrapped_without_amp`).
    """
    with unwrapped_without_amp(trainer.accelerator, model) as unwrapped:
        return _trl_batch_diagnostics(trainer, unwrapped, inputs, rho=rho, scope=scope, max_tokens=max_tokens,
                                      seed=seed, cutoff=cutoff)


def _trl_batch_diagnostics(trainer: Any, unwrapped: torch.nn.Module, inputs: dict, *, rho: float, scope: str,
                           max_tokens: int, seed: int, cutoff: str) -> dict[str, float]:
    pm, cm = inputs["prompt_mask"], inputs["completion_mask"]
    if "tool_mask" in inputs:
        cm = cm * inputs["tool_mask"]
    lp, ent, lgn = completion_quantities(unwrapped, inputs["prompt_ids"], pm, inputs["completion_ids"], cm,
                                         float(trainer.temperature))
    settings = trl_loss_settings(TrlLossArgs.of_trainer(trainer), what="gmts diagnostics")
    omega = token_omega(
        inputs["advantages"], cm, settings=settings, logprobs=lp, old_logprobs=inputs.get("old_per_token_logps"),
        ref_logprobs=inputs.get("ref_per_token_logps"), sampling_logprobs=inputs.get("sampling_per_token_logps"),
    )
    groups = None
    rows = inputs.get("selection_row_ids", inputs.get("gmts_row_ids"))
    if rows is not None:
        groups = torch.div(rows, trainer.num_generations, rounding_mode="floor")
    elif scope == "group":
        raise ValueError("diagnostics scope 'group' needs each row's generation index (selection_row_ids or "
                         "gmts_row_ids); attach the callback with GmtsDiagnosticsCallback.attach")
    seqs = trl_sequences(inputs["prompt_ids"], pm, inputs["completion_ids"], cm) if max_tokens > 0 else None
    return diagnose_batch(ent, omega, cm, rho=rho, scope=scope, group_ids=groups, logit_grad_norm=lgn, logprob=lp,
                          model=unwrapped if max_tokens > 0 else None, sequences=seqs, max_tokens=max_tokens,
                          seed=seed, temperature=float(trainer.temperature), cutoff=cutoff)


try:  # the callback needs transformers (always installed with the toolkit)
    from transformers import TrainerCallback
except ImportError:  # pragma: no cover
    TrainerCallback = object  # type: ignore[misc,assignment]


class GmtsDiagnosticsCallback(TrainerCallback):
    """Live diagnostics for a TRL ``GRPOTrainer``, logged through TRL's own metrics
    (``trainer._metrics["train"]["gmts/..."]``), so every ``report_to`` gets them.

    Usage::

        trainer = GRPOTrainer(...)
        GmtsDiagnosticsCallback(every=10, rho=0.2).attach(trainer)
        trainer.train()

    Which steps: the first micro-batch of every ``every``-th optimizer step, counted from the first, i.e.
    ``state.global_step`` 0, N, 2N, ... before the update, which TRL logs as steps 1, 1 + N, 1 + 2N, ...
    (1, 11, 21, ... for ``every=10``). Nothing runs unless a callback is attached (``SelectiveGRPOTrainer``
    attaches one only when ``diagnostics_every`` is set; its default 0 is off). The diagnosed micro-batch is
    measured before its loss is computed, without changing it: training is bit for bit the same.

    ``attach`` registers the callback and wraps two methods of this trainer instance:
    ``_generate_and_score_completions`` (records each row's index in the generation batch as
    ``gmts_row_ids`` before TRL shuffles it, for the group labels) and ``_compute_loss`` (runs :meth:`run` on
    a due micro-batch).

    Args:
        every: diagnose every this many optimizer steps (>= 1).
        rho: keep fraction of the selections compared, in (0, 1].
        scope: ``batch`` (the micro-batch on this process) or ``group`` (the answers to one prompt).
        max_tokens: at most this many completion tokens get exact per-token gradient norms per diagnosed step
            (0: the cheap part only).
        seed: seeds the choice of the answers whose gradients are computed (with the step).
        cutoff: ``top_k`` (exactly ``ceil(rho n)`` tokens per scope) or ``quantile`` (TRL's
            ``top_entropy_quantile`` rule); logged as ``gmts/cutoff_quantile`` (1 or 0).

    Attributes:
        history: ``[(global_step, metrics)]``, ``global_step`` before the update (0, N, ...) and the metrics
            :meth:`run` logged.

    Raises:
        ValueError: a parameter out of its domain (one line naming it).
    """

    def __init__(self, every: int = 10, rho: float = DEFAULT_RHO, scope: str = "batch",
                 max_tokens: int = DEFAULT_MAX_TOKENS, seed: int = 0, cutoff: str = "top_k"):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        rho = check_rho(rho, "rho")
        if scope not in SCOPES:
            raise ValueError(f"scope must be {' or '.join(SCOPES)}, got {scope!r}")
        if cutoff not in CUTOFFS:
            raise ValueError(f"cutoff must be {' or '.join(CUTOFFS)}, got {cutoff!r}")
        if max_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
        self.every, self.rho, self.scope, self.max_tokens, self.seed = every, rho, scope, max_tokens, seed
        self.cutoff = cutoff
        self._due = False
        self.history: list[tuple[int, dict[str, float]]] = []
        self.trainer: Any = None

    def attach(self, trainer: Any) -> GmtsDiagnosticsCallback:
        """Hook into ``trainer`` (see the class docstring).

        Args:
            trainer: a TRL ``GRPOTrainer`` (or subclass), before ``train()``.

        Returns:
            this callback, for chaining.

        Raises:
            gmts_analysis.errors.GmtsError: TRL settings whose omega the toolkit does not model (before
                training starts).
        """
        trl_loss_settings(TrlLossArgs.of_trainer(trainer), what="gmts diagnostics")
        self.trainer = trainer
        inner = trainer._compute_loss
        gen = trainer._generate_and_score_completions

        def _generate_and_score_completions(inputs):
            out = gen(inputs)
            if "selection_row_ids" not in out:
                ids = out["completion_ids"]
                n = ids.shape[0]
                out["gmts_row_ids"] = trainer.accelerator.process_index * n + torch.arange(n, device=ids.device)
            return out

        trainer._generate_and_score_completions = _generate_and_score_completions

        def _compute_loss(model, inputs):
            if self._due and model.training:
                self._due = False
                self.run(model, inputs)
            return inner(model, inputs)

        trainer._compute_loss = _compute_loss
        trainer.add_callback(self)
        return self

    def run(self, model: torch.nn.Module, inputs: dict) -> dict[str, float]:
        """Diagnose one micro-batch and append its metrics to the trainer's.

        Args:
            model: the model ``_compute_loss`` received (possibly wrapped by accelerate).
            inputs: the micro-batch of ``_compute_loss`` (TRL's dict of ``(B, T)`` tensors).

        Returns:
            the ``gmts/...`` metrics (module docstring); ``gmts/grad/seconds`` is the wall time in seconds of
            all of this call's work, i.e. everything the diagnostics add to the step.
        """
        t0 = time.perf_counter()
        tr = self.trainer
        step = int(tr.state.global_step)
        metrics = trl_batch_diagnostics(tr, model, inputs, rho=self.rho, scope=self.scope, cutoff=self.cutoff,
                                        max_tokens=self.max_tokens, seed=derive_seed(self.seed, "rl-diag-answers", step))
        metrics[PREFIX + "cutoff_quantile"] = 1.0 if self.cutoff == "quantile" else 0.0
        metrics[PREFIX + "grad/seconds"] = time.perf_counter() - t0
        for k, v in metrics.items():
            tr._metrics["train"][k].append(float(v))
        self.history.append((step, metrics))
        return metrics

    def on_step_begin(self, args, state, control, **kwargs):
        """Marks the step due when ``state.global_step`` (before the update) is a multiple of ``every``."""
        if state.global_step % self.every == 0:
            self._due = True
        return control


# ----------------------------------------------------------------------------- verl


def verl_diagnostics(
    data: Any,
    *,
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    loss_agg_mode: str = "token-mean",
    entropy_key: str = "old_entropys",
    lgn_key: str = "old_logit_grad_norm",
    kl_beta: float = 0.0,
    model: torch.nn.Module | None = None,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    seed: int = 0,
    temperature: float = 1.0,
    actor: Any = None,
    algorithm: Any = None,
    entropy_coeff: float = 0.0,
) -> dict[str, float]:
    """The same ``gmts/...`` dictionary from a verl ``DataProto`` (before the selection masks
    the advantages, i.e. before :func:`gmts_analysis.integrations.verl_recipe.apply_token_selection`).

    Reads ``batch[entropy_key]``, ``["advantages"]`` (token level), ``["response_mask"]``,
    ``["old_log_probs"]``/``["ref_log_prob"]`` for the KL term when ``kl_beta``, ``batch[lgn_key]``
    when present (gmts_lgn), and ``non_tensor_batch["uid"]`` (groups). The gradient part needs
    ``model`` (a Hugging Face causal LM on this process, e.g. a copy of the actor) and
    ``batch["prompts"]``/``["responses"]``/``["attention_mask"]`` (verl's left-padded prompts).
    """
    # the loss omega is computed under: verl's actor config, read as the recipe reads it
    b = data.batch
    settings = verl_settings(actor, algorithm, loss_agg_mode=loss_agg_mode, kl_beta=kl_beta,
                             entropy_coeff=entropy_coeff, horizon=b["response_mask"].shape[-1])
    kl_beta = settings.kl_beta
    keys = set(b.keys())
    ent, adv, mask = b[entropy_key], b["advantages"], b["response_mask"]
    ref = b["ref_log_prob"] if kl_beta and "ref_log_prob" in keys else None
    old = b["old_log_probs"] if "old_log_probs" in keys else None
    omega = token_omega(adv, mask, settings=settings, logprobs=old if ref is not None else None, ref_logprobs=ref)
    uid = data.non_tensor_batch.get("uid")
    lgn = b[lgn_key] if lgn_key in keys else None
    seqs = None
    if model is not None and max_tokens > 0:
        P = b["prompts"].shape[1]
        pm = b["attention_mask"][:, :P]
        seqs = trl_sequences(b["prompts"], pm, b["responses"], mask)
    return diagnose_batch(ent, omega, mask, rho=rho, scope=scope, group_ids=list(uid) if uid is not None else None,
                          logit_grad_norm=lgn, logprob=old, model=model, sequences=seqs, max_tokens=max_tokens, seed=seed,
                          temperature=temperature)
