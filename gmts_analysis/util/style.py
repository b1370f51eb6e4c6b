"""Shared look of figures and reports: estimator colours and how a token is shown.

A leaf module (no imports from the package), so that every figure module can use it
without importing another figure module.
"""

from __future__ import annotations

from typing import Any

COLORS = {"entropy": "#1f77b4", "gmts": "#ff7f0e", "oracle": "#2ca02c", "random": "#7f7f7f", "all": "#444444"}


def display_token(tok: Any, width: int | None = None) -> str:
    """A visible form of a token: newline as ↵, tab as →, space as ␣; cut to ``width`` chars."""
    s = "" if tok is None else str(tok)
    s = s.replace("\n", "↵").replace("\t", "→").replace(" ", "␣").replace("\r", "⏎")
    if width is not None and len(s) > width:
        s = s[: max(1, width - 1)] + "…"
    return s
