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
page with ``textContent`` only.
"""

from __future__ import annotations

import base64
import html
import io as _io
import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stats_types import CrossEntry, Statistics, WithinEntry
from gmts_analysis.core.vocabulary import DEFAULT_RHO

log = logging.getLogger(__name__)

MAX_ANSWERS = 200  # answers in the audit view (paged, PAGE_SIZE a page; the page says how many)
MAX_TOKENS = 1000  # tokens shown per answer (an answer cut says so)
PAGE_SIZE = 20
# off-policy columns shown on hover when the run has them: (column, data attribute, label, unit)
OFF_POLICY_FIELDS = (("ratio", "ra", "ratio", ""), ("ref_logprob", "rl", "ref logprob", " nats"),
                     ("kl_k3", "kl", "KL term (k3)", " nats"), ("clipped", "cl", "clipped", ""))


# characters that reorder or hide text: bidi embeddings/overrides/isolates and marks, C0/C1 controls
# (tab and newline excepted), DEL, lone surrogates; shown as <U+XXXX> instead of acting on the page
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                        "\ud800-\udfff]")


def visible(s: str) -> str:
    """``s`` with control and bidi-formatting characters replaced by visible ``<U+XXXX>`` markers."""
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", s)


def _e(x: Any) -> str:
    """HTML-escape any value (quotes too, so it is safe in attributes); control and bidi
    characters become visible ``<U+XXXX>`` markers (:func:`visible`)."""
    return html.escape(visible("" if x is None else str(x)), quote=True)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    try:
        v = float(x)
    except (TypeError, ValueError):
        return _e(x)
    if math.isnan(v):
        return "–"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}f}"


def _g(x: Any) -> str:
    """Four significant digits (compact, for the token data attributes)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(v) else f"{v:.4g}"


def _ci(v: Any, lo: Any, hi: Any) -> str:
    s = _fmt(v)
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        return s
    return f'{s} <span class="ci">[{_fmt(lo)}, {_fmt(hi)}]</span>'


# --------------------------------------------------------------------------- sections


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
    from gmts_analysis.analysis.summary import findings

    items = "".join(f"<li>{_e(x)}</li>" for x in findings(st))
    return f'<section id="findings"><h2>What this run shows</h2><ul class="findings">{items}</ul></section>' if items else ""


def _ranking_table(st: Statistics) -> str:
    """The estimator ranking (the run's estimators.csv) as an HTML table."""
    from gmts_analysis.analysis.stats import estimator_table

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
    from gmts_analysis.analysis.stats import stats_table

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
    from gmts_analysis.views.figures import FIGURE_CAPTIONS, FIGURES

    figdir = run_dir / "figures" if run_dir is not None else None
    items = []
    for name in FIGURES:
        png = figdir / f"{name}.png" if figdir is not None else None
        data = png.read_bytes() if png is not None and png.exists() else _render_png(name, run)
        if data is None:
            continue
        b64 = base64.b64encode(data).decode("ascii")
        items.append(
            f'<figure><img alt="{_e(name)}" src="data:image/png;base64,{b64}">'
            f"<figcaption><b>{_e(name)}</b>: {_e(FIGURE_CAPTIONS.get(name, ''))}</figcaption></figure>"
        )
    return f'<section id="figures"><h2>Figures</h2>{"".join(items) or "<p>No figures.</p>"}</section>'


def _render_png(name: str, run: Any) -> bytes | None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.views.figures import FIGURES

    try:
        fig = FIGURES[name](run)
    except (GmtsError, KeyError, ValueError) as e:
        log.warning("report: figure %s skipped: %s", name, e)
        return None
    if fig is None:
        return None
    FigureCanvasAgg(fig)
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def _flag(v: Any) -> str:
    """yes / no / – for a boolean-like cell (``clipped``)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    return "yes" if bool(v) else "no"


def _search_text(aid: Any, first: Any, prompt: Any, df: pd.DataFrame, rows: np.ndarray) -> str:
    """What the audit's search box matches for one answer: id, group, prompt and response text."""
    toks = "".join(str(t) for t in df["token"].to_numpy()[rows]) if "token" in df.columns else ""
    return f"{aid} {first.get('group_id')} {prompt or ''} {toks}"[:4000]


