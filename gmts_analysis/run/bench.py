"""Benchmark of the per-token gradient-norm methods (what ``gmts bench`` runs).

For each model and response length T, in one process and one run (so ratios are fair on a
shared machine): tokens/s and peak memory of

- ``naive``: a forward and backward per token (the first thing one writes);
- ``loop``: one shared forward, ``autograd.grad`` per token;
- ``exact``: the batched ghost-norm engine (:mod:`gmts_analysis.engine.exact`);
- ``sketch@K``: the forward-mode sketch with K directions;
- ``fwd+bwd``: one forward and backward of the whole answer (the memory reference).

``naive`` and ``loop`` cost the same for every token (full-length forward/backward), so at
large T they are timed on an evenly spaced subset of tokens and reported per token
(``extrapolated`` in the table says from how many tokens).

Peak memory: on CUDA ``torch.cuda.max_memory_allocated`` above the allocation before the
call. On CPU the resident-set high-water mark above the resident set before the call:
freed heap is first returned to the OS (glibc ``malloc_trim``), the kernel's high-water mark
is reset (``/proc/self/clear_refs`` = 5), and ``VmHWM - VmRSS`` is read from
``/proc/self/status`` (Linux). Where that is not possible, ``getrusage`` max RSS (process
lifetime) is reported and marked.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial

import torch

from gmts_analysis.core.rank import spearman
from gmts_analysis.core.seeding import derive_seed, seeded_global_rng
from gmts_analysis.core.tokens import sequence_logprobs
from gmts_analysis.engine import grad_norms
from gmts_analysis.engine.reference import loop_grad_norms, naive_grad_norms
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers import models as model_io  # load_model through its module: tests replace it there

log = logging.getLogger(__name__)

SMALL_FALLBACK = {
    "vocab_size": 100,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
QWEN05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
}


# ------------------------------------------------------------------------------------ memory
class PeakMemory:
    """Measure the peak memory of a call above what was in use before it (bytes)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.method = self._method()

    def _method(self) -> str:
        if self.device.type == "cuda":
            return "torch.cuda.max_memory_allocated"
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return "RSS high-water (VmHWM reset via /proc/self/clear_refs, after malloc_trim)"
        except OSError:
            return "getrusage max RSS (process lifetime; upper bound)"

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
        raise OSError(key)

    def run(self, fn: Callable[[], object]) -> tuple[object, int]:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out = fn()
            torch.cuda.synchronize(self.device)
            return out, int(torch.cuda.max_memory_allocated(self.device) - base)
        if self.method.startswith("RSS"):
            try:
                ctypes.CDLL("libc.so.6").malloc_trim(0)
            except OSError:
                pass
            base = self._status("VmRSS")
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            out = fn()
            return out, max(0, self._status("VmHWM") - base)
        import resource

        out = fn()
        return out, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ------------------------------------------------------------------------------------ models
@dataclass
class BenchModel:
    name: str
    label: str  # what it is, for the table
    model: torch.nn.Module
    n_params: int
    context: int | None


