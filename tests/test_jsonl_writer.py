"""One JSON-lines writer (issue 47 part 3): util.atomic.atomic_write_jsonl. The copies that inlined it write the
same bytes through it; the idiom is left only in files whose owners were editing them (listed below: each may
only shrink)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gmts_analysis

#: files that still inline the writer (others were editing them when it was added): switch them, then drop them here
LEFT: set[str] = set()


def test_jsonl_writer_bytes_and_atomicity(tmp_path):
    from gmts_analysis.util.atomic import atomic_write_jsonl

    rows = [{"b": 1, "a": "é"}, {"x": [1.5, None]}]
    p = atomic_write_jsonl(tmp_path / "r.jsonl", rows)
    assert p.read_bytes() == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    atomic_write_jsonl(tmp_path / "e.jsonl", iter([{"d": Path("q")}]), default=str)
    assert (tmp_path / "e.jsonl").read_text() == '{"d": "q"}\n'
    assert atomic_write_jsonl(tmp_path / "empty.jsonl", []).read_text() == ""
    assert sorted(x.name for x in tmp_path.iterdir()) == ["e.jsonl", "empty.jsonl", "r.jsonl"]  # no temp left


def test_callers_write_through_the_one_writer(tmp_path):
    from gmts_analysis.integrations.rollout_log import write_rows

    rows = [{"prompt": "2+2=", "response": "4", "reward": 1.0}]
    assert write_rows(tmp_path / "a.jsonl", rows).read_text(encoding="utf-8") == json.dumps(rows[0]) + "\n"
    pkg = Path(gmts_analysis.__file__).parent
    idiom = re.compile(r"json\.dumps\([^()]*\)\s*\+\s*\"\\n\"\s*for ")
    found = {str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if idiom.search(p.read_text(encoding="utf-8"))}
    assert found <= LEFT | {"util/atomic.py"}, sorted(found - LEFT)
