"""Figures of a probe: plain matplotlib functions of the tables, one figure each.

Every ``fig_*`` function takes the tokens table and/or the stats dict and returns a
:class:`matplotlib.figure.Figure` built without pyplot (no global state, any backend;
files are written with Agg). The figures of a run as entries (name, draw function, caption, which
runs) and writing them (``render_all``, ``save_figure``) are :mod:`gmts_analysis.views.figures`; the
token strip is :mod:`gmts_analysis.views.token_strip` (both re-exported here).

- ``within_vs_cross``: per-answer Spearman(s, grad_norm_logp) (zoomed) beside the pooled
  cross-answer Spearman(s, grad_norm), with 95% CIs, for entropy, the masked baseline
  entropy_inf, gmts, 1 - p and gmts_lgn; a second row over the uncertain tokens.
- ``decomposition``: cross-answer Spearman over all vs informative tokens (omega != 0) and the
  selection waste, for entropy, gmts, abs_omega, surprisal and logit_grad_norm, with CIs.
- ``decomposition_slices``: the same per domain (or step), beside each slice's zero-advantage share.
- ``estimators``: every estimator ranked (ties by paired CI), as paired differences with
  entropy on the within-answer mean, informative cross-answer Spearman and mass capture.
- ``group_answers``: one group's answers, log entropy vs log grad_norm, one colour per
  answer, marker by advantage sign.
- ``pooled_hexbin``: entropy vs grad_norm next to gmts vs grad_norm (log-log hexbins, zero-gradient
  tokens as a rug), with Spearman over all and over informative tokens.
- ``topk_overlap``: overlap with the top-rho tokens by grad_norm vs rho, every estimator.
- ``mass_capture``: the grad_norm mass a top-rho selection captures over the best possible, vs rho.
- ``update_fidelity``: cosine and norm ratio of the selected tokens' update vs the full one.
- ``token_strip``: one answer's tokens coloured by entropy and by grad_norm, with the
  entropy and GMTS selections under them.
- ``token_strings``: the token strings carrying the most gradient mass beside those entropy
  and GMTS select most, overall and per domain (:mod:`gmts_analysis.analysis.token_strings`).

Selections use the run's keep fraction (:func:`gmts_analysis.views.figures.run_rho`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from gmts_analysis.analysis.runs import RunTables
from gmts_analysis.analysis.stats_types import Block, CrossEntry, Statistics, WithinEntry
from gmts_analysis.core.scores import (
    ANSWER_CONSTANT_SCORES,
    HEADLINE_SCORES,
    MASKED_SCORES,
    figure_scores,
)
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.style import COLORS, display_token  # noqa: F401 - display_token re-exported (report)

log = logging.getLogger(__name__)

StatsLike = Statistics | Mapping[str, Any]  # a run's statistics, typed or as the stats.json dict



# ------------------------------------------------------------------------ run directory


Run = RunTables  # a run's tables; the one home is gmts_analysis.analysis.runs


def default_run_dir() -> Path:
    """``$GMTS_RUN_DIR``, else the shipped example run (:func:`gmts_analysis.util.resources.example_run_dir`)."""
    from gmts_analysis.util.resources import example_run_dir

    env = os.environ.get("GMTS_RUN_DIR")
    return Path(env) if env else example_run_dir()


def load_run(run_dir: str | os.PathLike | None = None, compute_missing_stats: bool = True) -> Run:
    """Read a run directory (default: :func:`default_run_dir`) with :func:`gmts_analysis.analysis.runs.read_run`.

    stats.json is computed (and not written) when absent and ``compute_missing_stats``.
    """
    from gmts_analysis.analysis.runs import read_run

    path = Path(run_dir) if run_dir is not None else default_run_dir()
    if not path.is_dir():
        raise GmtsError(f"{path}: no such run directory (set GMTS_RUN_DIR or pass a path)")
    return read_run(path, compute_missing_stats)


# ------------------------------------------------------------------------------ helpers


def _color(name: str, i: int) -> str:
    if name in COLORS:
        return COLORS[name]
    # never entropy's or gmts's colour for another score
    cycle = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#393b79", "#637939", "#843c39"]
    return cycle[i % len(cycle)]


def _num(x: Any) -> float:
    return float("nan") if x is None else float(x)


def _empty(fig: Figure, ax, msg: str) -> Figure:
    ax.text(0.5, 0.5, msg, ha="center", va="center", transform=ax.transAxes, parse_math=False)
    ax.set_axis_off()
    return fig


# ----------------------------------------------------------------------------- figures


WITHIN_CROSS_ESTIMATORS = figure_scores("within_vs_cross")  # the registry's scores with this figure (core/scores.py)


def _within_panel(ax, per_answer: pd.DataFrame, ests: Sequence[str], block: Block, rng: np.random.Generator) -> None:
    """Per-answer Spearman points (seeded jitter) with the mean and its 95% CI, on a zoomed axis."""
    allv = []
    for i, s in enumerate(ests):
        c = _color(s, i)
        rhos = per_answer[s].to_numpy(dtype=float) if s in per_answer else np.zeros(0)
        allv.append(rhos)
        ax.scatter(i + rng.uniform(-0.18, 0.18, len(rhos)), rhos, s=5, color=c, alpha=0.45, lw=0)
        entry = block.within_answer.get(s)
        _errbar(ax, i, entry, "mean", fmt="D", color="black", mfc="white", ms=6, zorder=5)
        m = _num(entry.mean) if entry is not None else float("nan")
        if np.isfinite(m):
            ax.annotate(f"{m:.3f}", (i, m), xytext=(9, 0), textcoords="offset points", va="center", fontsize=7)
    v = np.concatenate(allv) if allv else np.zeros(0)
    v = v[np.isfinite(v)]
    if len(v):
        lo = float(np.quantile(v, 0.02))
        ax.set_ylim(max(-1.02, lo - 0.05 * (1.0 - lo) - 0.01), 1.01)
    ax.set_xticks(range(len(ests)), ests, rotation=20, fontsize=8)
    ax.set_xlim(-0.6, len(ests) - 0.4)
    ax.grid(alpha=0.3, axis="y")


def _cross_panel(ax, ests: Sequence[str], block: Block) -> None:
    """Pooled Spearman with grad_norm over all tokens (open) and informative tokens (filled), 95% CIs."""
    for i, s in enumerate(ests):
        c = _color(s, i)
        r = _errbar(ax, i - 0.12, block.cross_answer.get(s), "spearman", fmt="D", color=c,
                    mfc="white", mec=c, ms=7)
        ri = _errbar(ax, i + 0.12, block.cross_answer_informative.get(s), "spearman", fmt="D",
                     color=c, mec="black", ms=7)
        for x, v, ha, dx in ((i - 0.12, r, "right", -7), (i + 0.12, ri, "left", 7)):
            if np.isfinite(v):
                ax.annotate(f"{v:.2f}", (x, v), xytext=(dx, 0), textcoords="offset points", va="center", ha=ha,
                            fontsize=7)
    ax.axhline(0, color="grey", lw=0.6, ls=":")
    ax.set_xticks(range(len(ests)), ests, rotation=20, fontsize=8)
    ax.set_xlim(-0.6, len(ests) - 0.4)
    ax.set_ylim(-1.05, 1.05)
    ax.grid(alpha=0.3, axis="y")


def fig_within_vs_cross(
    tokens: pd.DataFrame, stats: StatsLike | None = None, estimators: Sequence[str] = WITHIN_CROSS_ESTIMATORS
) -> Figure:
    """Inside answers vs across answers, on every token and on the uncertain ones (the paper's figure).

    Left column: per-answer Spearman(s, grad_norm_logp) (the same informative answers for every
    estimator, :func:`gmts_analysis.analysis.stats.within_values`), points with seeded jitter, the mean and
    its 95% CI (cluster bootstrap), on an axis zoomed to the data. Right column: pooled
    Spearman(s, grad_norm) over all tokens (open) and informative tokens, omega != 0 (filled),
    95% CIs. Top row: every token; bottom row: tokens with prob < ``meta.uncertain_below``
    (stats ``uncertain``), when the run has them. The masked baseline ``entropy_inf`` sits beside
    entropy and GMTS.
    """
    from gmts_analysis.analysis.stats import prepare_tokens, within_values

    df = prepare_tokens(tokens)
    st = Statistics.coerce(stats)
    ests = [s for s in estimators if s in df.columns]
    unc = st.uncertain
    below = _num(st.meta.uncertain_below)
    rows: list[tuple[str, pd.DataFrame, Block]] = [("every token", df, st)]
    if unc is not None and unc.within_answer and "prob" in df.columns and np.isfinite(below):
        rows.append((f"tokens with prob < {below:g} ({100 * _num(unc.token_share):.0f}% of tokens, "
                     f"{100 * _num(unc.mass_share):.0f}% of the gradient)", df[df["prob"] < below], unc))
    fig = Figure(figsize=(11.0, 3.6 * len(rows) + 0.6), layout="constrained")
    axes = fig.subplots(len(rows), 2, squeeze=False)
    if not ests:
        return _empty(fig, axes[0][0], "no estimator columns")
    rng = np.random.default_rng(0)
    for (label, sub, block), (ax1, ax2) in zip(rows, axes):
        per_answer = within_values(sub.reset_index(drop=True), ests)
        _within_panel(ax1, per_answer, ests, block, rng)
        n = len(per_answer)
        ax1.set_title(f"within answers ({n} answers): {label}", fontsize=9)
        ax1.set_ylabel("Spearman ρ with ‖∇ log p‖", fontsize=8)
        _cross_panel(ax2, ests, block)
        ax2.set_title(f"across answers: {label}", fontsize=9)
        ax2.set_ylabel("Spearman ρ with grad_norm", fontsize=8)
    axes[0][1].errorbar([], [], fmt="D", color="grey", mfc="white", label="all tokens (95% CI)")
    axes[0][1].errorbar([], [], fmt="D", color="grey", mec="black", label="informative tokens, ω ≠ 0")
    axes[0][0].errorbar([], [], fmt="D", color="black", mfc="white", label="mean over answers (95% CI)")
    fig.legend(loc="outside lower center", ncols=3, fontsize=7, frameon=False)
    fig.suptitle("Inside an answer (target ‖∇ log p‖, zoomed axis) vs across answers (target grad_norm = |ω| ‖∇ log p‖)",
                 fontsize=10)
    return fig


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
    from gmts_analysis.analysis.stats import informative_mask, spearman

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


def fig_topk_overlap(stats: StatsLike, scopes: Sequence[str] = ("batch", "group")) -> Figure:
    """Top-k overlap with the grad_norm selection vs the kept fraction, every estimator.

    The dotted diagonal is the expected overlap of a random selection (= rho). Error bars on
    entropy, the masked baseline entropy_inf (dashed) and gmts: 95% CIs of the cluster bootstrap (``topk_overlap_ci``, at every rho). S_true
    is taken among tokens with grad_norm > 0; scopes without one are left out (the title says how many).
    """
    st = Statistics.coerce(stats)
    tk = st.topk_overlap
    scopes = [s for s in scopes if s in tk]
    fig = Figure(figsize=(4.4 * max(1, len(scopes)) + 1.6, 4.0), layout="constrained")
    axes = fig.subplots(1, max(1, len(scopes)), squeeze=False, sharey=True)[0]
    if not scopes:
        return _empty(fig, axes[0], "no top-k overlap in stats")
    for ax, scope in zip(axes, scopes):
        for i, s in enumerate(tk.estimators(scope)):
            by_rho = tk.series(scope, s)
            ks = sorted(by_rho, key=float)
            xs = [float(k) for k in ks]
            ys = [_num(by_rho[k]) for k in ks]
            bold = s in HEADLINE_SCORES  # a masked baseline among them (scale informative): dashed
            ax.plot(xs, ys, marker="o", ms=3 if not bold else 5, lw=2.2 if bold else 1.0,
                    color=_color(s, i), alpha=1.0 if bold else 0.75, label=s,
                    ls="--" if bold and s in MASKED_SCORES else "-")
            ci = st.topk_overlap_ci.series(scope, s)
            for k, b in ci.items():  # 95% CI (bootstrap over answers) where computed
                v, lo, hi = _num(by_rho.get(k)), _num(b.ci_low), _num(b.ci_high)
                if bold and np.isfinite(lo) and np.isfinite(v):
                    ax.errorbar([float(k)], [v], yerr=[[max(v - lo, 0)], [max(hi - v, 0)]], color=_color(s, i),
                                capsize=4, lw=1.2)
        ax.plot([0, 0.55], [0, 0.55], ls=":", color="grey", label="random (= ρ)")
        ax.set_xlabel("kept fraction ρ")
        n_ex = st.topk_scopes_excluded.get(scope)
        ax.set_title(f"scope: {scope}" + (f" ({n_ex} without gradient left out)" if n_ex else ""), fontsize=10)
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("|S ∩ S_true| / |S_true|")
    fig.suptitle("Top-k overlap with the top tokens by grad_norm (S_true among grad_norm > 0)", fontsize=10)
    axes[-1].legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


MASS_ESTIMATORS = figure_scores("mass_capture")


def fig_mass_capture(stats: StatsLike, scopes: Sequence[str] = ("batch", "group"),
                     estimators: Sequence[str] = MASS_ESTIMATORS) -> Figure | None:
    """Gradient mass captured vs the kept fraction: sum of grad_norm over a top-rho selection by
    each score over the sum over the true top-rho (``mass_capture``), with 95% CIs, per scope."""
    st = Statistics.coerce(stats)
    mc = st.mass_capture
    scopes = [s for s in scopes if s in mc]
    if not scopes:
        return None
    fig = Figure(figsize=(4.4 * len(scopes) + 1.8, 4.0), layout="constrained")
    axes = fig.subplots(1, len(scopes), squeeze=False, sharey=True)[0]
    for ax, scope in zip(axes, scopes):
        ests = [s for s in estimators if s in mc.estimators(scope)]
        for i, s in enumerate(ests):
            by = mc.series(scope, s)
            ks = sorted(by, key=float)
            xs = np.array([float(k) for k in ks])
            ys = np.array([_num(by[k]) for k in ks])
            cis = [st.mass_capture_ci.at(scope, s, k) for k in ks]
            lo = np.array([_num(b.ci_low) for b in cis])
            hi = np.array([_num(b.ci_high) for b in cis])
            dx = (i - (len(ests) - 1) / 2) * 0.004  # side by side, so the intervals do not hide each other
            ax.errorbar(xs + dx, ys, yerr=[np.clip(ys - lo, 0, None), np.clip(hi - ys, 0, None)],
                        marker="o", ms=4, lw=1.4, capsize=2, color=_color(s, i), label=s,
                        ls="--" if s in MASKED_SCORES else "-")
        ax.set_xlabel("kept fraction ρ")
        ax.set_title(f"scope: {scope}", fontsize=10)
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("captured / best possible grad_norm mass")
    fig.suptitle("Gradient mass a top-ρ selection captures (95% CIs; dashed: masked baselines)", fontsize=10)
    axes[-1].legend(fontsize=7, frameon=False, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def fig_update_fidelity(stats: StatsLike) -> Figure | None:
    """Cosine and norm ratio of the selected tokens' update vs the full update (at the run's rho).

    Bars for each estimator and the references all (1, 1), oracle (top by grad_norm) and
    random (mean of several draws, with their standard deviation). None without fidelity.
    """
    fid = {k: v for k, v in Statistics.coerce(stats).update_fidelity.items() if v.has("cosine")}
    if not fid:
        return None
    refs = [k for k in ("all", "oracle") if k in fid]
    ests = [k for k in fid if k not in ("all", "oracle", "random", "random_std")]
    names = refs + ests + (["random"] if "random" in fid else [])
    std = fid.get("random_std")
    fig = Figure(figsize=(max(5.0, 0.9 * len(names) + 2.0), 3.8), layout="constrained")
    axes = fig.subplots(1, 2, squeeze=False)[0]
    for ax, metric, label in zip(axes, ("cosine", "norm_ratio"), ("cosine(g_S, g_all)", "‖g_S‖ / ‖g_all‖")):
        vals = [_num(getattr(fid[n], metric)) for n in names]
        cols = [_color(n, i) for i, n in enumerate(names)]
        ax.bar(range(len(names)), vals, color=cols, edgecolor="black", lw=0.4)
        if "random" in names and std is not None and np.isfinite(_num(getattr(std, metric))):  # spread of the draws
            j = names.index("random")
            ax.errorbar([j], [vals[j]], yerr=[_num(getattr(std, metric))], color="black", capsize=3)
        for i, v in enumerate(vals):
            if np.isfinite(v):
                ax.text(i, v, f"{v:.2f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
        ax.set_title(label, fontsize=10)
        ax.axhline(1.0, color="grey", lw=0.6, ls=":")
    fig.suptitle("Update fidelity of a 20% selection", fontsize=10)
    return fig


DECOMPOSITION_ESTIMATORS = figure_scores("decomposition")


def _errbar(ax, x: float, entry: CrossEntry | WithinEntry | None, key: str, **kw) -> float:
    """A point with its 95% CI from a stats entry (its attribute ``key``, ``ci_low``, ``ci_high``;
    None draws nothing); returns the value."""
    if entry is None:
        return float("nan")
    v, lo, hi = _num(getattr(entry, key)), _num(entry.ci_low), _num(entry.ci_high)
    if np.isfinite(v):
        yerr = [[max(v - lo, 0.0)], [max(hi - v, 0.0)]] if np.isfinite(lo) and np.isfinite(hi) else None
        ax.errorbar([x], [v], yerr=yerr, capsize=3, **kw)
    return v


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
    from gmts_analysis.analysis.stats import estimator_table

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
    axes[0].set_yticks(range(len(ests)), [f"{int(rk[s])}. {s}" for s in ests], fontsize=8)
    axes[0].set_ylim(len(ests) - 0.5, -0.5)
    n = st.meta.n_ci_units
    unit = st.meta.ci_unit if st.meta.has("ci_unit") else "group"
    fig.suptitle(f"Estimators vs {ref}: paired differences over {n} resampled {unit}s "
                 "(filled: CI excludes 0; rank ties by paired CI)", fontsize=9)
    return fig


#: names moved to views/figures.py and views/token_strip.py, still importable from here
_MOVED = {"FIGURES": "figures", "FIGURE_ENTRIES": "figures", "FIGURE_CAPTIONS": "figures", "CREATOR": "figures",
          "run_rho": "figures", "save_figure": "figures", "png_metadata": "figures", "render_all": "figures",
          "pick_answer": "token_strip", "STRIP_ROWS": "token_strip", "fig_token_strip": "token_strip"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        return getattr(importlib.import_module(f"gmts_analysis.views.{_MOVED[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
