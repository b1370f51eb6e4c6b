"""Figures of an RL selection experiment (functions of the results JSON; Agg backend).

- :func:`plot_learning_curves`: pass@1 vs step, one panel per domain plus their mean; a line
  per arm (mean over seeds) with a band from the lowest to the highest seed.
- :func:`plot_diagnostics`: per-step diagnostics averaged over seeds: training reward, the
  overlap of entropy and GMTS selections, mean entropy, share of selected tokens with A = 0.
- :func:`plot_selection_diagnostics`: the live selection diagnostics along training, pooled
  over every run: share of groups with all-equal rewards, selection waste of entropy, GMTS and
  gmts_lgn at the run's rho, overlaps of the selections.
- :func:`plot_final_pass1`: final pass@1 per arm and condition, every seed as a dot.
- :func:`plot_forest`: the arms report's paired differences with their 95% CIs, grouped by setting.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from gmts_analysis.core.scores import ARM_COLORS as COLORS  # {arm: colour}, live view of the registry
from gmts_analysis.core.scores import CHANCE_ARMS, DIAGNOSTIC_SCORES, diagnostic_pairs
from gmts_analysis.core.scores import SELECTION_ARMS as ARMS
from gmts_analysis.rl.arms_report import SE_MEAN_DIFF
from gmts_analysis.util.io import atomic_write_bytes


def _runs_by_arm(result: dict) -> dict[str, list[dict]]:
    arms: dict[str, list[dict]] = {}
    for r in result["runs"]:
        arms.setdefault(r["config"]["selection"], []).append(r)
    order = [a for a in ARMS if a in arms] + sorted(set(arms) - set(COLORS))
    return {a: sorted(arms[a], key=lambda r: r["config"]["seed"]) for a in order}


def _curve(runs: list[dict], key) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values (n_seeds, n_steps)) on the steps every run shares."""
    steps = sorted(set.intersection(*[{e["step"] for e in r["evals"]} for r in runs]))
    vals = np.array([[key(next(e for e in r["evals"] if e["step"] == s)) for s in steps] for r in runs], dtype=float)
    return np.array(steps), vals


def plot_learning_curves(result: dict, path: str | Path) -> Path:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

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

    a, b = diagnostic_pairs()[0]  # the first two diagnostic scores (entropy, gmts)
    keys = [
        ("reward_mean", "training reward (batch mean)"),
        (f"overlap_{a}_{b}", f"|S_{a} ∩ S_{b}| / |S_{b}|"),
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


def _sparse() -> list[tuple[str, str | None, tuple[str, ...], str]]:
    """The panels of the sparse diagnostics: (record block, field, names, title); the names are the
    registry's diagnostic scores (and the chance arm, the fidelity baseline)."""
    fidelity = (*DIAGNOSTIC_SCORES, *CHANCE_ARMS)
    return [
        ("fidelity", "cosine", fidelity, "update fidelity: cosine(g_S, g_all)"),
        ("fidelity", "norm_ratio", fidelity, "update fidelity: |g_S| / |g_all|"),
        ("grad_norm_corr", None, tuple(f"cross_answer_{s}" for s in DIAGNOSTIC_SCORES),
         "informative cross-answer Spearman vs grad_norm"),
        ("grad_norm_corr", None, ("within_answer_entropy_median",), "within-answer Spearman(entropy, |grad logp|)"),
    ]


def _plot_sparse(axes, result: dict) -> None:
    """Diagnostics logged every ``diag_every`` steps, pooled over every run."""
    colors = {s: COLORS[s] for s in (*DIAGNOSTIC_SCORES, *CHANCE_ARMS) if s in COLORS}
    colors.update({f"cross_answer_{s}": c for s, c in list(colors.items())})
    colors["within_answer_entropy_median"] = COLORS["entropy"]  # the entropy quantity's colour
    for ax, (block, field, names, title) in zip(axes, _sparse()):
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


def _pooled(results: dict[str, dict], get) -> tuple[list[int], list[list[float]]]:
    by_step: dict[int, list[float]] = {}
    for res in results.values():
        for r in res["runs"]:
            for s in r["steps"]:
                v = get(s)
                if v is not None and np.isfinite(v):
                    by_step.setdefault(s["step"], []).append(float(v))
    steps = sorted(by_step)
    return steps, [by_step[k] for k in steps]


def plot_selection_diagnostics(results: dict[str, dict], path: str | Path) -> Path:
    """Live selection diagnostics along training, one column per condition (``{label: experiment}``),
    pooled over arms and seeds (mean and min-max per step): share of groups with all-equal
    rewards and of tokens with A = 0; selection waste (share of the top-rho picks with A = 0)
    of entropy, GMTS and gmts_lgn; overlaps |S_entropy ∩ S_gmts| / |S_gmts| and
    |S_gmts ∩ S_gmts_lgn| / |S_gmts_lgn|."""
    from matplotlib.figure import Figure

    labels = list(results)
    fig = Figure(figsize=(4.2 * len(labels), 8.4))
    axes = fig.subplots(3, len(labels), squeeze=False)
    for j, label in enumerate(labels):
        one = {label: results[label]}
        ax = axes[0][j]
        for key, name, c in (("frac_groups_zero_std", "groups with all-equal rewards", "#444444"),
                             ("frac_tokens_zero_adv", "tokens with A = 0", "#999999")):
            st, v = _pooled(one, lambda s, k=key: s.get(k))
            if st:
                ax.plot(st, _smooth(np.array([np.mean(x) for x in v])), color=c, label=name, lw=1.5)
        ax.set_title(f"{label}: zero-advantage share", fontsize=9)
        ax.axhline(0.4, color="k", lw=0.6, ls=":")
        ax.set_ylim(0, 1)
        ax.legend(fontsize=7)
        ax = axes[1][j]
        for sc in DIAGNOSTIC_SCORES:
            st, v = _pooled(one, lambda s, k=sc: (s.get("waste") or {}).get(k))
            if st:
                m = _smooth(np.array([np.mean(x) for x in v]))
                ax.plot(st, m, color=COLORS[sc], label=sc, lw=1.5)
        ax.set_title(f"{label}: selection waste (picks with A = 0)", fontsize=9)
        ax.set_ylim(-0.02, 1)
        ax.legend(fontsize=7)
        ax = axes[2][j]
        scores = list(DIAGNOSTIC_SCORES)  # each with the next one: entropy vs gmts, gmts vs gmts_lgn
        for key, name, c in ((f"overlap_{a}_{b}", f"{a} vs {b}", COLORS[b]) for a, b in zip(scores, scores[1:])):
            st, v = _pooled(one, lambda s, k=key: s.get(k))
            if st:
                ax.plot(st, _smooth(np.array([np.mean(x) for x in v])), color=c, label=name, lw=1.5)
        ax.set_title(f"{label}: selection overlap", fontsize=9)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7)
        for a in axes[:, j]:
            a.set_xlabel("training step")
            a.grid(alpha=0.3)
    fig.suptitle("live selection diagnostics along training, every step, pooled over arms and seeds "
                 "(moving average of 5 steps)", fontsize=9)
    fig.tight_layout()
    return _save(fig, path, atomic_write_bytes)


