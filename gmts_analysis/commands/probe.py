"""``gmts probe``: per-token entropy, exact gradient norms and GMTS scores for a rollouts file."""

from __future__ import annotations

import argparse
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from gmts_analysis.config import ProbeConfig, add_dataclass_args

    p = sub.add_parser(
        "probe",
        help="probe a model on rollouts: tokens.parquet, answers.parquet, stats.json, manifest.json",
        description="Run a causal LM on sampled answers and write, per response token, entropy, log-prob, "
        "the exact norm of the per-token policy gradient, the advantage, omega and the GMTS score.",
    )
    add_dataclass_args(p, ProbeConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gmts_analysis.config import ProbeConfig, from_args
    from gmts_analysis.job import run_probe

    cfg = from_args(ProbeConfig, args)
    out = run_probe(cfg)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 writes the run
        print(f"wrote {out}", file=sys.stderr)
    return 0
