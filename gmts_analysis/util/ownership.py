"""Which directories are ours: run, policy and comparison directories, the marker of our staging, backup
and work directories, and the checks that refuse an output location or file that would swallow something else.

gmts never replaces or empties a directory that holds a file it did not write, and a directory's name proves
nothing: only our marker (:data:`OWNER_MARKER`) or our own records do.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.atomic import atomic_write_json
from gmts_analysis.util.files import require_regular, special_kind

log = logging.getLogger("gmts_analysis.util.io")


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
