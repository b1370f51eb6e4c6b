"""``gmts probe``: what it does (declared in :mod:`gmts_analysis.commands.probe`), and the exit status and the
results table that ``gmts run`` and ``gmts merge`` share."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.analysis.summary import summary_text
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ConfigFile, ProbeConfig, default_out
from gmts_analysis.run.job import run_probe
from gmts_analysis.run.series import checkpoint_series, probe_series
from gmts_analysis.run.sharding.merge import (
    EXIT_OUT_OF_MEMORY,
    skipped_answers,
    skipped_line,
)
from gmts_analysis.run.stats_job import warn_few_groups


def probe(config: ConfigFile, cfg: ProbeConfig) -> int:
    """Probe ``cfg.rollouts`` with ``cfg.model`` (or each checkpoint of a ``--model A,B,...`` series) into
    ``cfg.out``; the exit status of :func:`exit_status`. ``config``: the --config file the options came from."""
    out = cfg.out
    if out is None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # every rank must name the same directory
            raise GmtsError("--out: required under torchrun (each rank would pick its own default folder)")
        out = default_out("probe")
    cfg = dataclasses.replace(cfg, out=out, config_file=config.config, aliases=dict(cfg.aliases or {}))

    series = checkpoint_series(cfg.model)  # --model ckpt-100,ckpt-200,... or a directory of checkpoints
    out = run_probe(cfg) if series is None else probe_series(cfg, series, figures=cfg.figures)
    runs = [out] if series is None else _series_runs(out.parent)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 writes the run
        if series is None:
            print_results(out)
        print(f"wrote {out}", file=sys.stderr)
        return exit_status(runs, quiet=series is None)
    return exit_status(runs, quiet=True)  # every rank the same status: each returns once rank 0 finished the run


def exit_status(runs, quiet: bool = False) -> int:
    """0, or :data:`gmts_analysis.run.sharding.merge.EXIT_OUT_OF_MEMORY` when a finished run of
    ``runs`` dropped answers still out of memory after the back-off (each such run's line is
    printed to stderr unless ``quiet``: :func:`print_results` printed it already)."""
    bad = [r for r in runs if skipped_answers(r)[1]]
    if not quiet:
        for r in bad:
            print(f"{r}: {skipped_line(r)}", file=sys.stderr)
    return EXIT_OUT_OF_MEMORY if bad else 0


def _series_runs(out):
    """The finished checkpoint runs of a ``--model A,B,...`` series written under ``out``."""
    return sorted(d for d in out.iterdir() if d.name != "compare" and (d / "manifest.json").is_file())


def print_results(out) -> None:
    """The results table of a finished run directory, as ``gmts run`` prints it (stdout)."""
    path = Path(out) / "stats.json"
    if path.is_file():
        st = Statistics.read(path)  # parsed once for the table and the warning
        print(summary_text(st))
        warn_few_groups(st)
    if (Path(out) / "manifest.json").is_file():
        line = skipped_line(Path(out))  # never only in errors.jsonl
        if line:
            print(line)