def _from_config(kw: dict, max_len: int, seed: int, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(max_position_embeddings=max_len, **kw)
    with seeded_global_rng(seed):  # from_config initialises from the global generator
        model = AutoModelForCausalLM.from_config(cfg)
    return model.to(device=device, dtype=dtype).eval()


def build_bench_model(
    name: str, *, layers: int, max_len: int, seed: int, dtype: torch.dtype, device: torch.device
) -> BenchModel:
    """``small`` (the shipped policy, or a random model of its shape until it exists) or
    ``qwen0.5b`` (random init, Qwen2.5-0.5B shape with ``layers`` decoder layers)."""
    if name == "small":
        if (model_io.data_dir() / "policies" / "small" / "config.json").exists():
            model, _ = model_io.load_model("small", device=device, dtype=dtype)
            label = "shipped policy data/policies/small"
        else:
            model = _from_config(SMALL_FALLBACK, max_len, seed, dtype, device)
            label = "random Qwen2 of the small policy's shape (hidden 256, 4 layers, vocab 100, tied)"
    elif name in ("qwen0.5b", "qwen2.5-0.5b"):
        kw = dict(QWEN05B, num_hidden_layers=layers)
        model = _from_config(kw, max_len, seed, dtype, device)
        label = f"random Qwen2.5-0.5B shape, {layers} of 24 layers (hidden 896, vocab 151936, tied)"
    else:
        raise GmtsError(f"--models: unknown bench model '{name}' (choose small, qwen0.5b)")
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return BenchModel(name, label, model, n, model_io.context_length(model))


def sample_answer(model: torch.nn.Module, P: int, T: int, seed: int, device: torch.device) -> torch.Tensor:
    """A prompt of ``P`` random tokens and ``T`` response tokens sampled from the model itself."""
    g = torch.Generator().manual_seed(seed)
    V = model.config.vocab_size
    prompt = torch.randint(3, min(V, 100), (P,), generator=g).to(device)
    cuda = [device.index or 0] if torch.device(device).type == "cuda" else None
    with torch.no_grad(), seeded_global_rng(seed, cuda):  # generate samples from the global generator
        out = model.generate(
            prompt.unsqueeze(0),
            attention_mask=torch.ones(1, P, dtype=torch.long, device=device),
            do_sample=True,
            max_new_tokens=T,
            min_new_tokens=T,
            top_k=0,
            top_p=1.0,
            temperature=1.0,
            pad_token_id=0,
            eos_token_id=None,
        )
    ids = out[0]
    if ids.shape[0] != P + T:
        raise RuntimeError(f"sampling gave {ids.shape[0] - P} tokens, wanted {T}")
    return ids


# ------------------------------------------------------------------------------------ run
@dataclass
class Row:
    model: str
    T: int
    method: str
    tokens_per_s: float
    seconds: float
    peak_mb: float
    timed_tokens: int
    note: str = ""
    extra: dict = field(default_factory=dict)


def _timed(mem: PeakMemory, fn, device):
    def call():
        t0 = time.perf_counter()
        out = fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out, time.perf_counter() - t0

    (out, secs), peak = mem.run(call)
    return out, secs, peak


def _fwd_bwd(model, ids, P):
    lp = sequence_logprobs(model(input_ids=ids.unsqueeze(0), use_cache=False).logits[0], ids, P)
    lp.sum().backward()
    model.zero_grad(set_to_none=True)


def run_bench(
    models: list[str],
    lengths: list[int],
    probes: list[int],
    *,
    prompt_len: int = 32,
    layers: int = 2,
    naive_tokens: int = 8,
    full_reference_max_t: int = 64,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    max_memory: int | None = None,
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    """Run the benchmark; returns a JSON-able dict with ``rows``, ``machine`` and ``accuracy``."""
    mem = PeakMemory(device)
    rows: list[Row] = []
    accuracy: list[dict] = []
    labels = {}
    for mname in models:
        bm = build_bench_model(
            mname,
            layers=layers,
            max_len=max(2048, prompt_len + max(lengths) + 1),
            seed=seed,
            dtype=dtype,
            device=device,
        )
        labels[mname] = {"label": bm.label, "n_params": bm.n_params, "context": bm.context}
        for T in lengths:
            ids = sample_answer(bm.model, prompt_len, T, derive_seed(seed, "bench-answer", T), device)
            subset, note = _timed_tokens(T, naive_tokens, full_reference_max_t)
            run = _BenchRun(mem, bm, ids, prompt_len, T, device, max_memory, progress)
            exact, acc = _reference_rows(run, subset, note, rows)
            for K in probes:
                acc.update(_sketch_row(run, exact, K, derive_seed(seed, "bench-sketch", K), rows))
            accuracy.append(acc)
        bm = run = None
        gc.collect()
    return {
        "machine": machine_info(device),
        "memory_method": mem.method,
        "dtype": str(dtype).replace("torch.", ""),
        "prompt_len": prompt_len,
        "models": labels,
        "rows": [asdict(r) for r in rows],
        "accuracy": accuracy,
    }


@dataclass
class _BenchRun:
    """One model and one sampled answer (``ids``: ``prompt_len + T`` token ids) of the benchmark."""

    mem: PeakMemory
    bm: BenchModel
    ids: torch.Tensor
    prompt_len: int
    T: int
    device: torch.device
    max_memory: int | None
    progress: Callable[[str], None]

    def time(self, what: str, fn: Callable[..., object], *args, **kwargs) -> tuple[object, float, int]:
        """``(result, seconds, peak bytes)`` of ``fn(model, ids, prompt_len, *args, **kwargs)``."""
        self.progress(f"{self.bm.name} T={self.T}: {what}")
        return _timed(self.mem, partial(fn, self.bm.model, self.ids, self.prompt_len, *args, **kwargs), self.device)


def _timed_tokens(T: int, naive_tokens: int, full_reference_max_t: int) -> tuple[list[int], str]:
    """The tokens the per-token references are timed on (all ``T`` up to ``full_reference_max_t``, else
    ``naive_tokens`` evenly spaced ones) and the table's note on them."""
    if T <= full_reference_max_t:
        return list(range(T)), ""
    k = min(naive_tokens, T)
    subset = sorted({round(i * (T - 1) / max(1, k - 1)) for i in range(k)})
    return subset, f"extrapolated from {len(subset)} tokens"


def _reference_rows(run: _BenchRun, subset: list[int], note: str, rows: list[Row]) -> tuple[torch.Tensor, dict]:
    """Time fwd+bwd, the naive and shared-forward loops (on ``subset``) and the exact engine, appending
    their rows; returns the exact norms ``(T,)`` and the accuracy record of the answer."""
    mname, T = run.bm.name, run.T
    ctx = run.bm.context
    note_ctx = f"beyond context {ctx}" if ctx and run.prompt_len + T > ctx else ""
    _, secs, fb_peak = run.time("fwd+bwd", _fwd_bwd)
    rows.append(Row(mname, T, "fwd+bwd (1x, reference)", float("nan"), secs, fb_peak / 2**20, 0, note_ctx))
    naive, secs, peak = run.time(f"naive ({len(subset)} tokens)", naive_grad_norms, tokens=subset)
    rows.append(Row(mname, T, "naive loop (fwd+bwd per token)", len(subset) / secs, secs * T / len(subset),
                    peak / 2**20, len(subset), note))
    loop, secs, peak = run.time(f"shared-forward loop ({len(subset)} tokens)", loop_grad_norms, tokens=subset)
    rows.append(Row(mname, T, "shared-forward loop", len(subset) / secs, secs * T / len(subset),
                    peak / 2**20, len(subset), note))
    ex, secs, peak = run.time("exact engine", grad_norms, max_memory=run.max_memory)
    exact = ex.norms
    rel = float(((exact[subset] - loop) / loop).abs().max())
    rel_naive = float(((exact[subset] - naive) / naive).abs().max())
    rows.append(Row(mname, T, "exact engine", T / secs, secs, peak / 2**20, T, "",
                    {"peak_vs_fwd_bwd": peak / max(1, fb_peak)}))
    acc = {"model": mname, "T": T, "exact_max_rel_err_vs_loop": rel, "exact_max_rel_err_vs_naive": rel_naive,
           "n_checked": len(subset)}
    return exact, acc


def _sketch_row(run: _BenchRun, exact: torch.Tensor, K: int, seed: int, rows: list[Row]) -> dict:
    """Time the sketch with ``K`` directions, append its row; returns its accuracy fields (Spearman
    against the exact norms, coverage of their 95% intervals)."""
    sk, secs, peak = run.time(f"sketch K={K}", grad_norms, method="sketch", probes=K, seed=seed,
                              max_memory=run.max_memory)
    cover = float(((sk.lo <= exact) & (exact <= sk.hi)).double().mean())
    rho = spearman(sk.norms.numpy(), exact.numpy())
    rows.append(Row(run.bm.name, run.T, f"sketch K={K}", run.T / secs, secs, peak / 2**20, run.T, "",
                    {"spearman_vs_exact": rho, "coverage_95": cover}))
    return {f"sketch{K}_spearman": rho, f"sketch{K}_coverage": cover, f"sketch{K}_n_tokens": run.T}


def machine_info(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    try:
        info["load_avg_1m_at_end"] = os.getloadavg()[0]
    except OSError:
        pass
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def format_table(result: dict) -> str:
    """Markdown table of a bench result (tokens/s, speed-up over the naive loop, peak memory)."""
    lines = [
        "| model | T | method | tokens/s | x naive | time (s, all T) | peak MB | notes |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    naive = {(r["model"], r["T"]): r["tokens_per_s"] for r in result["rows"] if r["method"].startswith("naive")}
    for r in result["rows"]:
        tps = r["tokens_per_s"]
        tps = float("nan") if tps is None else tps  # JSON stores NaN as null
        base = naive.get((r["model"], r["T"]))
        speed = f"{tps / base:.1f}" if base and not math.isnan(tps) else ""
        notes = [r["note"]] if r["note"] else []
        for k, v in r.get("extra", {}).items():
            notes.append(f"{k}={v:.3f}")
        tps_s = f"{tps:.2f}" if not math.isnan(tps) else "-"
        lines.append(
            f"| {r['model']} | {r['T']} | {r['method']} | {tps_s} | {speed} | {r['seconds']:.1f} | {r['peak_mb']:.0f} | {'; '.join(notes)} |"
        )
    return "\n".join(lines)


__all__ = ["PeakMemory", "build_bench_model", "format_table", "machine_info", "math", "run_bench"]
