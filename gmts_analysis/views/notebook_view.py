"""An inline token heatmap for notebooks: ``Run.show()`` and ``Run._repr_html_``.

:func:`render_tokens_html` turns the tokens table into one self-contained HTML fragment:
the answers where entropy and GMTS rank tokens most differently, each token a coloured
``<span>`` whose ``title`` (the browser's own tooltip: no script, no stylesheet, nothing
fetched) carries the same values as the report's hover: entropy, grad_norm, gmts, omega,
log-prob, and when the run has them the importance ratio, the reference log-prob, the k3
KL term and whether the clipped surrogate is flat for the token.

Styles are inline attributes only, so the fragment survives notebook sanitisers (Jupyter,
GitHub, VS Code) and any content security policy that allows inline styles. All text from
the model or the rollouts is HTML-escaped, and control and bidirectional-formatting
characters (e.g. U+202E) are shown as ``⟨U+202E⟩`` instead of acting on the page.

Disagreement of an answer: the mean over its tokens of ``|pct_rank(entropy) -
pct_rank(gmts)|``, percentile ranks taken in the selection scope (the whole batch by
default; see ``docs/definitions.md`` section 5). Tokens kept by the top-``rho`` entropy
selection are underlined (blue), those kept by GMTS overlined (orange).
"""

from __future__ import annotations

import html
import math
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.core.selection import select_top, token_disagreement
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.settings import RunSettings

# (column, label, unit) shown on hover, in this order, when the column is present
HOVER_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("entropy", "entropy", " nats"),
    ("grad_norm", "grad_norm", ""),
    ("gmts", "gmts", ""),
    ("omega", "omega", ""),
    ("logprob", "logprob", " nats"),
    ("ratio", "ratio", ""),
    ("ref_logprob", "ref_logprob", " nats"),
    ("kl_k3", "KL term (k3)", " nats"),
    ("clipped", "clipped", ""),
)
COLOURS = {"entropy": (31, 119, 180), "grad_norm": (214, 39, 40), "gmts": (255, 127, 14)}
MAX_TOKENS_DEFAULT = 300

# bidirectional formatting characters (Unicode "Bidi_Control"): they reorder the text around them
_BIDI = {0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)}


def safe_text(s: Any) -> str:
    """``s`` as HTML text: escaped, with control, bidi and other format characters made visible.

    Newline, tab, space and carriage return become ``↵ → ␣ ⏎`` (as in the report and figures);
    any other character of Unicode category Cc, Cf, Cs, Co or a bidi control becomes
    ``⟨U+XXXX⟩``.
    """
    raw = "" if s is None else str(s)
    raw = raw.replace("\n", "↵").replace("\t", "→").replace(" ", "␣").replace("\r", "⏎")
    out = []
    for ch in raw:
        cp = ord(ch)
        if cp in _BIDI or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co"):
            out.append(f"⟨U+{cp:04X}⟩")
        else:
            out.append(ch)
    return html.escape("".join(out), quote=True)


def _num(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, (bool, np.bool_)):
        return "yes" if v else "no"
    try:
        x = float(v)
    except (TypeError, ValueError):
        return str(v)
    if math.isnan(x):
        return "–"
    return f"{x:.4g}"


def rank_disagreement(
    tokens: pd.DataFrame, a: str = "entropy", b: str = "gmts", scope: str = "batch",
    informative_first: bool = True,
) -> pd.DataFrame:
    """Per answer: ``mean |pct_rank(a) - pct_rank(b)|`` over its tokens (ranks inside ``scope``).

    Returns columns ``answer_id``, ``n_tokens``, ``rank_disagreement`` (in [0, 1]) and
    ``informative`` (some token has omega != 0), sorted most disagreeing first (ties by
    answer order in the table). With ``informative_first``, answers whose tokens all have
    omega = 0 (no gradient at all, whatever their entropy) come after the others. NaN ranks
    count as no disagreement.
    """
    for c in (a, b):
        if c not in tokens.columns:
            raise GmtsError(f"tokens table has no '{c}' column (needed to rank answers by disagreement)")
    df = tokens.reset_index(drop=True)
    d = np.abs(np.nan_to_num(token_disagreement(df, a, b, scope), nan=0.0))
    om = df["omega"].to_numpy(dtype=np.float64) if "omega" in df.columns else np.ones(len(df))
    t = pd.DataFrame({"answer_id": df["answer_id"].to_numpy(), "d": d, "inf": np.nan_to_num(om) != 0})
    g = t.groupby("answer_id", sort=False)
    out = pd.DataFrame({"n_tokens": g.size(), "rank_disagreement": g["d"].mean(),
                        "informative": g["inf"].any()}).reset_index()
    if informative_first:
        keys, asc = ["informative", "rank_disagreement"], [False, False]
    else:
        keys, asc = ["rank_disagreement"], [False]
    return out.sort_values(keys, ascending=asc, kind="stable").reset_index(drop=True)


