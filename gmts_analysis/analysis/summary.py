"""Words that follow the numbers: the printed summary of a run, generated from its stats.json.

Every sentence here is computed from a run's statistics (version 3, :mod:`gmts_analysis.analysis.stats`;
read as :class:`gmts_analysis.analysis.stats_types.Statistics`, a stats dict is accepted too):
nothing is hand-written about a particular run, so the printed table of ``gmts run``, the
report, the README's results paragraph and notebook 01 cannot contradict the run they show.

- :func:`summary_table`: Spearman with the gradient norm for entropy and GMTS, over all tokens
  and over informative tokens (omega != 0), with the zero-advantage share, overall and per slice.
- :func:`findings`: a few sentences: the zero-advantage share, the cross-answer Spearman over
  all vs informative tokens (with CIs), the uncertain tokens (prob < meta.uncertain_below) and
  the share of the gradient they hold, the gradient mass a top-rho selection captures (with the
  masked baseline entropy_inf), selection waste, top-k overlap, which scores rank best, and the
  scope of the intervals. Comparisons are only as strong as their paired CI (:func:`compare`);
  identities (``by_construction``) are never stated as findings.
- :func:`summary_text`: both, as ``gmts run`` prints them.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from gmts_analysis.analysis.score_roles import (
    ENTROPY,
    cross_answer_names,
    masked_of,
    mass_capture_names,
    topk_names,
    waste_names,
    within_answer_names,
)
from gmts_analysis.analysis.stats_types import Block, CrossEntry, Slice, Statistics, WithinEntry
from gmts_analysis.core.scores import UNCERTAIN_CONTRAST_SCORES
from gmts_analysis.core.vocabulary import MIN_GROUPS
from gmts_analysis.util.io import atomic_write_text, read_json
from gmts_analysis.util.markers import block_markers, find_block

StatsLike = Statistics | Mapping[str, Any]


def _f(x: Any) -> float:
    """A count or statistic as a float (NaN when the file lacks it)."""
    return float("nan") if x is None else float(x)


def _num(x: float, digits: int = 2) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def _signed(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.3f}"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.0f}%"


def _ci(value: Any, iv: Any, digits: int = 2, pct: bool = False) -> str:
    """``value [lo, hi]``: a statistic with the 95% CI of ``iv`` (anything with ``ci_low``/``ci_high``)."""
    f = _pct if pct else (lambda x: _num(x, digits))
    v, lo, hi = _f(value), _f(iv.ci_low), _f(iv.ci_high)
    if math.isnan(lo) or math.isnan(hi):
        return f(v)
    return f"{f(v)} [{f(lo)}, {f(hi)}]"


def _rho_ci(e: CrossEntry | None) -> str:
    """A cross-answer Spearman with its CI ("n/a" when the estimator is absent)."""
    e = e or CrossEntry()
    return _ci(e.spearman, e)


def _table_cells(b: Block, ests: list[str]) -> list[str]:
    """One row of :func:`summary_table`: the omega = 0 share, then per estimator within / cross / cross inf."""
    out = [_pct(b.zero_advantage.token_share if b.zero_advantage is not None else float("nan"))]
    for s in ests:
        out += [_signed((b.within_answer.get(s) or WithinEntry()).median),
                _signed((b.cross_answer.get(s) or CrossEntry()).spearman),
                _signed((b.cross_answer_informative.get(s) or CrossEntry()).spearman)]
    return out


def summary_table(stats: StatsLike, slices: Sequence[str] | None = None, section: str = "by_domain") -> str:
    """A fixed-width table: one row for the whole run and one per slice of ``section``
    (``slices``: which, in order; default all). Columns: share of tokens with omega = 0, then for
    entropy and gmts the within-answer median, and the cross-answer Spearman over all tokens
    and over informative tokens."""
    st = Statistics.coerce(stats)
    ests = [s for s in ("entropy", "gmts") if s in st.cross_answer]
    header = ["scope", "omega=0"]
    for s in ests:
        header += [f"{s} within", f"{s} cross", f"{s} cross inf."]
    rows = [["all", *_table_cells(st, ests)]]
    by = st.slices(section)
    few = []
    for k in (slices if slices is not None else list(by)):
        if k in by:
            n_g = _slice_units(by[k])
            flag = "*" if n_g is not None and n_g < MIN_GROUPS else ""
            if flag:
                few.append(f"{k} ({n_g})")
            rows.append([str(k) + flag, *_table_cells(by[k], ests)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    n_within = _f((st.within_answer.get("entropy") or WithinEntry()).n_answers)
    lines = [
        textwrap.fill(
            "Spearman with the per-token gradient norm. within: median over the same "
            f"{_num(n_within, 0)} informative answers, vs grad_norm_logp; cross: all tokens pooled, vs grad_norm; "
            "cross inf.: only tokens with omega != 0; omega=0: share of tokens without gradient", width=100),
        "  ".join(h.ljust(w) for h, w in zip(header, widths)),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    if few:
        lines.append(f"* fewer than {MIN_GROUPS} groups: {', '.join(few)}; read its numbers as indicative only")
    return "\n".join(lines)


def _units(n: Any, unit: str) -> str:
    """``"1 group"``, ``"8 groups"``: a count with its noun in the right number."""
    return f"{n} {unit}" + ("" if n == 1 else "s")


def _slice_units(block: Slice) -> int | None:
    """Groups of a slice (its within_group count over informative groups plus its groups without
    signal), or None when unknown."""
    ng = _f((block.within_group.get("entropy") or WithinEntry()).n_groups)
    zg = _f(block.zero_advantage.groups if block.zero_advantage is not None else None)
    if math.isnan(ng) and math.isnan(zg):
        return None
    return int((0 if math.isnan(ng) else ng) + (0 if math.isnan(zg) else zg))




def compare(block: Block | Mapping[str, Any], stat: str, a: str, b: str, n_units: int | None, unit: str = "group",
            digits: int = 3) -> str:
    """Words for ``a`` vs ``b`` on one statistic, only as strong as their paired difference
    (``paired_difference.<stat>.<a>.<b>``, or ``<b>.<a>`` negated): "a beats b by d [lo, hi]"
    only when the paired CI excludes 0; "a and b are not distinguishable with N groups" otherwise;
    "a equals b by construction" for a labelled identity. Empty when there is no paired entry.
    ``block``: the statistics (:class:`Statistics`, its ``uncertain`` block, or their dicts)."""
    blk = block if isinstance(block, Block) else Block.from_dict(block)
    sign = 1.0
    d = blk.paired_difference.get(stat, a, b)
    if d is None:
        d, sign = blk.paired_difference.get(stat, b, a), -1.0
    if d is None:
        return ""
    diff = sign * _f(d.diff)
    if math.isnan(diff):  # nothing measured (e.g. no gradient norms): no words at all
        return ""
    lo, hi = _f(d.ci_low), _f(d.ci_high)
    if sign < 0:
        lo, hi = -hi, -lo
    fixed = blk.fixed
    if f"paired_difference.{stat}.{a}.{b}" in fixed or f"paired_difference.{stat}.{b}.{a}" in fixed:
        return f"{a} equals {b} by construction"
    f = f"{{:+.{digits}f}}"
    num = f.format(diff) + (f" [{f.format(lo)}, {f.format(hi)}]" if not (math.isnan(lo) or math.isnan(hi)) else "")
    if math.isnan(lo) or math.isnan(hi):  # no interval (too few groups, or --n-boot 0): no verdict either way
        return f"{a} - {b} = {num} (no interval)"
    if lo <= 0.0 <= hi:
        n = f" with {_units(n_units, unit)}" if n_units else ""
        return f"{a} and {b} are not distinguishable{n} ({a} - {b} = {num})"
    if lo > 0:
        return f"{a} beats {b} by {num}"
    return f"{b} beats {a} by " + f.format(-diff) + f" [{f.format(-hi)}, {f.format(-lo)}]"


def _unit(st: Statistics, default: str = "group") -> str:
    """The resampling unit of the CIs (``meta.ci_unit``)."""
    return st.meta.ci_unit if st.meta.has("ci_unit") else default


RANKED_STATISTICS = (
    ("within_answer", "within_mean", "rank_within", "Within answers (mean Spearman with grad_norm_logp"),
    ("cross_answer_informative", "cross_inf_spearman", "rank_cross_informative",
     "Across answers on informative tokens (Spearman with grad_norm)"),
)


def _leader_clause(st: Statistics, t: Any, stat: str, col: str, rank_col: str, what: str) -> str | None:
    """One statistic's leader, the scores tied with it (by paired CI or by construction), and entropy."""
    lead = st.paired_leader.get(stat)
    if lead is None or lead not in set(t["estimator"]):
        return None
    n_units, unit = st.meta.units, _unit(st)
    by = t.set_index("estimator")
    tied = [e for e in t.sort_values([col, "estimator"], ascending=[False, True], kind="stable")["estimator"]
            if by.loc[e, rank_col] == 1 and e != lead]
    s_ = f"{what}, {lead} leads ({_num(by.loc[lead, col], 3)})"
    fixed = st.fixed
    same = [e for e in tied if f"paired_difference.{stat}.{e}.{lead}" in fixed
            or f"paired_difference.{stat}.{lead}.{e}" in fixed]
    tied = [e for e in tied if e not in same]
    if same:
        s_ += f"; identical to it by construction: {', '.join(same)}"
    if tied:
        s_ += (f"; not distinguishable from it with {_units(n_units, unit)}: {', '.join(tied)}" if n_units
               else f"; tied with it: {', '.join(tied)}")
    if "entropy" in by.index and "entropy" != lead and "entropy" not in tied + same:
        s_ += f"; {compare(st, stat, lead, 'entropy', n_units, unit)}"
    return s_


