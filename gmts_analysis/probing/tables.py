"""The probe's tables: column order of ``tokens.parquet`` and the one-row-per-answer table
(docs/definitions.md sections 2 and 8), and how per-answer column dicts become one DataFrame."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from gmts_analysis.core.vocabulary import TOKEN_COLUMNS  # noqa: F401 - the contract columns, re-exported

if TYPE_CHECKING:
    from gmts_analysis.readers.rollouts import Answer




def id_column(values: list) -> list:
    """Keep ids as ints when all are ints within int64, else strings (parquet needs one type)."""
    if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and -2**63 <= int(v) < 2**63
           for v in values):
        return [int(v) for v in values]
    return [str(v) for v in values]


def answers_table(answers: Sequence["Answer"], coefs: Sequence[Any]) -> pd.DataFrame:
    """One row per answer (docs/definitions.md section 8): ids, reward, advantage, length, the token
    ids exactly as probed (``prompt_ids``, ``response_ids``), texts, extras."""
    rows = []
    for a, c in zip(answers, coefs):
        row = {"answer_id": a.answer_id, "group_id": a.group_id, "reward": a.reward, "advantage": c.advantage,
               "length": a.length, "loss_weight": c.loss_weight, "prompt_ids": [int(i) for i in a.prompt_ids],
               "response_ids": [int(i) for i in a.response_ids], "prompt": a.prompt, "response": a.response}
        if a.domain is not None:
            row["domain"] = a.domain
        if a.step is not None:
            row["step"] = a.step
        for k, v in a.extra.items():
            row.setdefault(k, v)
        rows.append(row)
    df = pd.DataFrame(rows)
    for k in ("answer_id", "group_id"):
        df[k] = id_column(list(df[k]))
    return df


def concat_columns(parts: list[dict]) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame({c: [] for c in TOKEN_COLUMNS})
    keys: list[str] = []
    for p in parts:
        for k in p:
            if k not in keys:
                keys.append(k)
    data = {}
    for k in keys:
        vals: list = []
        for p in parts:
            n = len(p["position"])
            v = p.get(k)
            vals.extend(list(v) if v is not None else [None] * n)
        data[k] = vals
    df = pd.DataFrame(data)
    for k in ("answer_id", "group_id"):
        df[k] = id_column(list(df[k]))
    order = [c for c in TOKEN_COLUMNS if c in df.columns] + [c for c in df.columns if c not in TOKEN_COLUMNS]
    return df[order]

