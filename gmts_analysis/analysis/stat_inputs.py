"""The tokens table as the statistics read it (:mod:`gmts_analysis.analysis.stats`).

The targets (``grad_norm`` across answers and groups, ``grad_norm_logp`` inside an answer), the
estimator columns added to a copy of the table (:func:`prepare_tokens`), which tokens are
informative (omega != 0), the resampling unit of the cluster bootstrap (groups, or answers when
every group has one) and the keys of the keep fractions in stats.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stats_types import Meta, Statistics
from gmts_analysis.core.estimators import add_estimator_columns, times_abs_omega
from gmts_analysis.core.selection import RHOS
from gmts_analysis.core.vocabulary import DEFAULT_RHO

TARGET = "grad_norm"  # cross-answer, within-group and top-k target
TARGET_WITHIN = "grad_norm_logp"  # within-answer target
WASTE_RHO = DEFAULT_RHO  # the selection fraction quoted in summaries


def run_rho_key(stats: Statistics | Mapping[str, Any]) -> str:
    """The stats.json key of the run's keep fraction (``meta.rho``; "0.2" for older runs)."""
    if isinstance(stats, Statistics):
        return stats.rho_key
    meta = stats.get("meta") if isinstance(stats, Mapping) else None
    return Meta.from_dict(meta, "meta").rho_key if isinstance(meta, Mapping) else Meta().rho_key


def rho_key(rho: float) -> str:
    """The stats.json key of a selection fraction: 0.2 -> "0.2", 0.05 -> "0.05"."""
    return repr(float(rho))


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


def unit_codes(df: pd.DataFrame, unit: str) -> tuple[np.ndarray, pd.Index]:
    """Resampling cluster of each row as codes ``[0, C)``, and the C cluster ids."""
    col = "group_id" if unit == "group" else "answer_id"
    codes, uniq = pd.factorize(df[col], use_na_sentinel=False)  # a missing id is one cluster of its own
    return codes.astype(np.int64), pd.Index(uniq)


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
        elif df[c].dtype == object and df[c].isna().all():  # a column of nulls (parquet's null type): not computed
            df[c] = df[c].astype("float64")
    add_estimator_columns(df)
    return df