def _ranking_sentence(st: Statistics) -> str | None:
    """Who agrees best with the gradient, with the scores the paired CI cannot tell apart from it."""
    from gmts_analysis.analysis.stats import estimator_table  # deferred: pandas

    t = estimator_table(st)
    t = t[t["estimator"] != "abs_omega"]  # a baseline, constant inside answers
    if t.empty or t["within_mean"].isna().all():
        return None
    n = int(_f((st.within_answer.get("entropy") or WithinEntry()).n_answers)) \
        if "entropy" in set(t["estimator"]) else None
    parts = []
    for stat, col, rank_col, what in RANKED_STATISTICS:
        if stat == "within_answer":
            what += f" over {n} answers)" if n else ")"
        clause = _leader_clause(st, t, stat, col, rank_col, what)
        if clause is not None:
            parts.append(clause)
    s = ". ".join(parts) + "." if parts else ""
    ranks = t.sort_values(["rank", "estimator"], kind="stable")
    top = ranks[ranks["rank"] == 1]["estimator"].tolist()
    s += f" Ranked by both (estimators.csv, ties by paired CI): rank 1 {', '.join(top)}."
    return s.strip()


def too_small(st: Statistics) -> int | None:
    """The run's informative groups when they are fewer than ``meta.min_groups`` (its statistics then have
    no interval and state no comparison), else None."""
    za, need = st.zero_advantage, st.meta.min_groups
    have = za.informative_units if za is not None else None
    return have if isinstance(need, int) and isinstance(have, int) and have < need else None


