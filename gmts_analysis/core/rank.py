"""Ranking primitives shared by every part of the toolkit that reports a correlation or a selection.

One home for:

- :func:`spearman`: Spearman's rho = Pearson correlation of average ranks (ties share the
  mean of their ranks, as ``scipy.stats.spearmanr``). Pairs with a NaN are dropped first.
  Undefined (NaN) when fewer than 2 pairs remain or either column is constant.
  :func:`per_cluster_spearman` is the same definition computed for many clusters at once.
- :func:`kendall_tau_b`: Kendall's tau-b (scipy), same NaN rule.
- ``MIN_TOKENS``: a *within* correlation (inside one answer, or one group) needs at least this
  many tokens with a target value; fewer, and the cluster is left out.
- :func:`n_keep`: the top-k count of a selection, ``k = ceil(rho * n)`` with a 1e-9
  tolerance against float error (``0.3 * 10`` keeps 3, not 4), clipped to ``[0, n]``; for an
  int, a numpy array or a torch tensor (elementwise).

Only numpy at import (pandas, scipy and torch when a function needs them): the table statistics, the RL diagnostics and the
tensor selection all import from here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

MIN_TOKENS = 5  # a within-answer / within-group correlation needs this many tokens
KEEP_TOLERANCE = 1e-9  # ceil(rho * n - KEEP_TOLERANCE): 0.3 * 10 = 3.0000000000000004 keeps 3
_CONST = 1e-12  # a centred rank vector with a smaller sum of squares is constant


def n_keep(rho: float, n: Any) -> Any:
    """``ceil(rho * n - 1e-9)`` clipped to ``[0, n]``: how many tokens a top-``rho`` selection
    of ``n`` tokens keeps (docs/definitions.md section 5).

    n: an int (returns an int), a numpy array or a torch tensor (returns int64 of that kind,
    elementwise; a tensor stays on its device). Float ``n`` (weighted copies) are allowed.
    """
    if isinstance(n, (int, np.integer)):
        return int(min(int(n), max(0, math.ceil(rho * int(n) - KEEP_TOLERANCE))))
    if isinstance(n, np.ndarray):
        k = np.ceil(rho * n.astype(np.float64) - KEEP_TOLERANCE)
        return np.clip(k, 0, n).astype(np.int64) if n.dtype.kind in "iu" else np.clip(k, 0, n)
    if type(n).__module__.startswith("torch"):
        import torch

        k = torch.ceil(rho * n.to(torch.float64) - KEEP_TOLERANCE).to(torch.int64)
        return torch.minimum(torch.clamp(k, min=0), n.to(torch.int64))
    raise TypeError(f"n_keep: n must be an int, numpy array or torch tensor, not {type(n).__name__}")


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Average ranks (1-based) of a 1-D float array, like ``scipy.stats.rankdata``."""
    import pandas as pd

    return pd.Series(x).rank(method="average").to_numpy(dtype=np.float64)


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a = a - a.mean()
    b = b - b.mean()
    saa, sbb = float(a @ a), float(b @ b)
    if saa <= _CONST or sbb <= _CONST:
        return float("nan")
    return float(np.clip((a @ b) / math.sqrt(saa * sbb), -1.0, 1.0))


def _pairs(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"correlation of arrays of different lengths ({len(x)} and {len(y)})")
    ok = ~(np.isnan(x) | np.isnan(y))
    return x[ok], y[ok]


def spearman(x: Any, y: Any) -> float:
    """Spearman rho (average ranks for ties); NaN pairs dropped; NaN when undefined (see module)."""
    x, y = _pairs(x, y)
    if len(x) < 2:
        return float("nan")
    return _pearson(average_ranks(x), average_ranks(y))


def kendall_tau_b(x: Any, y: Any) -> float:
    """Kendall tau-b (scipy, O(n log n)); NaN pairs dropped; NaN when undefined."""
    from scipy.stats import kendalltau

    x, y = _pairs(x, y)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(kendalltau(x, y, variant="b").statistic)


def within_spearman(x: Any, y: Any, min_tokens: int = MIN_TOKENS) -> float:
    """Spearman rho of one cluster (an answer's tokens): NaN when fewer than ``min_tokens``
    pairs remain after dropping NaN, or when undefined."""
    x, y = _pairs(x, y)
    if len(x) < min_tokens:
        return float("nan")
    return _pearson(average_ranks(x), average_ranks(y))


def per_cluster_spearman(
    df: pd.DataFrame, score: str, target: str, cluster: str = "answer_id", min_tokens: int = MIN_TOKENS
) -> pd.Series:
    """:func:`within_spearman` of ``(score, target)`` inside each cluster, vectorized.

    Rows with a missing score or target are dropped first. Clusters with fewer than
    ``min_tokens`` remaining tokens or a constant score or target get NaN.
    Returns a float Series indexed by cluster id (every cluster of ``df``, first-seen order).
    """
    import pandas as pd

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
    ok = (n >= min_tokens) & (sums["xx"] > _CONST) & (sums["yy"] > _CONST)
    rho = (sums["xy"] / np.sqrt(sums["xx"] * sums["yy"])).clip(-1.0, 1.0).where(ok)
    out.loc[rho.index] = rho.to_numpy()
    return out
