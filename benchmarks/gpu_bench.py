"""Exact and sketch gradient norms on a Qwen2.5-1.5B- or SmolLM2-135M-shaped model (what ``benchmarks/gpu.sh`` runs).

For each dtype (bfloat16, float32) and method (exact, sketch): tokens/s and peak memory of
``grad_norms`` on one answer of ``--P`` prompt and ``--T`` response tokens (random ids), on a
random-weight model built from the config (no download). Each case has a time budget: a
calibration on the last ``--calib`` response tokens (the longest prefixes, so the slowest
per token) predicts the full answer's time; if it fits the budget the whole answer is
measured, else the calibration itself is reported (``scope`` says which). The JSON is
rewritten after every case, so a run cut short keeps what it measured.

    python benchmarks/gpu_bench.py --device cuda --out gpu.json           # the real run
    python benchmarks/gpu_bench.py --device cpu --shape tiny --T 48 --out x.json   # dry run
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

import torch

SHAPES = {
    # Qwen2.5-1.5B: 28 layers, hidden 1536, 12 heads / 2 KV heads, vocabulary 151936, tied
    "qwen1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                     num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
                     rope_theta=1000000.0, rms_norm_eps=1e-6),
    # SmolLM2-135M (Llama): 30 layers, hidden 576, 9 heads / 3 KV heads, vocabulary 49152, tied
    "smollm2": dict(arch="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                    num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True, rope_theta=100000.0,
                    rms_norm_eps=1e-5),
    # the same architecture, tiny (CPU dry run of the script)
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True),
}
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def build(shape: str, dtype: torch.dtype, device: torch.device, max_len: int, seed: int = 0) -> torch.nn.Module:
    """Random-weight model of ``shape`` (Qwen2 unless its ``arch`` says llama), created directly
    on ``device`` in ``dtype``."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    kw = dict(SHAPES[shape])
    config_class = LlamaConfig if kw.pop("arch", "qwen2") == "llama" else Qwen2Config
    cfg = config_class(max_position_embeddings=max(max_len, 4096), **kw)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.eval()


def run_case(model, ids: torch.Tensor, P: int, method: str, probes: int, budget_s: float, calib: int,
             device: torch.device) -> dict:
    from gmts_analysis.engine import grad_norms
    from gmts_analysis.run.bench import PeakMemory

    mem = PeakMemory(device)
    S = int(ids.shape[0])
    T = S - P
    kw = {"method": method}
    if method == "sketch":
        kw["probes"] = probes

    def timed(prompt_len):
        def call():
            t0 = time.perf_counter()
            out = grad_norms(model, ids, prompt_len, **kw)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out, time.perf_counter() - t0

        (out, secs), peak = mem.run(call)
        if not bool(torch.isfinite(out.norms).all()):
            raise RuntimeError(f"{method}: non-finite norms")
        return secs, peak

    k = min(calib, T)
    secs_c, peak_c = timed(S - k)  # the last k tokens: the longest prefixes
    per_tok = secs_c / k
    row = {"method": method, "T": T, "P": P, "calib_tokens": k, "calib_s": secs_c,
           "calib_tokens_per_s": k / secs_c, "calib_peak_mib": peak_c / 2**20,
           "memory_method": mem.method}
    if method == "sketch":
        row["probes"] = probes
    # exact: per-token cost grows with the prefix, the calibration is the slowest part;
    # sketch: K forward-mode passes over the whole answer whatever the number of tokens
    predicted = per_tok * T if method == "exact" else secs_c
    if k == T or predicted + secs_c <= budget_s:
        if k == T:
            secs, peak = secs_c, peak_c
        else:
            secs, peak = timed(P)
        row.update(scope="full answer", seconds=secs, tokens_per_s=T / secs, peak_mib=peak / 2**20)
    else:
        row.update(scope=f"last {k} tokens only (full answer predicted {predicted:.0f} s > budget {budget_s:.0f} s)",
                   seconds=secs_c, tokens_per_s=k / secs_c, peak_mib=peak_c / 2**20,
                   predicted_full_s=predicted)
    return row


def warm_up(model, ids: torch.Tensor, P: int, methods: list[str], device: torch.device) -> float:
    """One untimed call of each method on a short answer (``ids``, prompt ``P``), so that the timed
    cases do not pay the CUDA context, the kernels' first launch and the engine's plan; returns its
    seconds. A failure is printed and left to the timed case to record."""
    from gmts_analysis.engine import grad_norms

    t0 = time.perf_counter()
    for method in methods:
        try:
            grad_norms(model, ids, P, method=method, probes=2)
        except Exception as e:  # noqa: BLE001 - the timed case records it
            print(f"gpu_bench: warm-up {method} failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="qwen1.5b")
    ap.add_argument("--T", type=int, default=1024)
    ap.add_argument("--P", type=int, default=32)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--methods", default="exact,sketch")
    ap.add_argument("--probes", type=int, default=32)
    ap.add_argument("--calib", type=int, default=64, help="response tokens of the calibration run")
    ap.add_argument("--case-budget-s", type=float, default=90.0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-warmup", action="store_true", help="time the first call too (default: one untimed call "
                    "per method on a short answer first: CUDA context, kernels, the plan)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_bench: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    if a.threads:
        torch.set_num_threads(a.threads)
    from gmts_analysis.run.bench import machine_info

    result = {"shape": a.shape, "config": SHAPES[a.shape], "T": a.T, "P": a.P, "device": str(device),
              "case_budget_s": a.case_budget_s, "cases": [], "machine": machine_info(device)}

    def save():
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, a.out)

    g = torch.Generator().manual_seed(0)
    for dname in a.dtypes.split(","):
        dtype = DTYPES[dname]
        t0 = time.perf_counter()
        model = build(a.shape, dtype, device, a.P + a.T + 1)
        build_s = time.perf_counter() - t0
        n_params = sum(p.numel() for p in model.parameters())
        ids = torch.randint(3, model.config.vocab_size, (a.P + a.T,), generator=g).to(device)
        if not a.no_warmup:
            result.setdefault("warmup_s", {})[dname] = warm_up(model, ids[: a.P + 8], a.P, a.methods.split(","),
                                                               device)
        for method in a.methods.split(","):
            print(f"gpu_bench: {a.shape} {dname} {method} T={a.T} ...", file=sys.stderr, flush=True)
            try:
                row = run_case(model, ids, a.P, method, a.probes, a.case_budget_s, a.calib, device)
            except Exception as e:  # noqa: BLE001 - recorded, next case runs
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                row = {"method": method, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            row.update(dtype=dname, n_params=n_params, build_s=build_s)
            result["cases"].append(row)
            print(f"gpu_bench: {json.dumps(row)}", file=sys.stderr, flush=True)
            save()
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    save()
    bad = [c for c in result["cases"] if "error" in c]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
