"""Evaluate a policy's pass@1 per domain on held-out prompts and write its model card.

pass@1 at temperature ``tau`` is estimated as the mean verifier reward over
``samples`` independent answers to each of ``n_prompts`` held-out prompts (the
unbiased pass@1 estimator with ``k = 1``). Also reported per domain: the share of
prompt groups with mixed rewards (neither all right nor all wrong), the share of
answers cut at ``max_new_tokens`` and the mean response length in tokens.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

from gmts_analysis.toy.domains import DOMAINS
from gmts_analysis.toy.sample import sample_rollouts
from gmts_analysis.util.io import atomic_write_json, atomic_write_text

CARD_PROMPTS = 200
CARD_SAMPLES = 4
CARD_SEED = 1_000_003  # prompt and sampling seed of the card's evaluation
CARD_TEMPERATURE = 1.0
CARD_MAX_NEW_TOKENS = 96


def summarize(rows: list[dict]) -> dict:
    """pass@1 and group statistics of rollout rows of one domain."""
    from collections import defaultdict

    groups: dict[str, list[float]] = defaultdict(list)
    by_level: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        groups[r["group_id"]].append(r["reward"])
        by_level[int(r["difficulty"])].append(r["reward"])
    rewards = [r["reward"] for r in rows]
    means = [sum(v) / len(v) for v in groups.values()]
    return {
        "pass_at_1": sum(rewards) / len(rewards),
        "n_prompts": len(groups),
        "samples_per_prompt": len(rows) // max(1, len(groups)),
        "pass_at_1_by_difficulty": {str(k): sum(v) / len(v) for k, v in sorted(by_level.items())},
        "mixed_group_share": sum(0 < m < 1 for m in means) / len(means),
        "truncated_share": sum(bool(r["truncated"]) for r in rows) / len(rows),
        "mean_response_tokens": sum(len(r["response_ids"]) for r in rows) / len(rows),
    }


def evaluate_pass_at_1(
    model: torch.nn.Module,
    tokenizer: Any,
    n_prompts: int = CARD_PROMPTS,
    samples: int = CARD_SAMPLES,
    seed: int = CARD_SEED,
    temperature: float = CARD_TEMPERATURE,
    max_new_tokens: int = CARD_MAX_NEW_TOKENS,
    domains: list[str] | None = None,
    batch_size: int = 128,
    progress: bool = False,
) -> dict:
    """Per-domain :func:`summarize` of ``samples`` answers to ``n_prompts`` held-out prompts each."""
    out: dict[str, Any] = {
        "settings": {"n_prompts": n_prompts, "samples_per_prompt": samples, "seed": seed,
                     "temperature": temperature, "max_new_tokens": max_new_tokens, "split": "heldout"},
        "domains": {},
    }
    for name in domains or list(DOMAINS):
        rows = sample_rollouts(model, tokenizer, name, n_prompts, samples, temperature, max_new_tokens,
                               seed, split="heldout", batch_size=batch_size, progress=progress)
        out["domains"][name] = summarize(rows)
    return out


def write_card(out_dir: str | Path, train_info: dict, evaluation: dict) -> dict:
    """Write ``card.json`` and ``README.md`` into ``out_dir``; returns the card dict."""
    out_dir = Path(out_dir)
    card = _card(train_info, evaluation)
    atomic_write_json(out_dir / "card.json", card)
    atomic_write_text(out_dir / "README.md", "\n".join(_readme_lines(card, train_info, evaluation)))
    return card


def _card(train_info: dict, evaluation: dict) -> dict:
    """The ``card.json`` dict: name, parameters, pass@1 per domain, evaluation, training, versions, reproduce."""
    import transformers

    spec = train_info["spec"]
    return {
        "name": spec["name"],
        "architecture": "Qwen2ForCausalLM (tied embeddings)",
        "parameters": train_info["parameters"],
        "pass_at_1": {d: v["pass_at_1"] for d, v in evaluation["domains"].items()},
        # the generation budget and temperature the card's numbers were measured with
        "max_new_tokens": evaluation["settings"]["max_new_tokens"],
        "temperature": evaluation["settings"]["temperature"],
        "evaluation": evaluation,
        "training": {k: v for k, v in train_info.items() if k != "loss_curve"},
        "loss_curve": train_info.get("loss_curve", []),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
        "reproduce": f"gmts toy-train --size {spec['name']} --seed {train_info['seed']} "
                     f"--max-steps {train_info['steps']}",
    }


def _readme_lines(card: dict, train_info: dict, evaluation: dict) -> list[str]:
    """The model card ``README.md``, one line per element (architecture, training, evaluation table)."""
    spec = train_info["spec"]
    s = evaluation["settings"]
    lines = [
        f"# Toy policy `{spec['name']}`",
        "",
        f"A {card['parameters']:,}-parameter Qwen2-architecture causal LM with tied embeddings over a",
        "100-token character vocabulary, trained from scratch by supervised learning on reference",
        "traces of three verifiable domains (arithmetic, program tracing, boolean logic).",
        "Shipped with gmts_analysis as a model whose sampled groups have mixed rewards.",
        "",
        "## Architecture",
        "",
        (f"hidden {spec['hidden_size']}, {spec['num_layers']} layers, {spec['num_heads']} heads "
         f"({spec['num_kv_heads']} key/value heads), MLP {spec['intermediate_size']}, context "
         f"{spec['max_position_embeddings']} tokens, float32."),
        "",
        "## Training",
        "",
        (f"{train_info['steps']} AdamW steps of {spec['batch_size']} examples (lr {spec['lr']}, "
         f"{spec['warmup_steps']} warm-up steps, then constant), seed {train_info['seed']}, "
         f"{train_info['threads']} CPU threads, {train_info['train_seconds']:.0f} s."),
        *_restart_lines(spec, train_info["steps"]),
        "A share of the training traces (" + ", ".join(f"{d} {r}" for d, r in spec["slip_rate"].items())
        + ") has one slipped step",
        "(off by one, or a flipped truth value, propagated to the final answer), so the policy makes such",
        "slips at temperature 1.0 and rewards are mixed.",
        "Training prompts come from the `train` split only (a fixed hash split of each domain's prompts).",
        "",
        f"Reproduce: `{card['reproduce']}`",
        "",
        "## Evaluation",
        "",
        f"pass@1 at temperature {s['temperature']}: mean reward of {s['samples_per_prompt']} samples on each",
        f"of {s['n_prompts']} held-out prompts per domain (difficulty levels uniform), at most",
        f"{s['max_new_tokens']} new tokens, seed {s['seed']}.",
        "",
        "| domain | pass@1 | by difficulty 1 / 2 / 3 | mixed groups | truncated | mean length |",
        "|---|---|---|---|---|---|",
    ]
    for d, v in evaluation["domains"].items():
        lv = " / ".join(f"{x:.2f}" for x in v["pass_at_1_by_difficulty"].values())
        lines.append(f"| {d} | {v['pass_at_1']:.3f} | {lv} | {v['mixed_group_share']:.2f} | "
                     f"{v['truncated_share']:.3f} | {v['mean_response_tokens']:.1f} |")
    lines += ["", f"Versions: torch {card['versions']['torch']}, transformers {card['versions']['transformers']}.", ""]
    return lines


def _restart_lines(spec: dict, steps: int) -> list[str]:
    """One line per warm restart that the run reached (fresh AdamW, new peak lr, new mixture)."""
    lines = []
    lrs, ws = spec.get("restart_lrs", ()), spec.get("restart_weights", ())
    for i, r in enumerate(spec.get("restart_steps", ())):
        if r >= steps:
            continue
        lr = lrs[i] if i < len(lrs) else spec["lr"]
        w = ws[i] if i < len(ws) and ws[i] else None
        mix = f", domain mixture {', '.join(f'{d} {x}' for d, x in w.items())}" if w else ""
        lines.append(f"Warm restart at step {r}: fresh AdamW moments, warm-up to lr {lr}{mix}.")
    return lines


def save_policy(out_dir: str | Path, model: torch.nn.Module, tokenizer: Any, train_info: dict,
                evaluation: dict) -> dict:
    """Save weights (safetensors), config, tokenizer and card into ``out_dir`` (which must exist)."""
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    card = write_card(out_dir, train_info, evaluation)
    for f in Path(out_dir).iterdir():  # temp-file writes are private (0600); shipped files are not
        if f.is_file():
            f.chmod(0o644)
    return card