def too_small_caution(stats: StatsLike) -> str | None:
    """"Too small to compare: 5 informative groups (of 8), fewer than the 10 a bootstrap interval needs
    (meta.min_groups)" when :func:`too_small`, else None: the run summary's caution, which ``gmts compare``
    carries into its comparison."""
    st = Statistics.coerce(stats)
    small = too_small(st)
    if small is None:
        return None
    unit = _unit(st)
    return (f"Too small to compare: {small} informative {unit}{'' if small == 1 else 's'} (of {st.meta.units}), "
            f"fewer than the {st.meta.min_groups} a bootstrap interval needs (meta.min_groups)")


def _scope_sentence(st: Statistics) -> str:
    unit = _unit(st)
    n = st.meta.units
    caution = too_small_caution(st)
    if caution is not None:
        return caution + "; the numbers above are point estimates, with no interval and no verdict between scores."
    s = (f"Intervals: 95% percentile bootstrap over the {_units(n, unit)} of one checkpoint and one sampling seed "
         f"(they cover the choice of prompts, not of the model or of the sampling); a score is said to win only where "
         "the paired CI of the difference excludes 0.")
    if n is not None and n < MIN_GROUPS:
        s += f" Only {_units(n, unit)}: every interval here is fragile."
    return s


def _uncertain_sentences(st: Statistics, keep: str) -> list[str]:
    u = st.uncertain
    if u is None or not u.n_tokens:
        return []
    below = _f(st.meta.uncertain_below)
    n_units, unit = st.meta.units, _unit(st)
    out = [f"{int(u.n_tokens):,} tokens ({_pct(u.token_share)}) have prob < {below:g} under the policy; "
           f"they carry {_pct(u.mass_share)} of the summed grad_norm."]
    ci = u.cross_answer_informative
    names = [s for s in cross_answer_names() if s in ci]
    if names:
        words = ", ".join(f"{s} {_rho_ci(ci[s])}" for s in names)
        c = compare(u, "cross_answer_informative", "gmts", "entropy", n_units, unit)
        out.append(f"On those tokens, across answers (informative, Spearman with grad_norm): {words}"
                   + (f"; {c}" if c else "") + ".")
    wa = u.within_answer
    if "entropy" in wa and _f(wa["entropy"].n_answers) > 0:
        n_ans = int(_f(wa["entropy"].n_answers))
        words = ", ".join(f"{s} {_ci(wa[s].mean, wa[s])}" for s in within_answer_names() if s in wa)
        c = "; ".join(x for x in (compare(u, "within_answer", s, ENTROPY, n_units, unit)
                                  for s in UNCERTAIN_CONTRAST_SCORES) if x)
        flag = f" (only {n_ans} answers)" if n_ans < MIN_GROUPS else ""
        out.append(f"Within the {n_ans} answers with at least 5 such tokens{flag} (mean Spearman with "
                   f"grad_norm_logp): {words}" + (f"; {c}" if c else "") + ".")
    return out


