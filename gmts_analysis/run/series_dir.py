"""The folder of a ``gmts series`` audit, owned as every gmts writer owns its output
(:mod:`gmts_analysis.util.ownership`).

A series folder holds ``series.json``, ``samples/``, ``tokens/``, ``step-NNNNN/`` run directories, ``compare/``,
``exact_subset/``, ``batches/`` and ``pass1.png``; gmts marks it ours (:data:`~gmts_analysis.util.ownership.OWNER_MARKER`,
role ``series``) when it creates it. :func:`check_series_out` refuses, before anything is read or written:

- an ``--out`` inside any input (the training output directory, a checkpoint, the run's rollouts, the prompts
  file), or holding one, directly or through a symbolic link (paths are resolved);
- an existing folder that gmts did not make as a series (no marker and no ``series.json`` of ours), or one
  holding files a series never writes: someone else's files are never replaced, whatever ``--overwrite`` says.

A series folder of ours is resumed (its finished samples and runs are reused); ``--overwrite`` redoes its runs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from gmts_analysis.errors import GmtsError
from gmts_analysis.run.series_types import SERIES_FILE, SeriesRecord
from gmts_analysis.util.ownership import OWNER_MARKER, check_output_location, is_ours, mark_ours

SERIES_ROLE = "series"
#: what a series folder holds at its top (besides the run directories ``step-NNNNN``)
SERIES_ENTRIES = frozenset({SERIES_FILE, "samples", "tokens", "exact_subset", "batches", "compare", "pass1.png"})
_RUN_NAME = re.compile(r"^step-\d{5,}$")
_TMP_NAME = re.compile(r"^\..+\.tmp$")
#: what gmts leaves beside an entry of the series (a lock a killed run left, a staging or backup directory)
_BESIDE = re.compile(r"^\.(step-\d{5,}|compare|tokens|samples|batches|exact_subset|series\.json)\.")


def _is_series_record(d: Path) -> bool:
    """A ``series.json`` that gmts wrote (a series made before folders were marked): a regular file holding a
    :class:`~gmts_analysis.run.series_types.SeriesRecord` with the series' own keys."""
    try:
        rec = SeriesRecord.read(d / SERIES_FILE)
    except GmtsError:
        return False
    return all(rec.has(k) for k in ("output_dir", "checkpoints", "loss", "num_generations"))


def _inside(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def check_series_out(out: str | os.PathLike, inputs: dict[str, str | os.PathLike | None],
                     overwrite: bool = False) -> Path:
    """Refuse an ``--out`` that is not the series' own (module docstring); create it (marked ours) when absent
    or empty. Returns ``out`` as given."""
    given = Path(out)
    resolved = check_output_location(out, flag="--out", whole_dir=False)
    for name, path in inputs.items():
        if path is None or not os.path.lexists(path):
            continue
        try:
            ip = Path(path).expanduser().resolve()
        except (OSError, RuntimeError):
            continue
        if _inside(resolved, ip):
            via = f" (it resolves to {resolved})" if resolved != Path(os.path.abspath(out)) else ""
            raise GmtsError(f"--out {out}: is inside {name} {path}{via}; the audit never writes into what it "
                            "reads: choose a folder outside the run")
        if _inside(ip, resolved):
            raise GmtsError(f"--out {out}: holds {name} {path}; the audit never writes over what it reads: "
                            "choose another folder")
    if resolved.is_dir() and any(resolved.iterdir()):
        foreign = sorted(c.name for c in resolved.iterdir()
                         if c.name not in SERIES_ENTRIES and c.name != OWNER_MARKER and not _RUN_NAME.match(c.name)
                         and not _TMP_NAME.match(c.name) and not _BESIDE.match(c.name))
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            raise GmtsError(f"--out {out}: holds files that gmts did not write ({', '.join(foreign[:3])}{more}); "
                            "gmts never replaces such a folder: choose another output directory")
        if not (is_ours(resolved, SERIES_ROLE, resolved) or _is_series_record(resolved)):
            raise GmtsError(f"--out {out}: is not empty and is not a gmts series (no {OWNER_MARKER} or "
                            f"{SERIES_FILE} of gmts); gmts never replaces such a folder: choose another output "
                            "directory")
    resolved.mkdir(parents=True, exist_ok=True)
    if not is_ours(resolved, SERIES_ROLE, resolved):
        mark_ours(resolved, SERIES_ROLE, resolved)
    return given
