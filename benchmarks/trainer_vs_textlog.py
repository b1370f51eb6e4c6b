"""Rollouts written at the source (SelectiveGRPOConfig.rollouts_dir) vs the same rollouts read
back from TRL's own text log (GRPOConfig.log_completions=True), both through ``gmts probe``.

Two TRL 1.16 runs on CPU, 2 optimizer steps each, ``log_completions=True`` and ``rollouts_dir``:

- ``text``: the shipped ``tiny`` policy on toy arithmetic prompts (text prompts, no template);
- ``chat``: a tiny random qwen2 with a ChatML tokenizer (``<|im_start|>``/``<|im_end|>`` special
  tokens) on conversational prompts (lists of messages).

Reward functions: ``parity`` (character-code parity), ``sometimes`` (None for every third row:
TRL's skipped reward, NaN in the log) and a ``log_extra`` column ``n_chars``. Each pair of
directories is probed (``--grad-norm exact``, ``--advantage logged``) and compared answer by
answer: prompt ids, response ids (how many tokens differ, and why), rewards, advantages, and
token statistics and stats.json where the ids agree.

    OMP_NUM_THREADS=1 python benchmarks/trainer_vs_textlog.py [--out DIR] [--text-max-len 48] [--chat-max-len 12]

Writes DIR/summary.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def parity(prompts, completions, **kw):
    out = []
    for c in completions:
        text = c[0]["content"] if isinstance(c, list) else c
        out.append(float(sum(map(ord, text)) % 2))
    return out


def sometimes(prompts, completions, log_extra=None, **kw):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    if log_extra is not None:
        log_extra("n_chars", [len(t) for t in texts])
    return [None if i % 3 == 2 else 0.5 * (len(t) % 2) for i, t in enumerate(texts)]


def _dataset(kind: str, n: int):
    from datasets import Dataset

    from gmts_analysis.toy.domains import generate_problems

    probs = [p.prompt for p in generate_problems("arithmetic", n, seed=0, split="train")]
    if kind == "chat":
        return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in probs]})
    return Dataset.from_dict({"prompt": probs})


def _model(kind: str, tmp: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if kind == "text":
        from gmts_analysis.util.resources import data_dir

        path = data_dir() / "policies" / "tiny"
        return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), path
    from _trainer_logs import save_chat_model

    path = save_chat_model(tmp / "chat_model")
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok, path


def train(kind: str, out: Path, max_len: int, G: int):
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer

    model, tok, path = _model(kind, out)
    args = SelectiveGRPOConfig(
        output_dir=str(out / "trl"), per_device_train_batch_size=8, num_generations=G,
        max_completion_length=max_len, max_steps=2, learning_rate=1e-2, logging_steps=1, report_to="none",
        use_cpu=True, seed=0, save_strategy="no", dataloader_num_workers=0, bf16=False, temperature=1.0,
        log_completions=True, rollouts_dir=str(out / "rollouts"),
    )
    tr = SelectiveGRPOTrainer(model=model, reward_funcs=[parity, sometimes], args=args,
                              train_dataset=_dataset(kind, 16), processing_class=tok)
    tr.train()
    return path, tok


def probe(model: Path, rollouts: Path, out: Path, extra: list[str]) -> tuple[int, str]:
    import contextlib
    import io

    from gmts_analysis.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(["probe", "--model", str(model), "--rollouts", str(rollouts), "--out", str(out), "--device", "cpu",
                   "--no-figures", "--fidelity", "off", "--grad-norm", "exact", "--advantage", "logged",
                   "--overwrite", *extra])
    return rc, err.getvalue()


def _why(tok, exact: list[int], text: list[int], max_len: int) -> str:
    if exact == text:
        return "same"
    specials = set(tok.all_special_ids)
    eos = tok.eos_token_id
    if text == exact + [eos]:
        return "eos_added_to_cut_answer"
    if exact == text + [eos]:
        return "eos_not_restored"
    plain_e = [t for t in exact if t not in specials]
    plain_t = [t for t in text if t not in specials]
    if plain_e == plain_t:
        if exact[-1] != eos and text[-1] == eos and len(exact) == max_len:
            # skip_special_tokens dropped special tokens the policy emitted inside a cut answer: the
            # re-tokenized text is shorter than the limit, so it looked finished and got EOS
            return "special_tokens_dropped_then_eos_added_to_cut_answer"
        return "special_tokens_dropped"
    return "retokenization"


def _edit(a: list[int], b: list[int]) -> int:
    """Levenshtein distance in tokens."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def compare(kind: str, exact_dir: Path, text_dir: Path, tok, max_len: int) -> dict:
    ea = pd.read_parquet(exact_dir / "answers.parquet")
    ta = pd.read_parquet(text_dir / "answers.parquet")
    # the exact files are named by the step at generation, TRL's log by the step at logging (+1)
    ea = ea.sort_values(["step", "answer_id"], key=lambda s: s if s.name == "step" else
                        s.map(lambda v: int(str(v).split("-")[1]))).reset_index(drop=True)
    ta = ta.sort_values(["step"], kind="stable").reset_index(drop=True)
    assert len(ea) == len(ta), (len(ea), len(ta))
    assert list(ea.step + 1) == list(ta.step)
    why: dict[str, int] = {}
    prompt_diff = resp_diff = tok_edit = 0
    tokens_exact = int(sum(len(x) for x in ea.response_ids))
    tokens_text = int(sum(len(x) for x in ta.response_ids))
    same_rows = []
    for i in range(len(ea)):
        pe, pt = list(ea.prompt_ids[i]), list(ta.prompt_ids[i])
        re_, rt = list(ea.response_ids[i]), list(ta.response_ids[i])
        prompt_diff += pe != pt
        w = _why(tok, re_, rt, max_len)
        why[w] = why.get(w, 0) + 1
        if re_ != rt:
            resp_diff += 1
            tok_edit += _edit(re_, rt)
        if pe == pt and re_ == rt:
            same_rows.append(i)
    rew = np.abs(ea.reward.to_numpy() - ta.reward.to_numpy())
    adv = np.abs(ea.advantage.to_numpy() - ta.advantage.to_numpy())
    et = pd.read_parquet(exact_dir / "tokens.parquet")
    tt = pd.read_parquet(text_dir / "tokens.parquet")
    tok_stats = {}
    if same_rows:
        ek = et[et.answer_id.isin(set(ea.answer_id[same_rows]))].sort_values(["answer_id", "position"])
        tk = tt[tt.answer_id.isin(set(ta.answer_id[same_rows]))]
        # answer ids differ between the two readings: align by row order within matching answers
        emap = {a: i for i, a in enumerate(ea.answer_id)}
        tmap = {a: i for i, a in enumerate(ta.answer_id)}
        ek = ek.assign(_row=ek.answer_id.map(emap)).sort_values(["_row", "position"])
        tk = tk.assign(_row=tk.answer_id.map(tmap)).sort_values(["_row", "position"])
        for col in ("logprob", "entropy", "omega", "grad_norm", "gmts"):
            if col in ek and col in tk:
                d = np.abs(ek[col].to_numpy() - tk[col].to_numpy())
                tok_stats[col] = float(d.max()) if len(d) else 0.0
    es = json.loads((exact_dir / "stats.json").read_text())
    ts = json.loads((text_dir / "stats.json").read_text())
    if isinstance(ts.get("by_step"), dict):  # TRL's log names a step one later than the generation
        ts["by_step"] = {str(int(k) - 1): v for k, v in ts["by_step"].items()}
    stat_diff = {}
    for path, v in _flat(es).items():
        w = _flat(ts).get(path)
        if isinstance(v, (int, float)) and isinstance(w, (int, float)) and not isinstance(v, bool):
            if not (math.isfinite(v) and math.isfinite(w)):
                continue
            if v != w:
                stat_diff[path] = (v, w)
    big = sorted(stat_diff.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:8]
    keys = ("cross_answer.gmts.spearman", "cross_answer.entropy.spearman", "within_answer.gmts.median",
            "within_answer.entropy.median", "topk_overlap.batch.gmts.0.2", "topk_overlap.batch.entropy.0.2",
            "zero_advantage.tokens")
    headline = {k: (_flat(es).get(k), _flat(ts).get(k)) for k in keys if k in _flat(es)}
    return {
        "kind": kind, "answers": len(ea), "prompts_differing": int(prompt_diff),
        "responses_differing": int(resp_diff), "response_tokens_exact": tokens_exact,
        "response_tokens_text": tokens_text, "token_edit_distance": int(tok_edit), "why": why,
        "reward_max_abs_diff": float(rew.max()), "advantage_max_abs_diff": float(adv.max()),
        "token_columns_max_abs_diff_on_identical_answers": tok_stats,
        "stats_json_numbers_differing": len(stat_diff),
        "stats_json_largest_differences": {k: v for k, v in big},
        "stats_json_headline_exact_vs_text": headline,
    }


