"""Synthetic tokens/answers tables and run directories with the paper's structure.

Inside an answer, log grad_norm_logp follows log entropy (plus noise); across answers
the per-answer |omega| = |A_i| / sum_j L_j scales grad_norm, so pooled entropy ranks
grad_norm worse than GMTS = entropy * |omega| does. Used by the statistics, plotting,
report and notebook tests when no real run directory (data/example_run) exists.
"""

from __future__ import annotations

import string
from pathlib import Path

import numpy as np
import pandas as pd

from gmts_analysis.core.estimators import add_estimator_columns

ALPHABET = list(string.ascii_lowercase + " .,=+0123456789")


def make_tables(
    n_groups: int = 8,
    group_size: int = 4,
    min_len: int = 10,
    max_len: int = 40,
    seed: int = 0,
    domains: tuple[str, ...] | None = None,
    steps: int | None = None,
    planted_token: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(tokens, answers)`` tables following docs/definitions.md section 2 and 8 (on-policy, token-mean)."""
    rng = np.random.default_rng(seed)
    tok_rows = []
    ans_rows = []
    aid = 0
    n_steps = steps or 1
    for step in range(n_steps):
        step_groups = []
        for g in range(n_groups):
            gid = f"s{step}g{g}" if steps else f"g{g}"
            domain = domains[g % len(domains)] if domains else None
            rewards = rng.integers(0, 2, size=group_size).astype(float)
            if g == 0:
                rewards[:2] = [1.0, 0.0]  # at least one group with both signs
            mean, std = rewards.mean(), rewards.std(ddof=1) if group_size > 1 else 0.0
            adv = (rewards - mean) / (std + 1e-4)
            lengths = rng.integers(min_len, max_len + 1, size=group_size)
            step_groups.append((gid, domain, rewards, adv, lengths))
        total_len = sum(int(x[4].sum()) for x in step_groups)
        for gid, domain, rewards, adv, lengths in step_groups:
            for i in range(group_size):
                L = int(lengths[i])
                scale = rng.lognormal(0.0, 0.5)  # answer-level scale of grad_norm_logp
                entropy = rng.lognormal(-0.5, 1.0, size=L)
                gnl = scale * entropy**0.8 * rng.lognormal(0.0, 0.3, size=L)
                surprisal = entropy * rng.lognormal(0.0, 0.5, size=L)
                prob = np.exp(-surprisal)
                lgn = np.sqrt(np.clip((1 - prob) ** 2 + 0.1 * (1 - prob), 0, None))
                w = 1.0 / total_len
                omega = w * adv[i]
                chars = [str(c) for c in rng.choice(ALPHABET, size=L)]
                if planted_token is not None and aid == 0:
                    chars[0] = planted_token
                response = "".join(chars)
                for t in range(L):
                    row = {
                        "answer_id": aid,
                        "group_id": gid,
                        "position": t,
                        "token_id": int(rng.integers(4, 100)),
                        "token": str(chars[t]),
                        "logprob": float(-surprisal[t]),
                        "prob": float(prob[t]),
                        "entropy": float(entropy[t]),
                        "logit_grad_norm": float(lgn[t]),
                        "advantage": float(adv[i]),
                        "loss_weight": w,
                        "omega": float(omega),
                        "grad_norm_logp": float(gnl[t]),
                        "grad_norm": float(abs(omega) * gnl[t]),
                        "head_grad_norm": float(lgn[t] * rng.lognormal(0.0, 0.2)),
                        "reward": float(rewards[i]),
                    }
                    if domain is not None:
                        row["domain"] = domain
                    if steps:
                        row["step"] = step
                    tok_rows.append(row)
                arow = {
                    "answer_id": aid,
                    "group_id": gid,
                    "reward": float(rewards[i]),
                    "advantage": float(adv[i]),
                    "length": L,
                    "prompt": f"prompt of group {gid}: compute 2+2",
                    "response": response,
                }
                if domain is not None:
                    arow["domain"] = domain
                if steps:
                    arow["step"] = step
                ans_rows.append(arow)
                aid += 1
    tokens = pd.DataFrame(tok_rows)
    tokens["gmts"] = tokens["entropy"] * tokens["omega"].abs()
    add_estimator_columns(tokens)
    return tokens, pd.DataFrame(ans_rows)


def make_run_dir(
    path: Path,
    *,
    seed: int = 0,
    n_boot: int = 200,
    figures: bool = True,
    report: bool = True,
    planted_token: str | None = None,
    **kw,
) -> Path:
    """A complete synthetic run directory (docs/definitions.md section 8) at ``path``."""
    from gmts_analysis.analysis.stats import compute_stats
    from gmts_analysis.util.io import atomic_write_json, atomic_write_parquet

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokens, answers = make_tables(seed=seed, planted_token=planted_token, **kw)
    atomic_write_parquet(path / "tokens.parquet", tokens)
    atomic_write_parquet(path / "answers.parquet", answers)
    stats = compute_stats(tokens, answers, seed=seed, n_boot=n_boot, min_groups=1)
    # a plausible fidelity block (the real one needs a model; the probe computes it)
    stats["update_fidelity"] = {
        "all": {"cosine": 1.0, "norm_ratio": 1.0},
        "oracle": {"cosine": 0.93, "norm_ratio": 0.9},
        "random": {"cosine": 0.45, "norm_ratio": 0.46},
        "entropy": {"cosine": 0.62, "norm_ratio": 0.58},
        "gmts": {"cosine": 0.88, "norm_ratio": 0.84},
    }
    atomic_write_json(path / "stats.json", stats)
    atomic_write_json(
        path / "manifest.json",
        {
            "command": "synthetic test run",
            "model": "synthetic <b>model</b>",
            "config": {"temperature": 1.0, "advantage": "group", "loss_agg": "token-mean"},
            "grad_norm_method": "exact",
            "seed": seed,
        },
    )
    if figures:
        from gmts_analysis.views.plots import render_all

        render_all(path)
    if report:
        from gmts_analysis.views.report import write_report

        write_report(path)
    return path
