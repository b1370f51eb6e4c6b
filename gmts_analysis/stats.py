"""Statistics of a probe: do estimators rank tokens like their policy-gradient norm?

Everything here is a function of the tokens table (SPEC section 2) and is written to
``stats.json`` (SPEC section 6) by :func:`compute_stats`. For every estimator column
``s`` (see :func:`gmts_analysis.estimators.available`):

- ``within_answer.<s>``: Spearman rho(s, grad_norm_logp) inside each answer with at least
  5 tokens and non-constant target and score, summarised over answers (median, mean,
  quartiles, n_answers) with a 95% bootstrap CI of the mean that resamples answers.
  (Inside one answer on-policy ``|omega|`` is constant, so this also ranks ``grad_norm``.)
- ``cross_answer.<s>``: rho(s, grad_norm) and Kendall tau-b over all tokens pooled, with a
  95% CI of rho by a cluster bootstrap that resamples answers with replacement (every
  token of a drawn answer enters once per draw; ranks recomputed on the resample).
- ``within_group.<s>``: pooled rho(s, grad_norm) inside each group (>= 5 tokens,
  non-constant target), summarised over groups like ``within_answer`` (``n_groups``),
  the CI resampling groups.
- ``topk_overlap.<scope>.<s>.<rho>``: |S_s ∩ S_true| / |S_true| (S_true: top-rho by
  grad_norm in the same scope). With several scopes (groups; or batches when there is a
  ``step`` column) intersections and |S_true| are summed over scopes before dividing.
- ``topk_overlap_ci.<scope>.<s>."0.2"``: {ci_low, ci_high}, 95% CI of the overlap at rho 0.2 by
  a bootstrap over answers (selections recomputed on each resample; extra key, not in SPEC).
- ``update_fidelity``: needs the model; computed by :mod:`gmts_analysis.fidelity` during the
  probe and passed in here (``fidelity=``); ``gmts stats`` keeps the one already on disk.
- ``by_domain.<d>`` / ``by_step.<k>``: the same blocks on each slice, when the tables carry
  ``domain`` / ``step``.

Undefined correlations (constant columns, too few tokens) are NaN, written as null.
Bootstrap: percentile intervals from ``n_boot`` resamples (default 1000) of a numpy
``Generator`` seeded from ``seed`` and the name of the statistic, so results do not depend
on which estimators are present. The cluster bootstrap of the pooled Spearman is exact and
vectorized: a resample is a vector of answer multiplicities, and the average ranks of the
resampled table are cumulative sums of multiplicities along one precomputed sort order,
so each resample costs O(n) instead of a sort; the top-k CIs use the same idea (kept copies
are cumulative multiplicities along each score's selection order). Both are exact: they equal
the statistic recomputed on the table with every drawn answer repeated (tests check this).
Cost: about 7 s of CPU for 1000 resamples of 15k tokens in 200 answers with nine estimators
(4 s pooled Spearman CIs, 3 s top-k CIs), so ``n_boot`` stays at 1000 by default.
"""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.estimators import add_estimator_columns, available
from gmts_analysis.selection import RHOS, SCOPES, select_top

log = logging.getLogger(__name__)

TARGET = "grad_norm"  # cross-answer, within-group and top-k target
TARGET_WITHIN = "grad_norm_logp"  # within-answer target
MIN_TOKENS = 5  # an answer (or group) needs this many tokens for a within correlation
CI_LEVEL = 0.95
DEFAULT_N_BOOT = 1000


# ----------------------------------------------------------------------------- helpers


def _rng(seed: int, *key: object) -> np.random.Generator:
    """A Generator seeded from ``seed`` and a stable hash of ``key`` (order independent of callers)."""
    h = zlib.crc32("/".join(map(str, key)).encode("utf-8"))
    return np.random.default_rng([int(seed), h])


