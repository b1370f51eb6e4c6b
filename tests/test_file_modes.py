"""Output files and directories honour the umask (a run is shared with colleagues)."""

from __future__ import annotations

import os
import stat

import pandas as pd
import pytest

from gmts_analysis.util import io


@pytest.fixture
def umask():
    def set_(m: int) -> None:
        os.umask(m)

    old = os.umask(0o022)
    try:
        yield set_
    finally:
        os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("mask, fmode, dmode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775), (0o077, 0o600, 0o700)])
def test_atomic_files_and_staged_directories_follow_umask(tmp_path, umask, mask, fmode, dmode):
    umask(mask)
    assert io._umask() == mask
    t = io.atomic_write_text(tmp_path / "a.txt", "x")
    j = io.atomic_write_json(tmp_path / "b.json", {"a": 1})
    p = io.atomic_write_parquet(tmp_path / "c.parquet", pd.DataFrame({"a": [1, 2]}))
    assert [_mode(x) for x in (t, j, p)] == [fmode] * 3
    out = tmp_path / "run"
    with io.staged_directory(out) as d:
        io.atomic_write_text(d / "manifest.json", '{"config": {}}')
    assert _mode(out) == dmode
    assert _mode(out / "manifest.json") == fmode
