"""Shared look of figures and reports: reference colours and how a token is shown.

A leaf module (no imports from the package), so that every figure module can use it
without importing another figure module.
"""

from __future__ import annotations

from typing import Any

#: colours of the references that are not scores (a score's colour is its registry entry's, core/scores.py)
REFERENCE_COLORS = {"oracle": "#111111"}
#: colours for what has neither (a user's score registered without one), never a built-in score's
FALLBACK_COLORS = ("#e7969c", "#6b6ecf", "#b5cf6b", "#e7cb94", "#ce6dbd", "#9c9ede", "#cedb9c", "#bd9e39")


def display_token(tok: Any, width: int | None = None) -> str:
    """A visible form of a token: newline as ↵, tab as →, space as ␣; cut to ``width`` chars."""
    s = "" if tok is None else str(tok)
    s = s.replace("\n", "↵").replace("\t", "→").replace(" ", "␣").replace("\r", "⏎")
    if width is not None and len(s) > width:
        s = s[: max(1, width - 1)] + "…"
    return s
