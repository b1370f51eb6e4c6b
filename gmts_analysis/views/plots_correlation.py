"""Run figures of correlations: inside vs across answers, the decomposition (all vs informative tokens,
per slice) and every estimator's paired difference with entropy."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from gmts_analysis.analysis.stats import estimator_table, prepare_tokens, within_values
from gmts_analysis.analysis.stats_types import Block, Statistics
from gmts_analysis.core.scores import (
    ANSWER_CONSTANT_SCORES,
    figure_scores,
)
from gmts_analysis.views.plot_parts import StatsLike, _color, _empty, _errbar, _num

log = logging.getLogger("gmts_analysis.views.plots")


WITHIN_CROSS_ESTIMATORS = figure_scores("within_vs_cross")  # the registry's scores with this figure (core/scores.py)


def _within_panel(ax, per_answer: pd.DataFrame, ests: Sequence[str], block: Block, rng: np.random.Generator) -> None:
    """Per-answer Spearman points (seeded jitter); the median (the summary table's number, labelled) with
    the interquartile range, and beside it the mean with its 95% CI; on a zoomed axis."""
    allv = []
    for i, s in enumerate(ests):
        rhos = per_answer[s].to_numpy(dtype=float) if s in per_answer else np.zeros(0)
        allv.append(rhos)
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(rhos)), rhos, s=5, color=_color(s, i), alpha=0.45, lw=0)
        entry = block.within_answer.get(s)
        if entry is None:
            continue
        med, q25, q75 = _num(entry.median), _num(entry.q25), _num(entry.q75)
        if np.isfinite(q25) and np.isfinite(q75):
            ax.plot([i, i], [q25, q75], color="black", lw=2.4, alpha=0.55, solid_capstyle="butt", zorder=4)
        if np.isfinite(med):
            ax.plot([i], [med], "D", color="black", mfc="white", ms=6, zorder=5)
        _errbar(ax, i + 0.27, entry, "mean", fmt="o", color="black", ms=3, lw=0.9, zorder=5)
        if np.isfinite(med):
            ax.annotate(f"{med:.3f}", (i + 0.27, med), xytext=(5, 0), textcoords="offset points", va="center",
                        fontsize=6.5)
    v = np.concatenate(allv) if allv else np.zeros(0)
    v = v[np.isfinite(v)]
    if len(v):
        lo = float(np.quantile(v, 0.02))
        ax.set_ylim(max(-1.02, lo - 0.05 * (1.0 - lo) - 0.01), 1.01)
    _estimator_axis(ax, ests)


def _estimator_axis(ax, ests: Sequence[str]) -> None:
    ax.set_xticks(range(len(ests)), ests, rotation=20, fontsize=8)
    ax.set_xlim(-0.6, len(ests) - 0.4)
    ax.grid(alpha=0.3, axis="y")


def _cross_panel(ax, ests: Sequence[str], block: Block) -> None:
    """Pooled Spearman with grad_norm over all tokens (open) and informative tokens (filled), 95% CIs;
    each value written on the outer side of its point, small enough not to meet the next estimator's."""
    for i, s in enumerate(ests):
        c = _color(s, i)
        r = _errbar(ax, i - 0.12, block.cross_answer.get(s), "spearman", fmt="D", color=c,
                    mfc="white", mec=c, ms=6)
        ri = _errbar(ax, i + 0.12, block.cross_answer_informative.get(s), "spearman", fmt="D",
                     color=c, mec="black", ms=6)
        for x, v, ha, dx in ((i - 0.12, r, "right", -5), (i + 0.12, ri, "left", 5)):
            if np.isfinite(v):
                ax.annotate(f"{v:.2f}", (x, v), xytext=(dx, 0), textcoords="offset points", va="center", ha=ha,
                            fontsize=6.5)
    ax.axhline(0, color="grey", lw=0.6, ls=":")
    ax.set_ylim(-1.05, 1.05)
    _estimator_axis(ax, ests)


def _within_cross_rows(df: pd.DataFrame, st: Statistics) -> list[tuple[str, pd.DataFrame, Block]]:
    """The figure's rows: every token, then the uncertain tokens (prob < ``meta.uncertain_below``) when the
    run has them; each with its title, its tokens and its statistics block."""
    rows: list[tuple[str, pd.DataFrame, Block]] = [("every token", df, st)]
    unc, below = st.uncertain, _num(st.meta.uncertain_below)
    if unc is not None and unc.within_answer and "prob" in df.columns and np.isfinite(below):
        rows.append((f"tokens with prob < {below:g} ({100 * _num(unc.token_share):.0f}% of tokens, "
                     f"{100 * _num(unc.mass_share):.0f}% of the gradient)", df[df["prob"] < below], unc))
    return rows


def fig_within_vs_cross(
    tokens: pd.DataFrame, stats: StatsLike | None = None, estimators: Sequence[str] = WITHIN_CROSS_ESTIMATORS
) -> Figure:
    """Inside answers vs across answers, on every token and on the uncertain ones (the paper's figure).

    Left column: per-answer Spearman(s, grad_norm_logp) (the same informative answers for every
    estimator, :func:`gmts_analysis.analysis.stats.within_values`), points with seeded jitter, the median
    (the number the summary prints) with the interquartile range, and the mean with its 95% CI (cluster
    bootstrap), on an axis zoomed to the data. Right column: pooled Spearman(s, grad_norm) over all
    tokens (open) and informative tokens, omega != 0 (filled), 95% CIs. One row of panels per token set,
    titled above it: every token; tokens with prob < ``meta.uncertain_below`` (stats ``uncertain``), when
    the run has them. The masked baseline ``entropy_inf`` sits beside entropy and GMTS.
    """
    df = prepare_tokens(tokens)
    st = Statistics.coerce(stats)
    ests = [s for s in estimators if s in df.columns]
    rows = _within_cross_rows(df, st)
    fig = Figure(figsize=(12.5, 3.9 * len(rows) + 0.7), layout="constrained")
    subs = fig.subfigures(len(rows), 1, squeeze=False)[:, 0]
    if not ests:
        return _empty(fig, subs[0].subplots(), "no estimator columns")
    rng = np.random.default_rng(0)
    for (label, sub, block), sf in zip(rows, subs):
        ax1, ax2 = sf.subplots(1, 2)
        per_answer = within_values(sub.reset_index(drop=True), ests)
        sf.suptitle(label, fontsize=9.5, fontweight="bold")
        _within_panel(ax1, per_answer, ests, block, rng)
        ax1.set_title(f"within answers ({len(per_answer)} answers)", fontsize=9)
        ax1.set_ylabel("Spearman ρ with ‖∇ log p‖", fontsize=8)
        _cross_panel(ax2, ests, block)
        ax2.set_title("across answers (pooled tokens)", fontsize=9)
        ax2.set_ylabel("Spearman ρ with grad_norm", fontsize=8)
    ax = fig.axes[0]
    ax.plot([], [], "D", color="black", mfc="white", ms=6, label="median over answers (value written beside; bar: interquartile range)")
    ax.errorbar([], [], fmt="o", color="black", ms=3, label="mean over answers (95% CI)")
    ax.errorbar([], [], fmt="D", color="grey", mfc="white", label="all tokens (95% CI)")
    ax.errorbar([], [], fmt="D", color="grey", mec="black", label="informative tokens, ω ≠ 0 (95% CI)")
    fig.legend(loc="outside lower center", ncols=4, fontsize=7, frameon=False)
    fig.suptitle("Inside an answer (target ‖∇ log p‖, zoomed axis) vs across answers (target grad_norm = |ω| ‖∇ log p‖)",
                 fontsize=10)
    return fig


DECOMPOSITION_ESTIMATORS = figure_scores("decomposition")


def fig_decomposition(stats: StatsLike, estimators: Sequence[str] = DECOMPOSITION_ESTIMATORS,
                      rho: str | None = None) -> Figure:
    """How much of an estimator's cross-answer failure is picking tokens without gradient.

    Left: cross-answer Spearman(s, grad_norm) over all tokens (open marker) and over informative
    tokens, omega != 0 (filled), with 95% CIs. Right: the share of a top-``rho`` selection spent
    on tokens with omega = 0 (``selection_waste``), batch and group scope, with 95% CIs. A score
    whose gap closes on informative tokens fails by wasted picks; one that stays low fails on
    magnitude. Every number comes from ``stats`` (version 2 or later).
    """
    st = Statistics.coerce(stats)
    rk = rho or st.rho_key
    ca, ci = st.cross_answer, st.cross_answer_informative
    ests = [s for s in estimators if s in ca]
    fig = Figure(figsize=(3.0 + 1.5 * max(1, len(ests)), 4.4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1.15, 1.0])
    if not ests or not ci:
        return _empty(fig, ax1, "no informative-token statistics (stats.json version 2 or later needed)")
    for i, s in enumerate(ests):
        c = _color(s, i)
        a = _errbar(ax1, i - 0.13, ca.get(s), "spearman", fmt="o", color=c, mfc="white", mec=c, ms=7)
        b = _errbar(ax1, i + 0.13, ci.get(s), "spearman", fmt="o", color=c, mec="black", ms=7)
        if np.isfinite(a) and np.isfinite(b):
            ax1.annotate("", (i + 0.13, b), (i - 0.13, a), arrowprops={"arrowstyle": "->", "color": "grey", "lw": 0.8})
        for x, v, ha in ((i - 0.13, a, "right"), (i + 0.13, b, "left")):
            if np.isfinite(v):
                ax1.annotate(f"{v:.2f}", (x, v), xytext=(-6 if ha == "right" else 6, 0), textcoords="offset points",
                             ha=ha, va="center", fontsize=7)
    ax1.errorbar([], [], fmt="o", color="grey", mfc="white", label="all tokens")
    ax1.errorbar([], [], fmt="o", color="grey", mec="black", label="informative tokens (ω ≠ 0)")
    ax1.set_xticks(range(len(ests)), ests, rotation=20, ha="right", fontsize=8)
    ax1.set_xlim(-0.6, len(ests) - 0.4)
    ax1.set_ylim(min(-0.05, ax1.get_ylim()[0]), 1.05)
    ax1.axhline(0, color="grey", lw=0.6, ls=":")
    ax1.set_ylabel("cross-answer Spearman ρ with grad_norm")
    ax1.legend(fontsize=7, frameon=False, loc="lower right")
    ax1.set_title("Across answers: all vs informative tokens", fontsize=9)
    sw, swc = st.selection_waste, st.selection_waste_ci
    scopes = [sc for sc in ("batch", "group") if sc in sw]
    width = 0.8 / max(1, len(scopes))
    for j, sc in enumerate(scopes):
        for i, s in enumerate(ests):
            v = _num(sw.at(sc, s, rk))
            if not np.isfinite(v):
                continue
            x = i - 0.4 + width * (j + 0.5)
            ax2.bar([x], [100 * v], width=width * 0.9, color=_color(s, i), alpha=1.0 if sc == "batch" else 0.45,
                    edgecolor="black", lw=0.4, label=f"{sc} scope" if i == 0 else None, hatch=None if sc == "batch" else "//")
            b = swc.at(sc, s, rk)
            lo, hi = _num(b.ci_low), _num(b.ci_high)
            if np.isfinite(lo) and np.isfinite(hi):
                ax2.errorbar([x], [100 * v], yerr=[[100 * max(v - lo, 0)], [100 * max(hi - v, 0)]], color="black",
                             capsize=2, lw=0.8)
            ax2.annotate(f"{100 * v:.0f}%", (x, 100 * v), xytext=(0, 2), textcoords="offset points", ha="center",
                         va="bottom", fontsize=6)
    share = _num(st.zero_advantage.token_share if st.zero_advantage is not None else None)
    if np.isfinite(share):
        ax2.axhline(100 * share, color="grey", ls="--", lw=0.8, label=f"tokens with ω = 0: {100 * share:.0f}%")
    ax2.set_xticks(range(len(ests)), ests, rotation=20, ha="right", fontsize=8)
    ax2.set_ylabel(f"% of a top-{float(rk):g} selection with ω = 0")
    ax2.set_ylim(0, 100)
    ax2.legend(fontsize=7, frameon=False, loc="upper right")
    ax2.set_title("Selection waste (picks without gradient)", fontsize=9)
    return fig


def fig_decomposition_slices(stats: StatsLike, section: str | None = None,
                             estimators: Sequence[str] = ("entropy", "gmts")) -> Figure | None:
    """The decomposition per domain (or per step): for each slice, the share of tokens with
    omega = 0 (bars, right axis) and each estimator's cross-answer Spearman over all tokens (open)
    and over informative tokens (filled), with 95% CIs. None when the run has no slices."""
    st = Statistics.coerce(stats)
    section = section or next((k for k in ("by_domain", "by_step") if st.slices(k)), None)
    sl = st.slices(section) if section else None
    if not sl:
        return None
    names = list(sl)
    ests = [e for e in estimators if e in st.cross_answer]
    fig = Figure(figsize=(2.2 + 1.6 * len(names), 4.2), layout="constrained")
    ax = fig.add_subplot()
    ax2 = ax.twinx()
    share = [100 * _num(sl[k].zero_advantage.token_share if sl[k].zero_advantage is not None else None)
             for k in names]
    ax2.bar(range(len(names)), share, width=0.75, color="#dddddd", zorder=0, label="tokens with ω = 0")
    for x, v in enumerate(share):
        if np.isfinite(v):
            ax2.annotate(f"{v:.0f}% ω = 0", (x, v), xytext=(0, 2), textcoords="offset points", ha="center",
                         fontsize=7, color="#666666")
    ax2.set_ylim(0, 100)
    ax2.set_ylabel("% of tokens with ω = 0 (bars)", color="#666666")
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    off = np.linspace(-0.25, 0.25, 2 * max(1, len(ests)))
    for i, e in enumerate(ests):
        c = _color(e, i)
        for x, k in enumerate(names):
            _errbar(ax, x + off[2 * i], sl[k].cross_answer.get(e), "spearman", fmt="o", color=c,
                    mfc="white", mec=c, ms=6)
            _errbar(ax, x + off[2 * i + 1], sl[k].cross_answer_informative.get(e), "spearman",
                    fmt="o", color=c, mec="black", ms=6)
        ax.errorbar([], [], fmt="o", color=c, mfc="white", label=f"{e}: all tokens")
        ax.errorbar([], [], fmt="o", color=c, mec="black", label=f"{e}: ω ≠ 0")
    ax.set_xticks(range(len(names)), names)
    ax.set_xlim(-0.6, len(names) - 0.4)
    ax.set_ylim(min(-0.05, ax.get_ylim()[0]), 1.05)
    ax.set_ylabel("cross-answer Spearman ρ with grad_norm")
    ax.legend(fontsize=7, frameon=False, loc="lower left", ncols=2)
    ax.set_title(f"Across answers per {section.removeprefix('by_')}: all vs informative tokens", fontsize=10)
    return fig


PAIRED_PANELS = (("within_answer", "within answers: mean ρ vs ‖∇ log p‖"),
                 ("cross_answer_informative", "across answers, ω ≠ 0: ρ vs grad_norm"),
                 ("mass_capture", "gradient mass captured (batch, run's ρ)"))


def fig_estimators(tokens: pd.DataFrame, stats: StatsLike, ref: str = "entropy") -> Figure:
    """Every estimator, ranked (``estimators.csv``, ties by paired CI): its paired difference with
    ``ref`` (``paired_difference.<statistic>.<s>.<ref>``, 95% CI from the same group resamples) on
    the within-answer mean, the informative cross-answer Spearman and the mass capture. A CI that
    crosses 0 (dotted) cannot tell the score from ``ref``; identities by construction are marked
    "=" without an interval. Deterministic: no random jitter."""
    st = Statistics.coerce(stats)
    table = estimator_table(st)
    ests = [s for s in table["estimator"] if s != ref]
    panels = [(k, t) for k, t in PAIRED_PANELS if k in st.paired_difference]
    fig = Figure(figsize=(3.6 * max(1, len(panels)) + 1.6, 1.3 + 0.36 * max(3, len(ests))), layout="constrained")
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False, sharey=True)[0]
    if not ests or not panels:
        return _empty(fig, axes[0], f"no paired differences with {ref} in stats (run gmts stats)")
    rk = table.set_index("estimator")["rank"]
    fixed = st.fixed
    for ax, (stat, title) in zip(axes, panels):
        pdiff = st.paired_difference
        # the axis spans the estimators' intervals; the |omega| baseline (far off) is written at the edge
        ends = [_num(v) for s in ests if s not in ANSWER_CONSTANT_SCORES and (d := pdiff.get(stat, s, ref)) is not None
                for v in (d.diff, d.ci_low, d.ci_high)]
        ends = [e for e in ends if np.isfinite(e)] + [0.0]
        pad = 0.08 * (max(ends) - min(ends) or 1e-3)
        x_lo, x_hi = min(ends) - pad, max(ends) + pad
        ax.set_xlim(x_lo, x_hi)
        for i, s in enumerate(ests):
            d = pdiff.get(stat, s, ref)
            if d is None:
                continue
            v, lo, hi = _num(d.diff), _num(d.ci_low), _num(d.ci_high)
            if f"paired_difference.{stat}.{s}.{ref}" in fixed:
                ax.annotate("= by construction", (0, i), ha="center", va="center", fontsize=6, color="#555555")
                continue
            if not np.isfinite(v):
                continue
            sig = np.isfinite(lo) and (lo > 0 or hi < 0)
            if not x_lo <= v <= x_hi:
                edge, ha = (x_lo, "left") if v < x_lo else (x_hi, "right")
                ax.annotate(("◀ " if v < x_lo else "") + f"{v:+.3f}" + (" ▶" if v > x_hi else ""), (edge, i),
                            ha=ha, va="center", fontsize=7, color=_color(s, i))
                continue
            ax.errorbar([v], [i], xerr=[[max(v - lo, 0)], [max(hi - v, 0)]] if np.isfinite(lo) else None, fmt="o",
                        color=_color(s, i) if sig else "white", mec=_color(s, i), ecolor=_color(s, i), capsize=3, ms=5)
        ax.axvline(0, color="grey", lw=0.8, ls=":")
        ax.set_title(title, fontsize=8)
        ax.set_xlabel(f"score - {ref} (paired, 95% CI)", fontsize=8)
        ax.grid(alpha=0.3, axis="x")
        ax.tick_params(axis="x", labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # few, short labels: they never run into each other
    axes[0].set_yticks(range(len(ests)), [f"{int(rk[s])}. {s}" for s in ests], fontsize=8)
    axes[0].set_ylim(len(ests) - 0.5, -0.5)
    n = st.meta.n_ci_units
    unit = st.meta.ci_unit if st.meta.has("ci_unit") else "group"
    fig.suptitle(f"Estimators vs {ref}: paired differences over {n} resampled {unit}s "
                 "(filled: CI excludes 0; rank ties by paired CI)", fontsize=9)
    return fig


