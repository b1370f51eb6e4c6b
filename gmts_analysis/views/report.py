"""The self-contained HTML report of a run directory: ``report.html``.

One file, readable offline: styles, script and images are inline (PNG as data URIs),
nothing is fetched. It shows the run's configuration and model (manifest.json), the
statistics with their 95% CIs (stats.json), the figures, and an audit view of answers as
token heatmaps: hovering a token shows its entropy, probability, grad_norm, gmts and
whether each method's selection keeps it (a click pins the details). Answers are ordered
so those where entropy and GMTS selections (top rho, the run's ``--rho``, batch scope) disagree
most come first; they are paged (with a search box), and the page says how many are shown.

Every piece of text from the model, the rollouts or the manifest is HTML-escaped; the
token data used by the script sits in ``data-`` attributes (escaped) and is written to the
page with ``textContent`` only. The audit view, with the page's style and script, is
:mod:`gmts_analysis.views.report_audit`; sizes, escaping and number formats :mod:`gmts_analysis.views.report_text`.
"""

from __future__ import annotations

import base64
import io as _io
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gmts_analysis.analysis.runs import RunTables, load_run
from gmts_analysis.analysis.stats import estimator_table, stats_table
from gmts_analysis.analysis.stats_types import CrossEntry, Statistics, WithinEntry
from gmts_analysis.analysis.summary import findings
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import atomic_write_text
from gmts_analysis.views.report_audit import CSS, JS, _audit_section
from gmts_analysis.views.report_text import (  # noqa: F401 - MAX_ANSWERS, PAGE_SIZE importable from here
    MAX_ANSWERS,
    PAGE_SIZE,
    _ci,
    _e,
    _fmt,
)

log = logging.getLogger(__name__)

SUMMARY_FIELDS = (
    ("model", ("model_path", "model", ("config", "model"))),
    ("model class", ("model_class", "model_type")),
    ("parameters", ("n_parameters",)),
    ("device / dtype", ("device_name", "device")),
    ("dtype", ("dtype", ("config", "dtype"))),
    ("gradient norms", ("grad_norm_method", ("config", "grad_norm"))),
    ("temperature", (("config", "temperature"),)),
    ("advantage", (("config", "advantage"),)),
    ("loss aggregation", (("config", "loss_agg"),)),
    ("rollouts", (("rollouts", "path"), ("config", "rollouts"))),
    ("created", ("created",)),
    ("seed", ("seed", ("config", "seed"))),
)


def _lookup(manifest: Mapping, keys: tuple) -> Any:
    for k in keys:
        if isinstance(k, tuple):
            d: Any = manifest
            for kk in k:
                d = d.get(kk) if isinstance(d, Mapping) else None
            if d not in (None, ""):
                return d
        elif manifest.get(k) not in (None, ""):
            return manifest.get(k)
    return None


def _config_section(manifest: Mapping, st: Statistics) -> str:
    rows = []
    for k, v in manifest.items():
        if isinstance(v, Mapping):
            inner = "".join(
                f"<tr><td>{_e(k2)}</td><td>{_e(v2 if not isinstance(v2, (dict, list)) else _short(v2))}</td></tr>"
                for k2, v2 in v.items()
            )
            rows.append(f'<tr><th>{_e(k)}</th><td><table class="inner">{inner}</table></td></tr>')
        else:
            rows.append(f"<tr><th>{_e(k)}</th><td>{_e(_short(v))}</td></tr>")
    summary = "".join(
        f"<tr><th>{_e(label)}</th><td>{_e(_short(v))}</td></tr>"
        for label, keys in SUMMARY_FIELDS
        if (v := _lookup(manifest, keys)) is not None
    )
    meta = st.meta
    counts = (
        f"{_fmt(meta.n_answers)} answers in {_fmt(meta.n_groups)} groups, "
        f"{_fmt(meta.n_tokens)} response tokens; bootstrap: {_fmt(meta.n_boot)} resamples "
        f"of {meta.ci_unit or 'answer'}s, seed {_fmt(meta.seed)}"
    )
    full = (f'<details><summary>Full manifest.json</summary><table class="kv">{"".join(rows)}</table></details>'
            if rows else "<p>No manifest.json in this run.</p>")
    table = f'<table class="kv">{summary}</table>' if summary else ""
    return f'<section id="config"><h2>Run</h2><p>{_e(counts)}</p>{table}{full}</section>'


