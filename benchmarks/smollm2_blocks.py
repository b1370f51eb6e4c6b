"""The exact engine's CPU blocks: 64-token blocks (the chunking before, ``CPU_BLOCK = None``)
against 16-token blocks (the CPU default since, ``CPU_BLOCK = 16``), alternated in one process,
one thread, process CPU time, on the SmolLM2-135M shape (random weights, T=64 after a 64-token
prompt) and the toy shape (Qwen2 hidden 128, 4 layers, vocabulary 100; T=64 and 256 after 32).
Prints one JSON line per run.

    python benchmarks/smollm2_blocks.py
"""

import json
import sys
import time

import torch

torch.set_num_threads(1)
sys.path.insert(0, __file__.rsplit("/", 1)[0])
import smollm2_bench as b  # noqa: E402

import gmts_analysis.engine.exact as ex  # noqa: E402
from gmts_analysis.engine import grad_norms  # noqa: E402
from gmts_analysis.toy.testing import build_tiny_model  # noqa: E402


def compare(name: str, model: torch.nn.Module, P: int, T: int, vocab: int, rounds: int = 2) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (P + T,), generator=g)
    ref = None
    for _ in range(rounds):
        for cap in (None, 16):
            ex.CPU_BLOCK = cap
            c0 = time.process_time()
            r = grad_norms(model, ids, P)
            c = time.process_time() - c0
            if ref is None:
                ref = r.norms
            print(json.dumps({"shape": name, "T": T, "cpu_block": cap, "cpu_s": c, "cpu_tok_s": T / c,
                              "max_rel_vs_first": float(((r.norms - ref).abs() / ref).max())}), flush=True)
    ex.CPU_BLOCK = 16


def main() -> None:
    toy = build_tiny_model("qwen2", hidden=128, layers=4, vocab_size=100)
    compare("toy", toy, 32, 64, 100, rounds=3)
    compare("toy", toy, 32, 256, 100, rounds=3)
    compare("smollm2", b.build(), 64, 64, 49152)


if __name__ == "__main__":
    main()
