"""How the HTML report writes things: its sizes, escaping, visible text and number formats."""

from __future__ import annotations

import html
import math
import re
from typing import Any

import numpy as np

MAX_ANSWERS = 200  # answers in the audit view (paged, PAGE_SIZE a page; the page says how many)
MAX_TOKENS = 1000  # tokens shown per answer (an answer cut says so)
PAGE_SIZE = 20
# off-policy columns shown on hover when the run has them: (column, data attribute, label, unit)
OFF_POLICY_FIELDS = (("ratio", "ra", "ratio", ""), ("ref_logprob", "rl", "ref logprob", " nats"),
                     ("kl_k3", "kl", "KL term (k3)", " nats"), ("clipped", "cl", "clipped", ""))


# characters that reorder or hide text: bidi embeddings/overrides/isolates and marks, C0/C1 controls
# (tab and newline excepted), DEL, lone surrogates; shown as <U+XXXX> instead of acting on the page
_INVISIBLE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
                        "\ud800-\udfff]")


def visible(s: str) -> str:
    """``s`` with control and bidi-formatting characters replaced by visible ``<U+XXXX>`` markers."""
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", s)


def _e(x: Any) -> str:
    """HTML-escape any value (quotes too, so it is safe in attributes); control and bidi
    characters become visible ``<U+XXXX>`` markers (:func:`visible`)."""
    return html.escape(visible("" if x is None else str(x)), quote=True)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    try:
        v = float(x)
    except (TypeError, ValueError):
        return _e(x)
    if math.isnan(v):
        return "–"
    if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}f}"


def _g(x: Any) -> str:
    """Four significant digits (compact, for the token data attributes)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "–"
    return "–" if math.isnan(v) else f"{v:.4g}"


def _ci(v: Any, lo: Any, hi: Any) -> str:
    s = _fmt(v)
    if lo is None or hi is None or (isinstance(lo, float) and math.isnan(lo)):
        return s
    return f'{s} <span class="ci">[{_fmt(lo)}, {_fmt(hi)}]</span>'


# --------------------------------------------------------------------------- sections
