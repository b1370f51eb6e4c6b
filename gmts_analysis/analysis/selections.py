"""Top-``rho`` selections of each estimator against the gradient norm's: top-k overlap, selection waste
and mass capture (stats.json), point values on the table and exact values on each cluster resample.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from gmts_analysis.analysis.bootstrap import cumulative_indicator, quantile_ci
from gmts_analysis.analysis.stat_inputs import TARGET, rho_key
from gmts_analysis.core.rank import n_keep
from gmts_analysis.core.selection import RHOS, SCOPES, scope_codes, selection_order


def _scopes(df: pd.DataFrame) -> list[str]:
    return [sc for sc in SCOPES if sc != "group" or "group_id" in df.columns]


def _keep(order_scope: tuple[np.ndarray, np.ndarray], rho: float) -> np.ndarray:
    """Boolean mask of a top-``rho`` selection from its :func:`selection_order` (as select_top)."""
    import torch

    from gmts_analysis.core.selection_tensor import keep_first  # deferred: torch

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
        self.cum = cumulative_indicator(self.codes_sorted, n_clusters)
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
            out[key][scope] = {s: {rho_key(r): dict(zip(("ci_low", "ci_high"), quantile_ci(values[s][r])))
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