def _mass_sentences(st: Statistics, rk: str, keep: str) -> list[str]:
    mc, mcc = st.mass_capture, st.mass_capture_ci
    if "batch" not in mc:
        return []
    n_units, unit = st.meta.units, _unit(st)
    names = [s for s in mass_capture_names() if s in mc.estimators("batch")]
    out = []
    for r in dict.fromkeys(["0.05", rk]):
        if not all(r in mc.series("batch", s) for s in names):
            continue
        vals = ", ".join(f"{s} {_ci(mc.at('batch', s, r), mcc.at('batch', s, r))}" for s in names)
        out.append(f"Gradient mass a top-{100 * float(r):g}% batch selection captures, over what the best possible "
                   f"one captures: {vals}.")
    masked = masked_of("entropy")
    comps = [c for c in (compare(st, "mass_capture", "gmts", "entropy", n_units, unit),
                         masked and compare(st, "mass_capture", "gmts", masked, n_units, unit)) if c]
    if comps:
        why = (f" ({masked}: entropy on tokens with omega != 0 only, which separates skipping tokens without "
               "signal from weighting by |omega|)") if masked else ""
        out.append(f"At {keep} (paired): " + "; ".join(comps) + why + ".")
    return out


def _zero_sentences(st: Statistics) -> list[str]:
    """How many tokens, answers and groups carry no gradient (omega = 0)."""
    za, meta = st.zero_advantage, st.meta
    if not za:
        return []
    groups = f" in {int(_f(za.groups))} of {_units(int(_f(meta.n_groups)), 'group')}" if za.groups is not None \
        and meta.n_groups else ""
    return [f"{int(_f(za.tokens)):,} of {int(_f(meta.n_tokens)):,} tokens ({_pct(_f(za.token_share))}) carry no "
            f"gradient (omega = 0): {int(_f(za.answers))} of {int(_f(meta.n_answers))} answers{groups} have a zero "
            "advantage (every reward of their group equal)."]


