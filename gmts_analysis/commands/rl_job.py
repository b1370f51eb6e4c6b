"""``gmts rl``: what it does (declared in :mod:`gmts_analysis.commands.rl`)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import torch

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.models import resolve_device
from gmts_analysis.rl.config import RLOptions, runs_dir
from gmts_analysis.rl.experiment import run_experiment
from gmts_analysis.rl.plots import plot_diagnostics, plot_learning_curves
from gmts_analysis.util.io import check_output_file


def _is_rl_result(path) -> bool:
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    return isinstance(j, dict) and {"selections", "runs", "summary"} <= set(j)


def _check_targets(out, figures) -> None:
    """--out: absent, or an experiment JSON of gmts rl; its ``<stem>.runs/`` directory: absent or only
    run records of gmts rl; --figures: the two rl_<stem>_*.png files may be replaced, nothing else is
    touched. Anything else is someone else's: refused before any training."""
    check_output_file(out, "--out", _is_rl_result, overwrite=None)
    runs = runs_dir(out)
    if runs.exists():
        if not runs.is_dir() or runs.is_symlink():
            raise GmtsError(f"--out {out}: {runs} exists and is not a directory of run records; choose another --out")
        foreign = sorted(c.name for c in runs.iterdir()
                         if not re.fullmatch(r"(initial|[A-Za-z_]+-s\d+)\.json|\..+\.tmp", c.name))
        if foreign:
            raise GmtsError(f"--out {out}: {runs} holds files that gmts rl did not write ({', '.join(foreign[:3])}); "
                            "choose another --out")
    if figures is not None:
        for name in (f"rl_{out.stem}_curves.png", f"rl_{out.stem}_diagnostics.png"):
            p = figures / name
            if p.is_symlink() or p.is_dir():
                raise GmtsError(f"--figures {figures}: {name} is a link or a directory; choose another --figures")


def rl(opts: RLOptions) -> int:
    """Train every ``opts.selection`` x ``opts.seed`` run and write the results JSON and figures."""
    if opts.threads < 1:
        raise GmtsError("--threads must be >= 1")
    torch.set_num_threads(opts.threads)
    cfg = opts.config(device=str(resolve_device(opts.device)))
    cfg.check()
    out = Path(opts.out)
    _check_targets(out, None if opts.figures == "none" else Path(opts.figures))
    result = run_experiment(cfg, opts.selection, opts.seed, out, progress=not opts.quiet, offline=opts.offline)
    log = logging.getLogger("gmts")
    if opts.figures != "none":
        fdir = Path(opts.figures)
        for p in (plot_learning_curves(result, fdir / f"rl_{out.stem}_curves.png"),
                  plot_diagnostics(result, fdir / f"rl_{out.stem}_diagnostics.png")):
            log.info("wrote %s", p)
    log.info("wrote %s (%.0f s of training runs)", out, result["timing_s"]["sum_of_runs"])
    for arm, block in result["summary"].items():
        m = block["mean"]
        log.info("  %-8s final pass@1 (mean over domains) %.3f (min %.3f, max %.3f, %d seeds)",
                 arm, m["mean"], m["min"], m["max"], m["n_seeds"])
    return 0