def render_tokens_html(
    tokens: pd.DataFrame,
    answers: pd.DataFrame | None = None,
    n: int = 5,
    *,
    rho: float = DEFAULT_RHO,
    colour: str = "grad_norm",
    scope: str = "batch",
    max_tokens: int = MAX_TOKENS_DEFAULT,
    answer_ids: list | None = None,
) -> str:
    """An inline HTML heatmap of the ``n`` answers where entropy and GMTS disagree most.

    tokens: the tokens table (``docs/definitions.md`` section 2). answers: the answers table
    (rewards and prompts in the header; optional). colour: the column whose batch percentile
    rank sets each token's background (``entropy``, ``grad_norm`` or ``gmts``). rho: keep
    fraction of the entropy and GMTS selections marked under/over the tokens. answer_ids:
    show these answers (in this order) instead of the most disagreeing ones. max_tokens:
    tokens shown per answer (the header says when an answer is cut).
    """
    if colour not in COLOURS:
        raise GmtsError(f"colour must be one of {', '.join(COLOURS)}, got '{colour}'")
    if n < 1 or max_tokens < 1:
        raise GmtsError("n and max_tokens must be >= 1")
    df = tokens.reset_index(drop=True)
    if df.empty:
        return "<div><i>gmts: no tokens in this run</i></div>"
    if colour not in df.columns or df[colour].isna().all():
        colour = "entropy"
    dis = rank_disagreement(df, "entropy", "gmts", scope)
    shown = _shown_answers(dis, n, answer_ids)
    fields = [f for f in HOVER_FIELDS if f[0] in df.columns]
    h = _Heatmap(
        df=df, pos=df["position"].to_numpy(), cols={c: df[c].to_numpy() for c, _, _ in fields}, fields=fields,
        tok_col=df["token"].to_numpy() if "token" in df.columns else df["token_id"].astype(str).to_numpy(),
        sel_e=select_top(df, "entropy", rho, scope), sel_g=select_top(df, "gmts", rho, scope),
        level=df[colour].rank(pct=True, method="average").fillna(0.0).to_numpy(dtype=np.float64),
        rgb=COLOURS[colour], max_tokens=max_tokens, rows_of=df.groupby("answer_id", sort=False).indices,
        ainfo=answers.drop_duplicates("answer_id").set_index("answer_id") if (
            answers is not None and "answer_id" in answers.columns) else None,
    )
    blocks = [_heat_answer(h, rec) for rec in shown.to_dict("records")]
    n_zero = int((~dis["informative"]).sum())
    zero_note = (f" The {n_zero} answers with omega = 0 on every token (no gradient, whatever the entropy) "
                 "come last." if n_zero and answer_ids is None else "")
    legend = (
        f"<div style=\"font-size:12px;color:#444\">{len(shown)} of {len(dis)} answers, ordered by rank "
        f"disagreement between entropy and GMTS ({safe_text(scope)} scope).{zero_note} Background: {safe_text(colour)} "
        f"(percentile in the run). Underline: kept by entropy, overline: kept by GMTS (top {rho:g}). "
        "Hover a token for its values.</div>"
    )
    return f'<div class="gmts-view" style="max-width:100%">{legend}{"".join(blocks)}</div>'


def _shown_answers(dis: pd.DataFrame, n: int, answer_ids: list | None) -> pd.DataFrame:
    """The rows of :func:`rank_disagreement` to show: the ``n`` first, or ``answer_ids`` in their order."""
    if answer_ids is None:
        return dis.head(n)
    idx = dis.set_index("answer_id")
    missing = [a for a in answer_ids if a not in idx.index]
    if missing:
        raise GmtsError(f"answer id(s) not in the tokens table: {missing[:5]}")
    return idx.loc[list(answer_ids)].reset_index()


