"""Atomic writes: every file appears complete or not at all.

A file is written under a temporary name in its own directory and renamed; JSON is written with NaN as null.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def _tmp_sibling(path: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600: a run is shared as the umask allows
    finally:
        os.close(fd)
    return Path(name)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays, paths
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def to_json(obj: Any) -> str:
    """JSON text with NaN written as null (strict JSON readers choke on NaN)."""
    return json.dumps(_nan_to_none(obj), indent=2, default=_json_default, allow_nan=False) + "\n"


def _nan_to_none(obj: Any) -> Any:
    if isinstance(obj, float) and obj != obj:  # NaN
        return None
    if isinstance(obj, float) and obj in (float("inf"), float("-inf")):
        return None
    if isinstance(obj, dict):
        return {str(k): _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    if hasattr(obj, "item") and getattr(obj, "ndim", 1) == 0:
        return _nan_to_none(obj.item())
    return obj


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    return atomic_write_text(path, to_json(obj))


def atomic_write_parquet(path: str | os.PathLike, df: "Any") -> Path:
    """Write a pandas DataFrame to parquet atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_sibling(path)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (thread-safe), else by os.umask."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    m = os.umask(0)
    os.umask(m)
    return m


def atomic_write_jsonl(path: str | os.PathLike, rows: Any, ensure_ascii: bool = False, default: Any = None) -> Path:
    """``rows`` (an iterable of JSON-able objects) as JSON lines at ``path``, written atomically: one object per
    line, keys in their order, each line ended by a newline (no rows: an empty file). Non-ASCII text is kept as
    is unless ``ensure_ascii``; ``default`` as in :func:`json.dumps` (e.g. ``str``). The package's one JSON-lines
    writer."""
    return atomic_write_text(path, jsonl_text(rows, ensure_ascii=ensure_ascii, default=default))


def jsonl_text(rows: Any, ensure_ascii: bool = False, default: Any = None) -> str:
    """``rows`` as JSON-lines text (what :func:`atomic_write_jsonl` writes), for a file written with others."""
    return "".join(json.dumps(r, ensure_ascii=ensure_ascii, default=default) + "\n" for r in rows)