def _short(v: Any, n: int = 300) -> str:
    s = v if isinstance(v, str) else repr(v)
    return s if len(s) <= n else s[: n - 1] + "…"


def _findings_section(st: Statistics) -> str:
    """What the run shows, in sentences generated from its stats (:func:`gmts_analysis.analysis.summary.findings`)."""
    items = "".join(f"<li>{_e(x)}</li>" for x in findings(st))
    return f'<section id="findings"><h2>What this run shows</h2><ul class="findings">{items}</ul></section>' if items else ""


def _ranking_table(st: Statistics) -> str:
    """The estimator ranking (the run's estimators.csv) as an HTML table."""
    t = estimator_table(st)
    if t.empty:
        return ""
    rk = f"{float(st.rho_key):g}"
    head = ("<tr><th>rank</th><th>estimator</th><th>within answer ρ<br><small>mean [95% CI]</small></th>"
            "<th>across answers, ω ≠ 0<br><small>ρ [95% CI]</small></th><th>across answers, all tokens<br>"
            f"<small>ρ [95% CI]</small></th><th>waste, top-{rk} batch<br><small>[95% CI]</small></th></tr>")
    rows = []
    for _, r in t.iterrows():
        cls = ' class="key"' if r["estimator"] in ("entropy", "gmts") else ""
        rows.append(
            f"<tr{cls}><td>{int(r['rank'])}</td><td>{_e(r['estimator'])}</td>"
            f"<td>{_ci(r['within_mean'], r['within_ci_low'], r['within_ci_high'])}</td>"
            f"<td>{_ci(r['cross_inf_spearman'], r['cross_inf_ci_low'], r['cross_inf_ci_high'])}</td>"
            f"<td>{_ci(r['cross_spearman'], r['cross_ci_low'], r['cross_ci_high'])}</td>"
            f"<td>{_ci(r['waste_batch'], r['waste_batch_ci_low'], r['waste_batch_ci_high'])}</td></tr>"
        )
    body = "".join(rows)
    return ("<h3>Estimators ranked by agreement with the exact gradient</h3><p>Rank: by the sum of the ranks by "
            "within-answer mean ρ and by informative cross-answer ρ (the run's <code>estimators.csv</code>).</p>"
            f'<div class="scroll"><table class="stats"><thead>{head}</thead><tbody>{body}</tbody></table></div>')


