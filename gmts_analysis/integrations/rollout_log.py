"""Exact rollouts at the source: write what a TRL or verl trainer trained on, in our rollouts format.

The text TRL and verl log is decoded without special tokens; re-tokenizing it loses the chat
template and the stop token. The trainer itself holds the exact ids, so the recommended way to
audit a run is to write them as it trains, one JSONL file per generation step, rows as
docs/definitions.md section 7 describes them:

``step``, ``group_id``, ``answer_id``, ``prompt`` (text or messages), ``response`` (text or
messages), ``prompt_ids``, ``response_ids`` (the completion ids exactly as generated, the stop
token included), ``reward`` (TRL: the weighted ``nansum`` of the reward functions; a row every
function skipped gets ``reward`` 0.0 and ``unscorable: true``: TRL leaves it out of its group's
baseline and trains it with advantage 0, so audit such runs with ``--advantage logged``; verl: the
sum of ``token_level_scores``), ``logged_advantage`` (the trainer's own advantage), and, when the trainer computed them, ``old_logprobs``,
``ref_logprobs`` and ``sampling_logprobs`` (the inference engine's, for the vLLM correction).
``gmts probe --rollouts DIR`` reads them with no re-tokenization.

TRL (stock ``GRPOTrainer`` or :class:`~gmts_analysis.integrations.trl_trainer.SelectiveGRPOTrainer`)::

    trainer = GRPOTrainer(...)
    log_rollouts(trainer, "run/rollouts")      # or SelectiveGRPOConfig(rollouts_dir="run/rollouts")
    trainer.train()

A ``TrainerCallback`` cannot do this: its events receive the model, optimizer and dataloaders but
never the generated batch. :func:`log_rollouts` wraps three methods of the trainer *instance*
(``_generate``, ``_calculate_rewards``, ``_generate_and_score_completions``) and calls the
originals unchanged, so training is bit for bit the same. Each process writes its own rows to
``rollouts_rank{R}_{STEP:05d}.jsonl`` where STEP is numbered as TRL numbers its own
``completions/completions_{STEP:05d}.parquet``: the optimizer step that trains on the batch,
``trainer.state.global_step + 1`` when it was generated (so the batch that ``checkpoint-N`` generated
is STEP N + 1; :func:`gmts_analysis.readers.trl_output.own_batch` pairs them); groups are TRL's: row ``r`` of the global generation
batch belongs to group ``r // num_generations``. Evaluation batches are not written.

verl: :func:`write_verl_batch` writes a ``DataProto`` after ``compute_advantage`` (``prompts``,
``responses``, ``attention_mask``, ``token_level_scores``, ``advantages``, ``old_log_probs``,
``ref_log_prob``, ``uid``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from gmts_analysis.util.atomic import atomic_write_jsonl


def write_rows(path: str | Path, rows: Sequence[dict]) -> Path:
    """Write rollout rows as JSONL, atomically (:func:`~gmts_analysis.util.atomic.atomic_write_jsonl`)."""
    return atomic_write_jsonl(path, rows)


def _trim(row: torch.Tensor, n: int) -> list[float]:
    return [float(x) for x in row[:n].detach().to(torch.float64).cpu().tolist()]


def trl_rows(
    *,
    step: int,
    process_index: int,
    num_generations: int,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    rewards_per_func: torch.Tensor,
    reward_weights: torch.Tensor,
    advantages: torch.Tensor,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    sampling_logprobs: torch.Tensor | None = None,
) -> list[dict]:
    """Rows of one process's share of a TRL generation batch.

    ``rewards_per_func``: ``(N_global, F)`` as TRL's ``_calculate_rewards`` returns it (gathered);
    ``advantages``: ``(n_local,)``; the log-prob tensors: ``(n_local, T)`` right-padded like the
    completion ids.
    """
    n = len(completion_ids)
    start = process_index * n
    rpf = rewards_per_func[start:start + n].detach().to(torch.float64).cpu()
    w = reward_weights.detach().to(torch.float64).cpu()
    unscorable = torch.isnan(rpf).all(dim=1)
    rewards = (rpf * w[None]).nansum(dim=1)  # 0.0 where every function skipped the row
    adv = advantages.detach().to(torch.float64).cpu().reshape(n, -1)[:, 0]
    rows = []
    for j in range(n):
        g = start + j
        L = len(completion_ids[j])
        row = {
            "step": int(step),
            "group_id": f"{step}-{g // num_generations}",
            "answer_id": f"{step}-{g}",
            "prompt": prompts[j],
            "response": completions[j],
            "prompt_ids": [int(t) for t in prompt_ids[j]],
            "response_ids": [int(t) for t in completion_ids[j]],
            "reward": float(rewards[j]),
            "logged_advantage": float(adv[j]),
        }
        if bool(unscorable[j]):
            row["unscorable"] = True
        for name, t in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs),
                        ("sampling_logprobs", sampling_logprobs)):
            if t is not None:
                row[name] = _trim(t[j], L)
        rows.append(row)
    return rows


def log_rollouts(trainer: Any, out_dir: str | Path) -> Any:
    """Make a TRL 1.16 ``GRPOTrainer`` (or subclass) instance write its rollouts to ``out_dir``.

    See the module docstring. Returns the trainer. Calling it twice on one trainer is refused.
    """
    if getattr(trainer, "_gmts_rollouts_dir", None) is not None:
        raise ValueError("log_rollouts: this trainer already writes its rollouts")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer._gmts_rollouts_dir = out
    cap: dict[str, Any] = {}
    orig_generate = trainer._generate
    orig_rewards = trainer._calculate_rewards
    orig_gen_score = trainer._generate_and_score_completions

    def _generate(prompts, *a, **k):
        res = orig_generate(prompts, *a, **k)
        cap["prompt_ids"], cap["completion_ids"], cap["completions"] = res[0], res[1], res[3]
        return res

    def _calculate_rewards(inputs, prompts, completions, completion_ids_list, *a, **k):
        res = orig_rewards(inputs, prompts, completions, completion_ids_list, *a, **k)
        cap["rewards_per_func"] = res
        return res

    def _generate_and_score_completions(inputs, *a, **k):
        cap.clear()
        # TRL's numbering (completions/completions_{N:05d}.parquet): N is the optimizer step that trains on this
        # batch, global_step + 1; it was generated by the model after global_step updates (checkpoint-<N-1>)
        step = int(trainer.state.global_step) + 1
        out_batch = orig_gen_score(inputs, *a, **k)
        if trainer.model.training and "rewards_per_func" in cap:
            acc = trainer.accelerator
            rows = trl_rows(
                step=step, process_index=acc.process_index, num_generations=trainer.num_generations,
                prompts=[x.get("prompt") for x in inputs], completions=cap["completions"],
                prompt_ids=cap["prompt_ids"], completion_ids=cap["completion_ids"],
                rewards_per_func=cap["rewards_per_func"], reward_weights=trainer.reward_weights,
                advantages=out_batch["advantages"], old_logprobs=out_batch.get("old_per_token_logps"),
                ref_logprobs=out_batch.get("ref_per_token_logps"),
                sampling_logprobs=out_batch.get("sampling_per_token_logps"),
            )
            write_rows(out / f"rollouts_rank{acc.process_index}_{step:05d}.jsonl", rows)
        cap.clear()
        return out_batch

    trainer._generate = _generate
    trainer._calculate_rewards = _calculate_rewards
    trainer._generate_and_score_completions = _generate_and_score_completions
    return trainer


def verl_rows(data: Any, step: int, tokenizer: Any = None) -> list[dict]:
    """Rows of a verl ``DataProto`` batch (after ``compute_advantage``).

    Reads ``batch["prompts"]`` ``(bs, P)`` (left-padded), ``batch["responses"]`` ``(bs, R)``,
    ``batch["attention_mask"]`` ``(bs, P + R)`` (which tokens are real), ``token_level_scores``
    (the reward is their sum over the response), ``advantages`` (the first response token's value:
    GRPO broadcasts one advantage per answer), ``old_log_probs`` and ``ref_log_prob`` when present,
    and ``non_tensor_batch["uid"]`` as the group. ``tokenizer`` (optional) decodes text for display.
    """
    b = data.batch
    keys = set(b.keys())
    prompts, responses, attn = b["prompts"], b["responses"], b["attention_mask"]
    P = prompts.shape[1]
    pmask, rmask = attn[:, :P].bool(), attn[:, P:].bool()
    scores = b["token_level_scores"] if "token_level_scores" in keys else None
    adv = b["advantages"] if "advantages" in keys else None
    old = b["old_log_probs"] if "old_log_probs" in keys else None
    ref = b["ref_log_prob"] if "ref_log_prob" in keys else None
    uid = data.non_tensor_batch.get("uid") if hasattr(data, "non_tensor_batch") else None
    rows = []
    for i in range(prompts.shape[0]):
        p_ids = [int(t) for t in prompts[i][pmask[i]].tolist()]
        r_ids = [int(t) for t in responses[i][rmask[i]].tolist()]
        L = len(r_ids)
        row = {"step": int(step), "group_id": str(uid[i]) if uid is not None else f"{step}-{i}",
               "answer_id": f"{step}-{i}", "prompt_ids": p_ids, "response_ids": r_ids}
        if tokenizer is not None:
            row["prompt"] = tokenizer.decode(p_ids, skip_special_tokens=False)
            row["response"] = tokenizer.decode(r_ids, skip_special_tokens=False)
        if scores is not None:
            row["reward"] = float((scores[i].double() * rmask[i].double()).sum())
        if adv is not None and L:
            row["logged_advantage"] = float(adv[i][rmask[i]][0])
        for name, t in (("old_logprobs", old), ("ref_logprobs", ref)):
            if t is not None:
                row[name] = [float(x) for x in t[i][rmask[i]].double().tolist()]
        rows.append(row)
    return rows


def write_verl_batch(data: Any, out_dir: str | Path, step: int, tokenizer: Any = None, rank: int = 0) -> Path:
    """Write :func:`verl_rows` of one batch to ``out_dir/rollouts_rank{rank}_{step:05d}.jsonl``.

    Call it in ``RayPPOTrainer.fit`` right after ``compute_advantage`` (the driver holds the whole
    batch, so ``rank`` stays 0)::

        batch = compute_advantage(batch, ...)
        from gmts_analysis.integrations.rollout_log import write_verl_batch
        write_verl_batch(batch, "run/rollouts", self.global_steps, self.tokenizer)
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_rows(out / f"rollouts_rank{rank}_{int(step):05d}.jsonl", verl_rows(data, step, tokenizer))
