"""``gmts probe``: per-token entropy, exact gradient norms and GMTS scores for a rollouts file."""

from __future__ import annotations

import argparse
import os
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from gmts_analysis.config import ProbeConfig, add_dataclass_args
    from gmts_analysis.options import help_group

    p = sub.add_parser(
        "probe",
        help="probe a model on rollouts: tokens.parquet, answers.parquet, stats.json, manifest.json",
        description="Run a causal LM on sampled answers and write, per response token, entropy, log-prob, "
        "the exact norm of the per-token policy gradient, the advantage, omega and the GMTS score. "
        "Flags also take TRL's and verl's names and underscores (--loss_type, --epsilon, --beta, "
        "--top_entropy_quantile, ...: docs/cli.md).",
    )
    help_group(p, "config").add_argument(
        "--config", metavar="FILE.yaml", default=None,
        help="read options from a YAML file (keys: option names, ours or TRL's/verl's, either spelling); "
        "flags on the command line override it; unknown keys are refused (default: none)")
    add_dataclass_args(p, ProbeConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gmts_analysis.config import ProbeConfig, from_args
    from gmts_analysis.job import run_probe

    cfg = from_args(ProbeConfig, args, config_file=getattr(args, "config", None),
                    aliases=dict(getattr(args, "aliases", None) or {}))
    from gmts_analysis.compare import checkpoint_series, probe_series

    series = checkpoint_series(cfg.model)  # --model ckpt-100,ckpt-200,... or a directory of checkpoints
    out = run_probe(cfg) if series is None else probe_series(cfg, series, figures=cfg.figures)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 writes the run
        print(f"wrote {out}", file=sys.stderr)
    return 0