def _rank_avg(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based) of a 1-D array, like ``scipy.stats.rankdata``."""
    return pd.Series(x).rank(method="average").to_numpy(dtype=np.float64)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rho with average ranks for ties; NaN-pairs dropped; NaN when undefined."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = ~(np.isnan(x) | np.isnan(y))
    x, y = x[ok], y[ok]
    if len(x) < 2:
        return float("nan")
    return _pearson(_rank_avg(x), _rank_avg(y))


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    saa, sbb = float(a @ a), float(b @ b)
    if saa <= 1e-12 or sbb <= 1e-12:
        return float("nan")
    return float(np.clip((a @ b) / math.sqrt(saa * sbb), -1.0, 1.0))


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall tau-b (scipy, O(n log n)); NaN-pairs dropped; NaN when undefined."""
    from scipy.stats import kendalltau

    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    ok = ~(np.isnan(x) | np.isnan(y))
    if ok.sum() < 2 or np.ptp(x[ok]) == 0 or np.ptp(y[ok]) == 0:
        return float("nan")
    return float(kendalltau(x[ok], y[ok], variant="b").statistic)


def per_cluster_spearman(
    df: pd.DataFrame, score: str, target: str, cluster: str = "answer_id", min_tokens: int = MIN_TOKENS
) -> pd.Series:
    """Spearman rho(score, target) inside each cluster (answer or group), vectorized.

    Rows with a missing score or target are dropped first. Clusters with fewer than
    ``min_tokens`` remaining tokens or a constant score or target get NaN.
    Returns a float Series indexed by cluster id (every cluster of ``df``).
    """
    clusters = pd.Index(pd.unique(df[cluster]))
    out = pd.Series(np.nan, index=clusters, dtype=np.float64, name=score)
    if score not in df.columns or target not in df.columns:
        return out
    sub = df[[cluster, score, target]].dropna()
    if sub.empty:
        return out
    g = sub.groupby(cluster, sort=False)
    r = g[[score, target]].rank(method="average")
    c = r - r.groupby(sub[cluster], sort=False).transform("mean")
    prod = pd.DataFrame(
        {"xy": c[score] * c[target], "xx": c[score] ** 2, "yy": c[target] ** 2, cluster: sub[cluster]}
    )
    sums = prod.groupby(cluster, sort=False)[["xy", "xx", "yy"]].sum()
    n = g.size()
    ok = (n >= min_tokens) & (sums["xx"] > 1e-12) & (sums["yy"] > 1e-12)
    rho = (sums["xy"] / np.sqrt(sums["xx"] * sums["yy"])).clip(-1.0, 1.0).where(ok)
    out.loc[rho.index] = rho.to_numpy()
    return out


def bootstrap_mean_ci(values: np.ndarray, rng: np.random.Generator, n_boot: int, level: float = CI_LEVEL) -> tuple[float, float]:
    """Percentile CI of the mean of ``values`` (one per resampling unit); NaN if < 2 values."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if len(v) < 2 or n_boot < 1:
        return float("nan"), float("nan")
    means = np.empty(n_boot)
    chunk = max(1, int(2_000_000 // len(v)))
    for i in range(0, n_boot, chunk):
        b = min(chunk, n_boot - i)
        idx = rng.integers(0, len(v), size=(b, len(v)))
        means[i : i + b] = v[idx].mean(axis=1)
    a = (1 - level) / 2
    lo, hi = np.quantile(means, [a, 1 - a])
    return float(lo), float(hi)


def summarise(values: pd.Series | np.ndarray, rng: np.random.Generator, n_boot: int, count_key: str = "n_answers") -> dict:
    """``{median, mean, q25, q75, <count_key>, ci_low, ci_high}`` of per-unit correlations."""
    v = np.asarray(values, dtype=np.float64)
    v = v[~np.isnan(v)]
    if len(v) == 0:
        nan = float("nan")
        return {"median": nan, "mean": nan, "q25": nan, "q75": nan, count_key: 0, "ci_low": nan, "ci_high": nan}
    lo, hi = bootstrap_mean_ci(v, rng, n_boot)
    q25, med, q75 = np.quantile(v, [0.25, 0.5, 0.75])
    return {
        "median": float(med),
        "mean": float(v.mean()),
        "q25": float(q25),
        "q75": float(q75),
        count_key: len(v),
        "ci_low": lo,
        "ci_high": hi,
    }


# ------------------------------------------------------------- cluster bootstrap of rho


def multiplicities(n_clusters: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, n_clusters)`` draw counts: each row resamples the clusters with replacement."""
    draws = rng.integers(0, n_clusters, size=(n_boot, n_clusters))
    counts = np.zeros((n_boot, n_clusters), dtype=np.float64)
    rows = np.repeat(np.arange(n_boot), n_clusters)
    np.add.at(counts, (rows, draws.ravel()), 1.0)
    return counts


