"""Per-token scores as estimator columns of the tokens table (the table side of :mod:`gmts_analysis.core.scores`).

Every score of the registry whose quantities are table columns (:attr:`gmts_analysis.core.scores.Score.column`)
is an estimator: a function of the tokens table (a pandas DataFrame with the tokens-table columns of
docs/definitions.md) that returns one float per row. Adding one is a function and one
:func:`gmts_analysis.core.scores.register` call. Statistics loop over :func:`available` estimators.

The formulas (:func:`gmts_score`, ``entropy * |omega|``; :func:`times_abs_omega`; :func:`informative_only`)
live in :mod:`gmts_analysis.core.scores` and are re-exported here; they take tensors, arrays or Series
alike, so the kernel (numpy), the selection and RL code (torch) and this table side call the same function.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from gmts_analysis.core.scores import (  # noqa: F401 - the formulas, re-exported
    ESTIMATOR_NAMES,
    FieldView,
    NameView,
    get_score,
    gmts_score,
    informative_only,
    times_abs_omega,
)

if TYPE_CHECKING:
    import pandas as pd

Estimator = Callable[["pd.DataFrame"], "pd.Series"]


#: ``{name: (columns it needs, function of the table)}``, read from the registry at each use (the
#: score's function takes the table as its mapping of quantities)
ESTIMATORS: Mapping[str, tuple[tuple[str, ...], Estimator]] = FieldView(lambda s: s.column,
                                                                       lambda s: (s.needs, s.fn))

#: estimators that are 0 wherever omega = 0 (a top-k by them picks such a token only when it runs
#: out of tokens with a positive score): those scaled by |omega| or by 1[omega != 0]
ZERO_WHERE_OMEGA_ZERO = NameView(lambda s: s.column and s.scale is not None)
#: estimators that, inside one answer with |omega| constant and non-zero, rank like another one
SAME_WITHIN_ANSWER: Mapping[str, str] = FieldView(lambda s: s.column and s.base is not None, lambda s: s.base)
#: the masked estimators, ``{name: the score it masks}``: equal to it on every token with omega != 0
MASKED: Mapping[str, str] = FieldView(lambda s: s.column and s.scale == "informative", lambda s: s.base)


def add_estimator_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Add every derivable estimator column that is missing; returns ``df`` (modified in place)."""
    for name, (needs, fn) in ESTIMATORS.items():
        if name not in df.columns and all(c in df.columns for c in needs):
            df[name] = fn(df).astype("float64")
    return df


def available(df: pd.DataFrame) -> list[str]:
    """Estimator names whose column is present and not all null, in registry order."""
    return [n for n in ESTIMATORS if n in df.columns and df[n].notna().any()]