def _cross_sentences(st: Statistics) -> list[str]:
    """Entropy's and GMTS's cross-answer Spearman over all tokens and over informative ones."""
    ca, ci = st.cross_answer, st.cross_answer_informative
    if "entropy" not in ca or "gmts" not in ca:
        return []
    return [f"Across answers, entropy's Spearman with grad_norm is {_rho_ci(ca['entropy'])} over all tokens "
            f"and {_rho_ci(ci.get('entropy'))} over informative tokens; GMTS: "
            f"{_rho_ci(ca['gmts'])} and {_rho_ci(ci.get('gmts'))}."]


def _waste_sentences(st: Statistics, rk: str, keep: str) -> list[str]:
    """The share of a top-rho selection spent on tokens with omega = 0 (identities named as such)."""
    sw, swc, fixed = st.selection_waste, st.selection_waste_ci, st.fixed
    if "batch" not in sw or "entropy" not in sw.estimators("batch"):
        return []
    measured = [s for s in waste_names() if s in sw.estimators("batch")
                and f"selection_waste.batch.{s}.{rk}" not in fixed]
    zero = [s for s in sw.estimators("batch") if f"selection_waste.batch.{s}.{rk}" in fixed]
    vals = ", ".join(f"{s} {_ci(sw.at('batch', s, rk), swc.at('batch', s, rk), pct=True)}" for s in measured)
    s_ = f"A top-{keep} batch selection spends on tokens with omega = 0: {vals}"
    if zero:
        s_ += f" ({', '.join(zero)}: none, by construction: their score is 0 there)"
    out = [s_ + "."]
    g_fixed = [s for s in sw.estimators("group") if f"selection_waste.group.{s}.{rk}" in fixed]
    if g_fixed and len(g_fixed) == len(sw.estimators("group")):
        out.append(f"At group scope every score spends the same {_pct(_f(sw.at('group', g_fixed[0], rk)))} "
                   "(by construction: a group without gradient still gets its quota of picks).")
    return out


def _topk_sentences(st: Statistics, rk: str, keep: str) -> list[str]:
    """Top-rho overlap with the top tokens by grad_norm, batch / group scope, with the paired comparison."""
    tk, tkc = st.topk_overlap, st.topk_overlap_ci
    if not tk:
        return []
    parts = []
    for s in topk_names():
        vals = " / ".join(_ci(tk.at(scope, s, rk), tkc.at(scope, s, rk))
                          for scope in ("batch", "group") if scope in tk and s in tk.estimators(scope))
        if vals:
            parts.append(f"{s} {vals}")
    excl = st.topk_scopes_excluded
    n_ex = int(_f(excl["group"])) if "group" in excl else 0
    note = f"; {_units(n_ex, 'group')} without gradient left out" if n_ex else ""
    masked = masked_of("entropy")
    c = compare(st, "topk_overlap", "gmts", masked, st.meta.units, _unit(st)) if masked else None
    return [f"Top-{keep} overlap with the top {keep} by grad_norm (batch / group scope): " + ", ".join(parts) + note
            + (f"; batch scope, {c}" if c else "") + "."]


def findings(stats: StatsLike) -> list[str]:
    """Plain-text sentences that state what the run's statistics show (see module docstring).
    Statistics listed in ``by_construction`` are never stated as findings; comparisons follow the
    paired differences (:func:`compare`)."""
    st = Statistics.coerce(stats)
    rk = st.rho_key  # the run's keep fraction (--rho), a stats key such as "0.2"
    keep = f"{100 * float(rk):g}%"
    out = _zero_sentences(st) + _cross_sentences(st)
    out += _uncertain_sentences(st, keep)
    out += _mass_sentences(st, rk, keep)
    out += _waste_sentences(st, rk, keep)
    out += _topk_sentences(st, rk, keep)
    r = _ranking_sentence(st) if too_small(st) is None else None  # no leader without intervals
    if r:
        out.append(r)
    from gmts_analysis.analysis.reward_audit import audit_sentence  # deferred: pandas

    audit = audit_sentence(st.reward_audit.to_dict() if st.reward_audit else None)
    if audit:
        out.append(audit)
    out.append(_scope_sentence(st))
    return out


