"""Sketch accuracy on a trained policy's own answers: Spearman against exact and 95% coverage.

    python benchmarks/sketch_accuracy.py MODEL_DIR [--answers 18] [--probes 16,32,64]

Samples answers to the toy domains' held-out prompts (temperature 1), computes exact norms
and the sketch for each K, and prints pooled Spearman, the median within-answer Spearman
and interval coverage over all response tokens. Writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr

from gmts_analysis.engine import grad_norms
from gmts_analysis.readers.models import load_model
from gmts_analysis.toy.domains import generate_problems


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--answers", type=int, default=18)
    ap.add_argument("--probes", default="16,32,64")
    ap.add_argument("--max-new", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, device="cpu")
    ks = [int(k) for k in args.probes.split(",")]
    per = max(1, args.answers // 3)
    prompts = [p.prompt for d in ("arithmetic", "program", "logic") for p in generate_problems(d, per, seed=5)]
    exact_all, sk_all = [], {k: [] for k in ks}
    lo_all, hi_all = {k: [] for k in ks}, {k: [] for k in ks}
    within = {k: [] for k in ks}
    t_exact = 0.0
    t_sk = {k: 0.0 for k in ks}
    torch.manual_seed(0)
    for i, prompt in enumerate(prompts):
        ids = tok(prompt, return_tensors="pt").input_ids[0]
        P = ids.shape[0]
        with torch.no_grad():
            out = model.generate(
                ids[None],
                attention_mask=torch.ones(1, P, dtype=torch.long),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.max_new,
                pad_token_id=tok.pad_token_id,
            )[0]
        if out.shape[0] - P < 2:
            continue
        t0 = time.perf_counter()
        ex = grad_norms(model, out, P).norms
        t_exact += time.perf_counter() - t0
        exact_all.append(ex)
        for k in ks:
            t0 = time.perf_counter()
            sk = grad_norms(model, out, P, method="sketch", probes=k, seed=1000 * i + k)
            t_sk[k] += time.perf_counter() - t0
            sk_all[k].append(sk.norms)
            lo_all[k].append(sk.lo)
            hi_all[k].append(sk.hi)
            if ex.numel() >= 5:
                within[k].append(spearmanr(sk.norms, ex)[0])
    ex = torch.cat(exact_all)
    res = {"model": args.model, "n_answers": len(exact_all), "n_tokens": int(ex.numel()), "exact_seconds": t_exact}
    for k in ks:
        sk, lo, hi = torch.cat(sk_all[k]), torch.cat(lo_all[k]), torch.cat(hi_all[k])
        res[f"K={k}"] = {
            "spearman_pooled": float(spearmanr(sk, ex)[0]),
            "spearman_within_answer_median": float(np.nanmedian(within[k])),
            "coverage_95": float(((lo <= ex) & (ex <= hi)).double().mean()),
            "seconds": t_sk[k],
        }
    print(json.dumps(res, indent=1))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"sketch-accuracy-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json").write_text(
        json.dumps(res, indent=1)
    )


if __name__ == "__main__":
    main()
