"""How many torch CPU threads a command uses: set by the CLI and by an explicit ``threads=``, never on import.

torch's own default is every core. On a machine whose cores are also busy with other work,
that default oversubscribes them and a probe can run several times slower than on one
thread (docs/benchmarks.md, README "Threads"). :func:`default_threads` takes the cores
that are not already busy instead (one-minute load average), at least one; ``$GMTS_THREADS``
or ``--threads`` / ``threads=`` choose explicitly.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

from gmts_analysis.errors import GmtsError


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """``$GMTS_THREADS`` if set, else ``$OMP_NUM_THREADS`` (torchrun sets it to 1 per process), else
    the available cores minus the one-minute load average (rounded), shared among the processes
    of this node (``$LOCAL_WORLD_SIZE``), between 1 and the available cores."""
    for name in ("GMTS_THREADS", "OMP_NUM_THREADS"):
        env = os.environ.get(name, "").strip()
        if env:
            return check_threads(env, name)
    cores = available_cores()
    try:
        free = cores - os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average (Windows): every core
        free = cores
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    return max(1, min(cores, int(free / local + 0.5)))


def check_threads(value: object, name: str = "--threads") -> int:
    """``value`` as a thread count >= 1, or a :class:`GmtsError` naming ``name``."""
    try:
        n = int(str(value))
    except ValueError:
        raise GmtsError(f"{name}: expected a whole number of threads >= 1, got {value!r}") from None
    if n < 1 or isinstance(value, bool) or (isinstance(value, float) and value != n):
        raise GmtsError(f"{name}: expected a whole number of threads >= 1, got {value!r}")
    return n


def set_threads(threads: int | None, name: str = "--threads") -> int:
    """Set torch's CPU threads to ``threads`` (None: :func:`default_threads`); returns the number set."""
    import torch

    n = default_threads() if threads is None else check_threads(threads, name)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


#: the API's default ``threads=``: pick as the command line does, for the call only
AUTO = "auto"


@contextlib.contextmanager
def api_threads(threads: "int | str | None", name: str = "threads=") -> Iterator["int | None"]:
    """torch's CPU threads around one API call (:func:`gmts_analysis.probe`, :func:`gmts_analysis.sample`).

    ``"auto"`` (the default): the command line's choice (:func:`default_threads`: ``GMTS_THREADS``, else
    ``OMP_NUM_THREADS``, else the cores not already busy) for the call, torch's setting restored after it
    (torch's own default, every core, collapses on shared cores). An int: set, and kept after the call.
    ``None``: torch left as it is. Yields the threads used (None: left alone)."""
    if threads is None:
        yield None
        return
    if isinstance(threads, str) and threads == AUTO:
        import torch

        before = torch.get_num_threads()
        n = set_threads(None)
        try:
            yield n
        finally:
            if torch.get_num_threads() != before:
                torch.set_num_threads(before)
        return
    yield set_threads(threads, name)  # type: ignore[arg-type]
