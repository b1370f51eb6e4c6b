"""What the run figures share: the statistics they take, a score's colour, a point with its CI, an empty panel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gmts_analysis.analysis.stats_types import CrossEntry, Statistics, WithinEntry
from gmts_analysis.core.scores import score_color

StatsLike = Statistics | Mapping[str, Any]  # a run's statistics, typed or as the stats.json dict


def _color(name: str, i: int) -> str:
    return score_color(name, i)


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _empty(fig: Figure, ax, msg: str) -> Figure:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, parse_math=False)
    ax.set_axis_off()
    return fig


def _errbar(ax, x: float, entry: CrossEntry | WithinEntry | None, key: str, **kw) -> float:
    """A point with its 95% CI from a stats entry (its attribute ``key``, ``ci_low``, ``ci_high``;
    None draws nothing); returns the value."""
    if entry is None:
        return float("nan")
    v, lo, hi = _num(getattr(entry, key)), _num(entry.ci_low), _num(entry.ci_high)
    if np.isfinite(v):
        yerr = [[max(v - lo, 0.0)], [max(hi - v, 0.0)]] if np.isfinite(lo) and np.isfinite(hi) else None
        ax.errorbar([x], [v], yerr=yerr, capsize=3, **kw)
    return v

