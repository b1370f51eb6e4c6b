"""Atomic writes: every file appears complete or not at all.

Files are written under a temporary name in the same directory and renamed;
a run directory is assembled in a temporary sibling and renamed when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from gmts_analysis.errors import GmtsError


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tmp_sibling(path: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def read_json(path: str | os.PathLike) -> Any:
    path = Path(path)
    if not path.exists():
        raise GmtsError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GmtsError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None


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


def read_parquet(path: str | os.PathLike) -> "Any":
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise GmtsError(f"{path}: no such file")
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise GmtsError(f"{path}: cannot read parquet ({type(e).__name__}: {e})") from None


@contextlib.contextmanager
def staged_directory(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Build a run directory in a temporary sibling; rename it to ``out`` on success.

    A failure leaves ``out`` untouched (absent, or the previous complete run) and
    removes the temporary directory. With ``overwrite=False`` an existing non-empty
    ``out`` is refused before any work starts.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GmtsError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise GmtsError(f"{out}: output directory exists and is not empty (pass --overwrite to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