@dataclass
class _Heatmap:
    """What the heatmap shows of each token (row ``i`` of ``df``): position, text, hover fields
    ``(column, label, unit)``, the two selections, the colour level in [0, 1] and its ``rgb``."""

    df: pd.DataFrame
    pos: np.ndarray
    cols: dict[str, np.ndarray]
    fields: list
    tok_col: np.ndarray
    sel_e: np.ndarray
    sel_g: np.ndarray
    level: np.ndarray
    rgb: tuple
    max_tokens: int
    rows_of: dict
    ainfo: pd.DataFrame | None


def _heat_span(h: _Heatmap, i: int) -> str:
    """One token: its hover text, background level and selection marks."""
    tip = [f"position {int(h.pos[i])}", f"token {safe_text(repr(str(h.tok_col[i])))}"]
    tip += [f"{label} {_num(h.cols[c][i])}{unit}" for c, label, unit in h.fields]
    tip.append(f"entropy keeps: {'yes' if h.sel_e[i] else 'no'}; GMTS keeps: {'yes' if h.sel_g[i] else 'no'}")
    rgb = h.rgb
    style = (f"background:rgba({rgb[0]},{rgb[1]},{rgb[2]},{0.85 * h.level[i]:.3f});"
             "padding:1px 0;margin-right:1px;"
             f"border-bottom:3px solid {'#1f77b4' if h.sel_e[i] else 'transparent'};"
             f"border-top:3px solid {'#ff7f0e' if h.sel_g[i] else 'transparent'}")
    return (f'<span class="gmts-t" title="{" | ".join(tip)}" style="{style}">'
            f"{safe_text(h.tok_col[i])}</span>")


def _heat_answer(h: _Heatmap, rec: dict) -> str:
    """One answer (``rec``: its row of :func:`rank_disagreement`): a header, then its tokens in order."""
    aid = rec["answer_id"]
    rows = h.rows_of[aid]
    rows = rows[np.argsort(h.pos[rows], kind="stable")]
    n_all = len(rows)
    rows = rows[:h.max_tokens]
    info = h.ainfo.loc[aid] if h.ainfo is not None and aid in h.ainfo.index else None
    first = h.df.iloc[rows[0]] if len(rows) else None
    reward = info.get("reward") if info is not None else (first.get("reward") if first is not None else None)
    adv = first.get("advantage") if first is not None else None
    spans = [_heat_span(h, i) for i in rows]
    cut = f" (first {h.max_tokens} of {n_all} tokens)" if n_all > h.max_tokens else ""
    head = (f"<b>answer {safe_text(aid)}</b> · group {safe_text(first.get('group_id') if first is not None else '')}"
            f" · reward {_num(reward)} · advantage {_num(adv)} · {n_all} tokens{cut}"
            f" · rank disagreement {_num(rec['rank_disagreement'])}")
    return (
        '<div style="border:1px solid #ddd;border-radius:6px;margin:6px 0;padding:6px">'
        f'<div style="font-size:12px;color:#333;margin-bottom:4px">{head}</div>'
        '<div dir="ltr" style="font-family:Menlo,Consolas,monospace;font-size:12px;line-height:1.9;'
        f'white-space:pre-wrap;word-break:break-all">{"".join(spans)}</div></div>'
    )


class TokenView:
    """A rendered heatmap for notebooks: displays itself (``_repr_html_``); ``.html`` is the markup."""

    def __init__(self, html_text: str):
        self.html = html_text

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html


def show(run: Any, n: int = 5, **kw: Any) -> TokenView:
    """``render_tokens_html(run.tokens, run.answers, n, **kw)`` as a displayable object.

    The keep fraction defaults to the run's ``rho`` (manifest config) when it recorded one.
    """
    if "rho" not in kw:
        kw["rho"] = RunSettings.from_manifest(getattr(run, "manifest", None)).rho
    return TokenView(render_tokens_html(run.tokens, getattr(run, "answers", None), n, **kw))
