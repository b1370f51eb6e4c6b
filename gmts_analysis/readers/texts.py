"""Reading a response's text and its final ``\\boxed{}`` answer: shared by the rollouts reader, the verifiers and
the reward audit (below all three, so none imports another for them)."""

from __future__ import annotations

import re
from typing import Any


def last_boxed(text: str | None) -> str | None:
    """The content of the last complete ``\\boxed{...}`` of ``text`` (braces matched), or None."""
    if not text:
        return None
    for m in reversed(list(re.finditer(r"\\boxed\s*\{", text))):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            return text[m.end():i - 1].strip()
    return None


def response_text(x: Any) -> str | None:
    """The text of a response: a string as given, a message list's last message content (the assistant
    message, as TRL logs a conversational completion and ``gmts sample`` writes it), else None."""
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)) and x and isinstance(x[-1], dict):
        c = x[-1].get("content")
        return c if isinstance(c, str) else None
    return None
