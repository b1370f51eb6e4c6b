"""``gmts bench``: what it does (declared in :mod:`gmts_analysis.commands.bench`)."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path

import torch

from gmts_analysis.commands.bench import BenchOptions
from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.models import resolve_device, resolve_dtype
from gmts_analysis.run.bench import format_table, run_bench
from gmts_analysis.util.io import atomic_write_json, atomic_write_text


def _ints(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise GmtsError(f"expected comma-separated integers, got '{s}'") from None
    if not vals or any(v < 1 for v in vals):
        raise GmtsError(f"expected positive integers, got '{s}'")
    return vals


def bench(opts: BenchOptions) -> int:
    """Time the gradient-norm methods (:mod:`gmts_analysis.commands.bench`); print the table, write JSON and markdown to ``opts.out``."""
    log = logging.getLogger("gmts_analysis.bench")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    lengths = _ints(opts.lengths) if opts.lengths else ([64, 256] if opts.quick else [64, 256, 1024])
    probes = _ints(opts.probes)
    if any(k < 2 for k in probes):
        raise GmtsError("--probes: each K must be >= 2")
    # an existing path is one model, never split at its commas
    models = ([opts.models] if os.path.lexists(opts.models)
              else [m.strip() for m in opts.models.split(",") if m.strip()])
    layers = opts.layers if opts.layers is not None else (1 if opts.quick else 2)
    naive_tokens = opts.naive_tokens if opts.naive_tokens is not None else (4 if opts.quick else 8)
    if opts.prompt_len < 1 or layers < 1 or naive_tokens < 2:
        raise GmtsError("--prompt-len and --layers must be >= 1, --naive-tokens >= 2")
    device = resolve_device(opts.device)
    dtype = resolve_dtype(opts.dtype)
    t0 = time.perf_counter()
    result = run_bench(
        models,
        lengths,
        probes,
        prompt_len=opts.prompt_len,
        layers=layers,
        naive_tokens=naive_tokens,
        full_reference_max_t=opts.naive_full_max,
        device=device,
        dtype=dtype,
        seed=opts.seed,
        max_memory=None if opts.max_memory is None else opts.max_memory * 2**20,
        progress=(lambda s: None) if opts.quiet else (lambda s: log.info("bench: %s", s)),
    )
    result["wall_seconds"] = time.perf_counter() - t0
    result["command"] = "gmts bench " + " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in sorted(dataclasses.asdict(opts).items())
        if v not in (None, False)
    )
    table = format_table(result)
    print(table)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    atomic_write_json(out / f"bench-{stamp}.json", result)
    atomic_write_text(out / f"bench-{stamp}.md", table + "\n")
    log.info("bench: wrote %s", out / f"bench-{stamp}.json")
    return 0