def _pct(s: pd.Series) -> np.ndarray:
    """Batch-wide percentile rank in [0, 1] (NaN -> 0), so colours compare across answers."""
    r = s.rank(pct=True, method="average").fillna(0.0)
    return r.to_numpy(dtype=np.float64)


@dataclass
class _AuditTokens:
    """What the audit shows of each token: the table, the hover fields ``(column, data attribute, label,
    unit)``, the entropy and GMTS selections, grad_norm and the colour levels ``{e, n, m}``."""

    df: pd.DataFrame
    extra: list[tuple[str, str, str, str]]
    sel_e: np.ndarray
    sel_g: np.ndarray
    gn: pd.Series
    level: dict[str, np.ndarray]


def _audit_tokens(tokens: pd.DataFrame, rho: float) -> _AuditTokens:
    """The selections (top ``rho`` of the batch) and colour levels of every token."""
    from gmts_analysis.core.selection import select_top

    df = tokens.reset_index(drop=True)
    extra = [(c, k, label, unit) for c, k, label, unit in (("omega", "om", "omega", ""),
                                                            ("logprob", "lp", "logprob", " nats"),
                                                            *OFF_POLICY_FIELDS) if c in df.columns]
    have_g = "gmts" in df.columns
    gn = df["grad_norm"] if "grad_norm" in df.columns else pd.Series(np.nan, index=df.index)
    return _AuditTokens(
        df=df, extra=extra, sel_e=select_top(df, "entropy", rho, "batch"),
        sel_g=select_top(df, "gmts", rho, "batch") if have_g else np.zeros(len(df), bool), gn=gn,
        level={"e": _pct(df["entropy"]), "n": _pct(gn), "m": _pct(df["gmts"]) if have_g else np.zeros(len(df))},
    )


def _token_span(a: _AuditTokens, i: int) -> str:
    """One token of the audit: its classes (selections), data attributes (hover values) and colour."""
    from gmts_analysis.views.plots import display_token

    t = a.df.iloc[i]
    level = a.level
    cls = "t" + (" se" if a.sel_e[i] else "") + (" sg" if a.sel_g[i] else "")
    tok = display_token(t.get("token"))
    if str(t.get("token", "")).endswith("\n"):
        tok += "\n"
    return (
        f'<span class="{cls}" data-pos="{int(t["position"])}" data-tok="{_e(t.get("token"))}" '
        f'data-en="{_g(t.get("entropy"))}" data-p="{_g(t.get("prob"))}" '
        f'data-gn="{_g(a.gn.iloc[i])}" data-gm="{_g(t.get("gmts"))}" '
        + "".join(f'data-{k}="{_flag(t.get(c)) if c == "clipped" else _g(t.get(c))}" '
                  for c, k, _, _ in a.extra)
        + f'data-e="{level["e"][i]:.3f}" data-n="{level["n"][i]:.3f}" data-m="{level["m"][i]:.3f}" '
        f'style="background:rgba(31,119,180,{0.85 * level["e"][i]:.3f})">{_e(tok)}</span>'
    )


def _answer_block(a: _AuditTokens, d: Mapping[str, Any], rows: np.ndarray, ans_info: pd.DataFrame | None) -> str:
    """One answer of the audit (``d``: its row of the disagreement table; ``rows``: its token rows)."""
    df = a.df
    aid = d["answer_id"]
    rows = rows[np.argsort(df["position"].to_numpy()[rows], kind="stable")]
    n_all = len(rows)
    rows = rows[:MAX_TOKENS]
    first = df.iloc[rows[0]]
    info = ans_info.loc[aid] if ans_info is not None and aid in ans_info.index else None
    if isinstance(info, pd.DataFrame):
        info = info.iloc[0]
    reward = info.get("reward") if info is not None else first.get("reward")
    prompt = info.get("prompt") if info is not None and "prompt" in info.index else None
    spans = [_token_span(a, i) for i in rows]
    cut = f" (first {MAX_TOKENS} of {n_all} tokens)" if n_all > MAX_TOKENS else ""
    prompt_html = (
        f'<details><summary>prompt</summary><pre class="prompt">{_e(prompt)}</pre></details>' if prompt else ""
    )
    return (
        f'<div class="answer" data-aid="{_e(aid)}" data-text="{_e(_search_text(aid, first, prompt, df, rows))}">'
        f'<div class="ahead"><b>answer {_e(aid)}</b> · group {_e(first.get("group_id"))} · '
        f"reward {_fmt(reward)} · advantage {_fmt(first.get('advantage'))} · {n_all} tokens{_e(cut)} · "
        f"kept by entropy only: {int(d.get('n_only_entropy', 0))}, by GMTS only: {int(d.get('n_only_gmts', 0))}"
        f"</div>{prompt_html}<div class=\"toks\">{''.join(spans)}</div></div>"
    )


