"""Per-token gradient norms on the SmolLM2-135M shape on CPU: exact engine, sketch (K=16, 32)
and the naive per-token loop, with the exact engine's FLOP-count limit (issue 19, item 6).

The model is built from SmolLM2-135M's config (30 layers, hidden 576, 9 heads / 3 key-value
heads, MLP 1536, vocabulary 49,152 tied, rope_theta 1e5) with random weights: no download, and
the speed does not depend on the weight values (same shapes, same kernels). One answer per T of
``--P`` prompt tokens and T random response tokens. Every method runs in this one process with
``torch.set_num_threads(--threads)``; the table reports wall time and process CPU time (on a
shared machine CPU time is what the work costs; ratios are taken from CPU time). Peak memory:
the RSS high-water above the resident set before the call (:class:`gmts_analysis.run.bench.PeakMemory`).

The naive loop (a forward and a backward of the whole answer per token) costs the same for
every token of an answer, so it is timed on ``--naive-tokens`` evenly spaced tokens of each
answer and its per-token cost reported ("extrapolated from k tokens").

FLOP-count limit: the exact engine's arithmetic at this shape (:func:`engine_flops`: per token
an activation backward over its prefix, the ghost norms and the attention backward, plus one
forward per block of tokens and the head's closed form), against the FLOP/s of a plain float32
matmul of this model's shapes measured in the same run; ``limit tokens/s`` = matmul FLOP/s /
(engine FLOPs per token). Also the FLOPs of a forward+backward per token over its prefix
(``6 N L``), the textbook cost of one gradient.

    python benchmarks/smollm2_bench.py --threads 1 --out benchmarks/results/smollm2-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rms_norm_eps=1e-5,
               rope_theta=100000.0, max_position_embeddings=2048)


def build(seed: int = 0) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2)).eval()


def linears(cfg: dict) -> list[tuple[int, int]]:
    """(din, dout) of one layer's linear maps."""
    d, f = cfg["hidden_size"], cfg["intermediate_size"]
    kv = d // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    return [(d, d), (d, kv), (d, kv), (d, d), (d, f), (d, f), (f, d)]


def engine_flops(cfg: dict, P: int, T: int, block: int = 64) -> dict:
    """Multiply-add FLOPs (2 per multiply-add) of the exact engine for T tokens after P, and of
    a forward+backward per token over its prefix. ``L_t = P + t`` (causal truncation: token t's
    prefix; the batched backward of a block runs over the block's full prefix, counted here)."""
    n_layers, d, V = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]
    lin = linears(cfg)
    n_body = n_layers * sum(a * b for a, b in lin)
    total = 0.0
    fwd_bwd = 0.0
    for s in range(0, T, block):
        e = min(T, s + block)
        L = P + e - 1  # the block's prefix
        total += 2 * n_body * L + n_layers * 4 * L * L * d + 2 * (e - s) * V * d  # forward, attention, logits
        total += n_layers * sum(2 * L * L * a for a, _ in lin)  # the Gram matrices x x^T of the ghost norms
        for t in range(s, e):
            total += 2 * n_body * L  # activation VJP through every linear
            total += n_layers * 8 * L * L * d  # attention VJP (scores and values)
            total += n_layers * sum(min(2 * L * L * b, 2 * L * a * b) for a, b in lin)  # ghost norms
            total += 2 * V * d + 4 * V  # c_t W (the cotangent of h) and c_t itself
            fwd_bwd += 6 * n_body * (P + t) + 6 * V * d  # the body over the prefix, the head at one position
    return {"engine_flops": total, "engine_flops_per_token": total / T, "fwd_bwd_flops_per_token": fwd_bwd / T,
            "n_body": n_body}


def matmul_flops_per_s(d: int, f: int, L: int, reps: int = 20) -> float:
    """FLOP/s of a float32 (L, d) @ (d, f) matmul (this model's MLP shape) in this process."""
    a, b = torch.randn(L, d), torch.randn(d, f)
    for _ in range(3):
        a @ b
    t0 = time.process_time()
    for _ in range(reps):
        a @ b
    return 2 * L * d * f * reps / (time.process_time() - t0)


