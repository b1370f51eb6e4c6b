"""A small on-policy GRPO loop on the toy domains, with token selection (``gmts rl``).

One training step:

1. sample ``prompts_per_domain`` train-split prompts of each domain with ``num_generations``
   answers each (:func:`gmts_analysis.toy.sample.sample_rollouts`, temperature ``tau``),
   rewards from the domain verifier;
2. group advantages (:func:`gmts_analysis.core.advantages.compute_advantages`, GRPO by default);
3. one forward of the policy on the whole batch: log-probs ``(B, T)`` (differentiable)
   and entropies ``(B, T)`` of ``softmax(z / tau)``;
4. a selection mask (``all`` | ``entropy`` | ``gmts`` | ``random``, top ``rho`` in
   ``scope``; :func:`gmts_analysis.core.selection.selection_mask`), and the loss
   ``aggregate_loss(-A * ratio, mask, selected, normalizer, loss_agg)`` with
   ``ratio = exp(logp - logp.detach())``;
5. one AdamW step (gradient clipped to ``max_grad_norm``).

The update is strictly on-policy: one gradient step per fresh batch, so the importance ratio
is 1, the PPO clip is inactive and omega = w * A exactly (docs/definitions.md section 4); GMTS is then
entropy * |A| * w. No KL penalty, no reference model.

Per-step diagnostics (cheap, every step): the overlap ``|S_entropy ∩ S_gmts| / |S_gmts|`` of
the two selections on the same batch, the share of selected tokens with A = 0, reward,
entropy, length, loss, gradient norm. Every ``diag_every`` steps (costlier): exact per-token
gradient norms on ``diag_answers`` answers (:func:`gmts_analysis.engine.grad_norms`) for the
within-answer Spearman(entropy, grad_norm_logp) and cross-answer Spearman(entropy | gmts,
grad_norm), and the update fidelity (cosine and norm ratio between the summed gradient of
the selected tokens' terms and the full policy gradient) for entropy, gmts and random
selections on the whole batch.

Evaluation: pass@1 at temperature 1.0 on ``eval_prompts`` held-out prompts per domain
(one sample each, fixed ``eval_seed``: every arm and checkpoint sees the same prompts and
the same sampling noise, so differences between checkpoints are not sampling noise of the
prompt set).
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gmts_analysis.core.advantages import SingletonGroupWarning, compute_advantages
from gmts_analysis.core.rank import spearman, within_spearman
from gmts_analysis.core.scores import CHANCE_ARMS, DIAGNOSTIC_SCORES, diagnostic_pairs, get_score
from gmts_analysis.core.selection_tensor import (
    aggregate_loss,
    select_tokens,
    selection_mask,
    selection_overlap,
    token_omega,
)
from gmts_analysis.core.tokens import (
    entropy_from_logprobs,
    gather_positions,
    response_positions,
    scaled_log_softmax,
    target_logprobs,
    token_quantities,
)
from gmts_analysis.engine import grad_norms
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.rl.config import ALL_DOMAINS, SELECTION_ARMS, RLConfig, record_config, stable_seed
from gmts_analysis.toy.sample import sample_rollouts

log = logging.getLogger(__name__)

__all__ = ["ALL_DOMAINS", "SELECTION_ARMS", "RLConfig", "collate", "evaluate", "policy_forward", "stable_seed",
           "train", "batch_fidelity"]


# ----------------------------------------------------------------------------- batches


def collate(rows: list[dict], pad_id: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` ``(B, S)`` of prompt+response, and over the
    response positions ``targets``, ``mask``, ``logit_index`` ``(B, T)`` (``T`` the longest
    response): response token ``t`` of row ``i`` is ``input_ids[i, P_i + t]``, predicted by
    the logits at ``P_i + t - 1`` (the shift of :mod:`gmts_analysis.core.tokens`)."""
    B = len(rows)
    P = [len(r["prompt_ids"]) for r in rows]
    L = [len(r["response_ids"]) for r in rows]
    S = max(p + n for p, n in zip(P, L))
    T = max(max(L), 1)
    ids = torch.full((B, S), pad_id, dtype=torch.long)
    att = torch.zeros((B, S), dtype=torch.long)
    tgt = torch.full((B, T), pad_id, dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.long)
    lidx = torch.zeros((B, T), dtype=torch.long)
    for i, r in enumerate(rows):
        seq = list(r["prompt_ids"]) + list(r["response_ids"])
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        att[i, : len(seq)] = 1
        if L[i]:
            tgt[i, : L[i]] = torch.tensor(r["response_ids"], dtype=torch.long)
            mask[i, : L[i]] = 1
        lidx[i] = response_positions(P[i], T, S)
    out = {"input_ids": ids, "attention_mask": att, "targets": tgt, "mask": mask, "logit_index": lidx}
    return {k: v.to(device) for k, v in out.items()}


