"""Planned contrasts of a probe study: paired differences read from ``stats.json`` files, Holm over the family.

A study (docs/studies/smollm2.md) fixes before its run which paired differences it tests
(``paired_difference.<statistic>.<s>.<ref>``, in the run's block or its ``uncertain`` block, at a keep
fraction ``rho``: the stats file computed with that ``meta.rho``). Each difference's two-sided bootstrap
p-value is ``2 min(p_le_0, 1 - p_le_0)`` (``p_le_0``: the share of cluster resamples with a difference <= 0;
floored at one resample, ``1 / n_boot``); Holm's step-down adjustment runs over the primary family
(:func:`gmts_analysis.analysis.paired.holm`). A contrast *holds* when its adjusted p is below ``alpha`` and
its 95% CI excludes 0; a block below ``meta.min_groups`` has no interval and never holds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gmts_analysis.analysis.paired import holm


@dataclass(frozen=True)
class Contrast:
    """One planned paired difference: ``s - ref`` on ``statistic`` in ``block`` ("" the run's, or "uncertain")
    of the stats computed at keep fraction ``rho`` (a stats key such as "0.2")."""

    name: str
    block: str
    statistic: str
    s: str
    ref: str
    rho: str = "0.2"

    @property
    def key(self) -> str:
        return ".".join(x for x in (self.block, "paired_difference", self.statistic, self.s, self.ref) if x)


@dataclass
class Result:
    """A contrast's value: ``diff`` with its 95% CI, the two-sided bootstrap p, Holm's adjusted p, and
    whether it holds."""

    name: str
    key: str
    rho: str
    diff: float
    ci_low: float | None
    ci_high: float | None
    p: float | None
    p_holm: float | None = None
    holds: bool = False


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def read_contrast(stats: Mapping[str, Any], c: Contrast) -> Result:
    """The paired difference ``c`` of one stats dict (NaN/None where the stats have none)."""
    blk = stats.get(c.block, {}) if c.block else stats
    entry = ((blk.get("paired_difference") or {}).get(c.statistic) or {}).get(c.s, {}).get(c.ref) or {}
    n_boot = (stats.get("meta") or {}).get("n_boot") or 0
    p_le = _num(entry.get("p_le_0"))
    lo, hi = _num(entry.get("ci_low")), _num(entry.get("ci_high"))
    p = None
    if p_le is not None and lo is not None and n_boot:
        p = min(1.0, max(2.0 * min(p_le, 1.0 - p_le), 1.0 / n_boot))
    diff = _num(entry.get("diff"))
    return Result(c.name, c.key, c.rho, math.nan if diff is None else diff, lo, hi, p)


def family(stats_by_rho: Mapping[str, Mapping[str, Any]], contrasts: Sequence[Contrast],
           alpha: float = 0.05) -> list[Result]:
    """Every contrast of the family from the stats computed at its ``rho``, Holm-adjusted together."""
    out = [read_contrast(stats_by_rho[c.rho], c) for c in contrasts]
    adj = holm([math.nan if r.p is None else r.p for r in out])
    for r, a in zip(out, adj):
        r.p_holm = a if r.p is not None else None
        r.holds = bool(r.p_holm is not None and r.p_holm < alpha and r.ci_low is not None
                       and (r.ci_low > 0 or r.ci_high < 0))
    return out


def markdown(results: Sequence[Result], title: str = "") -> str:
    """A table: contrast, difference [95% CI], p, Holm p, holds."""
    def f(x: float | None, d: int = 3) -> str:
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{d}f}"

    lines = ([f"**{title}**", ""] if title else []) + [
        "| contrast | rho | difference [95% CI] | p (bootstrap, two-sided) | Holm p | holds |",
        "|---|---|---|---|---|---|"]
    for r in results:
        ci = f" [{f(r.ci_low)}, {f(r.ci_high)}]" if r.ci_low is not None else " (no interval)"
        p = "n/a" if r.p is None else f"{r.p:.3g}"
        ph = "n/a" if r.p_holm is None else f"{r.p_holm:.3g}"
        lines.append(f"| {r.name}: `{r.key}` | {r.rho} | {f(r.diff)}{ci} | {p} | {ph} | {'yes' if r.holds else 'no'} |")
    return "\n".join(lines)


def as_dicts(results: Sequence[Result]) -> list[dict]:
    return [asdict(r) for r in results]
