"""Which token strings carry the gradient, and which ones entropy and GMTS select.

The 80/20 paper lists "forking tokens" (high-entropy words such as "however", "wait",
"suppose"); the question a probe can answer exactly is which token *strings* carry the
most policy-gradient mass, and whether the selections pick those strings.

:func:`token_strings_table` groups the tokens table by the decoded token string, overall
and per domain (when the run has a ``domain`` column), and reports per string:

- ``count``: tokens with this string in the slice;
- ``grad_mass``: sum of ``grad_norm`` over them (the norm of each token's term of the
  policy gradient, ``docs/definitions.md`` section 2), and ``grad_mass_share``: that sum
  over the slice's total;
- ``kept_entropy`` / ``kept_gmts``: tokens of this string kept by the top-``rho`` entropy
  / GMTS selection (scope ``batch``: the whole batch pooled, as in training; see
  ``docs/definitions.md`` section 5), and ``kept_entropy_share`` / ``kept_gmts_share``:
  that count over the selection's size in the slice;
- ``kept_oracle`` / ``kept_oracle_share``: the same for the top-``rho`` by ``grad_norm``.

Selections are made once on the whole table (a training batch mixes domains) and then
counted per slice. Rows are sorted by slice ("all" first), then ``grad_mass`` descending.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from gmts_analysis.core.selection import select_top
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import atomic_write_text

ALL = "all"
COLUMNS = (
    "slice", "token", "count", "grad_mass", "grad_mass_share", "kept_entropy", "kept_entropy_share",
    "kept_gmts", "kept_gmts_share", "kept_oracle", "kept_oracle_share",
)
FILENAME = "token_strings.csv"


def token_strings_table(tokens: pd.DataFrame, rho: float = DEFAULT_RHO, by: str = "domain") -> pd.DataFrame:
    """One row per (slice, token string); see the module docstring for the columns.

    tokens: the tokens table (needs ``token``, ``grad_norm``, ``entropy``, ``gmts``,
    ``answer_id``, ``position``). rho: keep fraction of the selections. by: the column whose
    values define the per-slice rows besides the overall slice ``all`` (ignored if absent).
    """
    need = [c for c in ("token", "grad_norm", "entropy", "gmts", "answer_id", "position") if c not in tokens.columns]
    if need:
        raise GmtsError(f"tokens table lacks column(s) {', '.join(need)} (needed for the token strings table)")
    df = tokens.reset_index(drop=True)
    gn = df["grad_norm"].to_numpy(dtype=np.float64)
    if np.isnan(gn).all():
        raise GmtsError("grad_norm was not computed in this run (--grad-norm none): no gradient mass to count")
    base = pd.DataFrame({
        "token": df["token"].astype(str).to_numpy(),
        "grad_mass": np.nan_to_num(gn, nan=0.0),
        "kept_entropy": select_top(df, "entropy", rho, "batch"),
        "kept_gmts": select_top(df, "gmts", rho, "batch"),
        "kept_oracle": select_top(df, "grad_norm", rho, "batch"),
    })
    slices: list[tuple[str, np.ndarray]] = [(ALL, np.ones(len(df), dtype=bool))]
    if by in df.columns:
        vals = df[by].astype(str).to_numpy()
        slices += [(v, vals == v) for v in sorted(set(vals))]
    parts = []
    for name, mask in slices:
        b = base[mask]
        g = b.groupby("token", sort=True)
        t = pd.DataFrame({
            "count": g.size(),
            "grad_mass": g["grad_mass"].sum(),
            "kept_entropy": g["kept_entropy"].sum(),
            "kept_gmts": g["kept_gmts"].sum(),
            "kept_oracle": g["kept_oracle"].sum(),
        }).reset_index()
        total = float(b["grad_mass"].sum())
        t["grad_mass_share"] = t["grad_mass"] / total if total > 0 else np.nan
        for k in ("entropy", "gmts", "oracle"):
            n_sel = int(b[f"kept_{k}"].sum())
            t[f"kept_{k}_share"] = t[f"kept_{k}"] / n_sel if n_sel else np.nan
        t.insert(0, "slice", name)
        t = t.sort_values(["grad_mass", "token"], ascending=[False, True], kind="stable")
        parts.append(t)
    out = pd.concat(parts, ignore_index=True)
    for c in ("count", "kept_entropy", "kept_gmts", "kept_oracle"):
        out[c] = out[c].astype(np.int64)
    return out[list(COLUMNS)]


def write_token_strings(run_dir: str | os.PathLike, tokens: pd.DataFrame, rho: float = DEFAULT_RHO) -> Path | None:
    """Write ``token_strings.csv`` into ``run_dir`` (atomic); ``None`` when the run has no
    grad_norm or no token strings (nothing to count)."""
    try:
        t = token_strings_table(tokens, rho)
    except GmtsError:
        return None
    return atomic_write_text(Path(run_dir) / FILENAME, t.to_csv(index=False, float_format="%.6g"))
