"""Statistics of a probe: do estimators rank tokens like their policy-gradient norm?

Everything here is a function of the tokens table (docs/definitions.md, tokens table) and is
written to ``stats.json`` (version 3) by :func:`compute_stats`. For every estimator column
``s`` (:func:`gmts_analysis.core.estimators.available`; ``abs_omega`` = |omega| is the baseline that
knows only each token's coefficient):

*Informative* tokens have omega != 0. A token with omega = 0 (every reward of its group equal,
so A = 0) contributes nothing to the update; the statistics keep such tokens apart so that a
result coming from them is visible.

- ``zero_advantage``: ``answers`` and ``groups`` without an informative token, ``tokens`` with
  omega = 0 and their ``token_share``.
- ``cross_answer.<s>``: rho(s, grad_norm) (:func:`gmts_analysis.core.rank.spearman`) and Kendall
  tau-b over all tokens pooled, ``n_tokens``, 95% CI of rho. ``cross_answer_informative.<s>``:
  the same over informative tokens only.
- ``within_answer.<s>``: rho(s, grad_norm_logp) inside each answer, over ONE answer set for
  every estimator: informative answers with at least ``MIN_TOKENS`` tokens with a target and a
  non-constant target. A score that cannot rank an answer's tokens (constant inside it, as
  ``abs_omega`` on-policy) counts as rho = 0 there, so ``n_answers`` is the same for every
  estimator. Summarised by median, mean, q25, q75, n_answers and the 95% CI of the mean.
- ``within_group.<s>``: rho(s, grad_norm) pooled inside each group, over informative groups
  with the same rules (``n_groups``).
- ``topk_overlap.<scope>.<s>.<rho>``: |S_s ∩ S_true| / |S_true|, S_s the top
  ``n_keep(rho, n)`` tokens of the scope by s, S_true the top ``n_keep(rho, n)`` by grad_norm
  among the scope's tokens with grad_norm > 0 (all of them when fewer). A scope without such a
  token has no S_true: it is left out and counted in ``topk_scopes_excluded.<scope>``. Several
  scopes (groups; batches when there is a ``step``) are pooled: sums of intersections over
  sums of |S_true|. ``topk_overlap_ci.<scope>.<s>.<rho>``: {ci_low, ci_high}.
- ``selection_waste.<scope>.<s>.<rho>``: the share of S_s (pooled over scopes, excluded ones
  included) made of tokens with omega = 0; ``selection_waste_ci`` its CIs.
- ``update_fidelity``: needs the model; computed by :func:`gmts_analysis.engine.fidelity.fidelity_for_run`
  during the probe and passed in (``fidelity=``); ``gmts stats`` keeps the one on disk.
- ``mass_capture.<scope>.<s>.<rho>``: sum of grad_norm over S_s / sum over S_true (S as in
  top-k, same exclusions); ``mass_capture_ci``.
- ``uncertain``: the within/cross/top-k/mass blocks again over the tokens with prob <
  ``uncertain_below`` (default 0.9), on the same cluster resamples, with ``n_tokens``,
  ``token_share``, ``mass_share``.
- ``within_answer.<s>.weighted_tau`` / ``.top1`` (:func:`within_agreement`).
- ``paired_difference.<stat>.<s>.<ref>``: {diff, ci_low, ci_high, p_le_0} from the same resamples
  (:func:`paired_differences`), refs entropy, entropy_inf and ``paired_leader.<stat>``.
- ``by_construction``: statistics fixed or equal to another by construction (:func:`by_construction`).
- ``by_domain.<d>`` / ``by_step.<k>``: the same blocks on each slice.
- ``meta``: ``version`` 3, ``ci_unit`` (``group`` or ``answer``), counts and settings.

Confidence intervals: 95% percentile intervals of a seeded cluster bootstrap that resamples
**groups** (the advantage belongs to the group: answers of one group are not independent),
answers only when every group has one answer (``meta.ci_unit``); never tokens. One matrix of
cluster multiplicities per block (seeded from ``seed`` and the block's name) serves every
statistic of the block, so estimators are compared on paired resamples and results do not
depend on which estimators are present. Every resample is evaluated exactly, vectorized: a
resample is a vector of cluster counts; a token of a drawn cluster stands for as many copies.
Pooled Spearman: average ranks of the weighted table are cumulative sums of weights along one
precomputed sort order (O(n) per resample, no sort). Top-k and waste: the kept copies are
cumulative weights along each score's selection order, with ``k = n_keep(rho, total weight)``.
Means of per-answer (or per-group) values: weighted by their cluster's count. Each equals the
statistic recomputed on the table with every drawn cluster repeated (tests check this).
Cost: a few seconds of one CPU core for 6k tokens, 11 estimators and 1000 resamples; the
pooled bootstraps reduce their resample count on huge tables (:func:`pooled_n_boot`).

Undefined values (constant columns, too few tokens, no S_true) are NaN, written as null.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stats_types import CrossEntry, Meta, PairedDiff, Statistics, WithinEntry
from gmts_analysis.core.estimators import add_estimator_columns, available, times_abs_omega
from gmts_analysis.core.rank import MIN_TOKENS, kendall_tau_b, n_keep, per_cluster_spearman, spearman
from gmts_analysis.core.selection import RHOS, SCOPES, selection_order
from gmts_analysis.core.vocabulary import DEFAULT_RHO, MIN_GROUPS

__all__ = [
    "MIN_TOKENS", "STATS_VERSION", "Statistics", "TARGET", "TARGET_WITHIN", "compute_statistics", "compute_stats",
    "cross_answer", "estimator_table", "informative_mask", "kendall_tau_b", "per_answer_table", "per_cluster_spearman",
    "prepare_tokens", "rho_key", "run_rho_key", "spearman", "stats_table", "within_values", "write_stats",
]

log = logging.getLogger(__name__)

STATS_VERSION = 4
TARGET = "grad_norm"  # cross-answer, within-group and top-k target
TARGET_WITHIN = "grad_norm_logp"  # within-answer target
CI_LEVEL = 0.95
DEFAULT_N_BOOT = 1000
WASTE_RHO = DEFAULT_RHO  # the selection fraction quoted in summaries


# ----------------------------------------------------------------------------- helpers


def _rng(seed: int, *key: object) -> np.random.Generator:
    """A Generator seeded from ``seed`` and ``key`` (:func:`gmts_analysis.core.seeding.numpy_rng`)."""
    from gmts_analysis.core.seeding import numpy_rng

    return numpy_rng(int(seed), "stats", *key)


def run_rho_key(stats: Statistics | Mapping[str, Any]) -> str:
    """The stats.json key of the run's keep fraction (``meta.rho``; "0.2" for older runs)."""
    if isinstance(stats, Statistics):
        return stats.rho_key
    meta = stats.get("meta") if isinstance(stats, Mapping) else None
    return Meta.from_dict(meta, "meta").rho_key if isinstance(meta, Mapping) else Meta().rho_key


def rho_key(rho: float) -> str:
    """The stats.json key of a selection fraction: 0.2 -> "0.2", 0.05 -> "0.05"."""
    return repr(float(rho))


