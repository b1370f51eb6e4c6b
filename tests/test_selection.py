"""Top-k selection by scope (docs/definitions.md section 5) on hand-made tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gmts_analysis.core.selection import answer_disagreement, n_keep, overlap, select_top, token_disagreement
from gmts_analysis.errors import GmtsError


def _table(scores, answers, groups=None, steps=None):
    pos = pd.Series(answers).groupby(answers).cumcount().to_numpy()
    df = pd.DataFrame({"answer_id": answers, "position": pos, "s": np.asarray(scores, float)})
    if groups is not None:
        df["group_id"] = groups
    if steps is not None:
        df["step"] = steps
    return df


def test_n_keep_is_ceil_with_tolerance():
    assert n_keep(0.3, 10) == 3  # 0.3 * 10 = 3.0000000000000004 in floating point
    assert n_keep(0.2, 7) == 2 and n_keep(0.05, 1) == 1 and n_keep(0.0, 5) == 0 and n_keep(1.0, 5) == 5
    assert n_keep(0.1, 30) == 3 and n_keep(0.2, 15) == 3 and n_keep(0.5, 3) == 2


def test_batch_top_k_and_ties_by_answer_then_position():
    # rows shuffled on purpose: ties are broken by (answer_id, position), not by row order
    df = _table([5, 1, 1, 1, 1, 9], ["b", "b", "a", "a", "c", "c"])
    df = df.iloc[[3, 0, 5, 1, 2, 4]].reset_index(drop=True)
    m = select_top(df, "s", 0.5, "batch")  # k = 3: 9, 5, then the tie at 1 -> ("a", 0)
    kept = set(map(tuple, df.loc[m, ["answer_id", "position"]].to_numpy().tolist()))
    assert kept == {("c", 1), ("b", 0), ("a", 0)}
    # all scores equal: the first k by (answer_id, position)
    eq = _table([0.0] * 6, [2, 2, 10, 10, 1, 1])
    kept = eq.loc[select_top(eq, "s", 0.5), ["answer_id", "position"]].to_numpy().tolist()
    assert sorted(kept) == [[1, 0], [1, 1], [2, 0]]  # numeric order of ids, not text order


def test_nan_scores_rank_last():
    df = _table([np.nan, 3, np.nan, 1], ["a", "a", "b", "b"])
    assert select_top(df, "s", 0.5).tolist() == [False, True, False, True]
    assert select_top(df, "s", 0.75).tolist() == [True, True, False, True]  # NaN tie -> ("a", 0) first


def test_group_scope_is_per_group_and_step_splits_batches():
    df = _table([1, 2, 3, 4, 10, 20], ["a", "a", "b", "b", "c", "c"], groups=["g", "g", "g", "g", "h", "h"])
    assert select_top(df, "s", 0.25, "group").tolist() == [False, False, False, True, False, True]
    assert select_top(df, "s", 0.25, "batch").tolist() == [False, False, False, False, True, True]
    df["step"] = [0, 0, 0, 0, 1, 1]  # two batches: k = ceil(0.25 * 4) = 1 and ceil(0.25 * 2) = 1
    assert select_top(df, "s", 0.25, "batch").tolist() == [False, False, False, True, False, True]


def test_array_scores_and_bad_input():
    df = _table([1, 2, 3], ["a", "a", "a"])
    assert select_top(df, np.array([3.0, 2.0, 1.0]), 0.34).tolist() == [True, True, False]
    with pytest.raises(GmtsError):
        select_top(df, "s", 1.5)
    with pytest.raises(GmtsError):
        select_top(df, "s", 0.2, "prompt")
    with pytest.raises(GmtsError):
        select_top(df, "s", 0.2, "group")  # no group_id
    assert select_top(df.iloc[:0], "s", 0.2).shape == (0,)


def test_overlap_pools_counts_over_groups():
    # group g: 4 tokens, k=2; group h: 2 tokens, k=1
    df = _table([1, 2, 3, 4, 1, 2], ["a", "a", "b", "b", "c", "c"], groups=["g"] * 4 + ["h"] * 2)
    df["grad_norm"] = [4.0, 3.0, 2.0, 1.0, 1.0, 2.0]
    # g: S_s = {3,4}, S_true = {1,2}: 0 common; h: S_s = S_true = {2nd}: 1 common -> (0 + 1) / (2 + 1)
    assert overlap(df, "s", 0.5, "group") == pytest.approx(1 / 3)
    assert overlap(df, "grad_norm", 0.5, "group") == 1.0
    df["grad_norm"] = np.nan
    assert np.isnan(overlap(df, "s", 0.5))


def test_disagreement_tables():
    df = _table([9, 8, 1, 1, 0.5, 0.4], ["a", "a", "b", "b", "c", "c"])
    df["t"] = [0, 0, 1, 1, 0, 0]
    d = answer_disagreement(df, "s", "t", rho=1 / 3)  # k = 2: s keeps a0,a1; t keeps b0,b1
    assert d["answer_id"].tolist()[:2] == ["a", "b"] and d["n_disagree"].tolist() == [2, 2, 0]
    assert d.set_index("answer_id").loc["a", "n_only_s"] == 2
    td = token_disagreement(df, "s", "t")
    assert td[0] > 0 and td[2] < 0 and np.all(np.abs(td) <= 1)
