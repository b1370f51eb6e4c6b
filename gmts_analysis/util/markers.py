"""Generated blocks in text files: the text between ``<!-- TAG:begin ... -->`` and ``<!-- TAG:end -->``.

One home for finding and replacing such a block, used by the README results blocks
(:func:`gmts_analysis.analysis.summary.update_readme`) and by ``gmts rl-report --update``.
"""

from __future__ import annotations


def block_markers(tag: str) -> tuple[str, str]:
    """``(begin prefix, end marker)`` of the block ``tag``: ``<!-- TAG:begin`` (a begin marker may
    carry a note before its ``-->``) and ``<!-- TAG:end -->``."""
    return f"<!-- {tag}:begin", f"<!-- {tag}:end -->"


def find_block(text: str, tag: str) -> tuple[int, int, int, int] | None:
    """``(a, b, c, d)`` of the first block ``tag`` in ``text``: the begin marker is ``text[a:b]``,
    the generated body ``text[b:c]`` and the end marker ``text[c:d]``; None when either marker is
    missing (or the end comes before the begin)."""
    prefix, end = block_markers(tag)
    a = text.find(prefix)
    if a < 0:
        return None
    close = text.find("-->", a + len(prefix))
    if close < 0:
        return None
    b = close + len("-->")
    c = text.find(end, b)
    if c < 0:
        return None
    return a, b, c, c + len(end)


def block_note(text: str, tag: str) -> str:
    """The note a block's begin marker carries (``<!-- TAG:begin NOTE -->`` gives ``"NOTE"``), "" when it
    carries none or the block is missing."""
    span = find_block(text, tag)
    if span is None:
        return ""
    a, b, _, _ = span
    return text[a + len(block_markers(tag)[0]):b - len("-->")].strip()


def replace_body(text: str, tag: str, body: str) -> str | None:
    """``text`` with the body of the first block ``tag`` replaced by ``body`` (on its own lines), the
    markers and everything outside them kept byte for byte; None when the markers are missing."""
    span = find_block(text, tag)
    if span is None:
        return None
    _, b, c, _ = span
    return text[:b] + "\n" + body.strip("\n") + "\n" + text[c:]