def policy_forward(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float = 1.0,
                   with_lgn: bool = False):
    """``(logprobs, entropy)``, both ``(B, T)`` float32: log p(o_t) (differentiable) and the
    entropy in nats (detached) of ``softmax(z / tau)`` at every response position.

    with_lgn: also return the detached ``logit_grad_norm`` ``(B, T)`` (closed form of
    :func:`gmts_analysis.core.tokens.token_quantities`) as a third element.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
    resp = gather_positions(logits, batch["logit_index"])
    logp = scaled_log_softmax(resp, temperature)
    lp = target_logprobs(logp, batch["targets"])
    with torch.no_grad():
        ent = entropy_from_logprobs(logp)
    m = batch["mask"].to(lp.dtype)
    if with_lgn:
        lgn = token_quantities(resp.detach(), batch["targets"], temperature).logit_grad_norm.to(lp.dtype)
        return lp * m, ent * m, lgn * m
    return lp * m, ent * m


# ----------------------------------------------------------------------------- evaluation


def evaluate(model, tokenizer, cfg: RLConfig, n_prompts: int | None = None) -> dict[str, float]:
    """pass@1 per domain at temperature 1.0 on ``n_prompts`` (default ``cfg.eval_prompts``) held-out
    prompts per domain, one sample each, sampling noise fixed by ``cfg.eval_seed``."""
    out = {}
    for d in cfg.domains:
        rows = sample_rollouts(
            model, tokenizer, d, n_prompts or cfg.eval_prompts, 1, temperature=1.0, max_new_tokens=cfg.max_completion_length,
            seed=cfg.eval_seed, split="heldout", batch_size=cfg.batch_size,
        )
        out[d] = float(np.mean([r["reward"] for r in rows]))
    return out


# ----------------------------------------------------------------------------- diagnostics


def batch_fidelity(
    logprobs: torch.Tensor, omega: torch.Tensor, selections: dict[str, torch.Tensor], params: list
) -> dict[str, dict[str, float]]:
    """``{name: {cosine, norm_ratio}}`` of ``g_S = grad sum_S omega * logp`` against ``g_all`` on a
    training batch's tensors (the run-directory version is :func:`gmts_analysis.engine.fidelity.update_fidelity`;
    both compare with :func:`gmts_analysis.engine.fidelity.compare`).

    logprobs: ``(B, T)`` differentiable (graph retained); omega ``(B, T)`` (0 on padding).
    """
    from gmts_analysis.engine.fidelity import compare  # deferred: pandas

    def flat_grad(weights: torch.Tensor) -> torch.Tensor:
        gs = torch.autograd.grad((weights * logprobs).sum(), params, retain_graph=True, allow_unused=True)
        return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).double() for g, p in zip(gs, params)])

    om = omega.to(logprobs.dtype)
    g_all = flat_grad(om)
    return {name: compare(flat_grad(om * sel.to(om.dtype)), g_all) for name, sel in selections.items()}


def mass_capture(model, rows: list[dict], omega: torch.Tensor, mask: torch.Tensor,
                 selections: dict[str, torch.Tensor], cfg: RLConfig, group_ids) -> dict[str, float]:
    """``{name: capture}``: the gradient mass ``sum_{t in S} |omega_t| * ||grad log p_t||`` a selection
    holds over the mass of the true top-``rho`` tokens by that quantity (same ``rho``, scope and
    tie rule, :func:`gmts_analysis.core.selection_tensor.select_tokens`), on the whole training batch.

    The per-token norms are exact (:func:`gmts_analysis.engine.grad_norms`) on every answer with
    omega != 0; tokens of answers with omega = 0 carry no mass. 1.0 = the selection holds as much
    mass as the best selection of its size could.
    """
    mass = torch.zeros(mask.shape, dtype=torch.float64)
    device = next(model.parameters()).device
    for i, r in enumerate(rows):
        L = int(mask[i].sum())
        w = omega[i, :L].abs().double().cpu()
        if L == 0 or not bool((w > 0).any()):
            continue
        ids = torch.tensor(list(r["prompt_ids"]) + list(r["response_ids"]), dtype=torch.long, device=device)
        gn = grad_norms(model, ids, len(r["prompt_ids"]), temperature=cfg.temperature, method="exact").norms
        mass[i, :L] = w * gn.double().cpu()[:L]
    m = mask.cpu()
    best = float(mass[select_tokens(mass, m, cfg.rho, cfg.scope, group_ids)].sum())
    if best <= 0:
        return {name: float("nan") for name in selections}
    return {name: float(mass[sel.cpu()].sum()) / best for name, sel in selections.items()}


def grad_norm_correlations(model, rows: list[dict], entropy: list[np.ndarray], scores: dict[str, list[np.ndarray]],
                           omega_abs: list[np.ndarray], cfg: RLConfig) -> dict[str, float]:
    """Within-answer Spearman(entropy, grad_norm_logp) (median over answers with at least
    :data:`gmts_analysis.core.rank.MIN_TOKENS` tokens) and cross-answer Spearman(s, grad_norm) for every
    score ``s`` of ``scores`` (the diagnostic scores: entropy, gmts, gmts_lgn) on a few answers (exact
    per-token norms), with :func:`gmts_analysis.core.rank.spearman`. The caller passes informative
    answers only (A != 0), so the ``cross_answer_*`` values are the informative-token numbers
    (``cross_answer_informative`` of stats.json), not ``cross_answer``.

    entropy/omega_abs and each score: one array per row (``(L_i,)``), aligned with ``rows``.
    """
    within, gn_all = [], []
    device = next(model.parameters()).device
    for r, e, w in zip(rows, entropy, omega_abs):
        ids = torch.tensor(list(r["prompt_ids"]) + list(r["response_ids"]), dtype=torch.long, device=device)
        try:
            gn = grad_norms(model, ids, len(r["prompt_ids"]), temperature=cfg.temperature, method="exact").norms
        except Exception as err:  # noqa: BLE001 - fall back to the plain loop, say so once
            log.debug("exact grad norms failed (%s); using the loop", err)
            gn = grad_norms(model, ids, len(r["prompt_ids"]), temperature=cfg.temperature, method="loop").norms
        gn = gn.numpy()
        within.append(within_spearman(e, gn))  # NaN below the minimum tokens
        gn_all.append(gn * w)
    gn = np.concatenate(gn_all) if gn_all else np.zeros(0)
    wv = np.asarray([v for v in within if not math.isnan(v)])
    out: dict[str, float] = {"within_answer_entropy_median": float(np.median(wv)) if len(wv) else float("nan")}
    for name, per_row in scores.items():
        out[f"cross_answer_{name}"] = spearman(np.concatenate(per_row) if per_row else np.zeros(0), gn)
    out.update({"n_answers": len(rows), "n_tokens": len(gn)})
    return out


# ----------------------------------------------------------------------------- the loop


def _rows_for_step(model, tokenizer, cfg: RLConfig, step: int, reward_fn=None) -> list[dict]:
    rows = []
    for d in cfg.domains:
        rows += sample_rollouts(
            model, tokenizer, d, cfg.prompts_per_domain, cfg.num_generations, temperature=cfg.temperature,
            max_new_tokens=cfg.max_completion_length, seed=stable_seed("rl-train", cfg.seed, step),
            split="train", batch_size=cfg.batch_size,
        )
    if reward_fn is not None:
        for r in rows:
            r["reward"] = float(reward_fn(r))
    return rows


@dataclass
class _Run:
    """What the steps of one :func:`train` call share: the policy, its optimizer and the running logs
    (``evals``, ``steps``) and clocks (``t_eval``, ``t_diag``, seconds)."""

    model: torch.nn.Module
    tokenizer: Any
    cfg: RLConfig
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer
    pad: int
    device: torch.device
    on_eval: Callable[[int, dict], None] | None
    reward_fn: Callable[[dict], float] | None
    evals: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)
    t_eval: float = 0.0
    t_diag: float = 0.0


@dataclass
class _Batch:
    """One step's kept rollout rows and their tensors: ``rewards`` and ``adv_np`` ``(B,)`` float64,
    ``adv`` ``(B,)`` float32 on the policy's device, ``tensors`` of :func:`collate` (``mask`` ``(B, T)``)."""

    rows: list[dict]
    rewards: np.ndarray
    adv_np: np.ndarray
    adv: torch.Tensor
    group_ids: list
    tensors: dict[str, torch.Tensor]

    @property
    def mask(self) -> torch.Tensor:
        return self.tensors["mask"]