def _final_by_seed(res: dict, arm: str) -> dict[int, float]:
    """``{seed: final pass@1, mean of domains}`` of one arm (from the runs when present)."""
    runs = [r for r in res.get("runs") or [] if r["config"]["selection"] == arm]
    if runs:
        return {int(r["config"]["seed"]): float(np.mean(list(r["final_pass1"].values()))) for r in runs}
    vals = res["summary"][arm]["mean"]["values"]
    return dict(zip([int(x) for x in res.get("seeds") or range(len(vals))], [float(v) for v in vals]))


def plot_final_pass1(results: dict[str, dict], path: str | Path) -> Path:
    """Final pass@1 (mean over domains) per arm, one panel per condition: one line per seed across
    the arms (arms share the seed's data order and evaluation prompts, so a seed's line shows the
    paired differences), the mean of the seeds a black tick; the untrained policy dotted."""
    from matplotlib.figure import Figure

    labels = list(results)
    fig = Figure(figsize=(3.8 * len(labels) + 0.6, 3.8), layout="constrained")
    axes = fig.subplots(1, len(labels), squeeze=False, sharey=True)
    for ax, label in zip(axes[0], labels):
        res = results[label]
        arms = [a for a in ARMS if a in res["summary"]]
        by_arm = {a: _final_by_seed(res, a) for a in arms}
        seeds = sorted({sd for v in by_arm.values() for sd in v})
        for j, sd in enumerate(seeds):
            xs = [i for i, a in enumerate(arms) if sd in by_arm[a]]
            ys = [by_arm[a][sd] for a in arms if sd in by_arm[a]]
            ax.plot(xs, ys, "-", color="grey", lw=0.8, alpha=0.7, zorder=1,
                    label="one seed" if j == 0 else None)
            for x, y in zip(xs, ys):
                ax.plot([x], [y], "o", color=COLORS.get(arms[x], "black"), ms=4, zorder=2)
        for i, a in enumerate(arms):
            m = float(np.mean(list(by_arm[a].values())))
            ax.plot([i - 0.25, i + 0.25], [m, m], color="black", lw=2, zorder=3, label="mean" if i == 0 else None)
        init = float(np.mean(list(res["initial_pass1"].values())))
        ax.axhline(init, color="k", ls=":", lw=1, label="untrained")
        ax.set_xticks(range(len(arms)))
        ax.set_xticklabels(arms, rotation=30, ha="right", fontsize=8)
        ax.set_title(f"{label} ({len(seeds)} seeds)", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("final pass@1 (held-out, mean of domains)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    return _save(fig, path, atomic_write_bytes)


#: the ``Title`` metadata of the forest plot (what makes an existing rl_forest.png ours)
FOREST_TITLE = "gmts rl-report forest plot"
VERDICT_COLORS = {"beats": "#d62728", "above_unadjusted": "#ff7f0e", "not_distinguishable": "#4d4d4d"}


def forest_legend_labels(report: dict) -> list[str]:
    """The forest plot's legend: the three verdicts, then the grey bar, named as the report's text names
    the same quantity (:data:`gmts_analysis.rl.arms_report.SE_MEAN_DIFF`: the SE of the mean over the seeds,
    not the "evaluation SE of one seed's difference" of the tables)."""
    return ["beats (Holm p and CI agree)", "above, exploratory (unadjusted)", "not distinguishable",
            "+-1.96 " + SE_MEAN_DIFF.format(n=len(report["plan"]["seeds"]))]


def plot_forest(report: dict, path: str | Path) -> Path:
    """Forest plot of an arms report (:func:`gmts_analysis.rl.arms_report.build_report`): one row per
    reported contrast ``a - b``, grouped by setting (planned contrasts first, in bold), the mean paired
    difference of final pass@1 with its 95% t interval, coloured by the verdict; a grey bar of +-1.96
    evaluation SEs of the mean difference around it shows how much the evaluation alone could move it.
    Deterministic bytes (fixed PNG metadata, title :data:`FOREST_TITLE`)."""
    from matplotlib.figure import Figure

    from gmts_analysis.views.figures import save_figure  # deferred: matplotlib, pandas

    rows = [r for r in report["contrasts"] if r["status"] == "reported"]
    order = [s["name"] for s in report["settings"]]
    items: list[tuple[str, dict | None]] = []
    for name in order:
        mine = [r for r in rows if r["setting"] == name]
        if mine:
            items.append((name, None))
            items += [(name, r) for r in sorted(mine, key=lambda r: r["expanded"])]
    cut = [s["name"] for s in report["settings"] if s["status"] == "cut"]
    n = max(len(items), 1)
    fig = Figure(figsize=(7.5, 1.3 + 0.22 * n), layout="constrained")
    ax = fig.subplots()
    labels = []
    for i, (name, r) in enumerate(items):
        y = n - 1 - i
        if r is None:
            labels.append(f"[{name}]")
            continue
        labels.append(f"{r['a']} - {r['b']}")
        c = VERDICT_COLORS.get(r.get("verdict"), "black")
        half = 1.96 * (r.get("eval_se_mean_diff") or 0.0)
        ax.plot([r["mean"] - half, r["mean"] + half], [y, y], color="#cccccc", lw=5, solid_capstyle="butt", zorder=1)
        ax.plot([r["ci_low"], r["ci_high"]], [y, y], color=c, lw=1.4, zorder=2)
        ax.plot([r["mean"]], [y], "D" if not r["expanded"] else "o", color=c, ms=5 if not r["expanded"] else 3.5,
                zorder=3)
    ax.axvline(0.0, color="black", lw=0.8, ls="--")
    ax.set_yticks(range(n))
    ax.set_yticklabels(list(reversed(labels)) if labels else [""], fontsize=7)
    for t, (_, r) in zip(reversed(ax.get_yticklabels()), items):
        if r is None or not r["expanded"]:
            t.set_fontweight("bold")
    ax.set_ylim(-0.8, n - 0.2)
    ax.set_xlabel("paired difference of final pass@1 (a - b), mean over seeds, 95% t CI", fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    seeds = len(report["plan"]["seeds"])
    title = f"{report['plan'].get('title') or 'training arms compared'}: {seeds} seeds"
    if cut:
        title += f"; cut: {', '.join(cut)}"
    ax.set_title("\n".join(textwrap.wrap(title, 80)), fontsize=8)  # a long plan title is not cut at the edge
    from matplotlib.lines import Line2D

    labels = forest_legend_labels(report)
    handles = [Line2D([], [], color=VERDICT_COLORS["beats"], marker="D", label=labels[0]),
               Line2D([], [], color=VERDICT_COLORS["above_unadjusted"], marker="o", label=labels[1]),
               Line2D([], [], color=VERDICT_COLORS["not_distinguishable"], marker="o", label=labels[2]),
               Line2D([], [], color="#cccccc", lw=5, label=labels[3])]
    ax.legend(handles=handles, fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # never over a CI
    path = Path(path)
    return save_figure(fig, path.with_suffix(""), formats=("png",), dpi=120, title=FOREST_TITLE)[0]


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
