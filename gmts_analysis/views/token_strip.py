"""The token strip: one answer's tokens coloured by entropy and by grad_norm, with the entropy and
GMTS selections under them (``token_strip`` of :data:`gmts_analysis.views.figures.FIGURE_ENTRIES`).
Moved as is from :mod:`gmts_analysis.views.plots`, which re-exports it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gmts_analysis.core.scores import score_color
from gmts_analysis.core.selection import answer_disagreement, select_top
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.util.style import display_token
from gmts_analysis.views.plots import _empty


def pick_answer(tokens: pd.DataFrame, a: str = "entropy", b: str = "gmts", rho: float = DEFAULT_RHO) -> Any:
    """The answer whose tokens ``a`` and ``b`` select most differently (batch scope), among
    answers with a non-zero gradient when there are any."""
    d = answer_disagreement(tokens, a, b, rho, "batch")
    if "grad_norm" in tokens.columns:  # prefer answers whose tokens have a gradient at all
        live = tokens.loc[tokens["grad_norm"].fillna(0) > 0, "answer_id"].unique()
        if len(live):
            d = d[d["answer_id"].isin(live)]
    return d["answer_id"].iloc[0]


STRIP_ROWS = (("entropy", "entropy", "Blues"), ("grad_norm", "grad_norm", "Oranges"),
              ("entropy keeps", "_se", None), ("GMTS keeps", "_sg", None))  # (label, column, colour map)


def fig_token_strip(
    tokens: pd.DataFrame,
    answer_id: Any = None,
    rho: float = DEFAULT_RHO,
    scope: str = "batch",
    per_line: int = 32,
    max_tokens: int = 160,
) -> Figure:
    """One answer as a strip of tokens: coloured by entropy, by grad_norm, and the tokens the
    entropy and GMTS selections keep (top-``rho`` in ``scope``, computed on the whole table).

    Colours are log-scaled inside the answer (dark = high). Long answers are cut to
    ``max_tokens``; the strip wraps every ``per_line`` tokens.
    """
    if answer_id is None:
        answer_id = pick_answer(tokens, rho=rho)
    sel_e = select_top(tokens, "entropy", rho, scope)
    sel_g = select_top(tokens, "gmts", rho, scope) if "gmts" in tokens.columns else np.zeros(len(tokens), bool)
    m = (tokens["answer_id"] == answer_id).to_numpy()
    a = tokens[m].assign(_se=sel_e[m], _sg=sel_g[m]).sort_values("position")
    n_all = len(a)
    a = a.head(max_tokens)
    n = len(a)
    lines = max(1, -(-n // per_line))
    fig = Figure(figsize=(min(16.0, 0.42 * max(min(n, per_line), 14) + 1.8), 0.8 + 1.25 * lines),
                 layout="constrained")
    ax = fig.add_subplot()
    if n == 0:
        return _empty(fig, ax, f"answer {answer_id!r} not found")
    _draw_strip(ax, a, _strip_colours(a), per_line)
    ax.set_xlim(-4.0, max(min(n, per_line), 14))
    ax.set_ylim(lines * (len(STRIP_ROWS) + 0.6), -0.2)
    ax.set_axis_off()
    adv = float(a["advantage"].iloc[0]) if "advantage" in a.columns else float("nan")
    cut = f", first {n} of {n_all} tokens" if n < n_all else ""
    ax.set_title(
        f"answer {answer_id} (A = {adv:+.2f}{cut})\ncolour: value inside the answer (log scale, dark = high); "
        f"selections: top {rho:.0%} per {scope}", fontsize=8, loc="left", parse_math=False,
    )
    return fig


def _strip_colours(a: pd.DataFrame) -> dict[str, tuple[Any, Any]]:
    """``{column: (colour map, norm)}`` of the coloured rows: log-scaled over the answer's positive values."""
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize

    cmaps = {}
    for _label, col, cmap in STRIP_ROWS:
        if cmap is None:
            continue
        v = a[col].to_numpy(dtype=float)
        pos = v[np.isfinite(v) & (v > 0)]
        norm = LogNorm(pos.min(), pos.max()) if len(pos) >= 2 and pos.max() > pos.min() else Normalize(0, 1)
        cmaps[col] = (colormaps[cmap], norm)
    return cmaps


def _strip_cell(val: Any, col: str, cmap: str | None, cmaps: dict) -> tuple[Any, str]:
    """Face and text colour of one cell: a selection flag, or a value on its row's colour map."""
    if cmap is None:
        face = score_color("entropy" if col == "_se" else "gmts") if bool(val) else "white"
        return face, "white" if bool(val) else "#bbbbbb"
    cm, norm = cmaps[col]
    fv = float(val) if np.isfinite(val) and val > 0 else np.nan
    face = cm(norm(fv)) if np.isfinite(fv) else (0.9, 0.9, 0.9, 1)
    return face, "white" if np.isfinite(fv) and norm(fv) > 0.6 else "black"


def _draw_strip(ax, a: pd.DataFrame, cmaps: dict, per_line: int) -> None:
    """The cells of every token (one row per :data:`STRIP_ROWS` entry), wrapped every ``per_line`` tokens."""
    row_h = 1.0
    block = len(STRIP_ROWS) + 0.6
    toks = [display_token(t, 4) for t in a["token"]]
    for j in range(len(a)):
        line, x = divmod(j, per_line)
        y0 = line * block
        for r, (_label, col, cmap) in enumerate(STRIP_ROWS):
            y = y0 + r * row_h
            face, txt_color = _strip_cell(a[col].iloc[j], col, cmap, cmaps)
            ax.add_patch(_rect(x, y, face))
            ax.text(x + 0.5, y + 0.5, toks[j], ha="center", va="center", fontsize=6, color=txt_color,
                    parse_math=False, family="DejaVu Sans Mono")
        if x == 0:
            for r, (label, _, _) in enumerate(STRIP_ROWS):
                ax.text(-0.3, y0 + r * row_h + 0.5, label, ha="right", va="center", fontsize=7, parse_math=False)


def _rect(x: float, y: float, face) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.04, y + 0.04), 0.92, 0.92, facecolor=face, edgecolor="#dddddd", lw=0.3)