@dataclass
class _Update:
    """What one optimizer step leaves for the step record: the loss, the clipped gradient's norm, the
    entropies ``(B, T)``, the trained selection ``(B, T)`` bool, every compared selection and the diagnostics."""

    loss: torch.Tensor
    grad_norm: float
    entropy: torch.Tensor
    selected: torch.Tensor
    selections: dict[str, torch.Tensor]
    diagnostics: dict[str, Any]


def train(
    model: torch.nn.Module,
    tokenizer: Any,
    cfg: RLConfig,
    initial_eval: dict[str, float] | None = None,
    progress: bool = False,
    on_eval: Callable[[int, dict], None] | None = None,
    reward_fn: Callable[[dict], float] | None = None,
) -> dict:
    """Train ``model`` in place for ``cfg.max_steps`` steps; returns the run record (JSON-ready).

    initial_eval: pass@1 of the untrained policy when already known (the experiment runner
    evaluates it once for every arm); otherwise it is measured. reward_fn: replaces the
    domain verifier's reward of each training rollout row (tests; evaluation keeps the verifier).
    """
    run = _start(model, tokenizer, cfg, on_eval, reward_fn)
    t0 = time.perf_counter()
    if initial_eval is None:
        initial_eval = _timed_eval(run)
    _record_eval(run, 0, dict(initial_eval))
    it = range(1, cfg.max_steps + 1)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc=f"rl {cfg.selection} s{cfg.seed}", unit="step", leave=False)
    for step in it:
        run.steps.append(_train_step(run, step))
        _maybe_eval(run, step)
    final = _final_pass1(run)
    total = time.perf_counter() - t0
    return {
        "config": record_config(cfg),
        "steps": run.steps,
        "evals": run.evals,
        "final_pass1": final,
        "final_eval_prompts": cfg.final_prompts,
        "timing_s": {"total": total, "eval": run.t_eval, "diagnostics": run.t_diag,
                     "train": total - run.t_eval - run.t_diag},
    }


