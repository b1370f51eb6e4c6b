"""The cluster bootstrap of the statistics: resamples, percentile intervals, paired differences.

Confidence intervals: 95% percentile intervals of a seeded cluster bootstrap that resamples
**groups** (the advantage belongs to the group: answers of one group are not independent),
answers only when every group has one answer (``meta.ci_unit``); never tokens. One matrix of
cluster multiplicities per block (:func:`multiplicities`, seeded by :func:`block_rng` from ``seed``
and the block's name) serves every statistic of the block, so estimators are compared on paired
resamples (:func:`paired_differences`) and results do not depend on which estimators are present.
Every resample is evaluated exactly, vectorized: a resample is a vector of cluster counts; a token
of a drawn cluster stands for as many copies. Pooled Spearman
(:func:`cluster_bootstrap_spearman_many`): average ranks of the weighted table are cumulative sums
of weights along one precomputed sort order (O(n) per resample, no sort). Means of per-answer (or
per-group) values (:func:`resampled_means`): weighted by their cluster's count. Each equals the
statistic recomputed on the table with every drawn cluster repeated (tests check this). The pooled
bootstraps reduce their resample count on huge tables (:func:`pooled_n_boot`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from gmts_analysis.analysis.score_roles import paired_references
from gmts_analysis.analysis.stats_types import PairedDiff, PairedDifferences
from gmts_analysis.core.seeding import numpy_rng

CI_LEVEL = 0.95


def block_rng(seed: int, *key: object) -> np.random.Generator:
    """A Generator seeded from ``seed`` and ``key`` (:func:`gmts_analysis.core.seeding.numpy_rng`)."""
    return numpy_rng(int(seed), "stats", *key)


def quantile_ci(v: np.ndarray, level: float = CI_LEVEL) -> tuple[float, float]:
    v = v[np.isfinite(v)]
    if len(v) == 0:
        return float("nan"), float("nan")
    a = (1 - level) / 2
    lo, hi = np.quantile(v, [a, 1 - a])
    return float(lo), float(hi)


def multiplicities(n_clusters: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_clusters)`` draw counts: each row resamples the clusters with replacement."""
    draws = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    counts = np.zeros((n_boot, n_clusters), dtype=np.float64)
    rows = np.repeat(np.arange(n_boot), n_clusters)
    np.add.at(counts, (rows, draws.ravel()), 1.0)
    return counts


MATMUL_CELLS = 3e6  # cumulative sums by a (B, C) @ (C, n) product when C * n is at most this (24 MB)


def cumulative_indicator(codes_sorted: np.ndarray, n_clusters: int, at: np.ndarray | None = None) -> np.ndarray | None:
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
        self.cum_end = cumulative_indicator(self.codes_sorted, C, self.block_end)

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


def resampled_means(values: np.ndarray, unit_codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
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


def mean_summary(values: np.ndarray, unit_codes: np.ndarray, counts: np.ndarray, count_key: str,
             draws: np.ndarray | None = None) -> dict:
    """``{median, mean, q25, q75, <count_key>, ci_low, ci_high}``; the CI of the mean from the
    cluster resamples ``counts`` ``(B, C)`` (a value counts as often as its cluster is drawn).
    ``draws``: the resampled means when already computed (:func:`resampled_means`)."""
    nan = float("nan")
    v = np.asarray(values, dtype=np.float64)
    if len(v) == 0:
        return {"median": nan, "mean": nan, "q25": nan, "q75": nan, count_key: 0, "ci_low": nan, "ci_high": nan}
    q25, med, q75 = np.quantile(v, [0.25, 0.5, 0.75])
    lo = hi = nan
    if counts.shape[0] > 0:
        lo, hi = quantile_ci(draws if draws is not None else resampled_means(v, unit_codes, counts))
    return {"median": float(med), "mean": float(v.mean()), "q25": float(q25), "q75": float(q75),
            count_key: int(len(v)), "ci_low": lo, "ci_high": hi}


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
PAIRED_REFERENCES = paired_references()  # entropy and its masked baseline; plus the leader of each statistic


def paired_differences(points: Mapping[str, Mapping[str, float]], draws: Mapping[str, Mapping[str, np.ndarray]],
                       refs: Iterable[str] = PAIRED_REFERENCES,
                       level: float = CI_LEVEL) -> tuple[PairedDifferences, dict[str, str | None]]:
    """``paired_difference`` block and each statistic's leader.

    points: ``{statistic: {s: value}}``; draws: ``{statistic: {s: (B,) resampled values}}``, every
    estimator of a statistic on the SAME cluster resamples. For each statistic, each estimator s and
    each reference (``refs`` present, and the statistic's leader: the highest point value), s != ref:
    ``diff`` = value(s) - value(ref), ``ci_low``/``ci_high`` the percentile interval of the resampled
    differences, ``p_le_0`` the share of resamples where the difference is <= 0 (resamples where
    either is undefined left out). Returns ``(PairedDifferences {statistic: {s: {ref: PairedDiff}}},
    {statistic: leader})``.
    """
    nan = float("nan")
    out: dict[str, dict[str, dict[str, PairedDiff]]] = {}
    leaders: dict[str, str | None] = {}
    for stat, pts in points.items():
        finite = {k: v for k, v in pts.items() if v is not None and np.isfinite(v)}
        leader = max(finite, key=lambda k: (finite[k], k)) if finite else None
        leaders[stat] = leader
        dr = draws.get(stat, {})
        rs = [r for r in dict.fromkeys([*refs, leader]) if r is not None and r in pts]
        block: dict[str, dict[str, PairedDiff]] = {}
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
                        lo, hi = quantile_ci(v, level)
                        p = float(np.mean(v <= 0))
                block.setdefault(s_, {})[r] = PairedDiff.make(diff=float(d), ci_low=lo, ci_high=hi, p_le_0=p)
        out[stat] = block
    return PairedDifferences(out), leaders