def _flat(d, prefix=""):
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
    elif isinstance(d, list):
        for i, v in enumerate(d):
            out.update(_flat(v, f"{prefix}{i}."))
    else:
        out[prefix[:-1]] = d
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/gmts_trainer_vs_textlog")
    ap.add_argument("--text-max-len", type=int, default=48, help="max_completion_length of the tiny-policy run")
    ap.add_argument("--chat-max-len", type=int, default=12, help="max_completion_length of the random chat model")
    ap.add_argument("--num-generations", type=int, default=4)
    ap.add_argument("--kinds", default="text,chat")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    root = Path(a.out)
    shutil.rmtree(root, ignore_errors=True)
    results = []
    for kind in a.kinds.split(","):
        d = root / kind
        d.mkdir(parents=True)
        max_len = a.text_max_len if kind == "text" else a.chat_max_len
        model_path, tok = train(kind, d, max_len, a.num_generations)
        rc1, err1 = probe(model_path, d / "rollouts", d / "probe_exact", [])
        rc2, err2 = probe(model_path, d / "trl" / "completions", d / "probe_text",
                          ["--reward-columns", "parity,sometimes", "--num-generations", str(a.num_generations),
                           "--max-completion-length", str(max_len)])
        if rc1 or rc2:
            print(err1[-2000:], err2[-2000:], file=sys.stderr)
            return 1
        res = compare(kind, d / "probe_exact", d / "probe_text", tok, max_len)
        res["max_completion_length"] = max_len
        res["text_log_reader_said"] = json.loads((d / "probe_text" / "manifest.json").read_text())[
            "rollouts"]["read"]["restored"]
        results.append(res)
    (root / "summary.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
