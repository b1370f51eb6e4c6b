"""Rank agreement of each estimator with the gradient norm: Spearman inside answers and groups, and
pooled across answers (the ``within_answer``, ``within_group`` and ``cross_answer`` blocks of stats.json),
with their cluster-bootstrap intervals (:mod:`gmts_analysis.analysis.bootstrap`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from gmts_analysis.analysis.bootstrap import cluster_bootstrap_spearman_many, mean_summary, resampled_means
from gmts_analysis.analysis.stat_inputs import TARGET, TARGET_WITHIN, informative_mask
from gmts_analysis.analysis.stats_types import CrossEntry, WithinEntry
from gmts_analysis.core.rank import MIN_TOKENS, kendall_tau_b, per_cluster_spearman, spearman


def within_values(
    df: pd.DataFrame, estimators: Iterable[str], cluster: str = "answer_id", target: str = TARGET_WITHIN,
    informative: np.ndarray | None = None, unit_col: str | None = None,
) -> pd.DataFrame:
    """Per-cluster Spearman of each estimator vs ``target``, over the common cluster set.

    Kept clusters: with an informative token, at least ``MIN_TOKENS`` tokens with a target and a
    non-constant target. In them, rho(s, target) over the tokens where both are present; a
    score that cannot rank them (constant, or fewer than 2 values) gives rho = 0.
    Returns one row per kept cluster: ``cluster`` (the id), ``unit`` (the cluster's value of
    ``unit_col``, its resampling unit; default the id) and one float column per estimator.
    """
    estimators = list(estimators)
    if informative is None:
        informative = informative_mask(df)
    unit_col = unit_col or cluster
    cols = [c for c in dict.fromkeys([cluster, unit_col, target, *estimators]) if c in df.columns]
    d = df[cols].assign(_inf=informative)
    if target not in d.columns:
        return pd.DataFrame(columns=[cluster, "unit", *estimators])
    g = d.groupby(cluster, sort=False)
    has_t = d[target].notna()
    n_t = has_t.groupby(d[cluster], sort=False).sum()
    spread = g[target].agg(lambda v: v.max() - v.min() if v.notna().any() else 0.0)
    inf = g["_inf"].any()
    keep = inf & (n_t >= MIN_TOKENS) & (spread > 0)
    kept_ids = keep.index[keep.to_numpy()]
    sub = d[d[cluster].isin(kept_ids)]
    out = pd.DataFrame({cluster: kept_ids})
    out["unit"] = g[unit_col].first().reindex(kept_ids).to_numpy() if len(kept_ids) else []
    for s in estimators:
        r = per_cluster_spearman(sub, s, target, cluster, min_tokens=2) if len(sub) else pd.Series(dtype=float)
        out[s] = r.reindex(kept_ids).fillna(0.0).to_numpy(dtype=np.float64) if len(kept_ids) else []
    return out


def within_block(
    df: pd.DataFrame, estimators: list[str], informative: np.ndarray, unit_index: pd.Index, counts: np.ndarray,
    cluster: str, target: str, count_key: str, unit: str, draws: dict[str, np.ndarray] | None = None,
    agreement: bool = False,
) -> dict[str, WithinEntry]:
    """``{s: summary}`` of per-cluster Spearman values (see :func:`within_values`), CIs of the mean
    from the block's resamples of ``unit`` (``unit_index``: the unit id of each counts column).
    ``draws`` receives each estimator's resampled means ``(B,)``; ``agreement`` adds
    ``weighted_tau`` and ``top1`` (:func:`within_agreement`) over the same clusters."""
    unit_col = "group_id" if unit == "group" else "answer_id"
    vals = within_values(df, estimators, cluster, target, informative, unit_col=unit_col)
    codes = unit_index.get_indexer(vals["unit"].to_numpy()) if len(vals) else np.zeros(0, dtype=np.int64)
    out = {}
    for s in estimators:
        v = vals[s].to_numpy(dtype=np.float64)
        d = resampled_means(v, codes, counts) if counts.shape[0] > 0 and len(v) else None
        if draws is not None and d is not None:
            draws[s] = d
        out[s] = mean_summary(v, codes, counts, count_key, draws=d)
    if agreement:
        wt, top = within_agreement(df, estimators, vals[cluster].to_numpy() if len(vals) else [], cluster, target)
        for s in estimators:
            out[s]["weighted_tau"] = float(np.mean(wt[s])) if len(wt[s]) else float("nan")
            out[s]["top1"] = float(np.mean(top[s])) if len(top[s]) else float("nan")
    return {s: WithinEntry.make(**v) for s, v in out.items()}


def within_agreement(
    df: pd.DataFrame, estimators: Iterable[str], cluster_ids: Iterable, cluster: str = "answer_id",
    target: str = TARGET_WITHIN,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Top-weighted agreement inside each cluster of ``cluster_ids`` (the within-answer set).

    Returns ``(weighted_tau, top1)``, each ``{s: (n_clusters,)}``: ``scipy.stats.weightedtau(s,
    target)`` (hyperbolic weights on the ranks, so the top tokens count most; a score that cannot
    rank the cluster gives 0, as for Spearman), and the top-1 agreement: the share of the score's
    argmax tokens that are an argmax of the target (1 or 0 without ties; the expected hit of a
    random tie-break otherwise). Rows with a missing score or target are left out.
    """
    from scipy.stats import weightedtau

    estimators = list(estimators)
    ids = list(cluster_ids)
    wt = {s: np.zeros(len(ids)) for s in estimators}
    top = {s: np.zeros(len(ids)) for s in estimators}
    if not ids:
        return wt, top
    sub = df[df[cluster].isin(ids)]
    groups = dict(tuple(sub.groupby(cluster, sort=False)))
    for i, cid in enumerate(ids):
        g = groups[cid]
        y_all = g[target].to_numpy(dtype=np.float64)
        seen: dict[bytes, float] = {}  # weightedtau depends on x only through its order: one call per order
        for s in estimators:
            x = g[s].to_numpy(dtype=np.float64)
            ok = ~(np.isnan(x) | np.isnan(y_all))
            x, y = x[ok], y_all[ok]
            if len(x) < 2:
                continue
            if np.ptp(x) > 0 and np.ptp(y) > 0:
                key = ok.tobytes() + np.unique(x, return_inverse=True)[1].astype(np.int64).tobytes()
                if key not in seen:
                    with np.errstate(invalid="ignore", divide="ignore"):
                        t = float(weightedtau(x, y).statistic)
                    seen[key] = t if np.isfinite(t) else 0.0
                wt[s][i] = seen[key]
            xs = x == x.max()
            top[s][i] = float((xs & (y == y.max())).sum() / xs.sum())
    return wt, top


