"""``compare.html``: the page of a run comparison (:mod:`gmts_analysis.views.compare`), self-contained (figures
inlined as data URIs, every text escaped, no external fetch).

What it shows: the runs (step, settings group, model, and their intervals: a 95% CI over how many groups, or
"too small"), a banner for settings that differ between runs and one for runs too small to compare (the
caution of each run's own summary, :func:`gmts_analysis.analysis.summary.too_small_caution`), the main
statistics per run with their 95% CI where stats.json has one (a too-small run's values marked as point
estimates), and the figures.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: the mark of a too-small run's value in the table (a point estimate, no interval)
SMALL_MARK = "\u2020"
STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:1200px}"
         "table{border-collapse:collapse;font-size:12px;margin:0.5em 0}"
         "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
         "th:first-child,td:first-child{text-align:left}.warn{background:#fff3cd;padding:0.6em;"
         "border:1px solid #e0c060;margin:0.5em 0}td.small{color:#777}img{max-width:100%}")


def _fmt(v: float | None) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def _intervals(run: dict) -> str:
    """The runs table's "intervals" cell: over how many units the CIs are, or why there are none."""
    if run.get("too_small"):
        return (f"none: too small ({run.get('informative_units')} informative of {run.get('units')}, "
                f"{run.get('min_groups')} needed)")
    return f"95% CI over {run.get('units')} groups" if run.get("units") is not None else ""


def render_page(cmp: Any, main: Sequence[str], figs: Sequence[tuple[str, Path]] = ()) -> str:
    """A self-contained page of ``cmp`` (a :class:`gmts_analysis.views.compare.Comparison`; this module does not
    import that one, which imports it): runs, the settings and size cautions, the statistics ``main`` per run
    (the series :func:`gmts_analysis.views.compare.figure_series` draws), figures."""
    e = html.escape
    small = cmp.too_small
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>gmts compare</title>",
             f"<style>{STYLE}</style></head><body>", f"<h1>Comparison of {len(cmp.runs)} runs</h1>"]
    if small:
        which = "every run" if len(small) == len(cmp.runs) else f"{len(small)} of {len(cmp.runs)} runs"
        parts.append(f"<div class='warn'><b>Too small to compare</b> ({which}): as each run's own summary says, "
                     "its values are point estimates, "
                     "with no interval and no verdict between scores; a trend between such runs is not evidence "
                     "of a change. Probe more prompts (groups) per checkpoint.<ul>")
        parts += [f"<li>{e(str(run))}: {e(text)}</li>" for run, text in small.items()]
        parts.append("</ul></div>")
    if cmp.mismatches:
        parts.append("<div class='warn'><b>Runs made with different settings</b> (flagged, not mixed; "
                     "groups in the runs table):<ul>")
        for m in cmp.mismatches:
            vals = ", ".join(f"{e(str(n))}: {e(repr(v))}" for n, v in m["values"].items())
            parts.append(f"<li><code>{e(str(m['key']))}</code>: {vals}</li>")
        parts.append("</ul></div>")
    parts.append(f"<h2>Runs</h2><table><tr><th>run</th><th>{e(cmp.x_label)}</th><th>from</th><th>settings</th>"
                 "<th>model</th><th>intervals</th></tr>")
    for r in cmp.runs:
        parts.append(f"<tr><td>{e(str(r['run']))}</td><td>{r['x']}</td><td>{e(str(r['x_source']))}</td>"
                     f"<td>{e(str(r['settings']))}</td><td>{e(str(r['model']))}</td>"
                     f"<td>{e(_intervals(r))}</td></tr>")
    parts.append("</table>")
    if main:
        parts += _main_table(cmp, main)
    if figs:
        heads = ", ".join(cmp.figure_estimators)
        parts.append("<h2>Figures</h2>" + (f"<p>Each figure draws the headline estimators ({e(heads)}); the table "
                                           "above and compare.parquet hold every estimator.</p>" if heads else ""))
        for s, p in figs:
            data = base64.b64encode(Path(p).read_bytes()).decode("ascii")
            parts.append(f"<h3>{e(s)}</h3><img alt='{e(s)}' src='data:image/png;base64,{data}'>")
    parts.append("<p>All statistics: compare.parquet / compare.json (one row per run and statistic).</p>"
                 "</body></html>")
    return "\n".join(parts)


def _main_table(cmp: Any, main: Sequence[str]) -> list[str]:
    """The main statistics, one row per statistic and one column per run: ``value [lo, hi]`` where the run's
    stats.json has the 95% CI, the value alone otherwise, marked :data:`SMALL_MARK` for a too-small run."""
    e = html.escape
    t = cmp.table
    small = cmp.too_small
    runs = [r["run"] for r in cmp.runs]
    sub = t[t["series"].isin(main)]
    any_ci = bool((sub["ci_low"].notna() & sub["ci_high"].notna()).any())
    head = ("value [95% CI] where the run has one" if any_ci else "values only: no run has an interval")
    if small:
        head += f"; {SMALL_MARK} too small: a point estimate, no interval"
    out = [f"<h2>Main statistics ({e(head)})</h2><table><tr><th>statistic</th>"
           + "".join(f"<th>{e(str(r))}{SMALL_MARK if r in small else ''}</th>" for r in runs) + "</tr>"]
    for stat, d in sub.groupby("statistic", sort=False):
        cells = []
        for r in runs:
            row = d[d["run"] == r]
            if row.empty:
                cells.append("<td></td>")
                continue
            v, lo, hi = (float(row[c].iloc[0]) for c in ("value", "ci_low", "ci_high"))
            ci = f" [{_fmt(lo)}, {_fmt(hi)}]" if not (math.isnan(lo) or math.isnan(hi)) else ""
            mark = SMALL_MARK if r in small and not math.isnan(v) else ""
            cells.append(f"<td class='small'>{_fmt(v)}{mark}</td>" if mark else f"<td>{_fmt(v)}{ci}</td>")
        out.append(f"<tr><td>{e(str(stat))}</td>{''.join(cells)}</tr>")
    out.append("</table>")
    return out
