"""Atomic writes: every file appears complete or not at all.

Files are written under a temporary name in the same directory and renamed;
a run directory is assembled in a temporary sibling and renamed when complete.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import socket
import stat
import tempfile
from pathlib import Path
from typing import Any, Iterator

from gmts_analysis.errors import GmtsError

log = logging.getLogger("gmts_analysis.util.io")


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
    require_regular(path)
    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises many types for corrupt files
        raise GmtsError(f"{path}: cannot read parquet ({type(e).__name__}: {e})") from None


# ---------------------------------------------------------------- run directories: ownership, location, lock

# what a finished or unfinished run directory of ours may hold (top level); anything else is
# someone else's file, and gmts never replaces or empties a directory that holds one
RUN_ENTRIES = frozenset({
    "tokens.parquet", "answers.parquet", "grad_groups.parquet", "stats.json", "manifest.json", "errors.jsonl",
    "report.html", "figures", "rollouts.jsonl", "run.json", "chunks", "parts", "estimators.csv", "token_strings.csv",
})
# a finished run lists its own top-level entries here (written by staged_directory), so that files
# added to runs later are recognised without updating RUN_ENTRIES
RUN_LISTING = ".gmts-files"
# the marker that makes a directory ours: written into a staging, backup or work directory when gmts
# creates it (or moves it aside); a look-alike directory without it is someone else's, whatever its name
OWNER_MARKER = ".gmts-owner"
OWNER_FORMAT = "gmts-owner/1"
POLICY_ENTRIES = frozenset({
    "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "card.json", "README.md", "chat_template.jinja",
})
COMPARE_ENTRIES = frozenset({"compare.parquet", "compare.json", "compare.html", "figures"})
_TMP_NAME = re.compile(r"^\..+\.tmp$")  # atomic_write_* temporaries


def _read_regular_text(p: Path) -> str:
    """The UTF-8 text of ``p``; OSError when it is not a regular file (a FIFO would block the open)."""
    if special_kind(p) is not None:
        raise OSError(f"{p}: not a regular file")
    return p.read_text(encoding="utf-8")


def _is_run_marker(d: Path) -> bool:
    """A readable manifest.json with a ``config``, or a ``run.json`` of the run-state format."""
    for name, ok in (("manifest.json", lambda j: "config" in j),
                     ("run.json", lambda j: str(j.get("format", "")).startswith("gmts-run-state/"))):
        try:
            j = json.loads(_read_regular_text(d / name))
        except (OSError, ValueError):
            continue
        if isinstance(j, dict) and ok(j):
            return True
    return False


def _is_compare_marker(d: Path) -> bool:
    """A comparison gmts wrote: its listing (:data:`RUN_LISTING`, written last by
    :func:`staged_directory`) names compare.json, and compare.json carries our ``format``. A user's
    folder that merely holds files named compare.json / compare.html is not ours."""
    try:
        listed = json.loads(_read_regular_text(d / RUN_LISTING))
        j = json.loads(_read_regular_text(d / "compare.json"))
    except (OSError, ValueError):
        return False
    return (isinstance(listed, list) and "compare.json" in listed and isinstance(j, dict)
            and str(j.get("format", "")).startswith("gmts-compare/"))


def _is_policy_marker(d: Path) -> bool:
    return (d / "card.json").is_file() and (d / "config.json").is_file()


def foreign_entries(d: str | os.PathLike, allowed: frozenset = RUN_ENTRIES) -> list[str]:
    """Names at the top of ``d`` that gmts does not write into a directory of this kind
    (``allowed``, plus what the directory's own :data:`RUN_LISTING` says gmts wrote there)."""
    d = Path(d)
    listed: set[str] = {RUN_LISTING, OWNER_MARKER}
    try:
        names = json.loads(_read_regular_text(d / RUN_LISTING))
        if isinstance(names, list):
            listed.update(n for n in names if isinstance(n, str))
    except (OSError, ValueError):
        pass
    return sorted(c.name for c in d.iterdir()
                  if c.name not in allowed and c.name not in listed and not _TMP_NAME.match(c.name))


def check_ours(out: str | os.PathLike, kind: str = "run") -> None:
    """Raise unless ``out`` is absent, empty, or a directory that gmts wrote (a run, or a toy policy).

    ``kind`` is ``run`` (marker: manifest.json or run.json of ours; entries among :data:`RUN_ENTRIES`)
    or ``policy`` (card.json and config.json; entries among :data:`POLICY_ENTRIES`). The message never
    suggests ``--overwrite``: replacing someone else's files is not offered.
    """
    out = Path(out)
    if not out.exists():
        return
    if not out.is_dir():
        raise GmtsError(f"{out}: exists and is not a directory")
    if not any(out.iterdir()):
        return
    allowed, marker, what = {
        "run": (RUN_ENTRIES, _is_run_marker, "a gmts run"),
        "policy": (POLICY_ENTRIES, _is_policy_marker, "a gmts toy policy"),
        "compare": (COMPARE_ENTRIES, _is_compare_marker, "a gmts comparison"),
    }[kind]
    foreign = foreign_entries(out, allowed)
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise GmtsError(f"{out}: holds files that gmts did not write ({', '.join(foreign[:3])}{more}); "
                        "gmts never replaces such a directory: choose another output directory")
    if not marker(out):
        proof = "compare.json and .gmts-files of gmts" if kind == "compare" else "manifest.json or run.json of gmts"
        raise GmtsError(f"{out}: is not empty and is not {what} (no {proof}); "
                        "gmts never replaces such a directory: choose another output directory")


def check_output_file(path: str | os.PathLike, flag: str, is_ours_file: Any, overwrite: bool | None = False,
                      inputs: dict[str, Any] | None = None) -> Path:
    """Refuse an output file that would replace an input (``inputs``: ``{"--prompts": path}``, always
    refused), a directory, or an existing file :func:`is_ours_file` does not recognise as one gmts
    wrote, unless ``overwrite`` (None: the command has no --overwrite, none is suggested). Returns the
    path; nothing is created."""
    p = Path(path)
    for name, ip in (inputs or {}).items():
        if ip is not None and os.path.lexists(ip) and os.path.lexists(p) and os.path.samefile(ip, p):
            raise GmtsError(f"{flag} {path}: is the same file as {name} {ip}; write the output elsewhere")
    if p.is_symlink():
        raise GmtsError(f"{flag} {path}: is a symbolic link (to {os.readlink(p)}); give the file itself")
    if p.is_dir():
        raise GmtsError(f"{flag} {path}: is a directory; expected a file name")
    require_regular(p, f"{flag} {path}")
    if p.exists() and not overwrite:
        try:
            ours = bool(is_ours_file(p))
        except Exception:  # unreadable, not JSON, ...: not recognisably ours
            ours = False
        if not ours:
            hint = "pass --overwrite to replace it, or choose" if overwrite is not None else "choose"
            raise GmtsError(f"{flag} {path}: exists and was not written by gmts; {hint} another file name")
    return p


def check_output_location(out: str | os.PathLike, inputs: dict[str, str | os.PathLike | None] | None = None,
                          flag: str = "--out", whole_dir: bool = True) -> Path:
    """Refuse an output directory that cannot be written or that would swallow something else.

    Refused: ``out`` under a file, in a place that is not writable, the current directory or
    one of its parents (when ``whole_dir``: the directory is replaced as a whole), and any of
    ``inputs`` (``{"--rollouts": path, ...}``) inside ``out``. Returns ``out`` resolved. Nothing
    is created.
    """
    given = str(out)
    p = Path(out).expanduser()
    for q in (p, *p.parents):  # a dangling link on the way: mkdir would fail with 'File exists'
        if q.is_symlink() and not q.exists():
            raise GmtsError(f"{flag} {given}: {q} is a symbolic link to {os.readlink(q)}, which does not exist; "
                            "create its target or choose another output directory")
    if whole_dir and p.is_symlink():  # the run directory is replaced by a rename: the link itself would go
        raise GmtsError(f"{flag} {given}: is a symbolic link (to {os.readlink(p)}); give the directory itself")
    try:
        p = p.resolve()
    except (OSError, RuntimeError) as e:  # symlink loops
        raise GmtsError(f"{flag} {given}: cannot resolve the path ({e})") from None
    if p.exists() and not p.is_dir():
        raise GmtsError(f"{flag} {given}: exists and is not a directory")
    cwd = Path.cwd().resolve()
    if whole_dir and (cwd == p or p in cwd.parents):
        raise GmtsError(f"{flag} {given}: is the current directory or one of its parents; "
                        "give a new or dedicated directory for the run")
    anc = p
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise GmtsError(f"{flag} {given}: {anc} is a file, so nothing can be created under it")
    # the run directory is built beside ``out`` and renamed: its parent must be writable
    need = p.parent if anc == p and whole_dir else anc
    while not need.exists():
        need = need.parent
    if not os.access(need, os.W_OK | os.X_OK):
        raise GmtsError(f"{flag} {given}: {need} is not writable")
    if p.is_dir() and not os.access(p, os.W_OK | os.X_OK):  # an existing run directory is written in place
        raise GmtsError(f"{flag} {given}: {p} is not writable")
    for name, path in (inputs or {}).items():
        if path is None or not Path(path).exists():
            continue
        ip = Path(path).expanduser().resolve()
        if ip == p or p in ip.parents:
            raise GmtsError(f"{name} {path}: is inside {flag} {given}; the run directory must not hold its "
                            "own inputs (choose another output directory)")
    return p


def mark_ours(d: str | os.PathLike, role: str, out: str | os.PathLike) -> str:
    """Write :data:`OWNER_MARKER` into directory ``d``: gmts made it (or moved it aside) as the
    ``role`` (``staging``, ``backup``, ``work``, ``sample``) of run directory ``out``. Returns the
    marker's random token (kept by the caller where it needs to tell its own directory apart)."""
    token = secrets.token_hex(16)
    atomic_write_json(Path(d) / OWNER_MARKER, {"format": OWNER_FORMAT, "role": role, "for": Path(out).name,
                                                "token": token, "pid": os.getpid(), "uid": _uid()})
    return token


def is_ours(d: str | os.PathLike, role: str, out: str | os.PathLike, token: str | None = None) -> bool:
    """Whether ``d`` is a directory (not a link) of the current user holding our marker for ``role``
    of ``out`` (and ``token``, when given). Its name proves nothing: a look-alike is not ours."""

    d = Path(d)
    try:
        st = os.lstat(d)
        mst = os.lstat(d / OWNER_MARKER)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or not stat.S_ISREG(mst.st_mode) or mst.st_size > 4096:
        return False
    uid = _uid()
    if uid is not None and (st.st_uid != uid or mst.st_uid != uid):
        return False
    try:
        j = json.loads(_read_regular_text(d / OWNER_MARKER))
    except (OSError, ValueError):
        return False
    return (isinstance(j, dict) and j.get("format") == OWNER_FORMAT and j.get("role") == role
            and j.get("for") == Path(out).name and (token is None or j.get("token") == token))


def unmark(d: str | os.PathLike) -> None:
    """Remove :data:`OWNER_MARKER` from ``d`` (a directory back in its place, or finished)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(Path(d) / OWNER_MARKER)


def _uid() -> int | None:
    return os.getuid() if hasattr(os, "getuid") else None


def ours_beside(out: str | os.PathLike, role: str, stem: str) -> list[Path]:
    """Directories beside ``out`` named ``.<out name>.<stem>`` or ``.<out name>.<stem>-<8 hex>`` that
    carry our marker for ``role`` (:func:`is_ours`), oldest name first; look-alikes are skipped."""
    out = Path(out)
    pat = re.compile(r"^\." + re.escape(out.name) + r"\." + re.escape(stem) + r"(-[0-9a-f]{8})?$")
    try:
        names = sorted(c.name for c in out.parent.iterdir() if pat.match(c.name))
    except OSError:
        return []
    return [out.parent / n for n in names if is_ours(out.parent / n, role, out)]


def fresh_sibling_name(out: str | os.PathLike, stem: str) -> Path:
    """A name ``.<out name>.<stem>-<8 random hex>`` beside ``out`` that nothing has (never a look-alike's)."""
    out = Path(out)
    while True:
        p = out.parent / f".{out.name}.{stem}-{secrets.token_hex(4)}"
        if not os.path.lexists(p):
            return p


_STAGING = re.compile(r"^\.(?P<name>.+)\.[A-Za-z0-9_]{8}\.partial$")
_BACKUP = re.compile(r"^\.(?P<name>.+)\.gmts-old-[0-9a-f]{8}$")


def clean_stale_siblings(out: Path) -> list[Path]:
    """Remove staging directories and put back or remove backups left beside ``out`` by a killed job.

    Only directories that carry our marker for ``out`` (:func:`is_ours`) are touched; a directory
    whose name merely looks like one is left alone. Call only while holding :func:`exclusive_lock`.
    """
    removed: list[Path] = []
    if not out.parent.is_dir():
        return removed
    siblings = sorted(out.parent.iterdir())
    olds = [c for c in siblings if _BACKUP.match(c.name) and _BACKUP.match(c.name)["name"] == out.name
            and is_ours(c, "backup", out)]
    if olds and not os.path.lexists(out):
        # killed between moving the previous directory aside and renaming the new one in: put it back
        os.replace(olds[0], out)
        unmark(out)
        log.warning("%s: restored the previous directory (%s) left aside by an interrupted job", out, olds[0].name)
        olds = olds[1:]
    for c in siblings:
        m = _STAGING.match(c.name)
        if m and m["name"] == out.name and is_ours(c, "staging", out):
            shutil.rmtree(c, ignore_errors=True)
            removed.append(c)
            log.warning("%s: removed a stale staging directory left by an interrupted job", c)
    for c in olds:  # the new directory is in place: the previous one is no longer needed
        shutil.rmtree(c, ignore_errors=True)
        removed.append(c)
    return removed


_HELD_LOCKS: dict[str, int] = {}  # lock path -> depth held by this process (the lock is re-entrant)
LOCK_MAGIC = b"gmts-lock "  # the first bytes of every lock file gmts writes
_LEGACY_LOCK = b"pid "  # what gmts 0.2 wrote (a job of that version may hold the lock)


def lock_path(out: str | os.PathLike) -> Path:
    """The lock file of a run directory: a hidden sibling (it survives the directory's renames).
    Symbolic links are resolved first, so two spellings of one directory share one lock."""
    out = Path(os.path.realpath(out))
    return out.parent / f".{out.name}.gmts-lock"


def _open_lock(path: Path, out: Path) -> int:
    """Open (creating it if absent) the lock file at ``path`` without following a link and without
    ever truncating or writing a file gmts did not create: an existing file must be a regular file
    of the current user that starts with :data:`LOCK_MAGIC` (or is empty: a job killed between
    creating and writing it)."""

    nofollow = getattr(os, "O_NOFOLLOW", 0)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | nofollow, 0o644)
    except FileExistsError:
        pass
    except OSError as e:
        raise GmtsError(f"{out}: cannot create the lock file {path.name} ({e.strerror or e}); "
                        "is the location writable?") from None
    refuse = (f"{out}: {path} exists and is not a gmts lock file (a link, another kind of file, or someone "
              "else's); gmts never opens or changes it: remove it if it is not needed, or choose another "
              "output directory")
    try:
        fd = os.open(path, os.O_RDWR | nofollow | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return _open_lock(path, out)  # released meanwhile: create it
    except OSError:  # ELOOP: a symbolic link; EACCES: not ours
        raise GmtsError(refuse) from None
    st = os.fstat(fd)
    uid = _uid()
    head = os.pread(fd, len(LOCK_MAGIC), 0) if stat.S_ISREG(st.st_mode) else b"?"
    if (not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or (uid is not None and st.st_uid != uid)
            or (head and not (head == LOCK_MAGIC or head.startswith(_LEGACY_LOCK)))):
        os.close(fd)
        raise GmtsError(refuse)
    return fd


@contextlib.contextmanager
def exclusive_lock(out: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive ``flock`` on ``out``'s lock file for the block (re-entrant in one process).

    A second job on the same ``out`` fails at once with a :class:`GmtsError` saying which process
    holds it, and changes nothing. The lock file is created with ``O_EXCL | O_NOFOLLOW``; an
    existing one is reused only when it is a lock file of gmts (:func:`_open_lock`), so a link or a
    file planted at its name is never followed, truncated or written. It is removed on release (a
    killed job leaves it; it is reused, since the kernel released its lock). The parent of ``out``
    is created if needed.
    """
    import fcntl

    out = Path(out)
    path = lock_path(out)
    key = str(path.resolve()) if path.parent.exists() else str(path.absolute())
    if _HELD_LOCKS.get(key):
        _HELD_LOCKS[key] += 1
        try:
            yield path
        finally:
            _HELD_LOCKS[key] -= 1
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GmtsError(f"{out}: cannot create its parent directory ({e.strerror or e})") from None
    while True:
        fd = _open_lock(path, out)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode("utf-8", "replace").strip()
            os.close(fd)
            raise GmtsError(f"{out}: another gmts job is using this directory ({holder or 'lock ' + str(path)}); "
                            "wait for it to finish, or choose another output directory") from None
        try:  # the file we locked must still be the one at ``path`` (a releasing job unlinks it)
            same = os.path.samestat(os.fstat(fd), os.lstat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    key = str(path.resolve())
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, LOCK_MAGIC + f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
    except OSError:
        pass
    _HELD_LOCKS[key] = 1
    try:
        yield path
    finally:
        _HELD_LOCKS.pop(key, None)
        try:  # unlink only the file we hold (never one put at its name meanwhile)
            if os.path.samestat(os.fstat(fd), os.lstat(path)):
                os.unlink(path)
        except OSError:
            pass
        os.close(fd)


def swap_in(new: Path, out: Path, kind: str = "run") -> None:
    """Put the complete directory ``new`` at ``out``, replacing the directory there (checked ours
    by :func:`check_ours`): ``out`` is moved aside to a backup sibling marked ours, ``new`` renamed
    in, the backup removed. A failure before the second rename puts the previous directory back; a
    job killed between the two renames leaves the marked backup, which :func:`clean_stale_siblings`
    restores. The previous directory is never emptied before the new one is complete."""
    from gmts_analysis.util.interrupt import raise_if_interrupted

    raise_if_interrupted()  # a Ctrl-C lost on the way: the finished directory is not put in place
    old = None
    if os.path.lexists(out):
        check_ours(out, kind)  # re-checked: the work before may have run for hours
        old = out.parent / f".{out.name}.gmts-old-{secrets.token_hex(4)}"
        mark_ours(out, "backup", out)
        try:
            os.replace(out, old)
        except BaseException:
            unmark(out)
            raise
    try:
        os.replace(new, out)
    except BaseException:
        if old is not None and not os.path.lexists(out):
            os.replace(old, out)
            unmark(out)
        raise
    unmark(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def staged_directory(out: str | os.PathLike, overwrite: bool = False, kind: str = "run") -> Iterator[Path]:
    """Build a directory in a temporary sibling; rename it to ``out`` on success.

    A failure leaves ``out`` untouched (absent, or the previous complete directory) and
    removes the temporary directory. With ``overwrite=False`` an existing non-empty
    ``out`` is refused before any work starts; with ``overwrite=True`` it is replaced only
    when it is a directory gmts wrote (:func:`check_ours` with ``kind``), by :func:`swap_in` once
    the new one is complete. The whole block holds :func:`exclusive_lock` on ``out``; staging
    directories of killed jobs (those carrying our marker) are removed.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GmtsError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        check_ours(out, kind)
        if not overwrite:
            raise GmtsError(f"{out}: output directory exists and is not empty (pass --overwrite to replace it)")
    with exclusive_lock(out):
        clean_stale_siblings(out)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
        try:
            mark_ours(tmp, "staging", out)
            yield tmp
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700: honour the umask like mkdir
            if kind in ("run", "compare"):  # what we wrote: recognised as ours later, whatever new files runs gain
                atomic_write_json(tmp / RUN_LISTING, sorted(c.name for c in tmp.iterdir()
                                                            if not _TMP_NAME.match(c.name) and c.name != OWNER_MARKER))
            swap_in(tmp, out, kind)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise


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