def _start(model: torch.nn.Module, tokenizer: Any, cfg: RLConfig, on_eval, reward_fn) -> _Run:
    """Check ``cfg``, build the AdamW optimizer over the trainable parameters, put the policy in eval mode."""
    cfg.check()  # every random stream below is a local generator seeded from cfg.seed (gmts_analysis.core.seeding)
    params = [p for _, p in trainable_parameters(model)]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    model.eval()  # no dropout in the toy policies; keeps sampling and training identical
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    device = next(model.parameters()).device
    return _Run(model, tokenizer, cfg, params, opt, pad, device, on_eval, reward_fn)


def _timed_eval(run: _Run, n_prompts: int | None = None) -> dict[str, float]:
    """:func:`evaluate` on ``n_prompts`` (default ``cfg.eval_prompts``) prompts per domain, its time counted."""
    te = time.perf_counter()
    ev = evaluate(run.model, run.tokenizer, run.cfg, n_prompts)
    run.t_eval += time.perf_counter() - te
    return ev


def _record_eval(run: _Run, step: int, pass1: dict[str, float]) -> None:
    run.evals.append({"step": step, "pass1": pass1, "pass1_mean": float(np.mean(list(pass1.values())))})
    if run.on_eval:
        run.on_eval(step, run.evals[-1])


def _maybe_eval(run: _Run, step: int) -> None:
    """pass@1 every ``cfg.eval_every`` steps and after the last one."""
    cfg = run.cfg
    if step % cfg.eval_every == 0 or step == cfg.max_steps:
        ev = _timed_eval(run)
        _record_eval(run, step, ev)
        log.info("%s seed %d step %d: pass@1 %s", cfg.selection, cfg.seed, step,
                 " ".join(f"{k}={v:.3f}" for k, v in ev.items()))


def _final_pass1(run: _Run) -> dict[str, float]:
    """The last evaluation's pass@1, or a fresh one on ``cfg.final_prompts`` prompts when that set differs."""
    cfg = run.cfg
    final = run.evals[-1]["pass1"]
    if cfg.final_prompts != cfg.eval_prompts:  # the final pass@1 on its own, larger prompt set
        final = _timed_eval(run, cfg.final_prompts)
        log.info("%s seed %d final pass@1 on %d prompts per domain: %s", cfg.selection, cfg.seed,
                 cfg.final_prompts, " ".join(f"{k}={v:.4f}" for k, v in final.items()))
    return final


