"""Reading files safely: only regular files (never a FIFO or device), JSON and parquet read into one-line errors.

Every reader of gmts goes through these: :func:`require_regular` / :func:`check_regular_file` refuse what
would block or never end, :func:`read_json` bounds what it reads, :func:`jsonl_objects` names the line.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from gmts_analysis.errors import GmtsError


def special_kind(path: str | os.PathLike) -> str | None:
    """What ``path`` is when it exists but is neither a regular file nor a directory (links followed):
    ``"a FIFO (named pipe)"``, ``"a character device"``, ... ; ``None`` otherwise. Opening a FIFO blocks
    until someone writes to it and a device may never end, so gmts reads only regular files."""

    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    for test, what in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "a special file"


def require_regular(path: str | os.PathLike, label: str | None = None) -> None:
    """Raise a one-line :class:`GmtsError` when ``path`` is a FIFO, device or socket (see
    :func:`special_kind`); ``label`` names it in the message (default: the path)."""
    kind = special_kind(path)
    if kind is not None:
        raise GmtsError(f"{label or path}: is {kind}, not a regular file (gmts reads only regular files)")


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB blocks."""
    require_regular(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_regular_file(path: str | os.PathLike, flag: str) -> Path:
    """``path`` as a Path when it is a regular file; else a one-line error naming ``flag``: missing, a FIFO
    or device (:func:`require_regular`: a read would block or never end), or a directory."""
    p = Path(path)
    if not os.path.lexists(p):
        raise GmtsError(f"{flag} {p}: no such file")
    require_regular(p, f"{flag} {p}")
    if not p.is_file():
        raise GmtsError(f"{flag} {p}: not a regular file")
    return p


def jsonl_objects(path: str | os.PathLike, where: str = "") -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line of a JSON-lines file; a line that is not UTF-8, not
    JSON or not an object is one error naming ``where`` (default: the path) and the line."""
    name = where or str(path)
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise GmtsError(f"{name}: line {n}: not valid UTF-8") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except RecursionError:
                raise GmtsError(f"{name}: line {n}: invalid JSON (nested too deeply)") from None
            except ValueError as e:
                msg = e.msg if isinstance(e, json.JSONDecodeError) else (str(e).splitlines() or [""])[0][:120]
                raise GmtsError(f"{name}: line {n}: invalid JSON ({msg})") from None
            if not isinstance(obj, dict):
                raise GmtsError(f"{name}: line {n}: expected a JSON object per line")
            yield n, obj


#: the largest stats.json / manifest.json / record gmts reads (its own are well under a MiB)
MAX_JSON_BYTES = 64 << 20


def read_json(path: str | os.PathLike, max_bytes: int | None = MAX_JSON_BYTES) -> Any:
    """The JSON value of ``path``; one-line :class:`GmtsError` for a missing, special, oversized
    (``max_bytes``; None: no limit), undecodable or invalid file."""
    path = Path(path)
    if not path.exists():
        raise GmtsError(f"{path}: no such file")
    require_regular(path)
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise GmtsError(f"{path}: {path.stat().st_size:,} bytes, more than the {max_bytes >> 20} MiB a JSON file "
                        "of gmts holds; not read")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise GmtsError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise GmtsError(f"{path}: not valid UTF-8 (byte {e.start + 1})") from None
    except RecursionError:
        raise GmtsError(f"{path}: invalid JSON (nested too deeply)") from None
    except ValueError as e:  # an integer literal with more digits than Python converts
        raise GmtsError(f"{path}: invalid JSON ({str(e).splitlines()[0][:120] if str(e) else type(e).__name__})") from None
    except OSError as e:
        raise GmtsError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None


def read_json_object(path: str | os.PathLike) -> dict:
    """:func:`read_json` of a file that must hold one JSON object (stats.json, manifest.json)."""
    obj = read_json(path)
    if not isinstance(obj, dict):
        raise GmtsError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_parquet(path: str | os.PathLike) -> "Any":
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise GmtsError(f"{path}: no such file")
    require_regular(path)
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise GmtsError(f"{path}: cannot read parquet ({type(e).__name__}: {e})") from None
