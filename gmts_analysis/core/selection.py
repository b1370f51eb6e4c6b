"""Top-k token selection by scope (docs/definitions.md section 5), as pure functions of the tokens table.

A *selection* keeps the ``k = ceil(rho * n)`` highest scores of each scope, where
``n`` is the number of tokens in the scope:

- scope ``batch``: all response tokens of the batch pooled. The batch is every
  answer that shares a ``step`` (docs/definitions.md section 3); without a ``step`` column the whole
  table is one batch.
- scope ``group``: each group (answers to one prompt) separately, inside its batch.

Ties are broken by ``(answer_id, position)`` ascending, so a selection is
deterministic. Missing scores (NaN) rank below every real score (they are only
selected when a scope has fewer than ``k`` real scores). ``k`` comes from
:func:`gmts_analysis.core.rank.n_keep` (the one top-k count of the toolkit: ``ceil`` with a
tolerance of 1e-9 so that, e.g., ``0.3 * 10`` keeps 3 tokens and not 4).

Every function returns a boolean numpy mask aligned with the rows of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.core.rank import n_keep  # noqa: F401 - the one top-k count, re-exported here
from gmts_analysis.core.vocabulary import DEFAULT_RHO, RHOS, SCOPES  # noqa: F401 - RHOS re-exported
from gmts_analysis.errors import GmtsError


def _codes(values: pd.Series) -> np.ndarray:
    """Integer codes that sort like the values (strings, ints or a mix of both)."""
    try:
        return pd.factorize(values, sort=True)[0]
    except TypeError:  # mixed types that do not compare: order by their text
        return pd.factorize(values.astype(str), sort=True)[0]


def scope_codes(df: pd.DataFrame, scope: str, *, group_col: str = "group_id", batch_col: str = "step") -> np.ndarray:
    """One integer per row naming its selection scope (see module docstring)."""
    if scope not in SCOPES:
        raise GmtsError(f"unknown selection scope '{scope}' (choose from {', '.join(SCOPES)})")
    keys = []
    if batch_col in df.columns:
        keys.append(_codes(df[batch_col]))
    if scope == "group":
        if group_col not in df.columns:
            raise GmtsError(f"scope 'group' needs a '{group_col}' column in the tokens table")
        keys.append(_codes(df[group_col]))
    if not keys:
        return np.zeros(len(df), dtype=np.int64)
    if len(keys) == 1:
        return keys[0].astype(np.int64)
    combined = keys[0].astype(np.int64) * (int(keys[1].max()) + 1) + keys[1].astype(np.int64)
    return np.unique(combined, return_inverse=True)[1].astype(np.int64).reshape(-1)


def selection_order(
    df: pd.DataFrame,
    score: str | np.ndarray | pd.Series,
    scope: str = "batch",
    *,
    group_col: str = "group_id",
    batch_col: str = "step",
) -> tuple[np.ndarray, np.ndarray]:
    """``(order, scope_id)``: the row order in which selections keep tokens, and each row's scope.

    ``order`` sorts rows by scope, then real scores before NaN, then score descending, then
    ``(answer_id, position)``; a top-k selection keeps the first k rows of each scope in it.
    """
    import torch

    n = len(df)
    s = np.asarray(df[score] if isinstance(score, str) else score, dtype=np.float64)
    if s.shape != (n,):
        raise GmtsError(f"score has shape {s.shape}, expected ({n},)")
    scope_id = scope_codes(df, scope, group_col=group_col, batch_col=batch_col)
    # lay the rows out in (answer_id, position) order, so that the index is the tie-break
    tie = np.lexsort((np.asarray(df["position"], dtype=np.int64), _codes(df["answer_id"])))
    order = _tensor().scope_order(torch.from_numpy(np.ascontiguousarray(s[tie])), torch.from_numpy(scope_id[tie])).numpy()
    return tie[order], scope_id


def select_top(
    df: pd.DataFrame,
    score: str | np.ndarray | pd.Series,
    rho: float,
    scope: str = "batch",
    *,
    group_col: str = "group_id",
    batch_col: str = "step",
) -> np.ndarray:
    """Boolean mask (len(df),) of the tokens kept by a top-``rho`` selection on ``score``.

    df: tokens table with ``answer_id`` and ``position`` (and ``group_id`` / ``step``).
    score: a column name of ``df`` or an array of one score per row (higher is kept).
    rho: fraction kept in each scope, in [0, 1].
    """
    if not 0.0 <= rho <= 1.0:
        raise GmtsError(f"selection fraction rho must be in [0, 1], got {rho}")
    n = len(df)
    if n == 0:
        return np.zeros(0, dtype=bool)
    import torch

    order, scope_id = selection_order(df, score, scope, group_col=group_col, batch_col=batch_col)
    return _tensor().keep_first(torch.from_numpy(order), torch.from_numpy(scope_id), rho).numpy()


def overlap(
    df: pd.DataFrame,
    score: str,
    rho: float,
    scope: str = "batch",
    *,
    target: str = "grad_norm",
    group_col: str = "group_id",
    batch_col: str = "step",
) -> float:
    """``|S_score ∩ S_target| / |S_target|`` for a top-``rho`` selection in ``scope``.

    With several scopes (groups, or batches when there is a ``step``) the counts are pooled:
    sum of intersections over scopes divided by the sum of ``|S_target|`` (so large groups
    weigh more). NaN when nothing is selected or the target is entirely missing.
    """
    if target not in df.columns or df[target].isna().all():
        return float("nan")
    sel_true = select_top(df, target, rho, scope, group_col=group_col, batch_col=batch_col)
    n_true = int(sel_true.sum())
    if n_true == 0:
        return float("nan")
    sel = select_top(df, score, rho, scope, group_col=group_col, batch_col=batch_col)
    return float((sel & sel_true).sum() / n_true)


def answer_disagreement(
    df: pd.DataFrame,
    a: str = "entropy",
    b: str = "gmts",
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
) -> pd.DataFrame:
    """Per answer, how differently two scores select its tokens (top-``rho`` in ``scope``).

    Returns one row per answer, most disagreeing first, with columns ``answer_id``,
    ``n_tokens``, ``n_<a>`` / ``n_<b>`` (tokens kept by each), ``n_both``, ``n_only_<a>``,
    ``n_only_<b>``, ``n_disagree`` (kept by exactly one) and ``frac_disagree``
    (= n_disagree / n_tokens). Sorted by ``n_disagree`` then ``frac_disagree`` descending,
    ties by answer_id.
    """
    sa = select_top(df, a, rho, scope)
    sb = select_top(df, b, rho, scope)
    t = pd.DataFrame(
        {
            "answer_id": df["answer_id"].to_numpy(),
            f"n_{a}": sa,
            f"n_{b}": sb,
            "n_both": sa & sb,
            f"n_only_{a}": sa & ~sb,
            f"n_only_{b}": sb & ~sa,
        }
    )
    out = t.groupby("answer_id", sort=True).sum().astype(np.int64)
    out.insert(0, "n_tokens", t.groupby("answer_id", sort=True).size())
    out["n_disagree"] = out[f"n_only_{a}"] + out[f"n_only_{b}"]
    out["frac_disagree"] = out["n_disagree"] / out["n_tokens"]
    out = out.reset_index()
    out = out.sort_values(["n_disagree", "frac_disagree"], ascending=[False, False], kind="stable")
    return out.reset_index(drop=True)


def token_disagreement(df: pd.DataFrame, a: str = "entropy", b: str = "gmts", scope: str = "batch") -> np.ndarray:
    """Per token, ``pct_rank(a) - pct_rank(b)`` inside its scope, in [-1, 1].

    Positive: ``a`` ranks the token higher than ``b`` does (e.g. a high-entropy token in an
    answer with a small advantage, which entropy selection keeps and GMTS does not).
    """
    scope_id = scope_codes(df, scope)
    keys = pd.Series(scope_id, index=df.index)
    ra = df[a].groupby(keys).rank(pct=True)
    rb = df[b].groupby(keys).rank(pct=True)
    return (ra - rb).to_numpy(dtype=np.float64)


def selections(
    df: pd.DataFrame, scores: Sequence[str], rho: float = DEFAULT_RHO, scope: str = "batch"
) -> dict[str, np.ndarray]:
    """``{score: mask}`` for several score columns (convenience for plots and reports)."""
    return {s: select_top(df, s, rho, scope) for s in scores}


#: the tensor API (TRL/verl shapes: (B, T) scores with a completion mask), kept in its own module
#: (:mod:`gmts_analysis.core.selection_tensor`, which loads torch) and re-exported here on first use
TENSOR_API = frozenset({
    "NORMALIZERS", "SELECTIONS", "aggregate_loss", "gmts_lgn_scores", "gmts_scores", "loss_weight_tensor",
    "random_scores", "select_tokens", "selection_mask", "selection_overlap", "token_omega", "token_scores",
})


def _tensor() -> ModuleType:
    """:mod:`gmts_analysis.core.selection_tensor`, imported when first needed (so that the table-level selection
    above loads no torch until it selects)."""
    from gmts_analysis.core import selection_tensor  # deferred: torch

    return selection_tensor


def __getattr__(name: str) -> Any:
    """``gmts_analysis.core.selection.<tensor API name>``: that name of :mod:`gmts_analysis.core.selection_tensor`."""
    if name in TENSOR_API:
        return getattr(_tensor(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
