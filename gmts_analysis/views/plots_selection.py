"""Run figures of selections: top-k overlap with the grad_norm selection, gradient mass captured, update fidelity."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.core.scores import (
    HEADLINE_SCORES,
    MASKED_SCORES,
    figure_scores,
)
from gmts_analysis.views.plot_parts import StatsLike, _color, _empty, _num

log = logging.getLogger("gmts_analysis.views.plots")


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
    each score over the sum over the true top-rho (``mass_capture``), with 95% CIs where stats.json has
    them (``mass_capture_ci``; a run too small for an interval, or ``--n-boot 0``, has none, and the
    title says so instead of claiming them), per scope."""
    st = Statistics.coerce(stats)
    mc = st.mass_capture
    scopes = [s for s in scopes if s in mc]
    if not scopes:
        return None
    fig = Figure(figsize=(4.4 * len(scopes) + 1.8, 4.0), layout="constrained")
    axes = fig.subplots(1, len(scopes), squeeze=False, sharey=True)[0]
    has_ci = False
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
            has_ci = has_ci or bool((np.isfinite(lo) & np.isfinite(hi) & np.isfinite(ys)).any())
            dx = (i - (len(ests) - 1) / 2) * 0.004  # side by side, so the intervals do not hide each other
            ax.errorbar(xs + dx, ys, yerr=[np.clip(ys - lo, 0, None), np.clip(hi - ys, 0, None)],
                        marker="o", ms=4, lw=1.4, capsize=2, color=_color(s, i), label=s,
                        ls="--" if s in MASKED_SCORES else "-")
        ax.set_xlabel("kept fraction ρ")
        ax.set_title(f"scope: {scope}", fontsize=10)
        ax.set_ylim(0, 1.03)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("captured / best possible grad_norm mass")
    fig.suptitle("Gradient mass a top-ρ selection captures ("
                 + ("95% CIs" if has_ci else "no interval: none in stats.json") + "; dashed: masked baselines)",
                 fontsize=10)
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