def _stats_section(st: Statistics) -> str:
    rho_label = f"{float(st.rho_key):g}"
    t = stats_table(st)
    if t.empty:
        return '<section id="stats"><h2>Statistics</h2><p>No statistics.</p></section>'
    unit = st.meta.ci_unit or "answer"
    min_tokens = st.meta.min_tokens if st.meta.has("min_tokens") else 5
    head = (
        "<tr><th>estimator</th><th>within answer ρ<br><small>median (mean [95% CI])</small></th>"
        "<th>n answers</th><th>across answers ρ<br><small>all tokens [95% CI]</small></th>"
        "<th>across answers ρ<br><small>ω ≠ 0 [95% CI]</small></th><th>Kendall τ<sub>b</sub><br><small>all</small></th>"
        f"<th>within group ρ<br><small>median</small></th><th>top-{rho_label} overlap<br><small>batch / group [95% CI]</small></th>"
        f"<th>top-{rho_label} waste<br><small>batch / group</small></th>"
        "<th>update fidelity<br><small>cosine / norm ratio</small></th></tr>"
    )
    body = []
    for _, r in t.iterrows():
        cls = ' class="key"' if r["estimator"] in ("entropy", "gmts") else ""
        body.append(
            f"<tr{cls}><td>{_e(r['estimator'])}</td>"
            f"<td>{_fmt(r['within_median'])} ({_ci(r['within_mean'], r['within_ci_low'], r['within_ci_high'])})</td>"
            f"<td>{_fmt(r['n_answers'])}</td>"
            f"<td>{_ci(r['cross_spearman'], r['cross_ci_low'], r['cross_ci_high'])}</td>"
            f"<td>{_ci(r['cross_inf_spearman'], r['cross_inf_ci_low'], r['cross_inf_ci_high'])}</td>"
            f"<td>{_fmt(r['cross_kendall'])}</td><td>{_fmt(r['group_median'])}</td>"
            f"<td>{_ci(r['topk_batch'], r['topk_batch_ci_low'], r['topk_batch_ci_high'])} / "
            f"{_ci(r['topk_group'], r['topk_group_ci_low'], r['topk_group_ci_high'])}</td>"
            f"<td>{_fmt(r['waste_batch'])} / {_fmt(r['waste_group'])}</td>"
            f"<td>{_fmt(r['fidelity_cosine'])} / {_fmt(r['fidelity_norm_ratio'])}</td></tr>"
        )
    fid = st.update_fidelity
    refs = " ".join(
        f"<b>{_e(k)}</b> {_fmt(fid[k].cosine)} / {_fmt(fid[k].norm_ratio)};"
        for k in ("all", "oracle", "random") if k in fid
    )
    fid_note = f"<p>Update fidelity references (cosine / norm ratio): {refs}</p>" if refs else (
        "<p>Update fidelity was not computed for this run (it needs the model).</p>"
    )
    excl = st.topk_scopes_excluded
    excl_note = f" {_fmt(excl.get('group'))} groups without any gradient are left out of the group-scope overlap." \
        if excl.get("group") else ""
    slices = "".join(_slice_table(st, sec, title) for sec, title in (("by_domain", "domain"), ("by_step", "step")))
    return (
        '<section id="stats"><h2>Statistics</h2>'
        f"<p>Within answer: Spearman ρ(score, ‖∇ log p‖) inside each answer, over the same informative answers "
        f"(ω ≠ 0, ≥ {_fmt(min_tokens)} tokens, non-constant target) for every score. Across answers: "
        "ρ(score, grad_norm) pooled over all tokens, and over informative tokens (ω ≠ 0) only. CIs: 95% "
        f"percentile cluster bootstrap resampling {_e(unit)}s, never tokens. Overlap: "
        "|S<sub>score</sub> ∩ S<sub>true</sub>| / |S<sub>true</sub>|, S<sub>true</sub> the top "
        f"{rho_label} by grad_norm among tokens with grad_norm &gt; 0 (group scope pooled over groups).{excl_note} "
        "Waste: the share of a selection made of tokens with ω = 0.</p>"
        f'<div class="scroll"><table class="stats"><thead>{head}</thead><tbody>{"".join(body)}</tbody></table></div>'
        f"{fid_note}{_ranking_table(st)}{slices}</section>"
    )


def _slice_table(st: Statistics, section: str, title: str) -> str:
    sl = st.slices(section)
    if not sl:
        return ""
    rk = st.rho_key
    ests = [s for s in ("entropy", "gmts") if s in st.cross_answer]
    head = f"<tr><th>{_e(title)}</th><th>answers</th><th>tokens with ω = 0</th>" + "".join(
        f"<th>{_e(s)}: within median</th><th>{_e(s)}: across ρ, all [CI]</th><th>{_e(s)}: across ρ, ω ≠ 0 [CI]</th>"
        f"<th>{_e(s)}: top-{rk} overlap / waste</th>" for s in ests
    ) + "</tr>"
    rows = []
    for k, blk in sl.items():
        cells = ""
        for s in ests:
            wa = blk.within_answer.get(s) or WithinEntry()
            ca = blk.cross_answer.get(s) or CrossEntry()
            ci = blk.cross_answer_informative.get(s) or CrossEntry()
            tk = blk.topk_overlap.at("batch", s, rk)
            wst = blk.selection_waste.at("batch", s, rk)
            cells += (f"<td>{_fmt(wa.median)}</td><td>{_ci(ca.spearman, ca.ci_low, ca.ci_high)}</td>"
                      f"<td>{_ci(ci.spearman, ci.ci_low, ci.ci_high)}</td>"
                      f"<td>{_fmt(tk)} / {_fmt(wst)}</td>")
        share = blk.zero_advantage.token_share if blk.zero_advantage is not None else None
        rows.append(f"<tr><td>{_e(k)}</td><td>{_fmt(blk.n_answers)}</td><td>{_fmt(share)}</td>{cells}</tr>")
    return f'<h3>By {_e(title)}</h3><div class="scroll"><table class="stats"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table></div>'




