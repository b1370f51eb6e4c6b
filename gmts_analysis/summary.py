"""Words that follow the numbers: the printed summary of a run, generated from its stats.json.

Every sentence here is computed from a stats dict (version 2, :mod:`gmts_analysis.stats`):
nothing is hand-written about a particular run, so the printed table of ``gmts run``, the
report, the README's results paragraph and notebook 01 cannot contradict the run they show.

- :func:`summary_table`: Spearman with the gradient norm for entropy and GMTS, over all tokens
  and over informative tokens (omega != 0), with the zero-advantage share, overall and per slice.
- :func:`findings`: a few sentences: the zero-advantage share, the cross-answer Spearman over
  all vs informative tokens (with CIs), how much of entropy's gap to GMTS is left on
  informative tokens, selection waste, top-k overlap, and which score ranks best.
- :func:`summary_text`: both, as ``gmts run`` prints them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any


def _v(d: Any, *keys: str) -> float:
    for k in keys:
        if not isinstance(d, Mapping) or k not in d:
            return float("nan")
        d = d[k]
    try:
        return float("nan") if d is None else float(d)
    except (TypeError, ValueError):
        return float("nan")


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def _signed(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.3f}"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.0f}%"


def _ci(d: Mapping | None, key: str, digits: int = 2, pct: bool = False) -> str:
    """``value [lo, hi]`` of a stats entry."""
    f = _pct if pct else (lambda x: _num(x, digits))
    v, lo, hi = _v(d, key), _v(d, "ci_low"), _v(d, "ci_high")
    if math.isnan(lo) or math.isnan(hi):
        return f(v)
    return f"{f(v)} [{f(lo)}, {f(hi)}]"


def summary_table(stats: Mapping[str, Any], slices: Sequence[str] | None = None, section: str = "by_domain") -> str:
    """A fixed-width table: one row for the whole run and one per slice of ``section``
    (``slices``: which, in order; default all). Columns: share of tokens with omega = 0, then for
    entropy and gmts the within-answer median, and the cross-answer Spearman over all tokens
    and over informative tokens."""
    ests = [s for s in ("entropy", "gmts") if s in (stats.get("cross_answer") or {})]

    def cells(b: Mapping) -> list[str]:
        out = [_pct(_v(b, "zero_advantage", "token_share"))]
        for s in ests:
            out += [_signed(_v(b, "within_answer", s, "median")), _signed(_v(b, "cross_answer", s, "spearman")),
                    _signed(_v(b, "cross_answer_informative", s, "spearman"))]
        return out

    header = ["scope", "omega=0"]
    for s in ests:
        header += [f"{s} within", f"{s} cross", f"{s} cross inf."]
    rows = [["all", *cells(stats)]]
    by = stats.get(section) or {}
    for k in (slices if slices is not None else list(by)):
        if k in by:
            rows.append([str(k), *cells(by[k])])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    n_within = _v(stats, "within_answer", "entropy", "n_answers")
    lines = [
        textwrap.fill(
            "Spearman with the per-token gradient norm. within: median over the same "
            f"{_num(n_within, 0)} informative answers, vs grad_norm_logp; cross: all tokens pooled, vs grad_norm; "
            "cross inf.: only tokens with omega != 0; omega=0: share of tokens without gradient", width=100),
        "  ".join(h.ljust(w) for h, w in zip(header, widths)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _ranking_sentence(stats: Mapping[str, Any]) -> str | None:
    from gmts_analysis.stats import estimator_table

    t = estimator_table(stats)
    t = t[t["estimator"] != "abs_omega"]  # a baseline, constant inside answers
    if t.empty or t["within_mean"].isna().all():
        return None
    n = int(_v(stats, "within_answer", "entropy", "n_answers")) if "entropy" in set(t["estimator"]) else None
    w = t.sort_values(["within_mean", "estimator"], ascending=[False, True], kind="stable")
    best = w.iloc[0]
    tied = [r["estimator"] for _, r in w.iterrows() if r["within_mean"] == best["within_mean"]]
    name = " and ".join(tied) + (" (identical ranks)" if len(tied) > 1 else "")
    verb = "track" if len(tied) > 1 else "tracks"
    parts = [f"Within answers, {name} {verb} the exact gradient best (mean Spearman "
             f"{_num(best['within_mean'], 3)} [{_num(best['within_ci_low'], 3)}, {_num(best['within_ci_high'], 3)}]"
             + (f" over {n} answers" if n else "") + ")"]
    if "entropy" in set(t["estimator"]) and "entropy" not in tied:
        e = t.set_index("estimator").loc["entropy"]
        overlap = not (e["within_ci_high"] < best["within_ci_low"])
        parts.append(f"entropy {_num(e['within_mean'], 3)} [{_num(e['within_ci_low'], 3)}, "
                     f"{_num(e['within_ci_high'], 3)}]" + (", CIs overlapping" if overlap else ""))
    others = [r for _, r in w.iterrows() if r["estimator"] not in tied and r["estimator"] != "entropy"][:2]
    if others:
        parts.append(", ".join(f"{r['estimator']} {_num(r['within_mean'], 3)}" for r in others))
    c = t.dropna(subset=["cross_inf_spearman"]).sort_values(["cross_inf_spearman", "estimator"],
                                                             ascending=[False, True], kind="stable")
    s = "; ".join(parts) + "."
    if not c.empty:
        cb = c.iloc[0]
        s += (f" Across answers on informative tokens, {cb['estimator']} ranks best "
              f"({_num(cb['cross_inf_spearman'], 3)} [{_num(cb['cross_inf_ci_low'], 3)}, "
              f"{_num(cb['cross_inf_ci_high'], 3)}]).")
    s += f" Ranked by both (estimators.csv): {', '.join(t['estimator'].head(4))}" + (", ..." if len(t) > 4 else ".")
    return s


def findings(stats: Mapping[str, Any]) -> list[str]:
    """Plain-text sentences that state what the run's statistics show (see module docstring)."""
    from gmts_analysis.stats import run_rho_key

    out: list[str] = []
    rk = run_rho_key(stats)  # the run's keep fraction (--rho), a stats key such as "0.2"
    keep = f"{100 * float(rk):g}%"
    meta = stats.get("meta") or {}
    za = stats.get("zero_advantage") or {}
    unit = meta.get("ci_unit", "group")
    if za:
        n_tok = _v(meta, "n_tokens")
        groups = f" in {int(_v(za, 'groups'))} of {int(_v(meta, 'n_groups'))} groups" if za.get("groups") is not None \
            and meta.get("n_groups") else ""
        out.append(
            f"{int(_v(za, 'tokens')):,} of {int(n_tok):,} tokens ({_pct(_v(za, 'token_share'))}) carry no gradient "
            f"(omega = 0): {int(_v(za, 'answers'))} of {int(_v(meta, 'n_answers'))} answers{groups} have a zero "
            "advantage (every reward of their group equal)."
        )
    ca, ci = stats.get("cross_answer") or {}, stats.get("cross_answer_informative") or {}
    if "entropy" in ca and "gmts" in ca:
        out.append(
            f"Across answers, entropy's Spearman with grad_norm is {_ci(ca['entropy'], 'spearman')} over all tokens "
            f"and {_ci(ci.get('entropy'), 'spearman')} over informative tokens; GMTS: "
            f"{_ci(ca['gmts'], 'spearman')} and {_ci(ci.get('gmts'), 'spearman')} (95% CIs, bootstrap over {unit}s)."
        )
        gap_all = _v(ca, "gmts", "spearman") - _v(ca, "entropy", "spearman")
        gap_inf = _v(ci, "gmts", "spearman") - _v(ci, "entropy", "spearman")
        if not (math.isnan(gap_all) or math.isnan(gap_inf)):
            if gap_all > 0:
                share = max(0.0, min(1.0, 1 - gap_inf / gap_all))
                out.append(
                    f"Entropy's gap to GMTS shrinks from {_num(gap_all)} over all tokens to {_num(gap_inf)} over "
                    f"informative tokens: leaving out the tokens without gradient closes {_pct(share)} of it; the "
                    f"rest ({_pct(1 - share)}) is the magnitude of |omega| among informative tokens."
                )
            else:
                out.append(f"Across answers entropy is not behind GMTS here (gap {_num(gap_all)} over all tokens).")
    sw, swc = stats.get("selection_waste") or {}, stats.get("selection_waste_ci") or {}
    if "batch" in sw and "entropy" in sw["batch"]:
        parts = []
        for scope in ("batch", "group"):
            if scope not in sw:
                continue
            vals = ", ".join(
                f"{s} {_ci(dict(value=_v(sw, scope, s, rk), **(swc.get(scope, {}).get(s, {}).get(rk) or {})), 'value', pct=True)}"
                for s in ("entropy", "gmts") if s in sw[scope]
            )
            parts.append(f"{scope} scope: {vals}")
        out.append(f"Share of a top-{keep} selection spent on tokens with omega = 0 ({'; '.join(parts)}).")
        if "group" in sw:
            g = [_v(sw, "group", s, rk) for s in sw["group"]]
            if g and max(g) - min(g) < 1e-12 and g[0] > 0:
                out.append(f"Per group every score spends the same {_pct(g[0])}: a group without gradient still gets "
                           "its quota of picks.")
    tk, tkc = stats.get("topk_overlap") or {}, stats.get("topk_overlap_ci") or {}
    if tk:
        excl = stats.get("topk_scopes_excluded") or {}
        parts = []
        for s in ("entropy", "gmts"):
            vals = " / ".join(
                _ci(dict(value=_v(tk, scope, s, rk), **(tkc.get(scope, {}).get(s, {}).get(rk) or {})), "value")
                for scope in ("batch", "group") if scope in tk and s in tk[scope]
            )
            parts.append(f"{s} {vals}")
        n_ex = int(_v(excl, "group")) if "group" in excl else 0
        note = f"; {n_ex} groups without gradient left out" if n_ex else ""
        out.append(
            f"Top-{keep} overlap with the top {keep} by grad_norm (batch / group scope): " + ", ".join(parts) + note + "."
        )
    r = _ranking_sentence(stats)
    if r:
        out.append(r)
    return out


