"""The audit view of the HTML report: answers as token heatmaps, paged and searchable, with each
token's entropy, probability, grad_norm, gmts and selections on hover; the page's style and script.

Every text is HTML-escaped; token data sits in ``data-`` attributes and reaches the page through
``textContent`` only (:mod:`gmts_analysis.views.report`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.core.selection import answer_disagreement, select_top
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.util.style import display_token
from gmts_analysis.views.report_text import MAX_TOKENS, OFF_POLICY_FIELDS, PAGE_SIZE, _e, _fmt, _g


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
