"""Tables of a run's statistics: one row per estimator (:func:`stats_table`), the estimator ranking
``estimators.csv`` (:func:`estimator_table`, ties by paired uncertainty) and one row per answer
(:func:`per_answer_table`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.correlations import within_values
from gmts_analysis.analysis.stat_inputs import TARGET_WITHIN, prepare_tokens
from gmts_analysis.analysis.stats_types import CrossEntry, PairedDiff, Statistics, WithinEntry
from gmts_analysis.core.estimators import available


def per_answer_table(tokens: pd.DataFrame, estimators: list[str] | None = None) -> pd.DataFrame:
    """One row per answer of the within-answer set (see :func:`within_values`): ``answer_id``,
    ``group_id``, ``n_tokens``, ``advantage`` and the within-answer Spearman of each estimator vs
    grad_norm_logp (columns named after them)."""
    df = prepare_tokens(tokens)
    ests = estimators if estimators is not None else available(df)
    vals = within_values(df, ests, "answer_id", TARGET_WITHIN).drop(columns="unit")
    g = df.groupby("answer_id", sort=False)
    info = pd.DataFrame({"n_tokens": g.size()})
    for c in ("group_id", "advantage"):
        if c in df.columns:
            info[c] = g[c].first()
    out = vals.merge(info, left_on="answer_id", right_index=True, how="left")
    return out[["answer_id", *[c for c in ("group_id", "n_tokens", "advantage") if c in out], *ests]] \
        .sort_values("answer_id", kind="stable").reset_index(drop=True)


def _n(count: int | None) -> float | int:
    """A count of the table (NaN when the file lacks it)."""
    return float("nan") if count is None else count


def _table_row(st: Statistics, s: str, rho: str) -> dict[str, Any]:
    """The :func:`stats_table` row of estimator ``s`` at the keep fraction ``rho``."""
    wa = st.within_answer.get(s) or WithinEntry()
    ca = st.cross_answer.get(s) or CrossEntry()
    ci = st.cross_answer_informative.get(s) or CrossEntry()
    wg = st.within_group.get(s) or WithinEntry()
    row = {
        "estimator": s,
        "within_median": wa.median, "within_mean": wa.mean,
        "within_ci_low": wa.ci_low, "within_ci_high": wa.ci_high, "n_answers": _n(wa.n_answers),
        "cross_spearman": ca.spearman, "cross_ci_low": ca.ci_low, "cross_ci_high": ca.ci_high,
        "cross_kendall": ca.kendall, "n_tokens": _n(ca.n_tokens),
        "cross_inf_spearman": ci.spearman, "cross_inf_ci_low": ci.ci_low,
        "cross_inf_ci_high": ci.ci_high, "cross_inf_kendall": ci.kendall,
        "n_tokens_informative": _n(ci.n_tokens),
        "group_median": wg.median, "group_mean": wg.mean,
        "group_ci_low": wg.ci_low, "group_ci_high": wg.ci_high, "n_groups": _n(wg.n_groups),
    }
    for name, grid, cis in (("topk", st.topk_overlap, st.topk_overlap_ci),
                            ("waste", st.selection_waste, st.selection_waste_ci),
                            ("mass", st.mass_capture, st.mass_capture_ci)):
        for scope in ("batch", "group"):
            iv = cis.at(scope, s, rho)
            row[f"{name}_{scope}"] = grid.at(scope, s, rho)
            row[f"{name}_{scope}_ci_low"], row[f"{name}_{scope}_ci_high"] = iv.ci_low, iv.ci_high
    row["within_weighted_tau"] = wa.weighted_tau
    row["within_top1"] = wa.top1
    fid = st.update_fidelity.get(s)
    row["fidelity_cosine"] = fid.cosine if fid is not None else float("nan")
    row["fidelity_norm_ratio"] = fid.norm_ratio if fid is not None else float("nan")
    return row


def stats_table(stats: Statistics | Mapping[str, Any], rho: str | None = None) -> pd.DataFrame:
    """A tidy table of the statistics: one row per estimator, fixed columns, scalars only.

    Columns: estimator, within_median, within_mean, within_ci_low, within_ci_high, n_answers,
    cross_spearman, cross_ci_low, cross_ci_high, cross_kendall, n_tokens, cross_inf_spearman,
    cross_inf_ci_low, cross_inf_ci_high, cross_inf_kendall, n_tokens_informative, group_median,
    group_mean, group_ci_low, group_ci_high, n_groups, topk_batch (+ _ci_low/_ci_high),
    topk_group (+ CI), waste_batch (+ CI), waste_group (+ CI), mass_batch (+ CI), mass_group (+ CI)
    at ``rho``, within_weighted_tau, within_top1, fidelity_cosine,
    fidelity_norm_ratio. ``rho`` (a key such as "0.2"): default the run's ``meta.rho``, else "0.2".
    """
    st = Statistics.coerce(stats)
    rho = st.rho_key if rho is None else rho
    return pd.DataFrame([_table_row(st, s, rho) for s in st.estimators])


ESTIMATOR_TABLE_COLUMNS = (
    "rank", "estimator", "within_mean", "within_ci_low", "within_ci_high", "within_median", "n_answers",
    "rank_within", "cross_inf_spearman", "cross_inf_ci_low", "cross_inf_ci_high", "n_tokens_informative",
    "rank_cross_informative", "cross_spearman", "cross_ci_low", "cross_ci_high",
    "waste_batch", "waste_batch_ci_low", "waste_batch_ci_high",
    "mass_batch", "mass_batch_ci_low", "mass_batch_ci_high", "within_weighted_tau", "within_top1",
)


def tied_ranks(values: Mapping[str, float],
               paired: Mapping[str, Mapping[str, PairedDiff | Mapping[str, Any]]]) -> dict[str, int]:
    """Ranks (1 best) of ``values`` ``{s: value}`` with ties by paired uncertainty: the leader (highest
    value) and every score whose paired difference with it (``paired[s][leader]``) has a CI that
    includes 0, or is 0 by construction (entries :class:`PairedDiff` or their dicts), share rank 1; the others rank by value (ties: same rank).
    Undefined values rank last."""
    names = list(values)
    v = pd.Series({k: values[k] for k in names}, dtype=np.float64)
    ranks = v.rank(ascending=False, method="min", na_option="bottom").astype(int)
    if not v.notna().any():
        return {k: int(ranks[k]) for k in names}
    leader = max((k for k in names if np.isfinite(v[k])), key=lambda k: (v[k], k))
    for k in names:
        d = (paired.get(k) or {}).get(leader)
        d = d if isinstance(d, PairedDiff) else PairedDiff.from_dict(d or {}, f"paired_difference.{k}.{leader}")
        lo, hi = d.ci_low, d.ci_high
        if k == leader or d.diff == 0.0 or (np.isfinite(lo) and np.isfinite(hi) and lo <= 0.0 <= hi):
            ranks[k] = 1
    return {k: int(ranks[k]) for k in names}


def estimator_table(stats: Statistics | Mapping[str, Any]) -> pd.DataFrame:
    """Every estimator ranked by agreement with the exact gradient (the ``estimators.csv`` of a run).

    ``rank_within``: by the mean within-answer Spearman with grad_norm_logp (same answers for
    every estimator); ``rank_cross_informative``: by the cross-answer Spearman with grad_norm
    over informative tokens (omega != 0); both with ties by paired uncertainty (:func:`tied_ranks`:
    a score whose paired CI with the leader includes 0 shares rank 1). ``rank``: by the sum of
    the two ranks (equal sums share a rank); rows ordered by it, then the within-answer mean, then
    by name; 1 is best. Undefined values rank last. Columns:
    ``ESTIMATOR_TABLE_COLUMNS`` (CIs as two scalar columns each).
    """
    st = Statistics.coerce(stats)
    t = stats_table(st)
    if t.empty:
        return pd.DataFrame(columns=list(ESTIMATOR_TABLE_COLUMNS))
    for col, stat, value in (("rank_within", "within_answer", "within_mean"),
                             ("rank_cross_informative", "cross_answer_informative", "cross_inf_spearman")):
        r = tied_ranks(dict(zip(t["estimator"], t[value])), st.paired_difference.of(stat))
        t[col] = t["estimator"].map(r).astype(int)
    t["_sum"] = t["rank_within"] + t["rank_cross_informative"]
    t["_w"] = -t["within_mean"].fillna(-np.inf)
    t = t.sort_values(["_sum", "_w", "estimator"], kind="stable").reset_index(drop=True)
    t["rank"] = t["_sum"].rank(method="min").astype(int)
    return t[list(ESTIMATOR_TABLE_COLUMNS)]
