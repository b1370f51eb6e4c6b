"""``stats.json``'s ``reward_audit``: how far a run's rewards can be trusted (docs/definitions.md section 6).

Read from the answers table: ``truncated`` (the answer hit the budget without a stop token) and the per-answer
fields a verifier leaves when it scores (:mod:`gmts_analysis.readers.audit`: ``verifier``, ``boxed``,
``fallback``, ``copies_example``). A share is over the answers where its field is known; a field no answer
carries is ``null``, never guessed (a run whose rewards came with its rollouts has no verifier to audit).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stats_types import RewardAudit

#: the keys of ``reward_audit``, in order (the first six are SPEC's; the rest count what they mean for rewards)
KEYS = RewardAudit.KEYS


def _flags(answers: pd.DataFrame, col: str) -> pd.Series | None:
    """The column as booleans where known (None where no answer has it)."""
    if col not in answers.columns:
        return None
    v = answers[col]
    known = v.map(lambda x: isinstance(x, (bool, np.bool_)))
    return v[known].astype(bool) if known.any() else None


def _share(flags: pd.Series | None) -> float | None:
    return None if flags is None or len(flags) == 0 else float(flags.mean())


def _share_among_positive(flags: pd.Series | None, positive: pd.Series) -> float | None:
    """Share of all answers that are positive *and* flagged (None where the flag is unknown)."""
    if flags is None:
        return None
    return float((flags & positive.reindex(flags.index).fillna(False)).sum() / max(len(flags), 1))


def reward_audit(answers: pd.DataFrame | None, n_answers: int | None = None) -> dict[str, Any]:
    """The ``reward_audit`` block of the answers table (None: only ``n_answers`` known, the rest null)."""
    out: dict[str, Any] = dict.fromkeys(KEYS)
    if answers is None or not len(answers):
        out["n_answers"] = n_answers
        return out
    out["n_answers"] = int(len(answers))
    if "verifier" in answers.columns:
        names = sorted({str(v) for v in answers["verifier"] if isinstance(v, str)})
        out["verifier"] = ", ".join(names) if names else None
    positive = pd.to_numeric(answers["reward"], errors="coerce") > 0 if "reward" in answers.columns else None
    truncated = _flags(answers, "truncated")
    fallback = _flags(answers, "fallback")
    out["truncated_share"] = _share(truncated)
    out["boxed_share"] = _share(_flags(answers, "boxed"))
    out["fallback_share"] = _share(fallback)
    out["copies_prompt_example_share"] = _share(_flags(answers, "copies_example"))
    if positive is not None:
        out["positive_share"] = float(positive.mean())
        out["fallback_positive_share"] = _share_among_positive(fallback, positive)
        out["truncated_positive_share"] = _share_among_positive(truncated, positive)
    return out


def audit_sentence(audit: dict[str, Any] | None) -> str | None:
    """One line for the summary: who scored the answers and how far to trust it (None: no audit)."""
    known = [k for k in KEYS if k not in ("n_answers", "positive_share") and audit and audit.get(k) is not None]
    if not audit or not audit.get("n_answers") or not known:  # nothing recorded beyond the rewards themselves
        return None

    def pct(k: str) -> str | None:
        v = audit.get(k)
        return None if v is None else f"{100 * v:.0f}%"

    parts = [f"{pct('truncated_share')} truncated" if audit.get("truncated_share") is not None else None,
             f"{pct('boxed_share')} with a \\boxed{{}} answer" if audit.get("boxed_share") is not None else None,
             f"{pct('fallback_share')} scored by the verifier's fallback"
             + (f" ({pct('fallback_positive_share')} positive by it)" if audit.get("fallback_positive_share") else "")
             if audit.get("fallback_share") is not None else None,
             f"{pct('copies_prompt_example_share')} copying a worked example of the prompt"
             if audit.get("copies_prompt_example_share") is not None else None]
    who = f"verifier {audit['verifier']}" if audit.get("verifier") else "no verifier recorded: rewards as given"
    facts = ", ".join(p for p in parts if p) or "nothing more recorded"
    return f"Reward audit ({who}), {audit['n_answers']} answers: {facts}."
