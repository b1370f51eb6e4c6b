"""Run figures of tokens: one group's answers, pooled hexbins of a score vs grad_norm, the token strings."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gmts_analysis.analysis.stats import informative_mask, spearman
from gmts_analysis.analysis.token_strings import ALL, token_strings_table
from gmts_analysis.core.scores import (
    score_color,
)
from gmts_analysis.core.vocabulary import DEFAULT_RHO
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.style import display_token
from gmts_analysis.views.plot_parts import _empty

log = logging.getLogger("gmts_analysis.views.plots")


def pick_group(tokens: pd.DataFrame) -> Any:
    """A group to show: both advantage signs and most tokens with a positive grad_norm."""
    df = tokens
    if "group_id" not in df.columns:
        raise GmtsError("tokens table has no group_id")
    pos = df["grad_norm"].fillna(0) > 0 if "grad_norm" in df.columns else pd.Series(True, index=df.index)
    adv = df["advantage"] if "advantage" in df.columns else pd.Series(0.0, index=df.index)
    g = pd.DataFrame({"g": df["group_id"], "up": adv > 0, "down": adv < 0, "n": pos}).groupby("g", sort=True)
    summary = pd.DataFrame({"both": g["up"].any() & g["down"].any(), "n": g["n"].sum()})
    summary = summary.sort_values(["both", "n"], ascending=False, kind="stable")
    return summary.index[0]


def fig_group_answers(tokens: pd.DataFrame, group_id: Any = None) -> Figure:
    """One group's answers: log entropy vs log grad_norm, a colour per answer, marker by sign(A).

    Inside each answer the points rise together; the answers sit at different heights
    (their |omega| = w |A|), which is why pooled entropy misranks grad_norm.
    """
    fig = Figure(figsize=(6.4, 4.6), layout="constrained")
    ax = fig.add_subplot()
    if group_id is None:
        group_id = pick_group(tokens)
    df = tokens[tokens["group_id"] == group_id]
    if df.empty:
        return _empty(fig, ax, f"group {group_id!r} not found")
    ok = (df["entropy"] > 0) & (df["grad_norm"] > 0)
    n_zero = int((~ok).sum())
    markers = {1: "^", -1: "v", 0: "o"}
    for i, (aid, a) in enumerate(df[ok].groupby("answer_id", sort=True)):
        adv = float(a["advantage"].iloc[0]) if "advantage" in a.columns else 0.0
        sign = int(np.sign(adv))
        m = markers[sign]
        ax.scatter(a["entropy"], a["grad_norm"], s=16, marker=m, color=f"C{i % 10}", alpha=0.75, lw=0.3,
                   edgecolor="black", label=f"answer {aid} (A={adv:+.2f})")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("entropy (nats, log scale)")
    ax.set_ylabel("grad_norm = |ω| · ‖∇ log p‖ (log scale)")
    n_adv = df[ok]["advantage"].round(6).nunique() if "advantage" in df.columns else 0
    title = f"One group ({group_id}): one band per advantage value ({n_adv} values, |ω| = w |A|)"
    if n_zero:
        title += f"\n{n_zero} tokens with zero gradient (A = 0) not shown"
    ax.set_title(title, fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles[:12], labels[:12], fontsize=7, frameon=False, loc="best",
                  title="marker: ▲ A>0, ▼ A<0", title_fontsize=7)
    return fig


def fig_pooled_hexbin(tokens: pd.DataFrame, estimators: Sequence[str] = ("entropy", "gmts")) -> Figure:
    """Every token pooled: each estimator vs grad_norm on log-log hexbins of the tokens with both
    positive; tokens with zero gradient (omega = 0) as a rug under the axis at their score. The
    title gives Spearman over all tokens (the zero-gradient ones included) and over informative
    tokens (omega != 0), and says how many tokens each mark stands for."""
    ests = [s for s in estimators if s in tokens.columns]
    fig = Figure(figsize=(5.6 * max(1, len(ests)), 5.0), layout="constrained")
    axes = fig.subplots(1, max(1, len(ests)), squeeze=False)[0]
    if not ests:
        return _empty(fig, axes[0], "no estimator columns")
    inf = informative_mask(tokens)
    for ax, s in zip(axes, ests):
        x = tokens[s].to_numpy(dtype=float)
        y = tokens["grad_norm"].to_numpy(dtype=float) if "grad_norm" in tokens.columns else np.full(len(x), np.nan)
        fin = np.isfinite(x) & np.isfinite(y)
        ok = fin & (x > 0) & (y > 0)
        if ok.sum() < 2:
            _empty(fig, ax, f"{s}: no positive values")
            continue
        hb = ax.hexbin(x[ok], y[ok], xscale="log", yscale="log", gridsize=40, bins="log", cmap="viridis", mincnt=1)
        fig.colorbar(hb, ax=ax, label="tokens (log)")
        rug = fin & (y == 0) & (x > 0)
        if rug.any():
            ax.plot(x[rug], np.zeros(int(rug.sum())), "|", color="#d62728", ms=8, alpha=0.3,
                    transform=ax.get_xaxis_transform(), clip_on=False)
        n_x0 = int((fin & (x <= 0)).sum())
        rho_all = spearman(x[fin], y[fin])
        rho_inf = spearman(x[fin & inf], y[fin & inf])
        ax.set_xlabel(f"{s} (log scale)")
        ax.set_ylabel("grad_norm (log scale)")
        parts = [f"{int(ok.sum())} tokens in the hexbins"]
        if rug.any():
            parts.append(f"{int(rug.sum())} with zero gradient (red rug)")
        if n_x0:
            parts.append(f"{n_x0} with {s} = 0 (off the log axis)")
        ax.set_title(f"{s} vs grad_norm: Spearman ρ = {rho_all:.2f} over all tokens,\n{rho_inf:.2f} over "
                     f"informative tokens (ω ≠ 0)\n{'; '.join(parts)}", fontsize=8)
    return fig


def fig_token_strings(tokens: pd.DataFrame, rho: float = DEFAULT_RHO, top: int = 12, by: str = "domain") -> Figure | None:
    """Bar charts: the ``top`` strings by gradient-mass share beside the strings entropy and
    GMTS select most (share of each selection), one row per slice (overall, then each domain; a run of
    one domain has one row, named by its domain).

    Returns a matplotlib Figure (no pyplot), or ``None`` when the table cannot be built.
    """
    try:
        t = token_strings_table(tokens, rho, by)
    except GmtsError:
        return None
    names = list(dict.fromkeys(t["slice"]))
    if len(names) == 2 and names[0] == ALL:  # one domain: its row would repeat "all"'s; draw it once, named
        names = names[1:]
    panels = (("grad_mass_share", "share of gradient mass", score_color("oracle")),
              ("kept_entropy_share", f"share of entropy's top {rho:g}", score_color("entropy")),
              ("kept_gmts_share", f"share of GMTS's top {rho:g}", score_color("gmts")))
    fig = Figure(figsize=(12, 0.28 * top * len(names) + 1.2 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), 3, squeeze=False)
    for r, name in enumerate(names):
        s = t[t["slice"] == name]
        for c, (col, title, colour) in enumerate(panels):
            ax = axes[r][c]
            d = s.sort_values([col, "token"], ascending=[False, True], kind="stable").head(top)
            d = d[d[col] > 0]
            y = np.arange(len(d))
            ax.barh(y, d[col].to_numpy(), color=colour)
            ax.set_yticks(y, [display_token(x, 14) for x in d["token"]], fontsize=8)
            ax.invert_yaxis()
            ax.tick_params(axis="x", labelsize=8)
            ax.set_title(f"{name}: {title}", fontsize=9, loc="left")
            for lab in ax.get_yticklabels():
                lab.set_fontfamily("monospace")
    fig.suptitle("Token strings: where the gradient mass is, and what entropy and GMTS select", fontsize=10)
    return fig
