"""Measure SmolLM2 on the word problems before choosing the study's prompt and budget (issue #28).

For each prompt format (worked examples or none), samples ``--problems`` x ``--group`` answers with a
generous budget and prints: prompt length in tokens, the share of answers that end with an end token,
the response-length quantiles of finished answers, the share with a ``\\boxed{}``, and pass@1 scored
boxed-only. One thread; the model is loaded once. Usage::

    OMP_NUM_THREADS=1 python benchmarks/word_design.py --problems 24 --group 4 --budget 512 --examples 0 2
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problems", type=int, default=24)
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--budget", type=int, default=512)
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--examples", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--difficulty", type=int, default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from gmts_analysis.readers.models import load_model
    from gmts_analysis.sampling import wordproblems as wp
    from gmts_analysis.sampling.generate import prompt_ids, sample_prompts

    model, tok = load_model("smollm2", "cpu", "float32", offline=True)
    problems = wp.generate(a.problems, a.seed, a.difficulty)
    results = {}
    for k in a.examples:
        rows = []
        for p in problems:
            msgs = wp.prompt_messages(p, n_examples=k)
            rows.append({"prompt": msgs, "solution": str(p.answer)})
        t0 = time.perf_counter()
        out = sample_prompts(model, tok, rows, a.group, temperature=a.temperature, max_new_tokens=a.budget,
                             seed=a.seed, chat_template="auto")
        dt = time.perf_counter() - t0
        plen = [len(prompt_ids(tok, r["prompt"])) for r in rows]
        lens = sorted(len(r["response_ids"]) for r in out if not r["truncated"])
        texts = [r["response"][0]["content"] for r in out]
        boxed = [re.findall(r"\\boxed\{([^{}]*)\}", t) for t in texts]
        right = [bool(b) and b[-1].strip() == r["solution"] for b, r in zip(boxed, out)]
        fin = sum(not r["truncated"] for r in out) / len(out)
        q = statistics.quantiles(lens, n=20) if len(lens) > 2 else []
        res = {
            "examples": k, "prompt_tokens_median": statistics.median(plen), "answers": len(out),
            "finished": fin, "boxed": sum(bool(b) for b in boxed) / len(out), "pass1_boxed": sum(right) / len(out),
            "len_median": statistics.median(lens) if lens else None,
            "len_p90": q[17] if q else None, "len_p95": q[18] if q else None, "len_max": max(lens) if lens else None,
            "all_lens": [len(r["response_ids"]) for r in out], "sample_s": round(dt, 1),
            "mixed_groups": sum(0 < sum(right[i:i + a.group]) < a.group for i in range(0, len(out), a.group)),
            "texts": texts[:8],
        }
        results[k] = res
        print(json.dumps({k2: v for k2, v in res.items() if k2 not in ("all_lens", "texts")}), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
