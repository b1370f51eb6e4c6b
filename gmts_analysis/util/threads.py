"""How many torch CPU threads a command uses: set by the CLI and by an explicit ``threads=``, never on import.

torch's own default is every core. On a machine whose cores are also busy with other work,
that default oversubscribes them and a probe can run several times slower than on one
thread (docs/benchmarks.md, README "Threads"). :func:`default_threads` takes the cores
that are idle now instead, at least one: the CPUs of this process's affinity mask, less the
share of them that other work kept busy during a short sample of ``/proc/stat``
(:data:`SAMPLE_SECONDS`; the one-minute load average only where ``/proc/stat`` cannot be read,
which lags a minute behind: right after another command it still counts that command's cores),
and never more than a cgroup CPU quota allows (:func:`cgroup_cpu_quota`: a container limited to 2 CPUs
on a 64-core host gets at most 2 threads).
``$GMTS_THREADS`` or ``--threads`` / ``threads=`` choose explicitly.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from typing import Callable, Iterator, Mapping

from gmts_analysis.errors import GmtsError

#: where the kernel counts each CPU's time (Linux)
PROC_STAT = "/proc/stat"
#: how long :func:`busy_cores_now` watches the CPUs (seconds)
SAMPLE_SECONDS = 0.15
#: where the cgroup file systems are mounted (Linux); v2 unified, or v1 with a ``cpu`` controller folder
CGROUP_ROOT = "/sys/fs/cgroup"
#: which cgroup this process is in (its path under :data:`CGROUP_ROOT`)
PROC_SELF_CGROUP = "/proc/self/cgroup"


def available_cores() -> int:
    """CPU cores this process may run on: its affinity mask (else ``os.cpu_count()``), capped by a
    cgroup CPU quota (:func:`cgroup_cpu_quota`, rounded up: a quota of 1.5 CPUs gives 2), at least 1."""
    cores = len(_affinity()) or max(1, os.cpu_count() or 1)
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota - 1e-9)))
    return cores


def _read_first_line(path: str) -> "str | None":
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return None


def _own_cgroups(path: str) -> "dict[str, str]":
    """This process's cgroup path per controller from ``/proc/self/cgroup`` (v2's unified line under "")."""
    out: dict[str, str] = {}
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for ctrl in (parts[1].split(",") if parts[1] else [""]):
            out[ctrl] = parts[2].strip()
    return out


def _quota(quota: "str | None", period: "str | None") -> "float | None":
    """CPUs of a (quota, period) pair in microseconds; None for no limit (``max``, -1) or unreadable text."""
    try:
        q, p = int(quota or ""), int(period or "")
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def cgroup_cpu_quota(root: "str | None" = None, self_cgroup: "str | None" = None) -> "float | None":
    """The CPUs a cgroup CPU quota allows this process (e.g. 1.5), None where there is no quota or no cgroup.

    cgroup v2: ``cpu.max`` ("QUOTA PERIOD", or "max PERIOD" for none); v1: ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us`` (-1: none), in the ``cpu`` controller's folder. Read in this process's own cgroup
    (``/proc/self/cgroup``) and at the root (a container sees its own cgroup there); the smallest quota wins.
    ``root`` and ``self_cgroup`` default to :data:`CGROUP_ROOT` and :data:`PROC_SELF_CGROUP` (tests fake them)."""
    root = CGROUP_ROOT if root is None else root
    own = _own_cgroups(PROC_SELF_CGROUP if self_cgroup is None else self_cgroup)
    found: list[float] = []
    v2_dirs = {root, os.path.join(root, own.get("", "/").lstrip("/"))}
    for d in v2_dirs:
        line = _read_first_line(os.path.join(d, "cpu.max"))
        if line:
            fields = line.split()
            q = _quota(fields[0], fields[1] if len(fields) > 1 else "100000")
            if q is not None:
                found.append(q)
    for ctrl in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        base = os.path.join(root, ctrl)
        for d in {base, os.path.join(base, own.get("cpu", "/").lstrip("/"))}:
            q = _quota(_read_first_line(os.path.join(d, "cpu.cfs_quota_us")),
                       _read_first_line(os.path.join(d, "cpu.cfs_period_us")))
            if q is not None:
                found.append(q)
    return min(found) if found else None


def _affinity() -> "frozenset[int]":
    """The CPU ids this process may run on, empty where the system does not say."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset()