def _figures_section(run_dir: Path | None, run: Any) -> str:
    from gmts_analysis.views.figures import FIGURE_CAPTIONS, FIGURES  # deferred: matplotlib

    figdir = run_dir / "figures" if run_dir is not None else None
    items = []
    for name, draw in FIGURES.items():
        png = figdir / f"{name}.png" if figdir is not None else None
        data = png.read_bytes() if png is not None and png.exists() else _render_png(name, draw, run)
        if data is None:
            continue
        b64 = base64.b64encode(data).decode("ascii")
        items.append(
            f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{b64}">'
            f"<figcaption><b>{_e(name)}</b>: {_e(FIGURE_CAPTIONS.get(name, ''))}</figcaption></figure>"
        )
    return f'<section id="figures"><h2>Figures</h2>{"".join(items) or "<p>No figures.</p>"}</section>'


def _render_png(name: str, draw: Any, run: Any) -> bytes | None:
    """The PNG of figure ``name`` drawn by ``draw`` (its entry of :data:`~gmts_analysis.views.figures.FIGURES`)
    from ``run``; None when it is skipped."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    try:
        fig = draw(run)
    except (GmtsError, KeyError, ValueError) as e:
        log.warning("report: figure %s skipped: %s", name, e)
        return None
    if fig is None:
        return None
    FigureCanvasAgg(fig)
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()




def render_report(run_dir: Any, max_answers: int = MAX_ANSWERS) -> str:
    """The report of a run (a directory, or a run in memory) as one HTML string (see module docstring).

    A stats.json or manifest.json whose values are not what gmts writes (edited by hand, damaged)
    is a :class:`GmtsError` naming the run's files, not a raw exception from the rendering."""
    run = run_dir if isinstance(run_dir, RunTables) else load_run(run_dir)
    try:
        st = Statistics.coerce(run.stats)
    except GmtsError as e:  # a stats.json not of the shape gmts writes
        raise _unreadable(run, e) from None
    try:
        return _render_report(run, st, max_answers)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise _unreadable(run, e) from None


def _unreadable(run: Any, e: Exception) -> Exception:
    """The one-line error of a run whose stats or manifest hold values gmts did not write."""
    where = f"{run.path}/stats.json or manifest.json" if run.path is not None else "the run's stats or manifest"
    why = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
    return GmtsError(f"{where}: holds values gmts did not write, the report cannot be drawn "
                     f"({type(e).__name__}: {why}); rerun gmts stats on the run to rewrite stats.json")


def _render_report(run: Any, st: Statistics, max_answers: int) -> str:
    # the probe writes the report inside a staging directory: name the run after its final place
    out = run.manifest.get("config", {}).get("out") if isinstance(run.manifest.get("config"), Mapping) else None
    if run.path is None:
        name = "run in memory"
    else:
        staging = run.path.name.endswith(".partial") or run.path.name.endswith(".gmts-work")
        name = Path(str(out)).name if (out and staging) else run.path.name
    title = f"gmts report: {name}"
    model = run.manifest.get("model") or run.manifest.get("model_path") or ""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # no network at all, even if something slipped in: a strict content security policy
        (
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        ),
        f"<title>{_e(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{_e(title)}</h1>",
        (
            f"<p>Model: <code>{_e(model)}</code> · which tokens matter: per-token entropy vs the exact norm of each "
            "token's policy-gradient term (grad_norm = |ω| · ‖∇ log p‖), and GMTS = entropy · |ω|.</p>"
        ),
        (
            '<nav><a href="#config">run</a> · <a href="#findings">findings</a> · <a href="#stats">statistics</a> · '
            '<a href="#figures">figures</a> · '
            '<a href="#audit">audit</a></nav>'
        ),
        _config_section(run.manifest, st),
        _findings_section(st),
        _stats_section(st),
        _figures_section(run.path, run),
        _audit_section(run.tokens, run.answers, max_answers, rho=float(st.rho_key)),
        f"<script>{JS}</script></body></html>",
    ]
    return "\n".join(parts)


def write_report(run_dir: str | os.PathLike, out: str | os.PathLike | None = None, max_answers: int = MAX_ANSWERS) -> Path:
    """Write ``report.html`` into the run directory (or ``out``) atomically; returns its path."""
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    return atomic_write_text(path, render_report(run_dir, max_answers))
