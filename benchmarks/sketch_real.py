"""The sketch on a real model's own answers: Spearman with exact, interval coverage, CPU-time ratio.

    OMP_NUM_THREADS=1 python benchmarks/sketch_real.py data/smollm2_study/run --answers 8 --min-len 200 \
        --max-len 256 --probes 16,32

Takes a finished run probed with exact norms (its model and --temperature from the manifest), picks the
first ``--answers`` answers whose response has ``--min-len`` to ``--max-len`` tokens, and for each runs the
exact engine again (CPU time, and a check that it reproduces the run's norms) and the sketch at every K
(CPU time; its norms and 95% intervals). Prints, per K: the within-answer Spearman with exact (median and
range over the answers), pooled Spearman, the share of tokens whose interval holds the exact norm, the
median relative error, and the CPU-time ratio exact / sketch; writes JSON to benchmarks/results/.
One thread (``--threads``): CPU times are process times of this process.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import spearmanr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("--answers", type=int, default=8)
    ap.add_argument("--min-len", type=int, default=200)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--probes", default="16,32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from gmts_analysis.analysis.runs import read_run
    from gmts_analysis.engine import grad_norms
    from gmts_analysis.readers.models import load_model

    run = read_run(a.run, compute_missing_stats=False)
    cfg = run.manifest.get("config", {})
    tau = float(cfg.get("temperature", 1.0))
    model, _ = load_model(cfg.get("model") or run.manifest["model_path"], "cpu", cfg.get("dtype", "float32"))
    ans = run.answers[(run.answers["length"] >= a.min_len) & (run.answers["length"] <= a.max_len)].head(a.answers)
    ks = [int(k) for k in a.probes.split(",")]
    rows = []
    for _, r in ans.iterrows():
        P = len(r["prompt_ids"])
        ids = torch.tensor(list(r["prompt_ids"]) + list(r["response_ids"]))
        stored = run.tokens[run.tokens["answer_id"] == r["answer_id"]].sort_values("position")["grad_norm_logp"]
        t0 = time.process_time()
        ex = grad_norms(model, ids, P, temperature=tau, method="exact")
        t_ex = time.process_time() - t0
        e = ex.norms.double().numpy()
        row = {"answer_id": r["answer_id"], "tokens": int(r["length"]), "prompt": P, "exact_cpu_s": t_ex,
               "exact_vs_run_max_rel": float(np.max(np.abs(e / stored.to_numpy() - 1)))}
        for k in ks:
            t0 = time.process_time()
            sk = grad_norms(model, ids, P, temperature=tau, method="sketch", probes=k, seed=0)
            t_sk = time.process_time() - t0
            s, lo, hi = (x.double().numpy() for x in (sk.norms, sk.lo, sk.hi))
            row[f"k{k}"] = {"cpu_s": t_sk, "spearman": float(spearmanr(s, e)[0]),
                            "coverage": float(np.mean((lo <= e) & (e <= hi))),
                            "median_rel_err": float(np.median(np.abs(s / e - 1))), "norms": s.tolist(),
                            "exact": e.tolist()}
        rows.append(row)
        print(json.dumps({k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items()
                                                                 if kk not in ("norms", "exact")})
                          for k, v in row.items()}), flush=True)
    summary = {}
    for k in ks:
        sp = [r[f"k{k}"]["spearman"] for r in rows]
        pooled_s = np.concatenate([r[f"k{k}"]["norms"] for r in rows])
        pooled_e = np.concatenate([r[f"k{k}"]["exact"] for r in rows])
        summary[k] = {"answers": len(rows), "tokens": int(sum(r["tokens"] for r in rows)),
                      "spearman_within_median": float(np.median(sp)), "spearman_within_min": float(min(sp)),
                      "spearman_within_max": float(max(sp)), "spearman_pooled": float(spearmanr(pooled_s, pooled_e)[0]),
                      "coverage": float(np.mean([r[f"k{k}"]["coverage"] for r in rows])),
                      "median_rel_err": float(np.median([r[f"k{k}"]["median_rel_err"] for r in rows])),
                      "cpu_ratio_exact_over_sketch": float(sum(r["exact_cpu_s"] for r in rows)
                                                           / sum(r[f"k{k}"]["cpu_s"] for r in rows))}
        print(f"K={k}: {json.dumps(summary[k])}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"sketch-real-{time.strftime('%Y%m%d')}.json").write_text(
        json.dumps({"run": a.run, "temperature": tau, "threads": a.threads, "summary": summary, "answers": rows}) + "\n")


if __name__ == "__main__":
    main()
