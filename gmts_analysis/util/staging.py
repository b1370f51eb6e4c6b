"""Staged directories: a run (comparison, policy) directory is assembled in a temporary sibling marked ours
and renamed into place when complete; the directory it replaces is moved aside, never emptied first.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.atomic import _umask, atomic_write_json
from gmts_analysis.util.interrupt import raise_if_interrupted
from gmts_analysis.util.locks import exclusive_lock
from gmts_analysis.util.ownership import (
    _TMP_NAME,
    OWNER_MARKER,
    RUN_LISTING,
    check_ours,
    clean_stale_siblings,
    mark_ours,
    unmark,
)


def swap_in(new: Path, out: Path, kind: str = "run") -> None:
    """Put the complete directory ``new`` at ``out``, replacing the directory there (checked ours
    by :func:`check_ours`): ``out`` is moved aside to a backup sibling marked ours, ``new`` renamed
    in, the backup removed. A failure before the second rename puts the previous directory back; a
    job killed between the two renames leaves the marked backup, which :func:`clean_stale_siblings`
    restores. The previous directory is never emptied before the new one is complete."""
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
