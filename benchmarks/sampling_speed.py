"""Sampling speed: the batched sampler of gmts sample / gmts run against one-at-a-time ``generate``.

    OMP_NUM_THREADS=2 python benchmarks/sampling_speed.py [--model smollm2] [--prompts 4] [--group-size 4]
        [--max-new-tokens 32] [--threads 2]

Both arms sample the same word-problem answers (same per-answer Gumbel seeds, so the same tokens) in
the same process with the same thread count: ``batched`` is
:func:`gmts_analysis.sampling.generate.generate_from_ids` with every answer of every prompt in one left-padded
batch (one ``generate`` call, the KV cache of each row); ``one_at_a_time`` calls it once per answer
(batch size 1, still with the KV cache, as a plain ``model.generate`` loop would). Prints generated
tokens/s of each and the ratio; writes JSON to benchmarks/results/sampling_speed.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from gmts_analysis.readers.models import load_model
from gmts_analysis.sampling.generate import generate_from_ids, prompt_ids, row_seed, stop_ids
from gmts_analysis.sampling.wordproblems import word_problems


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model, tok = load_model(a.model, "cpu")
    stops = stop_ids(model, tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stops[0]
    rows = word_problems(a.prompts, 0)
    ids, seeds = [], []
    for i, r in enumerate(rows):
        p = prompt_ids(tok, r["prompt"])
        for j in range(a.group_size):
            ids.append(p)
            seeds.append(row_seed(0, i, j))
    res = {}
    with torch.inference_mode():
        t = time.perf_counter()
        batched = generate_from_ids(model, ids, seeds, stops, pad, a.temperature, a.max_new_tokens,
                                    batch_size=len(ids))
        res["batched_s"] = time.perf_counter() - t
        t = time.perf_counter()
        single = [generate_from_ids(model, [p], [s], stops, pad, a.temperature, a.max_new_tokens, batch_size=1)[0]
                  for p, s in zip(ids, seeds)]
        res["one_at_a_time_s"] = time.perf_counter() - t
    n = sum(len(x) for x in batched)
    res.update(model=a.model, threads=a.threads, answers=len(ids), prompt_tokens=len(ids[0]),
               generated_tokens=n, generated_tokens_single=sum(len(x) for x in single),
               same_tokens=sum(x == y for x, y in zip(batched, single)),
               batched_tok_s=n / res["batched_s"],
               one_at_a_time_tok_s=sum(len(x) for x in single) / res["one_at_a_time_s"])
    res["ratio"] = res["batched_tok_s"] / res["one_at_a_time_tok_s"]
    print(json.dumps(res, indent=1))
    out = Path(__file__).parent / "results" / "sampling_speed.json"
    out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
