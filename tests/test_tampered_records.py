"""Tampered run records under ``gmts rl-report`` (issue #38), fuzz-like: every field of a run record that the
report reads is set, one at a time, to values of the wrong type and to non-finite numbers, and each gives one
``gmts: error:`` line naming the record's file and the field, exit 2, no traceback, no "unexpected" error,
nothing written. Before #38 a step that was not an object gave "unexpected AttributeError", a share written
as text "unexpected ValueError", and an infinite share was printed as 'inf' in the mechanism table."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from _adversarial import assert_one_line_error, run_cli

from gmts_analysis.rl.arms_records import FIDELITY_FIELDS, STEP_COUNTS, STEP_NUMBERS, STEP_SHARES

REFEREE = Path(__file__).resolve().parent.parent / "data" / "rl" / "referee"
SETTING = "rho0.05_batch"
RECORD = "gmts-s0.json"

#: values no number field takes
NOT_NUMBERS = ("abc", "0.5", [0.5], {"v": 0.5}, True, math.inf, -math.inf, math.nan)
#: values no object field takes
NOT_OBJECTS = ("abc", [1], 0.5, True)


@pytest.fixture(scope="module")
def referee(tmp_path_factory) -> Path:
    """One setting of the committed referee data (plan and its run records)."""
    d = tmp_path_factory.mktemp("ref")
    plan = json.loads((REFEREE / "plan.json").read_text())
    plan["settings"] = [s for s in plan["settings"] if s["name"] == SETTING]
    plan["contrasts"] = [c for c in plan["contrasts"] if c["setting"] == SETTING]
    for k in ("prior_runs", "pool_with"):
        plan.pop(k, None)
    (d / "plan.json").write_text(json.dumps(plan))
    shutil.copytree(REFEREE / f"{SETTING}.runs", d / f"{SETTING}.runs")
    return d


def _diag_index(rec: dict) -> int:
    return max(i for i, s in enumerate(rec["steps"]) if isinstance(s.get("fidelity"), dict))


def _fields(rec: dict) -> list[tuple[tuple, str, tuple]]:
    """``(path into the record, the field as the error names it, bad values)`` of every field the report reads."""
    d = _diag_index(rec)
    step = [((("steps", 3, k)), f"steps[3].{k}", NOT_NUMBERS) for k in STEP_SHARES + STEP_COUNTS + STEP_NUMBERS]
    diag = [(("steps", d, "fidelity", "gmts", k), f"steps[{d}].fidelity.gmts.{k}", NOT_NUMBERS)
            for k in FIDELITY_FIELDS]
    diag += [(("steps", d, "mass_capture", "gmts"), f"steps[{d}].mass_capture.gmts", NOT_NUMBERS),
             (("steps", d, "step"), f"steps[{d}].step", NOT_NUMBERS),
             (("steps", d, "fidelity"), f"steps[{d}].fidelity", NOT_OBJECTS),
             (("steps", d, "fidelity", "gmts"), f"steps[{d}].fidelity.gmts", NOT_OBJECTS),
             (("steps", d, "mass_capture"), f"steps[{d}].mass_capture", NOT_OBJECTS)]
    dom = rec["config"]["domains"][0]
    rest = [(("steps", 3), "steps[3]", NOT_OBJECTS + (None,)),
            (("steps", 3, "skipped"), "steps[3].skipped", ("yes", 1, [True], {"v": 1})),
            (("steps",), "steps", ("abc", {"a": 1}, 3, None)),
            (("final_pass1", dom), f"final_pass1.{dom}", NOT_NUMBERS + (1.5, None)),
            (("final_pass1",), "final_pass1", NOT_OBJECTS),
            (("config", "domains"), "config.domains", ("abc", [1], [], {"a": 1}, True)),
            (("config", "eval_seed"), "config.eval_seed", ("abc", [1], 1.5, True)),
            (("config", "final_eval_prompts"), "config.final_eval_prompts", NOT_NUMBERS + (-1, 2.5)),
            (("config", "eval_prompts"), "config.eval_prompts", NOT_NUMBERS + (-1,)),
            (("config",), "config", NOT_OBJECTS)]
    evals = [(("evals", 1, "step"), "evals[1].step", NOT_NUMBERS + (None, -1, 2.5)),
             (("evals", 1, "pass1", dom), f"evals[1].pass1.{dom}", NOT_NUMBERS + (1.5, -0.5, None)),
             (("evals", 1, "pass1"), "evals[1].pass1", NOT_OBJECTS + (None,)),
             (("evals", 1), "evals[1]", NOT_OBJECTS + (None,)),
             (("evals",), "evals", ("abc", {"a": 1}, 3))]
    return step + diag + rest + evals


def _set(rec: dict, path: tuple, value: Any) -> None:
    obj = rec
    for k in path[:-1]:
        obj = obj[k]
    obj[path[-1]] = value


def _cases() -> list[tuple[tuple, str, Any]]:
    rec = json.loads((REFEREE / f"{SETTING}.runs" / RECORD).read_text())
    return [(path, field, v) for path, field, values in _fields(rec) for v in values]


@pytest.mark.parametrize("path,field,value", _cases(), ids=lambda x: repr(x)[:40])
def test_every_field_rl_report_reads_refuses_a_bad_value_naming_file_and_field(referee, tmp_path, path, field, value):
    rec_path = referee / f"{SETTING}.runs" / RECORD
    original = rec_path.read_text()
    rec = json.loads(original)
    _set(rec, path, value)
    rec_path.write_text(json.dumps(rec))
    try:
        out = tmp_path / "out"
        line = assert_one_line_error(*run_cli(["rl-report", str(referee), "--out", str(out), "-q"]), RECORD)
    finally:
        rec_path.write_text(original)
    assert "unexpected" not in line, line
    assert field in line, (field, line)
    assert not out.exists()


@pytest.mark.parametrize("value,says", [
    ("x", f"{RECORD}: steps[3]: expected an object, got 'x'"),
    ("abc", f"{RECORD}: steps[3].frac_groups_zero_std: expected a finite number, got 'abc'"),
    (math.inf, f"{RECORD}: steps[3].frac_groups_zero_std: expected a finite number, got inf"),
])
def test_the_three_cases_of_the_issue(referee, tmp_path, value, says):
    rec_path = referee / f"{SETTING}.runs" / RECORD
    original = rec_path.read_text()
    rec = json.loads(original)
    if value == "x":
        rec["steps"][3] = value
    else:
        rec["steps"][3]["frac_groups_zero_std"] = value
    rec_path.write_text(json.dumps(rec))
    try:
        assert_one_line_error(*run_cli(["rl-report", str(referee), "--out", str(tmp_path / "out"), "-q"]), says)
    finally:
        rec_path.write_text(original)


def test_null_where_gmts_rl_writes_it_is_read_as_not_logged(referee, tmp_path):
    """``gmts rl`` writes NaN as null (a quantity not logged at a step): accepted, and the untampered data
    gives the committed report's mechanism numbers."""
    rec_path = referee / f"{SETTING}.runs" / RECORD
    original = rec_path.read_text()
    rec = json.loads(original)
    rec["steps"][3].update({k: None for k in STEP_SHARES + STEP_COUNTS + ("skipped",)})
    rec_path.write_text(json.dumps(rec))
    try:
        rc, err = run_cli(["rl-report", str(referee), "--out", str(tmp_path / "out"), "-q"])
    finally:
        rec_path.write_text(original)
    assert rc == 0, err
