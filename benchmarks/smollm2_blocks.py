"""Exact engine on the SmolLM2-135M shape (random weights), T=64 after a 64-token prompt, one
thread: the default chunking (one 64-token block) against 16-token blocks (``chunk_size=16``),
alternated in one process, process CPU time. Prints one JSON line per run.

    python benchmarks/smollm2_blocks.py
"""

import json
import sys
import time

import torch

torch.set_num_threads(1)
sys.path.insert(0, __file__.rsplit('/', 1)[0])
import smollm2_bench as b  # noqa: E402

from gmts_analysis.grads import grad_norms  # noqa: E402


def main() -> None:
    m = b.build()
    g = torch.Generator().manual_seed(0)
    P, T = 64, 64
    ids = torch.randint(3, 49152, (P + T,), generator=g)
    ref = None
    for cs in ("auto", 16, "auto", 16):
        c0 = time.process_time()
        r = grad_norms(m, ids, P, chunk_size=cs)
        c = time.process_time() - c0
        if ref is None:
            ref = r.norms
        row = {"chunk_size": cs, "cpu_s": c, "cpu_tok_s": T / c,
               "max_rel_vs_first": float(((r.norms - ref).abs() / ref).max())}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
