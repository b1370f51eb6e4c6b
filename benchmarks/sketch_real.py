"""The sketch on a real model's own answers: Spearman with exact, interval coverage, CPU-time ratio.

    OMP_NUM_THREADS=1 python benchmarks/sketch_real.py data/smollm2_study/run --answers 8 --min-len 200 \
        --max-len 256 --probes 16,32

Takes a run probed with exact norms (its model and --temperature from the manifest), finished or still
running (then the answers its chunk records hold: ``--from-chunks``, with the run's rollouts.jsonl given by
``--rollouts``), picks the first ``--answers`` answers whose response has ``--min-len`` to ``--max-len``
tokens, and for each runs the sketch at every K (CPU time; its norms and 95% intervals) against the run's
exact norms, and the exact engine again on the first ``--time-exact`` of them (default all: CPU time, and a
check that it reproduces the run's norms); the CPU-time ratio is taken over the answers timed both ways. Prints, per K: the within-answer Spearman with exact (median and
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
    ap.add_argument("--skip", type=int, default=0, help="leave out the first N eligible answers (to split the work)")
    ap.add_argument("--min-len", type=int, default=200)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--probes", default="16,32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--from-chunks", action="store_true", help="a run still probing: its chunk records")
    ap.add_argument("--rollouts", help="with --from-chunks: the run's rollouts.jsonl")
    ap.add_argument("--time-exact", type=int, default=None, help="time exact on the first N answers (default all)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from gmts_analysis.engine import grad_norms
    from gmts_analysis.readers.models import load_model

    answers, tokens, cfg = _answers_and_norms(a)
    tau = float(cfg.get("temperature", 1.0))
    model, _ = load_model(cfg.get("model") or cfg["model_path"], "cpu", cfg.get("dtype", "float32"))
    ans = answers[(answers["length"] >= a.min_len) & (answers["length"] <= a.max_len)].iloc[a.skip:a.skip + a.answers]
    ks = [int(k) for k in a.probes.split(",")]
    rows = []
    for j, (_, r) in enumerate(ans.iterrows()):
        P = len(r["prompt_ids"])
        ids = torch.tensor(list(r["prompt_ids"]) + list(r["response_ids"]))
        e = tokens[tokens["answer_id"] == r["answer_id"]].sort_values("position")["grad_norm_logp"].to_numpy(float)
        row = {"answer_id": r["answer_id"], "tokens": int(r["length"]), "prompt": P}
        if a.time_exact is None or j < a.time_exact:
            t0 = time.process_time()
            ex = grad_norms(model, ids, P, temperature=tau, method="exact")
            row["exact_cpu_s"] = time.process_time() - t0
            row["exact_vs_run_max_rel"] = float(np.max(np.abs(ex.norms.double().numpy() / e - 1)))
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
                      "cpu_ratio_exact_over_sketch": _ratio(rows, k),
                      "answers_timed_exact": sum("exact_cpu_s" in r for r in rows)}
        print(f"K={k}: {json.dumps(summary[k])}")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"sketch-real-{time.strftime('%Y%m%d')}{f'-skip{a.skip}' if a.skip else ''}.json").write_text(
        json.dumps({"run": a.run, "from_chunks": a.from_chunks, "temperature": tau, "threads": a.threads, "summary": summary, "answers": rows}) + "\n")


def _answers_and_norms(a: argparse.Namespace):
    """The answers (prompt_ids, response_ids, length), the exact tokens (answer_id, position,
    grad_norm_logp) and the probe's config (model, temperature, dtype) of a finished or running run."""
    import pandas as pd

    if not a.from_chunks:
        from gmts_analysis.analysis.runs import read_run

        run = read_run(a.run, compute_missing_stats=False)
        return run.answers, run.tokens, {**run.manifest.get("config", {}), "model_path": run.manifest["model_path"]}
    from gmts_analysis.readers.rollouts import read_rollouts

    cfg = json.loads((Path(a.run) / "run.json").read_text())
    tokens = pd.concat([pd.read_parquet(p) for p in sorted((Path(a.run) / "chunks").glob("*.tokens.parquet"))])
    done = set(tokens["answer_id"])
    recs = [r for r in read_rollouts(a.rollouts) if r.answer_id in done]
    answers = pd.DataFrame({"answer_id": [r.answer_id for r in recs], "prompt_ids": [r.prompt_ids for r in recs],
                            "response_ids": [r.response_ids for r in recs],
                            "length": [len(r.response_ids) for r in recs]})
    return answers, tokens, cfg.get("config", cfg)


def _ratio(rows: list, k: int) -> float:
    timed = [r for r in rows if "exact_cpu_s" in r]
    return float(sum(r["exact_cpu_s"] for r in timed) / sum(r[f"k{k}"]["cpu_s"] for r in timed)) if timed else float("nan")


if __name__ == "__main__":
    main()