class _SortPlan:
    """A sort order and tie blocks of one column, to rank weighted resamples in O(n)."""

    def __init__(self, x: np.ndarray, cluster_codes: np.ndarray):
        self.order = np.argsort(x, kind="stable")
        self.codes_sorted = cluster_codes[self.order]
        xs = x[self.order]
        new_block = np.r_[True, xs[1:] != xs[:-1]]
        self.block_of_sorted = np.cumsum(new_block) - 1
        self.block_end = np.r_[np.flatnonzero(new_block)[1:], len(x)] - 1

    def sorted_weights(self, counts: np.ndarray) -> np.ndarray:
        """Token weights ``(B, n)`` in this column's sort order, from cluster counts ``(B, C)``."""
        return counts[:, self.codes_sorted]

    def sorted_ranks(self, ws: np.ndarray) -> np.ndarray:
        """Average ranks ``(B, n)`` (in sort order) of weighted resamples ``ws`` (in sort order).

        A token of weight w_j stands for w_j copies; the copies of a tie block share the
        average rank ``before + (block weight + 1) / 2``, as on the expanded table.
        """
        end = np.cumsum(ws, axis=1)[:, self.block_end]
        before = np.concatenate([np.zeros((ws.shape[0], 1)), end[:, :-1]], axis=1)
        rank_block = before + (end - before + 1.0) / 2.0
        return rank_block[:, self.block_of_sorted]