def _train_step(run: _Run, step: int) -> dict[str, Any]:
    """Sample the step's groups, leave out all-equal groups under ``cfg.dynamic_sampling`` (DAPO; a batch
    left empty is logged as skipped), take one optimizer step; returns the step's log record."""
    cfg = run.cfg
    ts = time.perf_counter()
    rows = _rows_for_step(run.model, run.tokenizer, cfg, step, run.reward_fn)
    t_sample = time.perf_counter() - ts
    zero_std = _zero_std_groups(rows)
    n_groups = len({r["group_id"] for r in rows})
    if cfg.dynamic_sampling:  # DAPO: groups with all-equal rewards leave the batch (not refilled)
        rows = [r for r in rows if r["group_id"] not in zero_std]
        if not rows:
            return {"step": step, "n_groups": n_groups, "n_groups_kept": 0, "frac_groups_zero_std": 1.0,
                    "skipped": True, "sample_s": t_sample, "step_s": time.perf_counter() - ts}
    b = _batch(run, rows)
    u = _update(run, step, b)
    m = b.mask.bool()
    n_tok = int(m.sum())
    zero_adv = torch.from_numpy(b.adv_np == 0).to(run.device)[:, None].expand_as(m)
    rec = u.diagnostics
    rec.update(
        {
            "step": step,
            "reward_mean": float(b.rewards.mean()),
            "frac_groups_zero_std": len(zero_std) / n_groups,
            "n_groups": n_groups,
            "n_groups_kept": len({r["group_id"] for r in rows}),
            "loss": float(u.loss.detach()),
            "grad_norm": u.grad_norm,
            "entropy_mean": float(u.entropy[m].mean()) if n_tok else float("nan"),
            "response_len_mean": n_tok / len(rows),
            "n_tokens": n_tok,
            "n_selected": int(u.selected.sum()),
            **{f"overlap_{a}_{c}": selection_overlap(u.selections[a], u.selections[c])
               for a, c in diagnostic_pairs()},
            "frac_tokens_zero_adv": float(zero_adv[m].float().mean()) if n_tok else float("nan"),
            "waste": {k: float((v & zero_adv).sum()) / max(int(v.sum()), 1) for k, v in u.selections.items()},
            "frac_selected_zero_adv": float((u.selected & zero_adv).sum()) / max(int(u.selected.sum()), 1),
            "sample_s": t_sample,
            "step_s": time.perf_counter() - ts,
        }
    )
    return rec


def _batch(run: _Run, rows: list[dict]) -> _Batch:
    """Group advantages (``cfg.advantage``; singleton groups get 0 without a warning) and the collated tensors."""
    rewards = np.array([r["reward"] for r in rows], dtype=np.float64)
    group_ids = [r["group_id"] for r in rows]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SingletonGroupWarning)
        adv_np = compute_advantages(rewards, group_ids, run.cfg.advantage)
    tensors = collate(rows, run.pad, run.device)
    adv = torch.tensor(adv_np, dtype=torch.float32, device=run.device)
    return _Batch(rows, rewards, adv_np, adv, group_ids, tensors)


def _update(run: _Run, step: int, b: _Batch) -> _Update:
    """One forward, the selections, the loss ``aggregate_loss(-A * ratio, ...)`` of the trained selection,
    the diagnostics every ``cfg.diag_every`` steps (before the backward, on the same graph), one clipped
    AdamW step."""
    cfg, mask = run.cfg, b.mask
    with torch.enable_grad():
        lp, ent, lgn = policy_forward(run.model, b.tensors, cfg.temperature, with_lgn=True)
        sel_kw = {"rho": cfg.rho, "scope": cfg.scope, "group_ids": b.group_ids, "loss_agg": cfg.loss_agg}
        sels = _selections(cfg, step, ent, b.adv, mask, lp, lgn, sel_kw)
        selected = mask.bool() if cfg.selection == "all" else sels[cfg.selection]
        ratio = torch.exp(lp - lp.detach())
        per_token = -b.adv[:, None] * ratio
        loss = aggregate_loss(per_token, mask, selected, cfg.normalizer, cfg.loss_agg)
        diag: dict[str, Any] = {}
        if cfg.diag_every and step % cfg.diag_every == 0:
            diag = _diagnostics(run, step, b, lp, ent, lgn, sels, sel_kw)
        run.opt.zero_grad(set_to_none=True)
        loss.backward()
    gnorm = float(torch.nn.utils.clip_grad_norm_(run.params, cfg.max_grad_norm))
    run.opt.step()
    return _Update(loss, gnorm, ent, selected, sels, diag)


