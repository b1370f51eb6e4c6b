"""``gmts series``: what it does (declared in :mod:`gmts_analysis.commands.series`)."""

from __future__ import annotations

import dataclasses
import logging

import torch

from gmts_analysis.options.config import RunControl, default_out
from gmts_analysis.run import trl_series  # audit_series through its module: tests replace it there
from gmts_analysis.run.series_types import SeriesSettings


def series(output_dir: str, s: SeriesSettings, rc: RunControl) -> int:
    """``gmts series OUTPUT_DIR``: the audit (:func:`gmts_analysis.run.trl_series.audit_series`) of the typed
    settings, into ``s.out`` (default: a new folder under runs/)."""
    if s.out is None:
        s = dataclasses.replace(s, out=default_out("series"))
    if rc.threads:
        torch.set_num_threads(int(rc.threads))
    out = trl_series.audit_series(output_dir, s, rc)
    logging.getLogger("gmts").info("series audit written to %s (series.json, compare/, tokens/)", out)
    return 0