def cluster_bootstrap_spearman_many(
    xs: Mapping[str, np.ndarray], y: np.ndarray, cluster_codes: np.ndarray, counts: np.ndarray,
    level: float = CI_LEVEL,
) -> dict[str, tuple[float, float]]:
    """Percentile CIs of the pooled Spearman rho(x, y) for several x under one cluster bootstrap.

    xs: ``{name: (n,)}`` token values; y ``(n,)``; no NaN anywhere. cluster_codes ``(n,)`` in
    ``[0, C)``; counts ``(B, C)`` cluster multiplicities (from :func:`multiplicities`), shared by
    every x (paired resamples). Each resample's rho equals ``scipy.stats.spearmanr`` on the
    table with every token of cluster c repeated ``counts[b, c]`` times (exact, ties averaged).
    Resamples where rho is undefined are dropped; all undefined gives NaN bounds.
    """
    n = len(y)
    names = list(xs)
    nan = (float("nan"), float("nan"))
    if n < 2 or counts.shape[0] == 0 or not names:
        return {k: nan for k in names}
    py = _SortPlan(y, cluster_codes)
    plans = {k: _SortPlan(np.asarray(xs[k], dtype=np.float64), cluster_codes) for k in names}
    B = counts.shape[0]
    rhos = {k: np.empty(B) for k in names}
    chunk = max(1, int(2_000_000 // n))
    inv_y = np.empty(n, dtype=np.int64)
    inv_y[py.order] = np.arange(n)
    for i in range(0, B, chunk):
        c = counts[i : i + chunk]
        wy = py.sorted_weights(c)
        ry = py.sorted_ranks(wy)
        W = wy.sum(axis=1, keepdims=True)
        dy_sorted_y = ry - np.einsum("ij,ij->i", wy, ry)[:, None] / W
        syy = np.einsum("ij,ij,ij->i", wy, dy_sorted_y, dy_sorted_y)
        for k in names:
            p = plans[k]
            wx = p.sorted_weights(c)
            rx = p.sorted_ranks(wx)
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
        v = rhos[k][~np.isnan(rhos[k])]
        out[k] = nan if len(v) == 0 else tuple(float(q) for q in np.quantile(np.clip(v, -1, 1), [a, 1 - a]))
    return out


def cluster_bootstrap_spearman(
    x: np.ndarray, y: np.ndarray, cluster_codes: np.ndarray, counts: np.ndarray, level: float = CI_LEVEL
) -> tuple[float, float]:
    """Percentile CI of one pooled Spearman rho(x, y) (see :func:`cluster_bootstrap_spearman_many`)."""
    return cluster_bootstrap_spearman_many({"x": x}, y, cluster_codes, counts, level)["x"]


# ------------------------------------------------------------------------ the blocks


def within_answer(df: pd.DataFrame, estimators: Iterable[str], *, seed: int, n_boot: int, key: str = "") -> dict:
    """``{s: summary}`` of per-answer Spearman(s, grad_norm_logp) (see module docstring)."""
    out = {}
    for s in estimators:
        rhos = per_cluster_spearman(df, s, TARGET_WITHIN, "answer_id")
        out[s] = summarise(rhos, _rng(seed, key, "within_answer", s), n_boot, "n_answers")
    return out


def within_group(df: pd.DataFrame, estimators: Iterable[str], *, seed: int, n_boot: int, key: str = "") -> dict:
    """``{s: summary}`` of per-group pooled Spearman(s, grad_norm) (``n_groups``)."""
    out = {}
    if "group_id" not in df.columns:
        return out
    for s in estimators:
        rhos = per_cluster_spearman(df, s, TARGET, "group_id")
        out[s] = summarise(rhos, _rng(seed, key, "within_group", s), n_boot, "n_groups")
    return out


def cross_answer(df: pd.DataFrame, estimators: Iterable[str], *, seed: int, n_boot: int, key: str = "") -> dict:
    """``{s: {spearman, kendall, n_tokens, ci_low, ci_high}}`` pooled over the tokens of ``df``.

    The same answer resamples are used for every estimator (paired comparisons).
    """
    out = {}
    codes_all, uniques = pd.factorize(df["answer_id"])
    counts = multiplicities(len(uniques), n_boot, _rng(seed, key, "cross_answer")) if n_boot > 0 else np.zeros((0, 0))
    y_all = df[TARGET].to_numpy(dtype=np.float64) if TARGET in df.columns else np.full(len(df), np.nan)
    pending: dict[bytes, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
    for s in estimators:
        x_all = df[s].to_numpy(dtype=np.float64)
        ok = ~(np.isnan(x_all) | np.isnan(y_all))
        x, y = x_all[ok], y_all[ok]
        rho = spearman(x, y)
        out[s] = {"spearman": rho, "kendall": kendall_tau_b(x, y), "n_tokens": int(ok.sum()),
                  "ci_low": float("nan"), "ci_high": float("nan")}
        if not math.isnan(rho) and n_boot > 0:
            pending.setdefault(ok.tobytes(), (ok, {}))[1][s] = x
    for ok, xs in pending.values():  # one shared pass per set of usable tokens (usually one)
        cis = cluster_bootstrap_spearman_many(xs, y_all[ok], codes_all[ok], counts)
        for s, (lo, hi) in cis.items():
            out[s]["ci_low"], out[s]["ci_high"] = lo, hi
    return out


def topk_overlap(df: pd.DataFrame, estimators: Iterable[str], rhos: Iterable[float] = RHOS) -> dict:
    """``{scope: {s: {"<rho>": overlap}}}`` for scope in batch/group (pooled over scopes)."""
    estimators = list(estimators)
    out: dict[str, dict] = {}
    has_target = TARGET in df.columns and df[TARGET].notna().any()
    for scope in SCOPES:
        if scope == "group" and "group_id" not in df.columns:
            continue
        block: dict[str, dict] = {s: {} for s in estimators}
        for rho in rhos:
            true = select_top(df, TARGET, rho, scope) if has_target else None
            n_true = int(true.sum()) if true is not None else 0
            for s in estimators:
                if n_true == 0:
                    block[s][rho_key(rho)] = float("nan")
                else:
                    sel = select_top(df, s, rho, scope)
                    block[s][rho_key(rho)] = float((sel & true).sum() / n_true)
        out[scope] = block
    return out


class _KeepPlan:
    """Selection order of one score in a scope, precomputed to select on weighted resamples."""

    def __init__(self, order: np.ndarray, scope_id: np.ndarray, codes: np.ndarray):
        n = len(order)
        self.order = order
        self.codes_sorted = codes[order]
        sc = scope_id[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sc)) + 1]
        self.ends = np.r_[starts[1:], n] - 1
        self.scope_of_sorted = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))

    def kept(self, counts: np.ndarray, rho: float) -> np.ndarray:
        """Copies of each token kept, ``(B, n)`` in this plan's sort order, from answer counts ``(B, C)``.

        A token of weight w_j stands for w_j identical copies; each scope keeps its first
        ``ceil(rho * total weight)`` copies in the order (as select_top on the expanded table).
        """
        ws = counts[:, self.codes_sorted]
        cs = np.cumsum(ws, axis=1)
        end = cs[:, self.ends]
        before_scope = np.concatenate([np.zeros((ws.shape[0], 1), ws.dtype), end[:, :-1]], axis=1)
        k = np.ceil(rho * (end - before_scope) - 1e-6)
        # copies before token j inside its scope = cs - ws - before_scope; kept = clip(k - that, 0, ws)
        lim = (k + before_scope)[:, self.scope_of_sorted] - cs + ws
        np.clip(lim, 0.0, ws, out=lim)
        return lim


