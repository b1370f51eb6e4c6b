"""Figures of an RL selection experiment (functions of the results JSON; Agg backend).

- :func:`plot_learning_curves`: pass@1 vs step, one panel per domain plus their mean; a line
  per arm (mean over seeds) with a band from the lowest to the highest seed.
- :func:`plot_diagnostics`: per-step diagnostics averaged over seeds: training reward, the
  overlap of entropy and GMTS selections, mean entropy, share of selected tokens with A = 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

COLORS = {"all": "#4d4d4d", "entropy": "#1f77b4", "gmts": "#d62728", "random": "#2ca02c"}


def _runs_by_arm(result: dict) -> dict[str, list[dict]]:
    arms: dict[str, list[dict]] = {}
    for r in result["runs"]:
        arms.setdefault(r["config"]["selection"], []).append(r)
    order = [a for a in ("all", "entropy", "gmts", "random") if a in arms] + sorted(set(arms) - set(COLORS))
    return {a: sorted(arms[a], key=lambda r: r["config"]["seed"]) for a in order}


def _curve(runs: list[dict], key) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values (n_seeds, n_steps)) on the steps every run shares."""
    steps = sorted(set.intersection(*[{e["step"] for e in r["evals"]} for r in runs]))
    vals = np.array([[key(next(e for e in r["evals"] if e["step"] == s)) for s in steps] for r in runs], dtype=float)
    return np.array(steps), vals


def plot_learning_curves(result: dict, path: str | Path) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    from gmts_analysis.io import atomic_write_bytes

    domains = list(result["config"]["domains"])
    panels = domains + (["mean"] if len(domains) > 1 else [])
    fig = Figure(figsize=(3.6 * len(panels), 3.2))
    axes = fig.subplots(1, len(panels), sharey=False, squeeze=False)
    for ax, d in zip(axes[0], panels):
        for arm, runs in _runs_by_arm(result).items():
            key = (lambda e: e["pass1_mean"]) if d == "mean" else (lambda e, d=d: e["pass1"][d])
            steps, v = _curve(runs, key)
            c = COLORS.get(arm)
            ax.plot(steps, v.mean(0), color=c, label=f"{arm} (n={len(runs)})", lw=1.8)
            if len(runs) > 1:
                ax.fill_between(steps, v.min(0), v.max(0), color=c, alpha=0.15, lw=0)
        ax.set_title(d if d != "mean" else "mean over domains")
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("pass@1 (T=1.0, held-out)")
    axes[0][-1].legend(fontsize=8, loc="best")
    cfg = result["config"]
    fig.suptitle(
        f"policy {Path(str(cfg['policy'])).name}: top {cfg['rho']:.0%} tokens by {cfg['scope']} scope, "
        f"normalizer {cfg['normalizer']}, lr {cfg['lr']:g}; lines = mean over seeds, bands = min-max",
        fontsize=9,
    )
    fig.tight_layout()
    return _save(fig, path, atomic_write_bytes)


def plot_diagnostics(result: dict, path: str | Path) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    from gmts_analysis.io import atomic_write_bytes

    keys = [
        ("reward_mean", "training reward (batch mean)"),
        ("overlap_entropy_gmts", "|S_entropy ∩ S_gmts| / |S_gmts|"),
        ("entropy_mean", "mean token entropy (nats)"),
        ("frac_selected_zero_adv", "selected tokens with A = 0"),
    ]
    fig = Figure(figsize=(3.6 * len(keys), 6.4))
    axes = fig.subplots(2, len(keys), squeeze=False)
    for ax, (k, title) in zip(axes[0], keys):
        for arm, runs in _runs_by_arm(result).items():
            n = min(len(r["steps"]) for r in runs)
            if n == 0:
                continue
            v = np.array([[np.nan if s.get(k) is None else s[k] for s in r["steps"][:n]] for r in runs], dtype=float)
            steps = [s["step"] for s in runs[0]["steps"][:n]]
            ax.plot(steps, _smooth(np.nanmean(v, 0)), color=COLORS.get(arm), label=arm, lw=1.5)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=8)
    _plot_sparse(axes[1], result)
    fig.suptitle("per-step diagnostics (top: mean over seeds per arm, moving average of 5 steps; bottom: "
                 "every --diag-every steps, pooled over arms and seeds, mean and min-max)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path, atomic_write_bytes)


SPARSE = [
    ("fidelity", "cosine", ("entropy", "gmts", "random"), "update fidelity: cosine(g_S, g_all)"),
    ("fidelity", "norm_ratio", ("entropy", "gmts", "random"), "update fidelity: |g_S| / |g_all|"),
    ("grad_norm_corr", None, ("cross_answer_entropy", "cross_answer_gmts"), "cross-answer Spearman vs grad_norm"),
    ("grad_norm_corr", None, ("within_answer_entropy_median",), "within-answer Spearman(entropy, |grad logp|)"),
]


def _plot_sparse(axes, result: dict) -> None:
    """Diagnostics logged every ``diag_every`` steps, pooled over every run."""
    colors = {"entropy": COLORS["entropy"], "gmts": COLORS["gmts"], "random": COLORS["random"],
              "cross_answer_entropy": COLORS["entropy"], "cross_answer_gmts": COLORS["gmts"],
              "within_answer_entropy_median": COLORS["entropy"]}
    for ax, (block, field, names, title) in zip(axes, SPARSE):
        for name in names:
            by_step: dict[int, list[float]] = {}
            for r in result["runs"]:
                for s in r["steps"]:
                    d = s.get(block)
                    if not d or name not in d:
                        continue
                    v = d[name][field] if field else d[name]
                    if v is not None and np.isfinite(v):
                        by_step.setdefault(s["step"], []).append(float(v))
            if not by_step:
                continue
            steps = sorted(by_step)
            v = [by_step[k] for k in steps]
            c = colors.get(name)
            ax.plot(steps, [np.mean(x) for x in v], "o-", color=c, ms=3, lw=1.5,
                    label=name.replace("cross_answer_", "").replace("_median", ""))
            ax.fill_between(steps, [min(x) for x in v], [max(x) for x in v], color=c, alpha=0.12, lw=0)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)


def _smooth(x: np.ndarray, k: int = 5) -> np.ndarray:
    if len(x) < k:
        return x
    pad = np.r_[np.full(k - 1, x[0]), x]
    return np.convolve(pad, np.ones(k) / k, mode="valid")


def _save(fig, path, writer) -> Path:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    return writer(path, buf.getvalue())