def summary_text(stats: Mapping[str, Any], slices: Sequence[str] | None = None, width: int = 100) -> str:
    """The table of :func:`summary_table` followed by :func:`findings`, wrapped at ``width``."""
    words = "\n".join(textwrap.fill(s, width=width, break_on_hyphens=False) for s in findings(stats))
    return summary_table(stats, slices) + "\n\n" + words


README_BEGIN = "<!-- gmts-results:begin (generated from data/example_run/stats.json by gmts_analysis.summary.update_readme) -->"
README_END = "<!-- gmts-results:end -->"


def readme_block(stats: Mapping[str, Any], slices: Sequence[str] | None = None) -> str:
    """The README's results block: :func:`summary_text` in a code fence between the markers."""
    return f"{README_BEGIN}\n```\n{summary_text(stats, slices)}\n```\n{README_END}"


def update_readme(readme: str, stats: Mapping[str, Any], slices: Sequence[str] | None = None) -> str:
    """``readme`` (the text) with its results block replaced by :func:`readme_block` of ``stats``."""
    a, b = readme.find(README_BEGIN), readme.find(README_END)
    if a < 0 or b < a:
        raise ValueError("README has no generated results block (markers missing)")
    return readme[:a] + readme_block(stats, slices) + readme[b + len(README_END):]
