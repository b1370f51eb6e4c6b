"""Which tokens gain or lose gradient share between checkpoints, on the same answers.

The series audit (``gmts series``) probes one fixed set of answers with every checkpoint. For each token its
**share** is its norm of grad log p over the sum of those norms in its answer (``grad_norm_logp``: the
direction the token pushes, before the advantage scales it; a share does not move because the advantage did).
:func:`token_moves` lines the checkpoints up token by token and writes:

- ``token_moves.csv``: one row per token (answer, position, token text), its share and entropy at every step,
  and ``delta`` = share at the last step - share at the first;
- ``token_moves_by_string.csv``: the same by token text (mean delta, occurrences), most gained first;
- ``token_moves.json``: how many tokens moved, and how many of the first step's top-20% tokens by share are
  still top-20% at the last step (per answer, pooled);
- ``token_moves.png``: the token texts that gained and lost most.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import atomic_write_bytes, atomic_write_json, atomic_write_text, read_parquet

#: the top fraction whose persistence is reported (the paper's budget)
TOP = 0.2


def _step_of(d: Path) -> int:
    import json

    m = json.loads((d / "manifest.json").read_text(encoding="utf-8"))
    step = m.get("step", (m.get("config") or {}).get("step"))
    if step is None:
        raise GmtsError(f"{d}/manifest.json: no step (the series audit records one per checkpoint)")
    return int(step)


def token_table(dirs: Sequence[str | os.PathLike]) -> tuple[pd.DataFrame, list[int]]:
    """``(table, steps)``: one row per token of the answers every run probed, with ``share_<step>`` and
    ``entropy_<step>`` columns, and ``delta`` (last step's share minus the first's)."""
    parts, steps = [], []
    keys = ["answer_id", "position"]
    for d in dirs:
        d = Path(d)
        step = _step_of(d)
        t = read_parquet(d / "tokens.parquet")[keys + ["token", "grad_norm_logp", "entropy"]].copy()
        tot = t.groupby("answer_id")["grad_norm_logp"].transform("sum")
        t[f"share_{step}"] = np.where(tot > 0, t["grad_norm_logp"] / tot.where(tot > 0, 1.0), np.nan)
        t[f"entropy_{step}"] = t["entropy"]
        parts.append(t[keys + ["token", f"share_{step}", f"entropy_{step}"]])
        steps.append(step)
    if len(parts) < 2:
        raise GmtsError("token moves: need the same answers probed at two checkpoints at least")
    order = np.argsort(steps, kind="stable")
    steps = [steps[i] for i in order]
    table = parts[order[0]]
    for i in order[1:]:
        nxt = parts[i].drop(columns=["token"])
        table = table.merge(nxt, on=keys, how="inner")
    if table.empty:
        raise GmtsError("token moves: the runs share no token (were they probed on the same answers?)")
    table["delta"] = table[f"share_{steps[-1]}"] - table[f"share_{steps[0]}"]
    return table.sort_values(keys).reset_index(drop=True), steps


def _top_mask(table: pd.DataFrame, col: str) -> pd.Series:
    """Per answer, the ``ceil(TOP * n)`` tokens of largest ``col`` (ties by position)."""
    out = pd.Series(False, index=table.index)
    for _, g in table.groupby("answer_id"):
        k = int(np.ceil(TOP * len(g)))
        idx = g.sort_values([col, "position"], ascending=[False, True]).index[:k]
        out.loc[idx] = True
    return out


def summarize(table: pd.DataFrame, steps: Sequence[int]) -> dict:
    """How many of the first step's top-20% tokens (by share, per answer) stay top-20% at the last step; the
    largest moves."""
    first, last = f"share_{steps[0]}", f"share_{steps[-1]}"
    a, b = _top_mask(table, first), _top_mask(table, last)
    kept = float((a & b).sum() / max(int(a.sum()), 1))
    d = table["delta"].abs()
    return {"steps": list(map(int, steps)), "n_tokens": int(len(table)), "n_answers": int(table["answer_id"].nunique()),
            "top20_kept": kept, "median_abs_delta": float(d.median()), "max_abs_delta": float(d.max())}


def by_string(table: pd.DataFrame) -> pd.DataFrame:
    """Mean change of share per token text (and its occurrences), most gained first."""
    g = table.groupby("token", dropna=False)["delta"].agg(["mean", "count"]).reset_index()
    return g.rename(columns={"mean": "mean_delta", "count": "n"}).sort_values("mean_delta", ascending=False)


def plot_moves(strings: pd.DataFrame, steps: Sequence[int], k: int = 10):
    """Bar chart of the ``k`` token texts that gained and the ``k`` that lost most share (mean over occurrences)."""
    from matplotlib.figure import Figure

    top = strings.head(k)
    bottom = strings.tail(k)
    both = pd.concat([top, bottom]).drop_duplicates("token")
    both = both.sort_values("mean_delta")
    fig = Figure(figsize=(6.5, 0.28 * len(both) + 1.4))
    ax = fig.subplots()
    colors = ["#b2182b" if v > 0 else "#2166ac" for v in both["mean_delta"]]
    labels = [f"{t!r} (n={n})" for t, n in zip(both["token"], both["n"])]
    ax.barh(range(len(both)), both["mean_delta"], color=colors)
    ax.set_yticks(range(len(both)), labels, fontsize=8)
    ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel(f"change of share of its answer's gradient, step {steps[0]} -> {steps[-1]}")
    ax.set_title("token texts that gained (red) and lost (blue) gradient share", fontsize=10)
    fig.tight_layout()
    return fig


def _png(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return atomic_write_bytes(path, buf.getvalue())


def write_token_moves(dirs: Sequence[str | os.PathLike], out: str | os.PathLike, figures: bool = True) -> dict:
    """Write the files of the module docstring into ``out``; returns the summary."""
    out = Path(out)
    table, steps = token_table(dirs)
    strings = by_string(table)
    atomic_write_text(out / "token_moves.csv", table.to_csv(index=False))
    atomic_write_text(out / "token_moves_by_string.csv", strings.to_csv(index=False))
    summary = summarize(table, steps)
    atomic_write_json(out / "token_moves.json", summary)
    if figures:
        _png(plot_moves(strings, steps), out / "token_moves.png")
    return summary


def fig_pass1(checkpoints: Sequence[dict]):
    """pass@1 on the held-out prompts against step, with its 95% CI (the series' ``checkpoints`` entries)."""
    from matplotlib.figure import Figure

    xs = [c["step"] for c in checkpoints]
    scored = [c for c in checkpoints if c.get("pass1") is not None]  # none scorable: no point (series.json says)
    ys = [c["pass1"] for c in scored]
    lo = [c["pass1"] - c["ci_low"] for c in scored]
    hi = [c["ci_high"] - c["pass1"] for c in scored]
    fig = Figure(figsize=(5, 3.2))
    ax = fig.subplots()
    ax.errorbar([c["step"] for c in scored], ys, yerr=[lo, hi], marker="o", capsize=3, color="#333333")
    n = checkpoints[0].get("n_answers")
    ax.set_xlabel("step")
    ax.set_ylabel("pass@1 (95% CI over prompts)")
    caution = next((c["caution"] for c in checkpoints if c.get("caution")), None)
    title = f"held-out pass@1 ({n} answers per checkpoint)"
    if caution:  # few prompts: said on the figure, not only in series.json
        title += f"\n{caution.split(';')[0]}: differences are within noise"
    ax.set_title(title, fontsize=9, color="#333333" if not caution else "#b03a2e")
    ax.set_xticks(xs)
    fig.tight_layout()
    return fig


def plot_pass1(checkpoints: Sequence[dict], path: str | os.PathLike) -> Path:
    """:func:`fig_pass1` written as a PNG at ``path`` (atomically)."""
    return _png(fig_pass1(checkpoints), Path(path))