def parse_cpu_ticks(text: str) -> "dict[int, tuple[int, int]]":
    """Each CPU's (busy, total) ticks from the text of ``/proc/stat`` (its ``cpuN`` lines).

    total is user + nice + system + idle + iowait + irq + softirq + steal (guest time is already
    inside user and nice); busy is total less idle and iowait. Niced work counts as busy: the
    default leaves other people's jobs their cores whatever their priority."""
    out: dict[int, tuple[int, int]] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        try:
            fields = [int(v) for v in rest.split()[:8]]
        except ValueError:
            continue
        if len(fields) < 4:
            continue
        total = sum(fields)
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        out[int(name[3:])] = (total - idle, total)
    return out


def read_cpu_ticks(path: str = PROC_STAT) -> "dict[int, tuple[int, int]] | None":
    """:func:`parse_cpu_ticks` of ``path``; None where it cannot be read or names no CPU."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            ticks = parse_cpu_ticks(f.read())
    except OSError:
        return None
    return ticks or None


def busy_cores(before: "Mapping[int, tuple[int, int]]", after: "Mapping[int, tuple[int, int]]",
               cpus: "frozenset[int] | set[int]" = frozenset()) -> "float | None":
    """How many of ``cpus`` (empty: every CPU of the readings) were busy between two readings of
    :func:`read_cpu_ticks`: the sum of each CPU's busy fraction. None if no CPU of ``cpus`` ticked."""
    ids = [c for c in (cpus or after) if c in before and c in after]
    if not ids and cpus:  # the affinity mask names CPUs /proc/stat does not (a container's view): all
        ids = [c for c in after if c in before]
    busy, counted = 0.0, 0
    for c in ids:
        d_total = after[c][1] - before[c][1]
        if d_total <= 0:
            continue
        busy += min(1.0, max(0.0, (after[c][0] - before[c][0]) / d_total))
        counted += 1
    return busy if counted else None


def busy_cores_now(seconds: float = SAMPLE_SECONDS, path: str = PROC_STAT,
                   sleep: Callable[[float], None] = time.sleep) -> "float | None":
    """The cores of this process's affinity mask that other work keeps busy now: two readings of
    ``/proc/stat`` ``seconds`` apart, less this process's own CPU time between them. None where
    ``/proc/stat`` cannot be read (not Linux)."""
    before = read_cpu_ticks(path)
    if before is None:
        return None
    own0, wall0 = time.process_time(), time.monotonic()
    sleep(seconds)
    after = read_cpu_ticks(path)
    own, wall = time.process_time() - own0, time.monotonic() - wall0
    busy = None if after is None else busy_cores(before, after, _affinity())
    if busy is None:
        return None
    return max(0.0, busy - (own / wall if wall > 0 else 0.0))


def load_average_busy() -> "float | None":
    """The one-minute load average (the fallback where /proc/stat is absent); None without one."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return None


def default_threads() -> int:
    """``$GMTS_THREADS`` if set, else ``$OMP_NUM_THREADS`` (torchrun sets it to 1 per process), else
    the available cores less those busy now (:func:`busy_cores_now`; where /proc/stat is absent, the
    one-minute load average; without either, none busy), rounded, shared among the processes of this
    node (``$LOCAL_WORLD_SIZE``), between 1 and the available cores (:func:`available_cores`: the
    affinity mask capped by a cgroup CPU quota)."""
    for name in ("GMTS_THREADS", "OMP_NUM_THREADS"):
        env = os.environ.get(name, "").strip()
        if env:
            return check_threads(env, name)
    cores = len(_affinity()) or max(1, os.cpu_count() or 1)
    n = threads_for(cores, busy_cores_now())  # the busy count is of the CPUs in the mask, quota or not
    limit = available_cores()
    if limit < cores:  # a cgroup quota: its CPUs shared among this node's processes, as the idle cores are
        n = min(n, max(1, limit // _local_world_size()))
    return n


def _local_world_size() -> int:
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))


def threads_for(cores: int, busy: "float | None") -> int:
    """Threads for ``cores`` of which ``busy`` are busy (None: ask the load average, else none busy),
    shared among ``$LOCAL_WORLD_SIZE`` processes: the idle cores, rounded, at least 1, at most ``cores``."""
    if busy is None:
        busy = load_average_busy() or 0.0
    return max(1, min(cores, int((cores - busy) / _local_world_size() + 0.5)))


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
