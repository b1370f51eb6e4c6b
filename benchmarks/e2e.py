"""End-to-end probe throughput: ``kernel.probe_answers`` (every per-token column, no files,
no fidelity) against the naive per-token loop and the shared-forward loop, in one process.

    OMP_NUM_THREADS=1 python benchmarks/e2e.py --shape small --T 256 --answers 2
    OMP_NUM_THREADS=1 python benchmarks/e2e.py --shape qwen0.5b --T 256 --answers 1 --naive-tokens 2

``small``: random Qwen2, hidden 128, 4 layers, vocabulary 100 (``build_tiny_model``'s
shape at width 128). ``qwen0.5b``: random Qwen2.5-0.5B shape (hidden 896, vocabulary
151936, tied) with ``--layers`` decoder layers. Answers are random token ids (prompt
``--P``, response ``--T``). The loops cost the same for every token (a full-length
forward/backward), so they are timed on ``--naive-tokens`` evenly spaced tokens and
reported per token (said in the output). Wall-clock and process CPU time are both
recorded (one thread: CPU time is far less sensitive to other jobs on a shared machine, and
``cpu x ...`` ratios use it). Also counted: calls of the model's top-level
forward per answer during the probe (``forwards_per_answer``) and the sequence positions
they processed.

Only APIs that exist before and after the one-forward change are used, so the same script
measures both (``PYTHONPATH=/tmp/before python benchmarks/e2e.py ...``). Prints one JSON
object; ``--out`` also writes it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

QWEN05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}


def build(shape: str, layers: int, seed: int) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    if shape == "small":
        from gmts_analysis.toy.testing import build_tiny_model

        return build_tiny_model("qwen2", hidden=128, layers=4, vocab_size=100, seed=seed)
    cfg = Qwen2Config(num_hidden_layers=layers, max_position_embeddings=4096, **QWEN05B)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=("small", "qwen0.5b"), default="small")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--P", type=int, default=32)
    ap.add_argument("--answers", type=int, default=2)
    ap.add_argument("--naive-tokens", type=int, default=8)
    ap.add_argument("--methods", default="exact", help="comma list of probe grad-norm methods (exact, sketch)")
    ap.add_argument("--no-loops", action="store_true", help="skip the naive and shared-forward loops")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)

    import gmts_analysis
    from gmts_analysis.engine.reference import loop_grad_norms, naive_grad_norms
    from gmts_analysis.options.config import ProbeConfig
    from gmts_analysis.probing import kernel
    from gmts_analysis.probing.settings import KernelSettings
    from gmts_analysis.readers.rollouts import Answer

    model = build(a.shape, a.layers, a.seed)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(a.seed)
    answers = []
    for i in range(a.answers):
        ids = torch.randint(3, V, (a.P + a.T,), generator=g).tolist()
        answers.append(Answer(answer_id=f"a{i}", group_id="g0", prompt_ids=ids[: a.P],
                              response_ids=ids[a.P:], reward=float(i % 2)))
    if len(answers) == 1:  # a group of one has advantage 0; the norms do not care
        pass

    calls = {"n": 0, "positions": 0}

    def pre_hook(module, args, kwargs):
        x = kwargs.get("input_ids", args[0] if args else None)
        calls["n"] += 1
        if isinstance(x, torch.Tensor):
            calls["positions"] += int(x.shape[-1])

    hd = model.register_forward_pre_hook(pre_hook, with_kwargs=True)
    base_calls = {"n": 0}
    base = getattr(model, "base_model", None)
    hb = base.register_forward_pre_hook(lambda m, ar, kw: base_calls.__setitem__("n", base_calls["n"] + 1),
                                        with_kwargs=True) if base is not None and base is not model else None

    fields = {f.name for f in dataclasses.fields(ProbeConfig)}
    result = {"package": gmts_analysis.__file__, "shape": a.shape, "layers": a.layers if a.shape != "small" else 4,
              "n_params": sum(p.numel() for p in model.parameters()), "T": a.T, "P": a.P,
              "answers": a.answers, "threads": torch.get_num_threads(), "rows": {}}
    try:
        for method in a.methods.split(","):
            kw = {"grad_norm": method, "quiet": True}
            for k, v in (("model", "x"), ("rollouts", "x"), ("out", "x"), ("fidelity", "off")):
                if k in fields:
                    kw[k] = v
            cfg = ProbeConfig(**{k: v for k, v in kw.items() if k in fields})
            calls.update(n=0, positions=0)
            base_calls["n"] = 0
            t0, c0 = time.perf_counter(), time.process_time()
            res = kernel.probe_answers(model, None, answers, KernelSettings.of(cfg), progress=False)
            secs, cpu = time.perf_counter() - t0, time.process_time() - c0
            n_tok = a.T * a.answers
            result["rows"][f"probe {method}"] = {
                "tokens_per_s": n_tok / secs, "seconds": secs, "tokens": n_tok,
                "cpu_tokens_per_s": n_tok / cpu, "cpu_seconds": cpu,
                "forwards_per_answer": calls["n"] / a.answers,
                "base_forwards_per_answer": base_calls["n"] / a.answers,
                "positions_per_answer": calls["positions"] / a.answers,
                "grad_norm_head": [float(x) for x in res.tokens["grad_norm_logp"].to_numpy()[:3]],
            }
            print(f"probe {method}: {n_tok / secs:.3f} tok/s", file=sys.stderr, flush=True)
        if not a.no_loops:
            ids = torch.tensor(answers[0].prompt_ids + answers[0].response_ids)
            k = min(a.naive_tokens, a.T)
            subset = sorted({round(i * (a.T - 1) / max(1, k - 1)) for i in range(k)})
            for name, fn in (("naive loop", naive_grad_norms), ("shared-forward loop", loop_grad_norms)):
                t0, c0 = time.perf_counter(), time.process_time()
                fn(model, ids, a.P, 1.0, tokens=subset)
                secs, cpu = time.perf_counter() - t0, time.process_time() - c0
                result["rows"][name] = {"tokens_per_s": len(subset) / secs, "seconds": secs,
                                        "cpu_tokens_per_s": len(subset) / cpu, "cpu_seconds": cpu,
                                        "tokens": len(subset),
                                        "note": f"timed on {len(subset)} of {a.T} tokens, per-token cost extrapolated"}
                print(f"{name}: {len(subset) / secs:.3f} tok/s", file=sys.stderr, flush=True)
    finally:
        hd.remove()
        if hb is not None:
            hb.remove()
    rows = result["rows"]
    for name in list(rows):
        if name.startswith("probe"):
            for ref in ("naive loop", "shared-forward loop"):
                if ref in rows:
                    rows[name][f"x {ref}"] = rows[name]["tokens_per_s"] / rows[ref]["tokens_per_s"]
                    rows[name][f"cpu x {ref}"] = rows[name]["cpu_tokens_per_s"] / rows[ref]["cpu_tokens_per_s"]
    try:
        import os

        result["load_avg_1m_at_end"] = os.getloadavg()[0]
    except OSError:
        pass
    text = json.dumps(result, indent=1)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
