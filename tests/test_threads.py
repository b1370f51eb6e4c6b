"""The default thread count follows what is busy now (issue #38): /proc/stat readings faked, no timing."""

from __future__ import annotations

import pytest

from gmts_analysis.util import threads
from gmts_analysis.util.threads import busy_cores, busy_cores_now, default_threads, parse_cpu_ticks, threads_for


def _stat(*cpus: "tuple[int, int]") -> str:
    """A /proc/stat text whose CPUs have these (busy, idle) ticks (busy split over user, nice, system)."""
    total_busy = sum(b for b, _ in cpus)
    total_idle = sum(i for _, i in cpus)
    lines = [f"cpu  {total_busy} 0 0 {total_idle} 0 0 0 0 0 0"]
    for n, (b, i) in enumerate(cpus):
        lines.append(f"cpu{n} {b // 2} {b - b // 2 - b // 4} {b // 4} {i} 0 0 0 0 0 0")
    return "\n".join(lines + ["intr 1 2 3", "procs_running 3", "procs_blocked 0", ""])


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("GMTS_THREADS", "OMP_NUM_THREADS", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_affinity", lambda: frozenset({0, 1}))
    monkeypatch.setattr("time.process_time", lambda: 0.0)  # our own CPU time: none
    monkeypatch.setattr(threads, "CGROUP_ROOT", "/nonexistent-cgroup-root")  # no quota unless a test fakes one


def _fake_proc(monkeypatch, tmp_path, first: str, second: str) -> None:
    """/proc/stat reads ``first`` before the sample and ``second`` after it (the sleep swaps them)."""
    path = tmp_path / "stat"
    path.write_text(first)
    monkeypatch.setattr(threads, "PROC_STAT", str(path))
    real = threads.busy_cores_now

    def now(seconds: float = 0.15, p: str = str(path), sleep=None) -> "float | None":
        path.write_text(first)
        return real(seconds, p, sleep=lambda s: path.write_text(second))

    monkeypatch.setattr(threads, "busy_cores_now", now)


def test_parse_cpu_ticks_reads_each_cpu():
    ticks = parse_cpu_ticks("cpu  9 9 9 9 9 0 0 0 0 0\ncpu0 10 5 5 70 10 0 0 0 0 0\ncpu1 1 2 3 4\ncpux 1 2 3\n"
                            "cpu2 a b c d\nprocs_running 2\n")
    assert ticks == {0: (20, 100), 1: (6, 10)}  # iowait counts as idle; the aggregate and bad lines skipped


def test_busy_cores_sums_fractions_over_the_affinity_mask():
    before = {0: (100, 1000), 1: (100, 1000), 2: (0, 1000)}
    after = {0: (200, 1100), 1: (150, 1100), 2: (100, 1100)}
    assert busy_cores(before, after, {0, 1}) == pytest.approx(1.5)
    assert busy_cores(before, after) == pytest.approx(2.5)
    assert busy_cores(before, after, {7}) == pytest.approx(2.5)  # a mask /proc/stat does not list: every CPU
    assert busy_cores(before, before, {0, 1}) is None  # no tick between the readings


def test_idle_right_after_a_load_gets_every_core(monkeypatch, tmp_path, clean_env):
    """The case the load average gets wrong: the load average still says 2 busy, the cores are idle."""
    monkeypatch.setattr("os.getloadavg", lambda: (2.0, 1.2, 0.6))
    _fake_proc(monkeypatch, tmp_path, _stat((5000, 100), (5000, 100)), _stat((5000, 115), (5001, 114)))
    assert default_threads() == 2


def test_busy_cores_get_one_thread(monkeypatch, tmp_path, clean_env):
    """Two busy cores now (niced work too): one thread, never zero, whatever the load average says."""
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
    _fake_proc(monkeypatch, tmp_path, _stat((100, 100), (100, 100)), _stat((115, 100), (114, 101)))
    assert default_threads() == 1


def test_one_core_busy_of_four(monkeypatch, tmp_path, clean_env):
    monkeypatch.setattr(threads, "_affinity", lambda: frozenset({0, 1, 2, 3}))
    idle = (0, 100)
    _fake_proc(monkeypatch, tmp_path, _stat(idle, idle, idle, idle),
               _stat((15, 100), (0, 115), (0, 115), (0, 115)))
    assert default_threads() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun processes share the three idle cores
    assert default_threads() == 2


def test_only_the_affinity_mask_counts(monkeypatch, tmp_path, clean_env):
    """Other CPUs busy, ours idle: every one of ours."""
    _fake_proc(monkeypatch, tmp_path, _stat((0, 100), (0, 100), (0, 100)),
               _stat((0, 115), (0, 115), (15, 100)))
    assert default_threads() == 2


def test_own_cpu_time_is_not_other_work(monkeypatch, tmp_path, clean_env):
    """This process's own CPU time during the sample is subtracted (a spinning pool of ours is not load)."""
    path = tmp_path / "stat"
    path.write_text(_stat((0, 100), (0, 100)))
    clock = iter([0.0, 10.0])
    own = iter([0.0, 9.0])  # our process used 0.9 of a core over the 10 s
    monkeypatch.setattr("time.monotonic", lambda: next(clock))
    monkeypatch.setattr("time.process_time", lambda: next(own))
    busy = busy_cores_now(10.0, str(path), sleep=lambda s: path.write_text(_stat((90, 110), (0, 1100))))
    assert busy == pytest.approx(0.0)


def test_no_proc_stat_falls_back_to_the_load_average_then_every_core(monkeypatch, tmp_path, clean_env):
    missing = str(tmp_path / "absent")
    assert busy_cores_now(0.0, missing) is None
    monkeypatch.setattr(threads, "PROC_STAT", missing)
    monkeypatch.setattr(threads, "busy_cores_now", lambda: busy_cores_now(0.0, missing))
    monkeypatch.setattr("os.getloadavg", lambda: (1.0, 0.0, 0.0))
    assert default_threads() == 1
    monkeypatch.setattr(threads, "_affinity", lambda: frozenset({0, 1, 2, 3}))
    assert default_threads() == 3

    def no_load() -> None:
        raise OSError("no load average")

    monkeypatch.setattr("os.getloadavg", no_load)
    assert default_threads() == 4
    assert threads_for(4, 4.0) == 1 and threads_for(4, 0.4) == 4 and threads_for(2, 1.6) == 1


def test_an_explicit_setting_skips_the_sample(monkeypatch, clean_env):
    monkeypatch.setattr(threads, "busy_cores_now", lambda: pytest.fail("sampled despite GMTS_THREADS"))
    monkeypatch.setenv("GMTS_THREADS", "3")
    assert default_threads() == 3


def _cgroup(tmp_path, files: "dict[str, str]", own: str = "0::/\n"):
    """A fake cgroup root holding ``files`` (path relative to the root: text) and a /proc/self/cgroup text."""
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    root.mkdir(exist_ok=True)
    (tmp_path / "self_cgroup").write_text(own)
    return str(root), str(tmp_path / "self_cgroup")


@pytest.mark.parametrize("files, own, want", [
    ({"cpu.max": "150000 100000\n"}, "0::/\n", 1.5),  # v2 at the root (a container's own cgroup)
    ({"cpu.max": "max 100000\n"}, "0::/\n", None),  # v2, no limit
    ({"cpu.max": "max 100000\n", "job/cpu.max": "200000 100000\n"}, "0::/job\n", 2.0),  # v2, own cgroup
    ({"cpu/cpu.cfs_quota_us": "300000\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n", 3.0),  # v1
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, "1:cpu:/\n", None),  # v1, none
    ({"cpu,cpuacct/a/cpu.cfs_quota_us": "50000\n", "cpu,cpuacct/a/cpu.cfs_period_us": "100000\n"},
     "2:cpu,cpuacct:/a\n", 0.5),  # v1, joint controller, own cgroup
    ({}, "", None),  # no cgroup files at all
    ({"cpu.max": "garbage\n"}, "0::/\n", None),
])
def test_cgroup_cpu_quota_read_from_v1_and_v2(tmp_path, files, own, want):
    root, self_cgroup = _cgroup(tmp_path, files, own)
    assert threads.cgroup_cpu_quota(root, self_cgroup) == (pytest.approx(want) if want is not None else None)


def test_default_threads_capped_by_the_cgroup_quota(monkeypatch, tmp_path, clean_env):
    """Issue 46: a container limited to 2 CPUs of a 16-core host whose cores are idle ran 16 threads."""
    monkeypatch.setattr(threads, "_affinity", lambda: frozenset(range(16)))
    idle = (0, 100)
    _fake_proc(monkeypatch, tmp_path, _stat(*[idle] * 16), _stat(*[(0, 115)] * 16))
    assert default_threads() == 16  # no cgroup quota here (the fake root below is not yet in place)
    root, self_cgroup = _cgroup(tmp_path, {"cpu.max": "200000 100000\n"})
    monkeypatch.setattr(threads, "CGROUP_ROOT", root)
    monkeypatch.setattr(threads, "PROC_SELF_CGROUP", self_cgroup)
    assert threads.available_cores() == 2
    assert default_threads() == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # two torchrun processes share the quota
    assert default_threads() == 1
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    (tmp_path / "cgroup" / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs: rounded up
    assert default_threads() == 2
    (tmp_path / "cgroup" / "cpu.max").write_text("20000 100000\n")  # a fifth of a CPU: still one thread
    assert default_threads() == 1
