"""``stats.json``'s ``reward_audit``: how far a run's rewards can be trusted (docs/definitions.md section 6).

Read from the answers table: ``truncated`` (the answer hit the budget without a stop token) and the per-answer
fields a verifier leaves when it scores (:mod:`gmts_analysis.readers.audit`: ``verifier``, ``boxed``,
``fallback``, ``copies_example``, ``final_answer``). A share is over the answers where its field is known; a
field no answer carries is ``null``, never guessed (a run whose rewards came with its rollouts has no verifier
to audit).

A constant-answer collapse (a policy that answers "8" whatever the question: reward hacking, right about as
often as the most common reference answer) leaves every share above healthy; :func:`modal_answers` measures
it: ``modal_answer`` (the most common final answer), ``modal_answer_share`` (its share of all answers) and
``modal_solution_share`` (the most common reference answer's share of the same answers: what one constant
answer could earn). :func:`audit_sentence` warns when :data:`COLLAPSE_SHARE` of the answers or more give one
answer, at least :data:`COLLAPSE_RATIO` times the most common solution's share.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from gmts_analysis.analysis.stats_types import RewardAudit
from gmts_analysis.readers.verifiers import reference_text

#: the keys of ``reward_audit``, in order (the first six are SPEC's; the rest count what they mean for rewards)
KEYS = RewardAudit.KEYS
#: the keys of :func:`modal_answers`
MODAL_KEYS = ("modal_answer", "modal_answer_share", "modal_solution_share")
#: a constant-answer collapse: at least this share of all answers give the same final answer ...
COLLAPSE_SHARE = 0.5
#: ... and at least this many times the share of the most common reference answer (``modal_solution_share``)
COLLAPSE_RATIO = 2.0
#: reference-answer columns, in the verifiers' order (``solution``, else GSM8K's ``answer``)
REFERENCE_COLUMNS = ("solution", "answer")


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


def _text(x: Any) -> str | None:
    """An answer as text (None: none recorded; NaN is a missing value of a table)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return str(x).strip()


def _mode(values: list[str | None]) -> tuple[str, int] | None:
    """The most common non-null value and its count (ties: the smallest value), None when all are null."""
    counts = Counter(v for v in values if v is not None)
    if not counts:
        return None
    return min(counts.items(), key=lambda kv: (-kv[1], kv[0]))


def modal_answers(answers: pd.DataFrame | None) -> dict[str, Any]:
    """``modal_answer``, ``modal_answer_share`` (over all answers) from the ``final_answer`` column, and
    ``modal_solution_share`` (over the same answers) from the reference answers (``solution``, else ``answer``,
    GSM8K's ``... #### 72`` read as the verifiers read it); each null where its column is absent or empty."""
    out: dict[str, Any] = dict.fromkeys(MODAL_KEYS)
    if answers is None or not len(answers):
        return out
    n = len(answers)
    if "final_answer" in answers.columns:
        mode = _mode([_text(x) for x in answers["final_answer"]])
        if mode is not None:
            out["modal_answer"], out["modal_answer_share"] = mode[0], mode[1] / n
    ref = next((c for c in REFERENCE_COLUMNS if c in answers.columns), None)
    if ref is not None:
        mode = _mode([None if _text(x) is None else (reference_text(x).strip() or None) for x in answers[ref]])
        if mode is not None:
            out["modal_solution_share"] = mode[1] / n
    return out


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
    out.update(modal_answers(answers))
    return out


def collapse_warning(audit: dict[str, Any] | None) -> str | None:
    """The clause that flags a constant-answer collapse (module docstring), None when there is none or the audit
    lacks ``modal_answer_share`` or ``modal_solution_share`` (an older stats.json, no reference answers)."""
    share = (audit or {}).get("modal_answer_share")
    base = (audit or {}).get("modal_solution_share")
    answer = (audit or {}).get("modal_answer")
    if share is None or base is None or answer is None:
        return None
    if share < COLLAPSE_SHARE or share < COLLAPSE_RATIO * base:
        return None
    answer = str(answer)
    shown = answer if len(answer) <= 40 else answer[:37] + "..."
    return (f"{100 * share:.0f}% of answers give the same final answer '{shown}' (the most common solution is "
            f"{100 * base:.0f}% of problems): a constant-answer collapse?")


def audit_sentence(audit: dict[str, Any] | None) -> str | None:
    """One line for the summary: who scored the answers and how far to trust it (None: no audit)."""
    known = [k for k in KEYS if k not in ("n_answers", "positive_share", "modal_solution_share")
             and audit and audit.get(k) is not None]
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
    warning = collapse_warning(audit)
    tail = f" Warning: {warning}" if warning else ""
    return f"Reward audit ({who}), {audit['n_answers']} answers: {facts}.{tail}"