def _quantile_ci(v: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(v, [a, 1 - a])
    return float(lo), float(hi)


def rho_grid(rho: float = WASTE_RHO) -> tuple[float, ...]:
    """The selection fractions of the statistics: the standard grid plus the run's ``rho``."""
    return tuple(sorted(set(RHOS) | {float(rho)}))


def informative_mask(df: pd.DataFrame) -> np.ndarray:
    """Boolean ``(n,)``: tokens with omega != 0 (every token when the table has no omega)."""
    if "omega" not in df.columns:
        return np.ones(len(df), dtype=bool)
    om = df["omega"].to_numpy(dtype=np.float64)
    return ~np.isnan(om) & (om != 0)


def cluster_unit(df: pd.DataFrame) -> str:
    """``group`` when the table has groups and one of them has several answers, else ``answer``."""
    if "group_id" not in df.columns or df["group_id"].isna().all():
        return "answer"
    per_group = df.groupby("group_id", sort=False)["answer_id"].nunique()
    return "group" if len(per_group) and int(per_group.max()) > 1 else "answer"


def _unit_codes(df: pd.DataFrame, unit: str) -> tuple[np.ndarray, pd.Index]:
    """Resampling cluster of each row as codes ``[0, C)``, and the C cluster ids."""
    col = "group_id" if unit == "group" else "answer_id"
    codes, uniq = pd.factorize(df[col], use_na_sentinel=False)  # a missing id is one cluster of its own
    return codes.astype(np.int64), pd.Index(uniq)


# ------------------------------------------------------------- cluster bootstrap of rho


def multiplicities(n_clusters: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_clusters)`` draw counts: each row resamples the clusters with replacement."""
    draws = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    counts = np.zeros((n_boot, n_clusters), dtype=np.float64)
    rows = np.repeat(np.arange(n_boot), n_clusters)
    np.add.at(counts, (rows, draws.ravel()), 1.0)
    return counts


MATMUL_CELLS = 3e6  # cumulative sums by a (B, C) @ (C, n) product when C * n is at most this (24 MB)


def _cumulative_indicator(codes_sorted: np.ndarray, n_clusters: int, at: np.ndarray | None = None) -> np.ndarray | None:
    """``M`` ``(C, m)`` with ``M[c, j]`` = tokens of cluster c among the first ``at[j] + 1`` tokens of
    the order (``at`` default: every position), so that ``counts @ M`` is the running weight of a
    resample at those positions: one small matrix product instead of a cumulative sum over
    ``(B, n)``. None when ``C * m`` exceeds ``MATMUL_CELLS`` (then callers use ``np.cumsum``)."""
    n = len(codes_sorted)
    at = np.arange(n) if at is None else at
    if n_clusters * max(len(at), 1) > MATMUL_CELLS:
        return None
    block = np.searchsorted(at, np.arange(n), side="left")  # first position at or after each token
    M = np.zeros((n_clusters, len(at) + 1))
    np.add.at(M, (codes_sorted, block), 1.0)
    return np.cumsum(M[:, : len(at)], axis=1)


class _SortPlan:
    """A sort order and tie blocks of one column, to rank weighted resamples in O(n)."""

    def __init__(self, x: np.ndarray, cluster_codes: np.ndarray, n_clusters: int | None = None):
        self.order = np.argsort(x, kind="stable")
        self.codes_sorted = cluster_codes[self.order]
        xs = x[self.order]
        new_block = np.r_[True, xs[1:] != xs[:-1]]
        self.block_of_sorted = np.cumsum(new_block) - 1
        self.block_end = np.r_[np.flatnonzero(new_block)[1:], len(x)] - 1
        C = int(n_clusters if n_clusters is not None else (cluster_codes.max() + 1 if len(x) else 0))
        self.cum_end = _cumulative_indicator(self.codes_sorted, C, self.block_end)

    def sorted_weights(self, counts: np.ndarray) -> np.ndarray:
        """Token weights ``(B, n)`` in this column's sort order, from cluster counts ``(B, C)``."""
        return counts[:, self.codes_sorted]

    def sorted_ranks(self, ws: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """Average ranks ``(B, n)`` (in sort order) of weighted resamples ``ws`` (in sort order).

        A token of weight w_j stands for w_j copies; the copies of a tie block share the
        average rank ``before + (block weight + 1) / 2``, as on the expanded table.
        With the resamples' cluster ``counts``, block ends come from one matrix product.
        """
        if counts is not None and self.cum_end is not None and self.cum_end.shape[0] == counts.shape[1]:
            end = counts @ self.cum_end
        else:
            end = np.cumsum(ws, axis=1)[:, self.block_end]
        before = np.concatenate([np.zeros((ws.shape[0], 1)), end[:, :-1]], axis=1)
        rank_block = before + (end - before + 1.0) / 2.0
        return rank_block[:, self.block_of_sorted]


def cluster_bootstrap_spearman_many(
    xs: Mapping[str, np.ndarray], y: np.ndarray, cluster_codes: np.ndarray, counts: np.ndarray,
    level: float = CI_LEVEL, draws: dict[str, np.ndarray] | None = None,
) -> dict[str, tuple[float, float]]:
    """Percentile CIs of the pooled Spearman rho(x, y) for several x under one cluster bootstrap.

    xs: ``{name: (n,)}`` token values; y ``(n,)``; no NaN anywhere. cluster_codes ``(n,)`` in
    ``[0, C)``; counts ``(B, C)`` cluster multiplicities (from :func:`multiplicities`), shared by
    every x (paired resamples). Each resample's rho equals ``scipy.stats.spearmanr`` on the
    table with every token of cluster c repeated ``counts[b, c]`` times (exact, ties averaged).
    Resamples where rho is undefined are dropped; all undefined gives NaN bounds. ``draws``: when
    given, receives each x's ``(B,)`` resampled rho (NaN where undefined), for paired differences.
    """
    n = len(y)
    names = list(xs)
    nan = (float("nan"), float("nan"))
    if n < 2 or counts.shape[0] == 0 or not names:
        return {k: nan for k in names}
    C = counts.shape[1]
    py = _SortPlan(y, cluster_codes, C)
    plans = {k: _SortPlan(np.asarray(xs[k], dtype=np.float64), cluster_codes, C) for k in names}
    B = counts.shape[0]
    rhos = {k: np.empty(B) for k in names}
    chunk = max(1, int(2_000_000 // n))
    inv_y = np.empty(n, dtype=np.int64)
    inv_y[py.order] = np.arange(n)
    with np.errstate(invalid="ignore", divide="ignore"):  # a resample may draw no usable token
        for i in range(0, B, chunk):
            c = counts[i : i + chunk]
            wy = py.sorted_weights(c)
            ry = py.sorted_ranks(wy, c)
            W = wy.sum(axis=1, keepdims=True)
            dy_sorted_y = ry - np.einsum("ij,ij->i", wy, ry)[:, None] / W
            syy = np.einsum("ij,ij,ij->i", wy, dy_sorted_y, dy_sorted_y)
            for k in names:
                p = plans[k]
                wx = p.sorted_weights(c)
                rx = p.sorted_ranks(wx, c)
                dx = rx - np.einsum("ij,ij->i", wx, rx)[:, None] / W
                dy = dy_sorted_y[:, inv_y[p.order]]  # y deviations in x's sort order
                sxy = np.einsum("ij,ij,ij->i", wx, dx, dy)
                sxx = np.einsum("ij,ij,ij->i", wx, dx, dx)
                with np.errstate(invalid="ignore", divide="ignore"):
                    r = sxy / np.sqrt(sxx * syy)
                r[(sxx <= 1e-9) | (syy <= 1e-9)] = np.nan
                rhos[k][i : i + len(r)] = r
    a = (1 - level) / 2
    out = {}
    for k in names:
        if draws is not None:
            draws[k] = np.clip(rhos[k], -1, 1)
        v = rhos[k][~np.isnan(rhos[k])]
        out[k] = nan if len(v) == 0 else tuple(float(q) for q in np.quantile(np.clip(v, -1, 1), [a, 1 - a]))
    return out


def cluster_bootstrap_spearman(
    x: np.ndarray, y: np.ndarray, cluster_codes: np.ndarray, counts: np.ndarray, level: float = CI_LEVEL
) -> tuple[float, float]:
    """Percentile CI of one pooled Spearman rho(x, y) (see :func:`cluster_bootstrap_spearman_many`)."""
    return cluster_bootstrap_spearman_many({"x": x}, y, cluster_codes, counts, level)["x"]


# ------------------------------------------------------------------------ the blocks


def zero_advantage(df: pd.DataFrame, informative: np.ndarray) -> dict:
    """``{answers, groups, tokens, token_share}``: answers / groups without an informative token,
    tokens with omega = 0 (or without omega) and their share of all tokens."""
    n = len(df)
    z = ~informative
    ans = pd.Series(informative).groupby(df["answer_id"].to_numpy(), sort=False).any()
    out = {"answers": int((~ans).sum()), "groups": None, "tokens": int(z.sum()),
           "token_share": float(z.sum() / n) if n else float("nan"), "informative_units": None}
    if "group_id" in df.columns:
        grp = pd.Series(informative).groupby(df["group_id"].to_numpy(), sort=False).any()
        out["groups"] = int((~grp).sum())
    out["informative_units"] = informative_units(df, informative, cluster_unit(df))
    return out


def informative_units(df: pd.DataFrame, informative: np.ndarray, unit: str) -> int:
    """The bootstrap units (groups, or answers when every group has one) holding an informative token."""
    col = "group_id" if unit == "group" else "answer_id"
    return int(pd.Series(informative).groupby(df[col].to_numpy(), sort=False).any().sum()) if len(df) else 0


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


def _resampled_means(values: np.ndarray, unit_codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``(B,)`` mean of per-cluster ``values`` in each resample of ``counts`` ``(B, C)`` (a value
    counts as often as its unit is drawn; NaN where no value is drawn)."""
    C = counts.shape[1]
    v = np.asarray(values, dtype=np.float64)
    sums = np.bincount(unit_codes, weights=v, minlength=C)
    ns = np.bincount(unit_codes, minlength=C).astype(np.float64)
    den = counts @ ns
    with np.errstate(invalid="ignore", divide="ignore"):
        means = (counts @ sums) / den
    return np.where(den > 0, means, np.nan)


def _summary(values: np.ndarray, unit_codes: np.ndarray, counts: np.ndarray, count_key: str,
             draws: np.ndarray | None = None) -> dict:
    """``{median, mean, q25, q75, <count_key>, ci_low, ci_high}``; the CI of the mean from the
    cluster resamples ``counts`` ``(B, C)`` (a value counts as often as its cluster is drawn).
    ``draws``: the resampled means when already computed (:func:`_resampled_means`)."""
    nan = float("nan")
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return {"median": nan, "mean": nan, "q25": nan, "q75": nan, count_key: 0, "ci_low": nan, "ci_high": nan}
    q25, med, q75 = np.quantile(v, [0.25, 0.5, 0.75])
    lo = hi = nan
    if counts.shape[0] > 0:
        lo, hi = _quantile_ci(draws if draws is not None else _resampled_means(v, unit_codes, counts))
    return {"median": float(med), "mean": float(v.mean()), "q25": float(q25), "q75": float(q75),
            count_key: int(len(v)), "ci_low": lo, "ci_high": hi}


def _within_block(
    df: pd.DataFrame, estimators: list[str], informative: np.ndarray, unit_index: pd.Index, counts: np.ndarray,
    cluster: str, target: str, count_key: str, unit: str, draws: dict[str, np.ndarray] | None = None,
    agreement: bool = False,
) -> dict:
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
        d = _resampled_means(v, codes, counts) if counts.shape[0] > 0 and len(v) else None
        if draws is not None and d is not None:
            draws[s] = d
        out[s] = _summary(v, codes, counts, count_key, draws=d)
    if agreement:
        wt, top = within_agreement(df, estimators, vals[cluster].to_numpy() if len(vals) else [], cluster, target)
        for s in estimators:
            out[s]["weighted_tau"] = float(np.mean(wt[s])) if len(wt[s]) else float("nan")
            out[s]["top1"] = float(np.mean(top[s])) if len(top[s]) else float("nan")
    return out


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
) -> dict:
    """``{s: {spearman, kendall, n_tokens, ci_low, ci_high}}`` over the tokens ``rows`` (a boolean
    mask; default all) pooled. ``codes``: each row's resampling cluster; ``counts`` ``(B, C)``
    cluster multiplicities shared by every estimator (paired resamples). ``draws`` receives each
    estimator's resampled rho ``(B,)``."""
    out = {}
    rows = np.ones(len(df), dtype=bool) if rows is None else rows
    y_all = df[TARGET].to_numpy(dtype=np.float64) if TARGET in df.columns else np.full(len(df), np.nan)
    pending: dict[bytes, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for s in estimators:
        x_all = df[s].to_numpy(dtype=np.float64)
        ok = rows & ~(np.isnan(x_all) | np.isnan(y_all))
        x, y = x_all[ok], y_all[ok]
        rho = spearman(x, y)
        out[s] = {"spearman": rho, "kendall": kendall_tau_b(x, y), "n_tokens": int(ok.sum()),
                  "ci_low": float("nan"), "ci_high": float("nan")}
        if not math.isnan(rho) and counts.shape[0] > 0:
            pending.setdefault(ok.tobytes(), (ok, {}))[1][s] = x
    for ok, xs in pending.values():  # one shared pass per set of usable tokens (usually one)
        cis = cluster_bootstrap_spearman_many(xs, y_all[ok], codes[ok], counts, draws=draws)
        for s, (lo, hi) in cis.items():
            out[s]["ci_low"], out[s]["ci_high"] = lo, hi
    return out


def _scopes(df: pd.DataFrame) -> list[str]:
    return [sc for sc in SCOPES if sc != "group" or "group_id" in df.columns]


def _keep(order_scope: tuple[np.ndarray, np.ndarray], rho: float) -> np.ndarray:
    """Boolean mask of a top-``rho`` selection from its :func:`selection_order` (as select_top)."""
    import torch

    from gmts_analysis.core.selection_tensor import keep_first

    order, scope_id = order_scope
    if len(order) == 0:
        return np.zeros(0, dtype=bool)
    return keep_first(torch.from_numpy(order), torch.from_numpy(scope_id), rho).numpy()


def topk_and_waste(df: pd.DataFrame, estimators: Iterable[str], informative: np.ndarray,
                   rhos: Iterable[float] = RHOS, orders: dict | None = None) -> dict:
    """Point values: ``{"topk_overlap", "topk_scopes_excluded", "selection_waste", "mass_capture"}``
    (see module).

    Computed with the selection of :mod:`gmts_analysis.core.selection` on the table itself (the bootstrap
    below uses a separate, weighted implementation; the tests compare the two). ``orders``: a
    cache ``{(scope, s): selection_order}`` filled and reused (one sort per score and scope).
    """
    orders = {} if orders is None else orders
    estimators = list(estimators)
    nan = float("nan")
    tk: dict[str, dict] = {}
    excl: dict[str, int] = {}
    waste: dict[str, dict] = {}
    mass: dict[str, dict] = {}
    gn = df[TARGET].to_numpy(dtype=np.float64) if TARGET in df.columns else np.full(len(df), np.nan)
    pos = gn > 0  # NaN compares False
    gn0 = np.where(pos, gn, 0.0)
    zero = ~informative
    for scope in _scopes(df):
        from gmts_analysis.core.selection import scope_codes

        sc = scope_codes(df, scope)
        has_pos = np.bincount(sc, weights=pos.astype(float), minlength=int(sc.max()) + 1 if len(sc) else 0) > 0
        excl[scope] = int((~has_pos).sum())
        tk[scope] = {s: {} for s in estimators}
        waste[scope] = {s: {} for s in estimators}
        mass[scope] = {s: {} for s in estimators}
        true_order = selection_order(df, np.where(pos, gn, np.nan), scope) if pos.any() else None
        for s in estimators:
            if (scope, s) not in orders:
                orders[(scope, s)] = selection_order(df, s, scope)
        for rho in rhos:
            rk = rho_key(rho)
            true = _keep(true_order, rho) & pos if true_order is not None else None
            n_true = int(true.sum()) if true is not None else 0
            m_true = float(gn0[true].sum()) if n_true else 0.0
            for s in estimators:
                sel = _keep(orders[(scope, s)], rho)
                tk[scope][s][rk] = float((sel & true).sum() / n_true) if n_true else nan
                mass[scope][s][rk] = float(gn0[sel].sum() / m_true) if m_true > 0 else nan
                n_sel = int(sel.sum())
                waste[scope][s][rk] = float((sel & zero).sum() / n_sel) if n_sel else nan
    return {"topk_overlap": tk, "topk_scopes_excluded": excl, "selection_waste": waste, "mass_capture": mass}


class _KeepPlan:
    """Selection order of one score in a scope, precomputed to select on weighted resamples."""

    def __init__(self, order: np.ndarray, scope_id: np.ndarray, codes: np.ndarray, n_clusters: int):
        n = len(order)
        self.order = order
        self.codes_sorted = codes[order]
        self.cum = _cumulative_indicator(self.codes_sorted, n_clusters)
        sc = scope_id[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sc)) + 1] if n else np.zeros(0, dtype=np.int64)
        self.ends = np.r_[starts[1:], n] - 1
        self.scope_of_sorted = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))

    def prepare(self, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token weights ``ws`` (B, n) in plan order, the copies before each token inside its
        scope, and the scope totals ``(B, n_scopes)``; shared by every rho."""
        ws = counts[:, self.codes_sorted]
        cs = counts @ self.cum if self.cum is not None else np.cumsum(ws, axis=1)
        end = cs[:, self.ends]
        before = np.concatenate([np.zeros((ws.shape[0], 1), ws.dtype), end[:, :-1]], axis=1)
        cs -= ws  # copies before token j in the order ...
        if len(self.ends) == 1:
            excl = cs  # ... one scope: nothing before it
        else:
            excl = np.subtract(cs, before[:, self.scope_of_sorted], out=cs)  # ... inside its scope
        return ws, excl, end - before

    def kept(self, prep: tuple, rho: float) -> np.ndarray:
        """Copies of each token kept, ``(B, n)`` in plan order: each scope keeps its first
        ``n_keep(rho, scope weight)`` copies in the order (as select_top on the expanded table)."""
        ws, excl, total = prep
        k = n_keep(rho, total).astype(ws.dtype)
        lim = (k if k.shape[1] == 1 else k[:, self.scope_of_sorted]) - excl
        np.maximum(lim, 0.0, out=lim)
        return np.minimum(lim, ws, out=lim)


def topk_waste_ci(
    df: pd.DataFrame, estimators: Iterable[str], informative: np.ndarray, codes: np.ndarray, counts: np.ndarray,
    rhos: Iterable[float] = RHOS, draws: dict[tuple[str, str, str, str], np.ndarray] | None = None,
    orders: dict | None = None,
) -> dict:
    """``{"topk_overlap_ci", "selection_waste_ci", "mass_capture_ci"}``: ``{scope: {s: {"<rho>":
    {ci_low, ci_high}}}}``, percentile CIs over the cluster resamples ``counts`` (selections
    recomputed exactly on each). ``draws`` receives the resampled values ``(B,)`` under the keys
    ``(statistic, scope, s, "<rho>")``."""
    estimators = list(estimators)
    rhos = list(rhos)
    out: dict[str, dict] = {"topk_overlap_ci": {}, "selection_waste_ci": {}, "mass_capture_ci": {}}
    if counts.shape[0] < 1 or len(df) == 0:
        return out
    gn = df[TARGET].to_numpy(dtype=np.float64) if TARGET in df.columns else np.full(len(df), np.nan)
    zero = (~informative).astype(np.float64)
    for scope in _scopes(df):
        res = _resampled_selections(df, estimators, gn, zero, codes, counts, rhos, scope, orders)
        for key, values in zip(out, res):
            out[key][scope] = {s: {rho_key(r): dict(zip(("ci_low", "ci_high"), _quantile_ci(values[s][r])))
                                   for r in rhos} for s in estimators}
        if draws is not None:
            for s in estimators:
                for r in rhos:
                    draws[("topk_overlap", scope, s, rho_key(r))] = res[0][s][r]
                    draws[("mass_capture", scope, s, rho_key(r))] = res[2][s][r]
    return out


def _selection_plans(df: pd.DataFrame, estimators: list[str], gn0: np.ndarray, zero: np.ndarray,
                     true_plan: _KeepPlan, codes: np.ndarray, n_clusters: int, scope: str,
                     orders: dict | None) -> dict[str, tuple[_KeepPlan, np.ndarray, np.ndarray, np.ndarray]]:
    """``{s: (plan, to_true, zero_sorted, gn_sorted)}`` of each score in ``scope``: its :class:`_KeepPlan`,
    the score-sorted index of each target-sorted token, and omega = 0 / grad_norm in the score's order."""
    n = len(df)
    out = {}
    for s in estimators:
        order, scope_id = (orders or {}).get((scope, s)) or selection_order(df, s, scope)
        inv = np.empty(n, dtype=np.int64)
        inv[order] = np.arange(n)
        out[s] = (_KeepPlan(order, scope_id, codes, n_clusters), inv[true_plan.order], zero[order], gn0[order])
    return out


def _resampled_selections(
    df: pd.DataFrame, estimators: list[str], gn: np.ndarray, zero: np.ndarray, codes: np.ndarray,
    counts: np.ndarray, rhos: list[float], scope: str, orders: dict | None,
) -> tuple[dict, dict, dict]:
    """Top-k overlap, selection waste and mass capture of every score and rho in each resample of
    ``counts`` ``(B, C)`` at ``scope``: three ``{s: {rho: (B,)}}``."""
    B, C = counts.shape
    chunk = max(16, int(100_000 // len(df)))  # rows per pass: (B, n) blocks that stay in cache, but not too few rows
    pos = gn > 0
    gn0 = np.where(pos, gn, 0.0)
    true_plan = _KeepPlan(*selection_order(df, np.where(pos, gn, np.nan), scope), codes, C)
    pos_sorted = pos[true_plan.order].astype(np.float64)
    gn_true_sorted = gn0[true_plan.order]
    plans = _selection_plans(df, estimators, gn0, zero, true_plan, codes, C, scope, orders)
    tk = {s: {r: np.empty(B) for r in rhos} for s in estimators}
    ws_ = {s: {r: np.empty(B) for r in rhos} for s in estimators}
    ms = {s: {r: np.empty(B) for r in rhos} for s in estimators}
    for i in range(0, B, chunk):
        c = counts[i : i + chunk]
        tprep = true_plan.prepare(c)
        trues = {}
        for r in rhos:
            t = true_plan.kept(tprep, r)
            t *= pos_sorted
            cols = np.flatnonzero(t.any(axis=0))  # target-sorted tokens kept by some resample of the chunk
            trues[r] = (t[:, cols], cols, t.sum(axis=1, dtype=np.float64), t[:, cols] @ gn_true_sorted[cols])
        for s in estimators:
            plan, to_true, zero_sorted, gn_sorted = plans[s]
            prep = plan.prepare(c)
            for r in rhos:
                sel = plan.kept(prep, r)
                n_sel = n_keep(r, prep[2]).sum(axis=1, dtype=np.float64)  # every scope keeps exactly k copies
                with np.errstate(invalid="ignore", divide="ignore"):
                    ws_[s][r][i : i + len(c)] = (sel @ zero_sorted).astype(np.float64) / n_sel
                t, cols, denom, m_true = trues[r]
                inter = np.minimum(sel[:, to_true[cols]], t).sum(axis=1, dtype=np.float64)
                with np.errstate(invalid="ignore", divide="ignore"):
                    tk[s][r][i : i + len(c)] = inter / denom
                    ms[s][r][i : i + len(c)] = np.where(m_true > 0, (sel @ gn_sorted) / m_true, np.nan)
    return tk, ws_, ms


POOLED_BOOT_WORK = 3e9  # token x resample x estimator budget of the pooled bootstraps (~minutes at most)


def pooled_n_boot(n_boot: int, n_tokens: int, n_estimators: int) -> int:
    """Resamples for the pooled (cross-answer, top-k) bootstraps: ``n_boot``, reduced on huge
    tables so that ``n_tokens * resamples * n_estimators`` stays under ``POOLED_BOOT_WORK``
    (never below 200). 15k tokens x 9 estimators keep 1000; 1M tokens keep 333."""
    if n_boot <= 0 or n_tokens == 0:
        return max(n_boot, 0)
    cap = int(POOLED_BOOT_WORK // (n_tokens * max(n_estimators, 1)))
    return int(min(n_boot, max(200, cap)))


PAIRED_STATISTICS = ("within_answer", "cross_answer_informative", "topk_overlap", "mass_capture")
PAIRED_REFERENCES = ("entropy", "entropy_inf")  # plus the leader of each statistic


def paired_differences(points: Mapping[str, Mapping[str, float]], draws: Mapping[str, Mapping[str, np.ndarray]],
                       refs: Iterable[str] = PAIRED_REFERENCES, level: float = CI_LEVEL) -> tuple[dict, dict]:
    """``paired_difference`` block and each statistic's leader.

    points: ``{statistic: {s: value}}``; draws: ``{statistic: {s: (B,) resampled values}}``, every
    estimator of a statistic on the SAME cluster resamples. For each statistic, each estimator s and
    each reference (``refs`` present, and the statistic's leader: the highest point value), s != ref:
    ``diff`` = value(s) - value(ref), ``ci_low``/``ci_high`` the percentile interval of the resampled
    differences, ``p_le_0`` the share of resamples where the difference is <= 0 (resamples where
    either is undefined left out). Returns ``({statistic: {s: {ref: {...}}}}, {statistic: leader})``.
    """
    nan = float("nan")
    out: dict[str, dict] = {}
    leaders: dict[str, str | None] = {}
    for stat, pts in points.items():
        finite = {k: v for k, v in pts.items() if v is not None and np.isfinite(v)}
        leader = max(finite, key=lambda k: (finite[k], k)) if finite else None
        leaders[stat] = leader
        dr = draws.get(stat, {})
        rs = [r for r in dict.fromkeys([*refs, leader]) if r is not None and r in pts]
        block: dict[str, dict] = {}
        for s_ in pts:
            for r in rs:
                if s_ == r:
                    continue
                d = pts[s_] - pts[r] if pts[s_] is not None and pts[r] is not None else nan
                lo = hi = p = nan
                if s_ in dr and r in dr:
                    v = dr[s_] - dr[r]
                    v = v[np.isfinite(v)]
                    if len(v):
                        lo, hi = _quantile_ci(v, level)
                        p = float(np.mean(v <= 0))
                block.setdefault(s_, {})[r] = {"diff": float(d), "ci_low": lo, "ci_high": hi, "p_le_0": p}
        out[stat] = block
    return out, leaders


def _core(df: pd.DataFrame, estimators: list[str], informative: np.ndarray, codes: np.ndarray,
          unit_index: pd.Index, counts: np.ndarray, pooled: np.ndarray, unit: str, rhos: Iterable[float],
          run_rk: str, *, groups: bool = True, waste: bool = True) -> dict:
    """The statistics of one token set on given cluster resamples (``counts`` ``(B, C)``, ``pooled``
    its first rows for the pooled statistics), with the paired differences (:func:`paired_differences`)."""
    rhos = tuple(rhos)
    d_within: dict[str, np.ndarray] = {}
    d_cross: dict[str, np.ndarray] = {}
    d_topk: dict[tuple, np.ndarray] = {}
    out: dict[str, Any] = {}
    out["cross_answer"] = cross_answer(df, estimators, codes, pooled)
    out["cross_answer_informative"] = cross_answer(df, estimators, codes, pooled, rows=informative, draws=d_cross)
    out["within_answer"] = _within_block(df, estimators, informative, unit_index, counts, "answer_id",
                                         TARGET_WITHIN, "n_answers", unit, draws=d_within, agreement=True)
    if groups:
        out["within_group"] = (_within_block(df, estimators, informative, unit_index, counts, "group_id",
                                             TARGET, "n_groups", unit) if "group_id" in df.columns else {})
    orders: dict = {}
    tw = topk_and_waste(df, estimators, informative, rhos=rhos, orders=orders)
    cis = topk_waste_ci(df, estimators, informative, codes, pooled, rhos=rhos, draws=d_topk, orders=orders)
    out["topk_overlap"] = tw["topk_overlap"]
    out["topk_overlap_ci"] = cis["topk_overlap_ci"]
    out["topk_scopes_excluded"] = tw["topk_scopes_excluded"]
    if waste:
        out["selection_waste"] = tw["selection_waste"]
        out["selection_waste_ci"] = cis["selection_waste_ci"]
    out["mass_capture"] = tw["mass_capture"]
    out["mass_capture_ci"] = cis["mass_capture_ci"]
    points = {
        "within_answer": {s: out["within_answer"][s]["mean"] for s in estimators},
        "cross_answer_informative": {s: out["cross_answer_informative"][s]["spearman"] for s in estimators},
        "topk_overlap": {s: tw["topk_overlap"].get("batch", {}).get(s, {}).get(run_rk) for s in estimators},
        "mass_capture": {s: tw["mass_capture"].get("batch", {}).get(s, {}).get(run_rk) for s in estimators},
    }
    draws = {
        "within_answer": d_within, "cross_answer_informative": d_cross,
        "topk_overlap": {s: d_topk[k] for s in estimators if (k := ("topk_overlap", "batch", s, run_rk)) in d_topk},
        "mass_capture": {s: d_topk[k] for s in estimators if (k := ("mass_capture", "batch", s, run_rk)) in d_topk},
    }
    out["paired_difference"], out["paired_leader"] = paired_differences(points, draws)
    return out


def _uncertain_block(df: pd.DataFrame, estimators: list[str], informative: np.ndarray, unit_col: str,
                     unit_index: pd.Index, counts: np.ndarray, pooled: np.ndarray, unit: str,
                     rhos: Iterable[float], run_rk: str, below: float) -> dict:
    """The ``uncertain`` block: :func:`_core` over the tokens with prob < ``below``, on the same
    cluster resamples as the whole table (their columns for the clusters that keep a token)."""
    if "prob" not in df.columns:
        return {}
    keep = (df["prob"].to_numpy(dtype=np.float64) < below)
    gn = df[TARGET].to_numpy(dtype=np.float64)
    gn0 = np.where(gn > 0, gn, 0.0)
    total = float(gn0.sum())
    sub = df[keep].reset_index(drop=True)
    out: dict[str, Any] = {"n_tokens": int(keep.sum()),
                           "token_share": float(keep.mean()) if len(df) else float("nan"),
                           "mass_share": float(gn0[keep].sum() / total) if total > 0 else float("nan")}
    if len(sub) == 0:
        return out
    sub_codes, sub_index = _unit_codes(sub, unit)
    cols = unit_index.get_indexer(sub_index)
    out.update(_core(sub, estimators, informative[keep], sub_codes, sub_index, counts[:, cols], pooled[:, cols],
                     unit, rhos, run_rk, groups=False, waste=False))
    return out


def _block(df: pd.DataFrame, estimators: list[str], *, seed: int, n_boot: int, key: str, unit: str,
           fidelity: Mapping | None, rhos: Iterable[float] = RHOS, run_rk: str = "0.2",
           uncertain_below: float = 0.9, min_groups: int = MIN_GROUPS) -> dict:
    """Every statistic of one table (the whole run, or one domain / step)."""
    informative = informative_mask(df)
    codes, unit_index = _unit_codes(df, unit)
    n_units = len(unit_index)
    if informative_units(df, informative, unit) < min_groups:
        n_boot = 0  # too few informative clusters for a bootstrap: no interval, no paired verdict (meta.min_groups)
    counts = multiplicities(n_units, n_boot, _rng(seed, key, "clusters")) if n_boot > 0 else np.zeros((0, n_units))
    nb_pooled = pooled_n_boot(n_boot, len(df), len(estimators))
    pooled = counts[:nb_pooled]
    out: dict[str, Any] = {"zero_advantage": zero_advantage(df, informative)}
    out.update(_core(df, estimators, informative, codes, unit_index, counts, pooled, unit, rhos, run_rk))
    out["update_fidelity"] = dict(fidelity or {})
    out["uncertain"] = _uncertain_block(df, estimators, informative, "group_id" if unit == "group" else "answer_id",
                                        unit_index, counts, pooled, unit, rhos, run_rk, uncertain_below)
    entries = by_construction(out, df)
    if "prob" in df.columns and out["uncertain"].get("within_answer"):
        sub = df[df["prob"].to_numpy(dtype=np.float64) < uncertain_below].reset_index(drop=True)
        entries += _null_fixed_cis(out["uncertain"], by_construction(out["uncertain"], sub, "uncertain."))
    out["by_construction"] = _null_fixed_cis(out, entries)
    return out


# ------------------------------------------------------------------- identities, not findings


def _constant_abs_omega_within_answers(df: pd.DataFrame) -> bool:
    """Whether |omega| takes one value inside every answer (on-policy token-mean: |w A| per answer)."""
    if "omega" not in df.columns or len(df) == 0:
        return False
    a = df["omega"].abs()
    g = a.groupby(df["answer_id"], sort=False)
    return bool(((g.max() - g.min()).fillna(0) <= 1e-12 * g.max().abs().fillna(0).clip(lower=1e-300)).all()
                and a.notna().all())


def by_construction(block: Mapping[str, Any], df: pd.DataFrame, prefix: str = "") -> list[dict]:
    """Entries ``{key, equals, why}`` for the statistics of ``block`` fixed or equal to another by
    construction (checked on the table and the values, never assumed). Such a statistic is no
    finding: the words never state it, and a fixed value carries no CI (set to null by the caller).
    """
    out = _zero_waste_identities(block, prefix)
    if "group_id" in df.columns and "group" in (block.get("selection_waste") or {}):
        out += _group_waste_identities(block, df, prefix)
    out += _masked_identities(block, prefix)
    if _constant_abs_omega_within_answers(df):
        out += _within_identities(block, prefix)
    return out


def _zero_waste_identities(block: Mapping[str, Any], prefix: str) -> list[dict]:
    """A score that is 0 where omega = 0 wastes nothing when every resample agrees (waste 0, CI 0)."""
    from gmts_analysis.core.estimators import ZERO_WHERE_OMEGA_ZERO

    out: list[dict] = []
    for scope, per_s in (block.get("selection_waste") or {}).items():
        for s_ in ZERO_WHERE_OMEGA_ZERO:
            for rk, v in (per_s.get(s_) or {}).items():
                ci = (block.get("selection_waste_ci") or {}).get(scope, {}).get(s_, {}).get(rk, {})
                # 0 on the table and in every resample (else it measures the share without signal)
                if v == 0.0 and all(ci.get(k) in (0.0, None) or ci.get(k) != ci.get(k) for k in ("ci_low", "ci_high")):
                    out.append({"key": f"{prefix}selection_waste.{scope}.{s_}.{rk}", "equals": 0,
                                "_ci": ("selection_waste_ci", scope, s_, rk),
                                "why": f"{s_} is 0 where omega = 0, and each scope has more tokens with a "
                                "positive score than picks, in the table and in every resample: the selection never reaches a "
                                "token without gradient"})
    return out


def _group_waste_identities(block: Mapping[str, Any], df: pd.DataFrame, prefix: str) -> list[dict]:
    """Group-scope waste equal for every score: when a group has signal in every token or in none,
    the picks in its zero-advantage groups are all waste, whatever the score."""
    inf = informative_mask(df)
    ests = list(block.get("within_answer", {}))
    grp_inf = pd.Series(inf).groupby(df["group_id"].to_numpy(), sort=False)
    if not bool((grp_inf.all() | ~grp_inf.any()).all()):
        return []
    from gmts_analysis.core.selection import scope_codes

    out: list[dict] = []
    sc = scope_codes(df, "group")
    n = np.bincount(sc)
    zero_scope = np.bincount(sc, weights=(~inf).astype(float)) == n
    for rk in block["selection_waste"]["group"].get(ests[0] if ests else "", {}):
        k = n_keep(float(rk), n)
        share = float(k[zero_scope].sum() / k.sum()) if k.sum() else float("nan")
        vals = [block["selection_waste"]["group"][s_][rk] for s_ in ests]
        if vals and all(v is not None and abs(v - share) < 1e-12 for v in vals):
            for s_ in ests:
                out.append({"key": f"{prefix}selection_waste.group.{s_}.{rk}",
                            "equals": f"the share of group-scope picks in groups without signal ({share:.6g})",
                            "why": "a group has signal in every token or in none, so at group scope the "
                            "waste of every score is the picks of its zero-advantage groups"})
    return out


def _masked_identities(block: Mapping[str, Any], prefix: str) -> list[dict]:
    """A masked score equals its score on every informative token (and their paired difference is 0)."""
    from gmts_analysis.core.estimators import MASKED

    out: list[dict] = []
    cai = block.get("cross_answer_informative") or {}
    pdc = (block.get("paired_difference") or {}).get("cross_answer_informative", {})
    for s_, ref in MASKED.items():
        if s_ in cai and ref in cai and cai[s_].get("spearman") == cai[ref].get("spearman"):
            out.append({"key": f"{prefix}cross_answer_informative.{s_}", "equals": f"{prefix}cross_answer_informative.{ref}",
                        "why": f"{s_} is {ref} times 1[omega != 0]: the same score on every informative token"})
            for a, b in ((s_, ref), (ref, s_)):
                if b in (pdc.get(a) or {}):
                    out.append({"key": f"{prefix}paired_difference.cross_answer_informative.{a}.{b}", "equals": 0,
                                "_ci": ("paired_difference", "cross_answer_informative", a, b),
                                "why": f"{a} and {b} are the same score on informative tokens"})
    return out


def _within_identities(block: Mapping[str, Any], prefix: str) -> list[dict]:
    """With |omega| constant inside every answer: scores that rank an answer's tokens alike
    (:data:`SAME_WITHIN_ANSWER`), their paired differences, and abs_omega's rho of 0."""
    from gmts_analysis.core.estimators import SAME_WITHIN_ANSWER

    out: list[dict] = []
    wa = block.get("within_answer") or {}
    for s_, ref in SAME_WITHIN_ANSWER.items():
        if s_ in wa and ref in wa and wa[s_].get("mean") == wa[ref].get("mean"):
            out.append({"key": f"{prefix}within_answer.{s_}", "equals": f"{prefix}within_answer.{ref}",
                        "why": "|omega| is one positive constant inside an informative answer, so "
                        f"{s_} ranks its tokens exactly as {ref}"})
    # every pair inside a class of scores that rank answers alike has a paired difference of 0
    classes: dict[str, set[str]] = {}
    for e in out:
        ref = e["equals"].rsplit(".", 1)[1]
        classes.setdefault(ref, {ref}).add(e["key"].rsplit(".", 1)[1])
    pd_ = (block.get("paired_difference") or {}).get("within_answer", {})
    for members in classes.values():
        for a in sorted(members):
            for b in sorted(members):
                if a != b and b in (pd_.get(a) or {}):
                    out.append({"key": f"{prefix}paired_difference.within_answer.{a}.{b}", "equals": 0,
                                "_ci": ("paired_difference", "within_answer", a, b),
                                "why": f"{a} and {b} rank the tokens of an answer alike (see within_answer)"})
    if "abs_omega" in wa and wa["abs_omega"].get("mean") == 0.0:
        out.append({"key": f"{prefix}within_answer.abs_omega", "equals": 0,
                    "_ci": ("within_answer", "abs_omega"),
                    "why": "|omega| is constant inside an answer: it cannot rank the answer's tokens (rho 0)"})
    return out


def _null_fixed_cis(block: dict, entries: list[dict]) -> list[dict]:
    """A statistic fixed by construction carries no CI: null the CI (and p_le_0) of each entry of
    ``entries`` in ``block``; returns the entries without their internal ``_ci`` path."""
    out = []
    for e in entries:
        path = e.get("_ci")
        node: Any = block
        for k in path or ():
            node = node.get(k) if isinstance(node, Mapping) else None
        if isinstance(node, dict):
            for k in ("ci_low", "ci_high", "p_le_0"):
                if k in node:
                    node[k] = float("nan")  # written as null
        out.append({k: v for k, v in e.items() if k != "_ci"})
    return out


# ------------------------------------------------------------------------ the entry point


def prepare_tokens(tokens: pd.DataFrame, answers: pd.DataFrame | None = None) -> pd.DataFrame:
    """A copy of the tokens table with estimator columns, ``grad_norm`` and answer-level
    ``domain``/``step`` (from the answers table when the tokens lack them)."""
    df = tokens.copy()
    if answers is not None and "answer_id" in answers.columns:
        extra = [c for c in ("domain", "step", "group_id") if c in answers.columns and c not in df.columns]
        if extra:
            # by the ids' text, so int ids in one table and string ids in the other still match
            right = answers[["answer_id", *extra]].drop_duplicates("answer_id")
            lookup = right.assign(_key=right["answer_id"].astype(str)).drop(columns="answer_id").set_index("_key")
            keys = df["answer_id"].astype(str)
            for c in extra:
                df[c] = keys.map(lookup[c]).to_numpy()
    if TARGET not in df.columns and {"omega", TARGET_WITHIN} <= set(df.columns):
        df[TARGET] = times_abs_omega(df[TARGET_WITHIN], df["omega"])
    for c in (TARGET, TARGET_WITHIN):
        if c not in df.columns:
            df[c] = np.nan
    add_estimator_columns(df)
    return df


def _check_inputs(tokens: pd.DataFrame, n_boot: int, rho: float, uncertain_below: float) -> None:
    """One-line errors for a tokens table or settings :func:`compute_stats` cannot use."""
    from gmts_analysis.errors import GmtsError

    missing = [c for c in ("answer_id", "position") if c not in tokens.columns]
    if missing:
        raise GmtsError(f"tokens table lacks column(s) {', '.join(missing)}")
    if n_boot < 0:
        raise GmtsError(f"n_boot must be >= 0, got {n_boot}")
    if not 0.0 < float(rho) <= 1.0:
        raise GmtsError(f"--rho must be in (0, 1], got {rho}")
    if not 0.0 < float(uncertain_below) <= 1.0:
        raise GmtsError(f"--uncertain-below must be in (0, 1], got {uncertain_below}")


def _estimators(df: pd.DataFrame, estimators: list[str] | None) -> list[str]:
    """The score columns to evaluate (default: every estimator present); an absent one is an error."""
    from gmts_analysis.errors import GmtsError

    ests = list(estimators) if estimators is not None else available(df)
    bad = [s for s in ests if s not in df.columns]
    if bad:
        raise GmtsError(f"estimator column(s) not in the tokens table: {', '.join(bad)}")
    return ests


def _meta(df: pd.DataFrame, ests: list[str], unit: str, *, seed: int, n_boot: int, rhos: tuple[float, ...],
          rho: float, uncertain_below: float, min_groups: int = MIN_GROUPS,
          rescored_from: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``meta`` block: counts, settings and what each block means."""
    return {
        "version": STATS_VERSION,
        "n_answers": int(df["answer_id"].nunique()),
        "n_tokens": len(df),
        "n_groups": int(df["group_id"].nunique()) if "group_id" in df.columns else None,
        "target": TARGET,
        "target_within_answer": TARGET_WITHIN,
        "estimators": ests,
        "informative": "omega != 0" if "omega" in df.columns else "every token (no omega column)",
        "n_boot": int(n_boot),
        "n_boot_pooled": pooled_n_boot(n_boot, len(df), len(ests)),
        "ci_level": CI_LEVEL,
        "ci_unit": unit,
        "n_ci_units": int(df["group_id" if unit == "group" else "answer_id"].nunique()),
        "ci_method": f"percentile cluster bootstrap resampling {unit}s (never tokens); one seeded "
        "resample matrix per block shared by every statistic",
        "seed": int(seed),
        "min_tokens": MIN_TOKENS,
        "within_set": "informative clusters with >= min_tokens tokens and a non-constant target, the same "
        "for every estimator; a score constant inside a cluster counts as rho 0",
        "rhos": [rho_key(r) for r in rhos],
        "rho": rho_key(rho),
        "topk_true": "top n_keep(rho, n) of the scope by grad_norm among tokens with grad_norm > 0; "
        "scopes without such a token excluded (topk_scopes_excluded)",
        "topk_pooling": "sum over scopes of |S_s ∩ S_true| / sum over scopes of |S_true|",
        "selection_waste": "share of S_s with omega = 0, pooled over every scope",
        "batch_scope": "per step" if "step" in df.columns else "all tokens",
        "update_fidelity": f"rho {float(rho):g}, batch scope, computed by the probe (needs the model); "
        "empty when not computed",
        "uncertain_below": float(uncertain_below),
        "uncertain": "tokens with prob < uncertain_below (the policy's own probability, not the target); "
        "the within/cross/top-k blocks again over them, on the same cluster resamples",
        "mass_capture": "sum of grad_norm over S_s / sum over S_true (S as in topk_overlap), pooled over scopes",
        "paired_difference": "value(s) - value(ref) on the same cluster resamples; statistics within_answer "
        "(mean), cross_answer_informative (spearman), topk_overlap and mass_capture (batch scope, meta.rho); "
        "refs entropy, entropy_inf and the leader (paired_leader); p_le_0: share of resamples with diff <= 0",
        "by_construction": "statistics fixed or equal to another by construction: listed, no CI, not findings",
        "min_groups": int(min_groups),
        "rescored_from": dict(rescored_from) if rescored_from else None,
    }


def _slice_blocks(df: pd.DataFrame, col: str, ests: list[str], fidelity: Mapping[str, Mapping] | None, *,
                  seed: int, n_boot: int, unit: str, rhos: tuple[float, ...], run_rk: str,
                  uncertain_below: float, min_groups: int = MIN_GROUPS) -> dict[str, dict]:
    """``{value: block}`` of each value of ``col`` (``by_domain`` / ``by_step``), with its counts."""
    out: dict[str, dict] = {}
    for value, sub in df.groupby(col, sort=True):
        k = str(value)
        out[k] = _block(
            sub.reset_index(drop=True), ests, seed=seed, n_boot=n_boot, key=f"{col}={k}", unit=unit,
            fidelity=(fidelity or {}).get(k), rhos=rhos, run_rk=run_rk, uncertain_below=uncertain_below,
            min_groups=min_groups,
        )
        out[k]["n_answers"] = int(sub["answer_id"].nunique())
        out[k]["n_tokens"] = len(sub)
    return out


def compute_stats(
    tokens: pd.DataFrame,
    answers: pd.DataFrame | None = None,
    *,
    seed: int = 0,
    n_boot: int = DEFAULT_N_BOOT,
    estimators: list[str] | None = None,
    fidelity: Mapping[str, Any] | None = None,
    fidelity_by_domain: Mapping[str, Mapping] | None = None,
    fidelity_by_step: Mapping[str, Mapping] | None = None,
    rho: float = DEFAULT_RHO,
    uncertain_below: float = 0.9,
    min_groups: int = MIN_GROUPS,
    rescored_from: Mapping[str, Any] | None = None,
) -> dict:
    """Every statistic of stats.json (version 3) that needs no model, as a nested dict (the JSON
    object of stats.json; :func:`compute_statistics` gives it as typed :class:`Statistics`).

    uncertain_below: the ``uncertain`` block keeps the tokens with prob below it
    (``--uncertain-below``; recorded as ``meta.uncertain_below``).

    rho: the run's keep fraction (``--rho``, TRL's ``top_entropy_quantile``): added to the grid
    of top-k fractions and recorded as ``meta.rho``, the fraction the report and the headline quote.

    tokens: the tokens table; answers: the answers table (optional; gives ``domain``/``step``
    when the tokens lack them). estimators: score columns to evaluate (default: every
    estimator present, :func:`gmts_analysis.core.estimators.available`). fidelity: an
    ``update_fidelity`` block (kept as is); ``fidelity_by_domain`` / ``fidelity_by_step`` the
    same per slice. Returns ``{"meta", "zero_advantage", "cross_answer",
    "cross_answer_informative", "within_answer", "within_group", "topk_overlap",
    "topk_overlap_ci", "topk_scopes_excluded", "selection_waste", "selection_waste_ci",
    "update_fidelity", ["by_domain"], ["by_step"]}``; NaN marks undefined values.
    """
    _check_inputs(tokens, n_boot, rho, uncertain_below)
    df = prepare_tokens(tokens, answers).reset_index(drop=True)
    ests = _estimators(df, estimators)
    if df[TARGET].isna().all():
        log.warning("no grad_norm in the tokens table (probe run with --grad-norm none?): correlations are null")
    unit = cluster_unit(df)
    rhos = rho_grid(rho)
    if min_groups < 1:
        from gmts_analysis.errors import GmtsError

        raise GmtsError(f"min_groups must be >= 1, got {min_groups}")
    from gmts_analysis.analysis.reward_audit import reward_audit

    stats: dict[str, Any] = {"meta": _meta(df, ests, unit, seed=seed, n_boot=n_boot, rhos=rhos, rho=rho,
                                           uncertain_below=uncertain_below, min_groups=min_groups,
                                           rescored_from=rescored_from),
                             "reward_audit": reward_audit(answers, int(df["answer_id"].nunique()))}
    run_rk = rho_key(rho)
    stats.update(_block(df, ests, seed=seed, n_boot=n_boot, key="all", unit=unit, fidelity=fidelity, rhos=rhos,
                        run_rk=run_rk, uncertain_below=uncertain_below, min_groups=min_groups))
    for col, name, fid in (("domain", "by_domain", fidelity_by_domain), ("step", "by_step", fidelity_by_step)):
        if col in df.columns and not df[col].isna().all():
            stats[name] = _slice_blocks(df, col, ests, fid, seed=seed, n_boot=n_boot, unit=unit, rhos=rhos,
                                        run_rk=run_rk, uncertain_below=uncertain_below, min_groups=min_groups)
    return stats


def compute_statistics(tokens: pd.DataFrame, answers: pd.DataFrame | None = None, **options: Any) -> Statistics:
    """:func:`compute_stats` as typed :class:`Statistics` (same arguments; ``to_dict()`` gives its dict back)."""
    return Statistics.from_dict(compute_stats(tokens, answers, **options))


def is_current(stats: Mapping[str, Any]) -> bool:
    """Whether a stats dict has this version's layout (older ones are rewritten by ``gmts stats``)."""
    meta = stats.get("meta") if isinstance(stats, Mapping) else None
    return isinstance(meta, Mapping) and meta.get("version") == STATS_VERSION


def kept_fidelity(old: Mapping[str, Any]) -> dict[str, Any]:
    """The ``update_fidelity`` blocks of a stats dict (any version), as keyword arguments of
    :func:`compute_stats`: they need the model, so a recomputation keeps them."""
    def section(name: str) -> dict:
        return {k: v.get("update_fidelity") for k, v in (old.get(name) or {}).items() if isinstance(v, Mapping)}

    return {"fidelity": old.get("update_fidelity") or None, "fidelity_by_domain": section("by_domain"),
            "fidelity_by_step": section("by_step")}


def write_stats(run_dir: str | Path, stats: Statistics | Mapping[str, Any],
                json_path: str | Path | None = None) -> list[Path]:
    """Write ``stats.json`` (from :class:`Statistics`: a stats dict is read into one first) and the
    estimator ranking ``estimators.csv`` (atomically) into ``run_dir``; with ``json_path`` only that
    file (no sibling the caller did not name). Returns the paths."""
    from gmts_analysis.util.io import atomic_write_text

    st = Statistics.coerce(stats)
    jp = Path(json_path) if json_path is not None else Path(run_dir) / "stats.json"
    out = [atomic_write_text(jp, st.to_json())]
    if json_path is not None:
        return out
    table = estimator_table(st)
    out.append(atomic_write_text(jp.parent / "estimators.csv", table.to_csv(index=False, float_format="%.6g")))
    return out


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
