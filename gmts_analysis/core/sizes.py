"""The chunk size of the exact engine, parsed once: tokens per batched VJP, or ``auto``.

``--chunk-size`` (the option's check), the probe kernel, the engine's entry and the worker's
out-of-memory retry all read a chunk size through :func:`parse_chunk_size`.
"""

from __future__ import annotations

from typing import Any

from gmts_analysis.errors import GmtsError

AUTO = "auto"


def parse_chunk_size(value: Any, flag: str = "--chunk-size") -> int | str:
    """``"auto"`` (also for None), or a positive integer; anything else is a :class:`GmtsError` naming ``flag``."""
    if value is None or str(value).strip() == AUTO:
        return AUTO
    if isinstance(value, bool) or isinstance(value, float) and not value.is_integer():
        raise GmtsError(f"{flag}: expected an integer or 'auto', got {value!r}")
    try:
        n = int(str(value).strip()) if not isinstance(value, (int, float)) else int(value)
    except ValueError:
        raise GmtsError(f"{flag}: expected an integer or 'auto', got {value!r}") from None
    if n < 1:
        raise GmtsError(f"{flag}: must be an integer >= 1 or 'auto', got {n}")
    return n