def timed(fn, mem):
    def call():
        w0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        return out, time.perf_counter() - w0, time.process_time() - c0

    (out, wall, cpu), peak = mem.run(call)
    return out, wall, cpu, peak


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--P", type=int, default=64)
    ap.add_argument("--lengths", default="64,128,256")
    ap.add_argument("--probes", default="16,32")
    ap.add_argument("--naive-tokens", type=int, default=8)
    ap.add_argument("--methods", default="exact,sketch,naive", help="which of exact, sketch, naive, in this order")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from gmts_analysis.engine import grad_norms
    from gmts_analysis.engine.reference import naive_grad_norms
    from gmts_analysis.run.bench import PeakMemory, machine_info

    mem = PeakMemory(torch.device("cpu"))
    model = build()
    n_params = sum(p.numel() for p in model.parameters())
    res = {"shape": "SmolLM2-135M (random weights from the config)", "config": SMOLLM2, "n_params": n_params,
           "P": a.P, "threads": torch.get_num_threads(), "memory_method": mem.method,
           "machine": machine_info(torch.device("cpu")), "rows": []}

    def save():
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(res, f, indent=1)
        os.replace(tmp, a.out)

    res["matmul_flops_per_s"] = matmul_flops_per_s(SMOLLM2["hidden_size"], SMOLLM2["intermediate_size"], 256)
    g = torch.Generator().manual_seed(0)
    for T in [int(x) for x in a.lengths.split(",")]:
        ids = torch.randint(3, SMOLLM2["vocab_size"], (a.P + T,), generator=g)
        fl = engine_flops(SMOLLM2, a.P, T)
        cases = []
        for m in a.methods.split(","):
            if m == "exact":
                cases.append(("exact", {"method": "exact"}))
            elif m == "sketch":
                cases += [(f"sketch K={k}", {"method": "sketch", "probes": int(k)}) for k in a.probes.split(",")]
            elif m == "naive":
                cases.append(("naive loop", None))
        exact_norms = None
        for name, kw in cases:
            print(f"smollm2_bench: T={T} {name} ...", file=sys.stderr, flush=True)
            if kw is None:
                k = min(a.naive_tokens, T)
                toks = [round(i * (T - 1) / max(k - 1, 1)) for i in range(k)]
                out, wall, cpu, peak = timed(lambda ids=ids, toks=toks: naive_grad_norms(model, ids, a.P, tokens=toks), mem)
                row = {"method": name, "T": T, "timed_tokens": k, "scope": f"extrapolated from {k} tokens",
                       "tokens_per_s": k / wall, "cpu_tokens_per_s": k / cpu}
                if exact_norms is not None:
                    row["max_rel_err_exact_vs_naive"] = float(((exact_norms[toks] - out).abs() / out).max())
            else:
                out, wall, cpu, peak = timed(lambda ids=ids, kw=kw: grad_norms(model, ids, a.P, **kw), mem)
                row = {"method": name, "T": T, "scope": "full answer", "tokens_per_s": T / wall,
                       "cpu_tokens_per_s": T / cpu}
                if name == "exact":
                    exact_norms = out.norms
                    row.update(fl)
                    row["limit_tokens_per_s"] = res["matmul_flops_per_s"] / fl["engine_flops_per_token"]
                    row["fraction_of_limit"] = row["cpu_tokens_per_s"] / row["limit_tokens_per_s"]
                    row["achieved_flops_per_s"] = fl["engine_flops"] / cpu
                elif exact_norms is not None:
                    from scipy.stats import spearmanr

                    row["spearman_vs_exact"] = float(spearmanr(out.norms, exact_norms).statistic)
                    row["coverage_95"] = float(((out.lo <= exact_norms) & (exact_norms <= out.hi)).double().mean())
            row.update(wall_s=wall, cpu_s=cpu, peak_mib=peak / 2**20)
            res["rows"].append(row)
            print(f"smollm2_bench: {json.dumps(row)}", file=sys.stderr, flush=True)
            save()
        base = [r for r in res["rows"] if r["method"] == "naive loop" and r["T"] == T]
        for r in (r for r in res["rows"] if r["T"] == T):
            if base:
                r["x_naive_cpu"] = r["cpu_tokens_per_s"] / base[0]["cpu_tokens_per_s"]
                r["x_naive_wall"] = r["tokens_per_s"] / base[0]["tokens_per_s"]
        save()
    res["load_average_end"] = os.getloadavg()
    save()
    return 0


def table(paths: list[str]) -> str:
    """Markdown table of the rows of result files (``python benchmarks/smollm2_bench.py --table A.json ...``)."""
    rows = []
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        rows += [dict(r, file=os.path.basename(p), flops=res["matmul_flops_per_s"]) for r in res["rows"]]
    naive = {r["T"]: r["cpu_tokens_per_s"] for r in rows if r["method"] == "naive loop"}
    order = {"exact": 0, "sketch K=16": 1, "sketch K=32": 2, "naive loop": 3}
    rows.sort(key=lambda r: (r["T"], order.get(r["method"], 9)))
    out = ["| T | method | CPU tokens/s | x naive (CPU) | wall tokens/s | peak MB | notes |",
           "|---:|---|---:|---:|---:|---:|---|"]
    for r in rows:
        x = f"{r['cpu_tokens_per_s'] / naive[r['T']]:.2f}" if r["T"] in naive else "-"
        notes = []
        if r["method"] == "exact":
            notes.append(f"FLOP limit {r['limit_tokens_per_s']:.2f} tok/s ({r['fraction_of_limit']:.0%} of it; "
                         f"{r['achieved_flops_per_s'] / 1e9:.0f} of {r['flops'] / 1e9:.0f} GFLOP/s)")
        if "spearman_vs_exact" in r:
            notes.append(f"Spearman vs exact {r['spearman_vs_exact']:.2f}, 95% coverage {r['coverage_95']:.0%}")
        if r["method"] == "naive loop":
            notes.append(r["scope"])
            if "max_rel_err_exact_vs_naive" in r:
                notes.append(f"exact vs naive max rel. error {r['max_rel_err_exact_vs_naive']:.1e}")
        out.append(f"| {r['T']} | {r['method']} | {r['cpu_tokens_per_s']:.3f} | {x} | {r['tokens_per_s']:.3f} | "
                   f"{r['peak_mib']:.0f} | {'; '.join(notes)} ({r['file']}) |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--table":
        print(table(sys.argv[2:]))
        raise SystemExit(0)
    raise SystemExit(main())
