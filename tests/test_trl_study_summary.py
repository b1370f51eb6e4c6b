"""benchmarks/trl_study_summary.py: the study's audit table reads each series audit's compare.json at every
checkpoint, and its cost table gives each run its training process's CPU seconds and its driver's CPU rises after
that training (the evaluations run in the driver's own process)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import trl_study_summary as S  # noqa: E402


def _series(d: Path, steps: dict[int, dict[str, float]]) -> None:
    (d / "compare").mkdir(parents=True)
    cps = [{"step": s, "run": f"step-{s:05d}", "pass1": 0.25 * i, "method": "exact", "seconds": {"total": 60.0}}
           for i, s in enumerate(steps)]
    (d / "series.json").write_text(json.dumps({"checkpoints": cps}))
    rows = [{"run": f"step-{s:05d}", "statistic": k, "value": v} for s, kv in steps.items() for k, v in kv.items()]
    (d / "compare" / "compare.json").write_text(json.dumps({"rows": rows}))


def test_audit_table_has_a_row_per_checkpoint_with_its_statistics(tmp_path):
    _series(tmp_path / "gmts-s1000", {0: {"within_answer.entropy.median": 0.5},
                                      20: {"within_answer.entropy.median": 0.875, "cross_answer.gmts.spearman": -0.25}})
    (tmp_path / "all-s1000").mkdir()
    (tmp_path / "all-s1000" / "series.json").write_text(json.dumps({"checkpoints": []}))  # unfinished: left out
    lines = S.audit_table(tmp_path).splitlines()
    assert len(lines) == 4 and lines[0].count("|") == len(S.AUDIT_STATS) + 6
    row0, row20 = ([c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:])
    col = {c: i for i, c in enumerate(c.strip() for c in lines[0].strip("|").split("|"))}
    assert row0[:4] == ["gmts-s1000", "0", "0.000", "exact"]
    assert row0[col["within-answer rho(H, ‖∇log p‖)"]] == "0.500" and row0[col["cross-answer rho(GMTS, ‖g‖)"]] == "n/a"
    assert row20[col["within-answer rho(H, ‖∇log p‖)"]] == "0.875"
    assert row20[col["cross-answer rho(GMTS, ‖g‖)"]] == "-0.250"


def test_cost_table_attributes_a_drivers_cpu_to_the_run_it_evaluates(tmp_path):
    runs = tmp_path / "s.runs"
    runs.mkdir()
    for name, (tr, ev) in {"all-s1": (100.0, 40.0), "gmts-s1": (120.0, 60.0)}.items():
        (runs / f"{name}.json").write_text(json.dumps({"timing_s": {"train": tr, "eval": ev}}))
    log = ["1000 7 0 0 driver all-s1,gmts-s1 1", "1000 8 5 0 train /r/all-s1 7",
           "1000 20 3 0 train /r/all-s1 19",                                      # all-s1 again, for an audit
           "1030 7 1 0 driver all-s1,gmts-s1 1", "1030 8 29 0 train /r/all-s1 7",  # all-s1 trains until 1030
           "1030 20 30 0 train /r/all-s1 19",
           "1060 7 41 0 driver all-s1,gmts-s1 1",                                 # its evaluation: 40 CPU-s
           "1060 20 58 0 train /r/all-s1 19",                                     # (not the driver's: no pause)
           "1090 7 42 0 driver all-s1,gmts-s1 1", "1090 9 30 0 train /r/gmts-s1",  # older lines: cpu_parents.json
           "1120 7 42 0 driver all-s1,gmts-s1 1", "1120 9 57 0 train /r/gmts-s1",
           "1120 30 9 0 train /ci/tmp/all-s0 4",                                  # a test's run: no record
           "1150 7 102 0 driver all-s1,gmts-s1 1",                                # its evaluation: 60 CPU-s
           "1150 40 70 0 series /a/gmts-s1 39",
           "an older line without the fields"]
    (tmp_path / "cpu_samples.log").write_text("\n".join(log) + "\n")
    (tmp_path / "cpu_parents.json").write_text(json.dumps({"9": 7}))
    procs = S._cpu_by_process(tmp_path / "cpu_samples.log")
    assert {p["kind"] for p in procs.values()} == {"driver", "train", "series"}
    assert procs[9]["ppid"] == 7 and procs[20]["ppid"] == 19 and procs[30]["run"] == "all-s0"
    assert S._eval_cpu_by_run(procs) == {"all-s1": 40.0, "gmts-s1": 60.0}
    # a later session's driver of one run, resumed after that run's training was done: it only evaluates
    with open(tmp_path / "cpu_samples.log", "a") as f:
        f.write("2000 50 3 0 driver gmts-s1 1\n2030 50 28 0 driver gmts-s1 1\n")
    assert S._eval_cpu_by_run(S._cpu_by_process(tmp_path / "cpu_samples.log")) == {"all-s1": 40.0, "gmts-s1": 85.0}
    (tmp_path / "cpu_samples.log").write_text("\n".join(log) + "\n")
    table = S.cost_table(tmp_path)
    assert "| train (one run) | 110 (min 100, max 120, n=2) | 43 (min 29, max 57, n=2) |" in table
    assert "| eval (one run) | 50 (min 40, max 60, n=2) | 50 (min 40, max 60, n=2) |" in table
    assert "| train again for an audit | n/a | 58 (min 58, max 58, n=1) |" in table
    assert "| series audit (one run's) | n/a | 70 (min 70, max 70, n=1) |" in table
