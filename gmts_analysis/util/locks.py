"""The lock of a run directory: one job at a time on one output directory.

The lock file is a hidden sibling of the directory (it survives the directory's renames), created without
following a link and never truncated or written unless gmts wrote it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path
from typing import Iterator

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.ownership import _uid

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