def _audit_section(tokens: pd.DataFrame, answers: pd.DataFrame | None, max_answers: int, rho: float = DEFAULT_RHO) -> str:
    """The audit: the ``max_answers`` answers whose tokens entropy and GMTS select most differently."""
    from gmts_analysis.core.selection import answer_disagreement

    a = _audit_tokens(tokens, rho)
    df = a.df
    dis = answer_disagreement(df, "entropy", "gmts", rho, "batch") if "gmts" in df.columns else (
        pd.DataFrame({"answer_id": df["answer_id"].unique(), "n_disagree": 0, "frac_disagree": 0.0,
                      "n_only_entropy": 0, "n_only_gmts": 0})
    )
    shown = dis.head(max_answers)
    ans_info = answers.set_index("answer_id") if answers is not None and "answer_id" in answers.columns else None
    rows_of = df.groupby("answer_id", sort=False).indices
    # records keep each column's type (ids stay ints)
    blocks = [_answer_block(a, d, rows_of[d["answer_id"]], ans_info) for d in shown.to_dict("records")]
    return _audit_html(len(shown), df["answer_id"].nunique(), rho, a.extra, blocks)


def _audit_html(n_shown: int, n_total: int, rho: float, extra: list, blocks: list[str]) -> str:
    """The audit section around its answer blocks: explanation, search, pages and colour controls."""
    hover = "".join(f'<span data-k="{k}" data-label="{_e(label)}" data-unit="{_e(unit)}"></span>'
                    for _, k, label, unit in extra)
    more = (f" The {n_total - n_shown} least disagreeing answers are not in this file: "
            "write more with gmts figures RUN_DIR --report --max-answers N." if n_total > n_shown else "")
    return (
        '<section id="audit"><h2>Audit: answers where entropy and GMTS disagree most</h2>'
        f"<p>{n_shown} of {n_total} answers, ordered by the number of tokens kept by exactly one of the two "
        f"selections (top {rho:g} of the batch), {PAGE_SIZE} a page.{_e(more)} Underline: kept by entropy; "
        "overline: kept by GMTS. Hover a token for its values, click to pin them.</p>"
        f'<div id="hoverfields" hidden>{hover}</div>'
        '<div class="controls">search: <input type="search" id="search" placeholder="answer id, group or text"> '
        '<button type="button" id="prev">previous</button> <span id="pageinfo"></span> '
        '<button type="button" id="next">next</button></div>'
        '<div class="controls">colour by: '
        '<label><input type="radio" name="mode" value="e" checked> entropy</label> '
        '<label><input type="radio" name="mode" value="n"> grad_norm</label> '
        '<label><input type="radio" name="mode" value="m"> gmts</label> '
        '<span class="legend"><span class="t se">entropy keeps</span> <span class="t sg">GMTS keeps</span> '
        '<span class="t se sg">both</span></span></div>'
        '<div id="details" class="details">click a token</div>'
        f'{"".join(blocks)}</section>'
    )

CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 80px;color:#222}
h1{font-size:1.5em}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:1.6em}
table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
table.stats td{text-align:right;white-space:nowrap}table.stats td:first-child{text-align:left}
tr.key{background:#f6f8fa;font-weight:600}.ci{color:#666;font-weight:normal}
table.inner td{border:none;padding:0 6px}.scroll{overflow-x:auto}
figure{margin:16px 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:13px;color:#444}
.answer{border:1px solid #ddd;border-radius:6px;margin:10px 0;padding:8px}
.ahead{font-size:13px;color:#333;margin-bottom:6px}.toks .t{margin-right:1px}.toks{font-family:Menlo,Consolas,monospace;font-size:13px;line-height:1.9;white-space:pre-wrap;word-break:break-all}
.t{padding:1px 0;border-top:3px solid transparent;border-bottom:3px solid transparent;cursor:pointer}
.t.se{border-bottom-color:#1f77b4}.t.sg{border-top-color:#ff7f0e}.t.pinned{outline:2px solid #d62728}
.legend .t{padding:0 4px;margin-left:8px}
.details{position:sticky;top:0;background:#fffbe6;border:1px solid #e6d27a;padding:4px 8px;font-size:13px;z-index:2;min-height:1.4em;font-family:Menlo,Consolas,monospace}
.controls{margin:8px 0;font-size:14px}pre.prompt{white-space:pre-wrap;background:#f6f8fa;padding:6px;font-size:12px}
"""

JS = """
(function(){
  var det=document.getElementById('details');
  if(!det){return;}
  var colours={e:[31,119,180],n:[214,39,40],m:[255,127,14]};
  var pinned=null;
  function show(el){
    var d=el.dataset;
    var box=el.closest('.answer');
    det.textContent='answer '+(box?box.dataset.aid:'?')+' | token '+JSON.stringify(d.tok)+' @ position '+d.pos+' | entropy '+d.en+' nats | prob '+d.p+
      ' | grad_norm '+d.gn+' | gmts '+d.gm+' | entropy keeps: '+(el.classList.contains('se')?'yes':'no')+
      ' | GMTS keeps: '+(el.classList.contains('sg')?'yes':'no')+extra(d);
  }
  var fields=[];
  document.querySelectorAll('#hoverfields span').forEach(function(f){fields.push(f.dataset);});
  function extra(d){
    var s='';
    fields.forEach(function(f){ if(d[f.k]!==undefined){ s+=' | '+f.label+' '+d[f.k]+f.unit; } });
    return s;
  }
  var toks=document.querySelectorAll('.toks .t');
  toks.forEach(function(el){
    el.addEventListener('mouseenter',function(){ if(!pinned){show(el);} });
    el.addEventListener('click',function(){
      if(pinned){pinned.classList.remove('pinned');}
      if(pinned===el){pinned=null;return;}
      pinned=el;el.classList.add('pinned');show(el);
    });
  });
  function recolour(mode){
    var c=colours[mode];
    toks.forEach(function(el){
      var a=parseFloat(el.dataset[mode])||0;
      el.style.background='rgba('+c[0]+','+c[1]+','+c[2]+','+(0.85*a).toFixed(3)+')';
    });
  }
  document.querySelectorAll('input[name=mode]').forEach(function(r){
    r.addEventListener('change',function(){ if(r.checked){recolour(r.value);} });
  });
  var boxes=Array.prototype.slice.call(document.querySelectorAll('#audit .answer'));
  var size=20, page=0, query='';
  var info=document.getElementById('pageinfo'), search=document.getElementById('search');
  function matching(){
    return boxes.filter(function(b){ return !query || b.dataset.text.toLowerCase().indexOf(query)>=0; });
  }
  function draw(){
    var m=matching(), pages=Math.max(1,Math.ceil(m.length/size));
    if(page>=pages){page=pages-1;}
    boxes.forEach(function(b){b.hidden=true;});
    m.slice(page*size,(page+1)*size).forEach(function(b){b.hidden=false;});
    var lo=m.length?page*size+1:0, hi=Math.min(m.length,(page+1)*size);
    info.textContent='answers '+lo+'-'+hi+' of '+m.length+(query?' matching (of '+boxes.length+' in this report)':'');
  }
  document.getElementById('prev').addEventListener('click',function(){ if(page>0){page--;draw();} });
  document.getElementById('next').addEventListener('click',function(){ page++;draw(); });
  search.addEventListener('input',function(){ query=search.value.toLowerCase(); page=0; draw(); });
  draw();
})();
"""


def render_report(run_dir: Any, max_answers: int = MAX_ANSWERS) -> str:
    """The report of a run (a directory, or a run in memory) as one HTML string (see module docstring).

    A stats.json or manifest.json whose values are not what gmts writes (edited by hand, damaged)
    is a :class:`GmtsError` naming the run's files, not a raw exception from the rendering."""
    from gmts_analysis.analysis.runs import RunTables
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.views.plots import load_run

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
    from gmts_analysis.errors import GmtsError

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
    from gmts_analysis.util.io import atomic_write_text

    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    return atomic_write_text(path, render_report(run_dir, max_answers))