def topk_overlap_ci(
    df: pd.DataFrame, estimators: Iterable[str], *, seed: int, n_boot: int, key: str = "", rho: float = 0.2,
    level: float = CI_LEVEL,
) -> dict:
    """``{scope: {s: {"<rho>": {ci_low, ci_high}}}}``: percentile CIs of the top-k overlap by a
    bootstrap that resamples answers (exact: the selections are recomputed on each resample,
    every copy of a drawn answer counted, counts pooled over scopes as in :func:`topk_overlap`).
    Only at ``rho`` (default 0.2) to keep the cost at O(n) per resample and estimator.
    """
    from gmts_analysis.selection import selection_order

    out: dict[str, dict] = {}
    if n_boot < 1 or TARGET not in df.columns or df[TARGET].isna().all():
        return out
    codes, uniques = pd.factorize(df["answer_id"])
    counts = multiplicities(len(uniques), n_boot, _rng(seed, key, "topk_overlap")).astype(np.float32)
    n = len(df)
    chunk = max(1, int(2_000_000 // max(n, 1)))
    rk = rho_key(rho)
    for scope in SCOPES:
        if scope == "group" and "group_id" not in df.columns:
            continue
        true_plan = _KeepPlan(*selection_order(df, TARGET, scope), codes)
        plans = {}
        for s in estimators:
            order, scope_id = selection_order(df, s, scope)
            plans[s] = _KeepPlan(order, scope_id, codes)
            inv = np.empty(n, dtype=np.int64)
            inv[order] = np.arange(n)
            plans[s].to_true = inv[true_plan.order]  # estimator-sorted index of each target-sorted token
        vals = {s: np.empty(n_boot) for s in estimators}
        for i in range(0, n_boot, chunk):
            c = counts[i : i + chunk]
            true = true_plan.kept(c, rho)
            denom = true.sum(axis=1, dtype=np.float64)
            for s in estimators:
                sel = plans[s].kept(c, rho)[:, plans[s].to_true]
                np.minimum(sel, true, out=sel)
                with np.errstate(invalid="ignore", divide="ignore"):
                    vals[s][i : i + len(c)] = sel.sum(axis=1, dtype=np.float64) / denom
        a = (1 - level) / 2
        block = {}
        for s in estimators:
            v = vals[s][np.isfinite(vals[s])]
            lo, hi = (np.quantile(v, [a, 1 - a]) if len(v) else (np.nan, np.nan))
            block[s] = {rk: {"ci_low": float(lo), "ci_high": float(hi)}}
        out[scope] = block
    return out


def rho_key(rho: float) -> str:
    """The stats.json key of a selection fraction: 0.2 -> "0.2", 0.05 -> "0.05"."""
    return repr(float(rho))


POOLED_BOOT_WORK = 3e9  # token x resample x estimator budget of the pooled bootstraps (~minutes at most)


def pooled_n_boot(n_boot: int, n_tokens: int, n_estimators: int) -> int:
    """Resamples for the pooled (cross-answer, top-k) bootstraps: ``n_boot``, reduced on huge
    tables so that ``n_tokens * resamples * n_estimators`` stays under ``POOLED_BOOT_WORK``
    (never below 200). 15k tokens x 9 estimators keep 1000; 1M tokens keep 333."""
    if n_boot <= 0 or n_tokens == 0:
        return max(n_boot, 0)
    cap = int(POOLED_BOOT_WORK // (n_tokens * max(n_estimators, 1)))
    return int(min(n_boot, max(200, cap)))


def _block(df: pd.DataFrame, estimators: list[str], *, seed: int, n_boot: int, key: str, fidelity: Mapping | None) -> dict:
    nb_pooled = pooled_n_boot(n_boot, len(df), len(estimators))
    return {
        "within_answer": within_answer(df, estimators, seed=seed, n_boot=n_boot, key=key),
        "cross_answer": cross_answer(df, estimators, seed=seed, n_boot=nb_pooled, key=key),
        "within_group": within_group(df, estimators, seed=seed, n_boot=n_boot, key=key),
        "topk_overlap": topk_overlap(df, estimators),
        "topk_overlap_ci": topk_overlap_ci(df, estimators, seed=seed, n_boot=nb_pooled, key=key),
        "update_fidelity": dict(fidelity or {}),
    }


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
        df[TARGET] = df["omega"].abs() * df[TARGET_WITHIN]
    for c in (TARGET, TARGET_WITHIN):
        if c not in df.columns:
            df[c] = np.nan
    add_estimator_columns(df)
    return df


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
) -> dict:
    """Every statistic of SPEC section 6 that needs no model, as a nested dict for stats.json.

    tokens: the tokens table (SPEC section 2); answers: the answers table (optional; gives
    ``domain``/``step`` when the tokens lack them). estimators: score columns to evaluate
    (default: every estimator present, :func:`gmts_analysis.estimators.available`).
    fidelity: an ``update_fidelity`` block from :func:`gmts_analysis.fidelity.update_fidelity`
    (kept as is); ``fidelity_by_domain`` / ``fidelity_by_step`` the same per slice.
    Returns ``{"meta", "within_answer", "cross_answer", "within_group", "topk_overlap",
    "update_fidelity", ["by_domain"], ["by_step"]}``; NaN marks undefined values.
    """
    from gmts_analysis.errors import GmtsError

    missing = [c for c in ("answer_id", "position") if c not in tokens.columns]
    if missing:
        raise GmtsError(f"tokens table lacks column(s) {', '.join(missing)}")
    df = prepare_tokens(tokens, answers)
    ests = list(estimators) if estimators is not None else available(df)
    bad = [s for s in ests if s not in df.columns]
    if bad:
        raise GmtsError(f"estimator column(s) not in the tokens table: {', '.join(bad)}")
    if df[TARGET].isna().all():
        log.warning("no grad_norm in the tokens table (probe run with --grad-norm none?): correlations are null")
    stats: dict[str, Any] = {
        "meta": {
            "n_answers": int(df["answer_id"].nunique()),
            "n_tokens": len(df),
            "n_groups": int(df["group_id"].nunique()) if "group_id" in df.columns else None,
            "target": TARGET,
            "target_within_answer": TARGET_WITHIN,
            "estimators": ests,
            "n_boot": int(n_boot),
            "n_boot_pooled": pooled_n_boot(n_boot, len(df), len(ests)),
            "ci_level": CI_LEVEL,
            "ci_method": "percentile bootstrap resampling answers (groups for within_group)",
            "seed": int(seed),
            "min_tokens": MIN_TOKENS,
            "rhos": [rho_key(r) for r in RHOS],
            "topk_overlap_ci": "95% percentile CI at rho 0.2, bootstrap over answers",
            "topk_pooling": "sum over scopes of |S_s ∩ S_true| / sum over scopes of |S_true|",
            "batch_scope": "per step" if "step" in df.columns else "all tokens",
            "update_fidelity": "rho 0.2, batch scope, computed by the probe (needs the model); "
            "empty when not computed",
        }
    }
    stats.update(_block(df, ests, seed=seed, n_boot=n_boot, key="all", fidelity=fidelity))
    for col, name, fid in (("domain", "by_domain", fidelity_by_domain), ("step", "by_step", fidelity_by_step)):
        if col not in df.columns or df[col].isna().all():
            continue
        stats[name] = {}
        for value, sub in df.groupby(col, sort=True):
            k = str(value)
            stats[name][k] = _block(
                sub.reset_index(drop=True), ests, seed=seed, n_boot=n_boot, key=f"{col}={k}",
                fidelity=(fid or {}).get(k),
            )
            stats[name][k]["n_answers"] = int(sub["answer_id"].nunique())
            stats[name][k]["n_tokens"] = len(sub)
    return stats


def per_answer_table(tokens: pd.DataFrame, estimators: list[str] | None = None) -> pd.DataFrame:
    """One row per answer: ``answer_id``, ``group_id``, ``n_tokens``, ``advantage`` and the
    within-answer Spearman of each estimator vs grad_norm_logp (columns named after them)."""
    df = prepare_tokens(tokens)
    ests = estimators if estimators is not None else available(df)
    g = df.groupby("answer_id", sort=True)
    out = pd.DataFrame({"n_tokens": g.size()})
    for c in ("group_id", "advantage"):
        if c in df.columns:
            out[c] = g[c].first()
    for s in ests:
        out[s] = per_cluster_spearman(df, s, TARGET_WITHIN, "answer_id")
    return out.reset_index()


def stats_table(stats: Mapping[str, Any], rho: str = "0.2") -> pd.DataFrame:
    """A tidy table of a stats dict: one row per estimator, fixed columns.

    Columns: estimator, within_median, within_mean, within_ci_low, within_ci_high,
    n_answers, cross_spearman, cross_ci_low, cross_ci_high, cross_kendall, n_tokens,
    group_median, group_mean, n_groups, topk_batch (+ _ci_low/_ci_high), topk_group (+ CI) at ``rho``,
    fidelity_cosine, fidelity_norm_ratio.
    """
    def g(d: Mapping | None, *keys: str) -> float:
        for k in keys:
            if not isinstance(d, Mapping) or k not in d:
                return float("nan")
            d = d[k]
        return float("nan") if d is None else d

    ests = list(stats.get("meta", {}).get("estimators") or stats.get("cross_answer", {}).keys())
    rows = []
    for s in ests:
        wa = stats.get("within_answer", {}).get(s)
        ca = stats.get("cross_answer", {}).get(s)
        wg = stats.get("within_group", {}).get(s)
        rows.append(
            {
                "estimator": s,
                "within_median": g(wa, "median"),
                "within_mean": g(wa, "mean"),
                "within_ci_low": g(wa, "ci_low"),
                "within_ci_high": g(wa, "ci_high"),
                "n_answers": g(wa, "n_answers"),
                "cross_spearman": g(ca, "spearman"),
                "cross_ci_low": g(ca, "ci_low"),
                "cross_ci_high": g(ca, "ci_high"),
                "cross_kendall": g(ca, "kendall"),
                "n_tokens": g(ca, "n_tokens"),
                "group_median": g(wg, "median"),
                "group_mean": g(wg, "mean"),
                "n_groups": g(wg, "n_groups"),
                "topk_batch": g(stats.get("topk_overlap"), "batch", s, rho),
                "topk_batch_ci_low": g(stats.get("topk_overlap_ci"), "batch", s, rho, "ci_low"),
                "topk_batch_ci_high": g(stats.get("topk_overlap_ci"), "batch", s, rho, "ci_high"),
                "topk_group": g(stats.get("topk_overlap"), "group", s, rho),
                "topk_group_ci_low": g(stats.get("topk_overlap_ci"), "group", s, rho, "ci_low"),
                "topk_group_ci_high": g(stats.get("topk_overlap_ci"), "group", s, rho, "ci_high"),
                "fidelity_cosine": g(stats.get("update_fidelity"), s, "cosine"),
                "fidelity_norm_ratio": g(stats.get("update_fidelity"), s, "norm_ratio"),
            }
        )
    return pd.DataFrame(rows)
