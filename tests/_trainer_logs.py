"""Training logs written the way TRL 1.16 and verl write them, from known token ids.

- TRL (``GRPOTrainer.log``): ``completions/completions_{step:05d}.parquet`` from
  ``pd.DataFrame({"step", "prompt", "completion", **rewards, **extra, "advantage"}).to_parquet``;
  text prompts were tokenized with ``processing_class(text=prompts)`` (special tokens, no
  template), conversational ones with ``apply_chat_template(add_generation_prompt=True)``;
  completions are ``batch_decode(completion_ids, skip_special_tokens=True)`` (wrapped as one
  assistant message for conversational prompts); a reward function's None is NaN.
- verl (``RayPPOTrainer._dump_generations``): ``{step}.jsonl`` of ``json.dumps(entry,
  ensure_ascii=False)`` joined by newlines, with ``input``/``output`` decoded from the padded
  prompt/response ids with ``skip_special_tokens=True``, ``gts``, ``score``, ``step`` and the
  reward_extra_infos.

Each builder returns the exact ids the trainer used, to compare with what the reader restores.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pandas as pd

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")  # ChatML, as Qwen's


# Qwen2.5's shape: a default system message when the conversation has none
QWEN_TEMPLATE = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                 "{% endif %}" + TEMPLATE)


def chat_tokenizer(template: str = TEMPLATE):
    """The character tokenizer with ChatML's markers as special tokens and a ChatML chat template."""
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = template
    return tok


def save_chat_model(path: Path, arch: str = "qwen2") -> Path:
    from gmts_analysis.toy.testing import build_tiny_model

    tok = chat_tokenizer()
    model = build_tiny_model(arch, seed=3, vocab_size=len(tok))
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def template_ids(tok, messages) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return list(ids)


def _completion(tok, rng: random.Random, max_len: int, cut: bool) -> list[int]:
    """Sampled ids: letters then EOS, or ``max_len`` letters with no EOS (cut at the limit)."""
    letters = tok("abcdefghij xyz", add_special_tokens=False)["input_ids"]
    if cut:
        return [rng.choice(letters) for _ in range(max_len)]
    return [rng.choice(letters) for _ in range(rng.randint(1, max_len - 1))] + [tok.eos_token_id]


def write_trl_completions(root: Path, tok, G: int = 2, max_len: int = 6, seed: int = 0) -> dict:
    """Two logging steps: step 10 with text prompts, step 20 conversational. Reward functions
    ``accuracy`` and ``format`` (one NaN), a ``log_extra`` column ``num_steps_extracted``, and
    ``advantage``. Returns ``{(step, row): (prompt_ids, completion_ids, reward, advantage)}``."""
    rng = random.Random(seed)
    (root / "completions").mkdir(parents=True, exist_ok=True)
    truth = {}
    for step, conversational in ((10, False), (20, True)):
        questions = [f"q{step}a: 1+2=", f"q{step}b: 3+4="]
        prompts, completions, acc, fmt, extra, adv = [], [], [], [], [], []
        for qi, q in enumerate(questions):
            p = [{"role": "user", "content": q}] if conversational else q
            pids = template_ids(tok, p) if conversational else list(tok(text=[q])["input_ids"][0])
            for j in range(G):
                cut = (qi, j) == (1, 1)
                cids = _completion(tok, rng, max_len, cut)
                text = tok.batch_decode([cids], skip_special_tokens=True)[0]
                prompts.append(p)
                completions.append([{"role": "assistant", "content": text}] if conversational else text)
                a = float(j == 0)
                f = math.nan if (step, qi, j) == (10, 0, 1) else 1.0  # format reward skipped (None -> NaN)
                acc.append(a)
                fmt.append(f)
                extra.append(3 + j)  # log_extra("num_steps_extracted", ...): an int column, not a reward
                r = a + (0.0 if math.isnan(f) else f)
                adv.append(round(rng.uniform(-1, 1), 3))
                truth[(step, len(prompts) - 1)] = (pids, cids, r, adv[-1])
        table = {"step": [step] * len(prompts), "prompt": prompts, "completion": completions,
                 "accuracy": acc, "format": fmt, "num_steps_extracted": extra, "advantage": adv}
        pd.DataFrame(table).to_parquet(root / "completions" / f"completions_{step:05d}.parquet")
    return truth


def write_verl_dumps(root: Path, tok, G: int = 2, max_len: int = 6, seed: int = 1, pad_to: int = 40,
                     with_uid: bool = True) -> dict:
    """Steps 1 and 2 of verl rollout dumps; prompts are the chat template of one user message
    (one prompt has a system message: its template cannot be restored from the text).
    Returns ``{(step, line): (prompt_ids, response_ids, score, restorable)}``."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    truth = {}
    for step in (1, 2):
        entries = []
        for qi in range(2):
            msgs = [{"role": "user", "content": f"step {step} q{qi}: 2*{qi}="}]
            if step == 2 and qi == 1:
                msgs = [{"role": "system", "content": "be brief"}] + msgs
            pids = template_ids(tok, msgs)
            uid = f"uid-{step}-{qi}"
            for j in range(G):
                cids = _completion(tok, rng, max_len, cut=(step, qi, j) == (1, 1, 0))
                padded_prompt = [tok.pad_token_id] * (pad_to - len(pids)) + pids  # verl left-pads prompts
                padded_resp = cids + [tok.pad_token_id] * (max_len - len(cids))  # and right-pads responses
                score = float(j == 1)
                e = {"input": tok.decode(padded_prompt, skip_special_tokens=True),
                     "output": tok.decode(padded_resp, skip_special_tokens=True),
                     "gts": str(2 * qi), "score": score, "step": step, "acc": bool(j == 1)}
                if with_uid:
                    e["uid"] = uid
                entries.append(e)
                truth[(step, len(entries))] = (pids, cids, score, len(msgs) == 1)
        (root / f"{step}.jsonl").write_text("\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n")
    return truth