def _selections(cfg: RLConfig, step: int, ent, adv, mask, lp, lgn, sel_kw: dict) -> dict[str, torch.Tensor]:
    """``{name: (B, T) bool}``: the diagnostic scores of the registry on every step (entropy, gmts,
    gmts_lgn), and the trained arm when it is another arm of the registry (random with its seeded
    generator, a masked baseline, a registered score)."""
    gen = torch.Generator().manual_seed(stable_seed("rl-random", cfg.seed, step))
    sels = {name: selection_mask(name, ent, adv, mask, token_logprobs=lp, logit_grad_norm=lgn, **sel_kw)
            for name in DIAGNOSTIC_SCORES}
    if cfg.selection not in sels and cfg.selection != "all":  # any other arm of the registry
        sels[cfg.selection] = selection_mask(cfg.selection, ent, adv, mask, generator=gen, token_logprobs=lp,
                                             logit_grad_norm=lgn, **sel_kw)
    return sels


def _diagnostics(run: _Run, step: int, b: _Batch, lp, ent, lgn, sels: dict, sel_kw: dict) -> dict[str, Any]:
    """Update fidelity and mass capture of every selection (a seeded random one added when not trained) and
    the grad-norm correlations; their time counted in ``run.t_diag``."""
    cfg, mask = run.cfg, b.mask
    td = time.perf_counter()
    om = token_omega(b.adv, mask, loss_agg=cfg.loss_agg).float()
    fsel = dict(sels)
    for chance in CHANCE_ARMS:  # the random selection, as the fidelity baseline
        if chance not in fsel:
            g2 = torch.Generator().manual_seed(stable_seed("rl-diag-random", cfg.seed, step))
            fsel[chance] = selection_mask(chance, ent, b.adv, mask, generator=g2, **sel_kw)
    rec = {
        "fidelity": batch_fidelity(lp, om, fsel, run.params),
        "mass_capture": mass_capture(run.model, b.rows, om.detach(), mask, fsel, cfg, b.group_ids),
        "grad_norm_corr": _correlations(run.model, b.rows, b.adv_np, ent, om, mask, cfg, step, lgn),
    }
    run.t_diag += time.perf_counter() - td
    return rec


def _zero_std_groups(rows: list[dict]) -> set:
    """Group ids whose rewards are all equal (every answer's group advantage is 0)."""
    by: dict = {}
    for r in rows:
        by.setdefault(r["group_id"], []).append(float(r["reward"]))
    return {g for g, v in by.items() if max(v) == min(v)}


def _correlations(model, rows, adv_np, ent, om, mask, cfg: RLConfig, step: int, lgn=None) -> dict[str, float]:
    """Grad-norm correlations on ``cfg.diag_answers`` answers with A != 0 (seeded choice)."""
    cand = [i for i in range(len(rows)) if adv_np[i] != 0 and int(mask[i].sum()) > 0]
    if not cand or cfg.diag_answers <= 0:
        return {"n_answers": 0}
    rng = np.random.default_rng(stable_seed("rl-diag", cfg.seed, step))
    pick = sorted(rng.choice(cand, size=min(cfg.diag_answers, len(cand)), replace=False).tolist())
    ents, oms = [], []
    have = {"entropy", "omega"} | ({"logit_grad_norm"} if lgn is not None else set())
    names = [s for s in DIAGNOSTIC_SCORES if set(get_score(s).needs) <= have]
    scores: dict[str, list[np.ndarray]] = {s: [] for s in names}
    for i in pick:
        L = int(mask[i].sum())
        q = {"entropy": ent[i, :L].double().cpu().numpy(), "omega": om[i, :L].double().cpu().numpy()}
        if lgn is not None:
            q["logit_grad_norm"] = lgn[i, :L].double().cpu().numpy()
        ents.append(q["entropy"])
        oms.append(np.abs(q["omega"]))
        for s in names:
            scores[s].append(np.asarray(get_score(s).fn(q), dtype=np.float64))
    return grad_norm_correlations(model, [rows[i] for i in pick], ents, scores, oms, cfg)