def cross_answer(
    df: pd.DataFrame, estimators: Iterable[str], codes: np.ndarray, counts: np.ndarray,
    rows: np.ndarray | None = None, draws: dict[str, np.ndarray] | None = None,
) -> dict[str, CrossEntry]:
    """``{s: CrossEntry(spearman, kendall, n_tokens, ci_low, ci_high)}`` over the tokens ``rows`` (a boolean
    mask; default all) pooled. ``codes``: each row's resampling cluster; ``counts`` ``(B, C)``
    cluster multiplicities shared by every estimator (paired resamples). ``draws`` receives each
    estimator's resampled rho ``(B,)``."""
    out: dict[str, CrossEntry] = {}
    rows = np.ones(len(df), dtype=bool) if rows is None else rows
    y_all = df[TARGET].to_numpy(dtype=np.float64) if TARGET in df.columns else np.full(len(df), np.nan)
    pending: dict[bytes, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for s in estimators:
        x_all = df[s].to_numpy(dtype=np.float64)
        ok = rows & ~(np.isnan(x_all) | np.isnan(y_all))
        x, y = x_all[ok], y_all[ok]
        rho = spearman(x, y)
        out[s] = CrossEntry.make(spearman=rho, kendall=kendall_tau_b(x, y), n_tokens=int(ok.sum()),
                                 ci_low=float("nan"), ci_high=float("nan"))
        if not math.isnan(rho) and counts.shape[0] > 0:
            pending.setdefault(ok.tobytes(), (ok, {}))[1][s] = x
    for ok, xs in pending.values():  # one shared pass per set of usable tokens (usually one)
        cis = cluster_bootstrap_spearman_many(xs, y_all[ok], codes[ok], counts, draws=draws)
        for s, (lo, hi) in cis.items():
            out[s].ci_low, out[s].ci_high = lo, hi
    return out