def summary_text(stats: StatsLike, slices: Sequence[str] | None = None, width: int = 100) -> str:
    """The table of :func:`summary_table` followed by :func:`findings`, wrapped at ``width``."""
    st = Statistics.coerce(stats)
    words = "\n".join(textwrap.fill(s, width=width, break_on_hyphens=False) for s in findings(st))
    return summary_table(st, slices) + "\n\n" + words


README_BEGIN = "<!-- gmts-results:begin (generated from data/example_run/stats.json by gmts_analysis.analysis.summary.update_readme) -->"
README_END = "<!-- gmts-results:end -->"


def readme_markers(name: str | None = None, source: str = "stats.json") -> tuple[str, str]:
    """``(begin, end)`` markers of a generated results block: the README's original pair when
    ``name`` is None, else ``<!-- gmts-results:NAME:begin (generated from SOURCE ...) -->`` and
    ``<!-- gmts-results:NAME:end -->`` (one pair per run shown, e.g. a real model beside the toy)."""
    if name is None:
        return README_BEGIN, README_END
    import re

    if not re.fullmatch(r"[A-Za-z0-9_]+(-[A-Za-z0-9_]+)*", name):
        raise ValueError(f"block name {name!r}: use letters, digits, '-' or '_'")
    return (f"<!-- gmts-results:{name}:begin (generated from {source} by gmts_analysis.analysis.summary.update_readme) -->",
            f"<!-- gmts-results:{name}:end -->")


def readme_block(stats: StatsLike, slices: Sequence[str] | None = None, name: str | None = None,
                 source: str = "stats.json") -> str:
    """A README results block: :func:`summary_text` in a code fence between the markers of ``name``."""
    begin, end = readme_markers(name, source)
    return f"{begin}\n```\n{summary_text(stats, slices)}\n```\n{end}"


def update_readme(readme: str, stats: StatsLike, slices: Sequence[str] | None = None,
                  name: str | None = None, source: str = "stats.json") -> str:
    """``readme`` (the text) with the results block of ``name`` (default: the original one)
    replaced by :func:`readme_block` of ``stats``. The begin marker is found by its prefix, so a
    block generated from another source is replaced too."""
    readme_markers(name, source)  # checks the name
    tag = "gmts-results" if name is None else f"gmts-results:{name}"
    span = find_block(readme, tag)
    if span is None:
        prefix, end = block_markers(tag)
        raise ValueError(f"README has no generated results block {name or ''} (markers {prefix} ... {end} missing)")
    return readme[:span[0]] + readme_block(stats, slices, name, source) + readme[span[3]:]


def update_readme_from_run(readme_path: str, run_dir: str, name: str | None = None) -> None:
    """Render the block of ``name`` in the file ``readme_path`` from the run directory ``run_dir``
    (its stats.json, and the manifest's domains as the table's slices); written atomically."""
    from pathlib import Path

    run = Path(run_dir)
    stats = read_json(run / "stats.json")
    manifest = read_json(run / "manifest.json") if (run / "manifest.json").exists() else {}
    source = f"{run.as_posix().rstrip('/')}/stats.json"
    if name is None:
        source = "data/example_run/stats.json"
    text = Path(readme_path).read_text(encoding="utf-8")
    atomic_write_text(Path(readme_path), update_readme(text, stats, manifest.get("domains"), name, source))


if __name__ == "__main__":  # python -m gmts_analysis.analysis.summary docs/getting_started.md RUN_DIR [--name NAME]
    import argparse

    ap = argparse.ArgumentParser(prog="python -m gmts_analysis.analysis.summary",
                                 description="render a README results block from a run directory")
    ap.add_argument("readme")
    ap.add_argument("run_dir")
    ap.add_argument("--name", default=None, help="marker name of the block (default: the original block)")
    a = ap.parse_args()
    update_readme_from_run(a.readme, a.run_dir, a.name)
