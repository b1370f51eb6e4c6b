"""The checkpoint-series audit's typed parts (issue 47 part 3): ``series.json`` read and written as a typed record
(the committed series read back and written again give the same text), ``gmts series``' settings declared once (its
flags generated from the dataclass the job takes), the trained loss passed by name, and one series service for
``gmts probe --model A,B`` and ``gmts series``. No model is loaded here."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

from gmts_analysis.errors import GmtsError

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = [ROOT / "data" / "trl_pilot_series" / "series.json",
             *sorted((ROOT / "data" / "trl_study" / "audit").glob("*/series.json"))]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.parent.name)
def test_committed_series_read_back_and_written_again_unchanged(path, tmp_path):
    """An older series.json (no loss_source, loss_defaulted, n_unscorable) reads as typed attributes, and written
    again by the one writer it has the same keys, in the same order, with the same values: the same text."""
    from gmts_analysis.run.series_types import CheckpointEntry, SeriesRecord, TrainedLoss

    rec = SeriesRecord.read(path)
    assert isinstance(rec.loss, TrainedLoss) and rec.loss.temperature == 0.7 and rec.loss.loss_type == "dapo"
    assert all(isinstance(c, CheckpointEntry) for c in rec.checkpoints) and len(rec.checkpoints) >= 2
    assert [c.run for c in rec.checkpoints] == [f"step-{c.step:05d}" for c in rec.checkpoints]
    assert not rec.has("loss_source") and not rec.checkpoints[0].has("n_unscorable")  # absent, not invented
    rec.write(tmp_path)
    assert (tmp_path / "series.json").read_text(encoding="utf-8") == path.read_text(encoding="utf-8")
    assert list(json.loads((tmp_path / "series.json").read_text())) == list(json.loads(path.read_text()))


def test_series_record_keeps_unknown_keys_and_names_the_file_on_bad_input(tmp_path):
    from gmts_analysis.run.series_types import SeriesRecord

    p = tmp_path / "series.json"
    p.write_text(json.dumps({"output_dir": "r", "checkpoints": [{"step": 0, "later_key": 1}], "newer": {"a": 1}}))
    rec = SeriesRecord.read(p)
    assert rec.checkpoints[0].extra == {"later_key": 1} and rec.to_dict() == json.loads(p.read_text())
    p.write_text(json.dumps({"checkpoints": {"step": 0}}))
    with pytest.raises(GmtsError) as e:
        SeriesRecord.read(p)
    assert str(e.value).startswith(f"{p} field checkpoints: expected a list") and "\n" not in str(e.value)
    p.write_text(json.dumps({"checkpoints": [3]}))
    with pytest.raises(GmtsError, match=r"field checkpoints\[0\]: expected an object"):
        SeriesRecord.read(p)


def test_pass1_keys_are_the_checkpoint_entry_keys():
    """Every key pass@1 gives (refused and cautioned alike) is a key of a checkpoint's entry, in the order it gives
    them: a key added to pass_at_1 must be typed here too (CheckpointEntry.make refuses an unknown one)."""
    from gmts_analysis.run.heldout import pass_at_1
    from gmts_analysis.run.series_types import PASS1_KEYS, CheckpointEntry

    rows = [{"group_id": g, "reward": float(a), "response": "\\boxed{1}", "verifier": "math_boxed"}
            for g in range(3) for a in range(2)]
    for rs in (rows, [{**r, "unscorable": True} for r in rows]):
        keys = list(pass_at_1(rs))
        assert keys == [k for k in PASS1_KEYS if k in keys]
        entry = CheckpointEntry.make(step=0, **pass_at_1(rs))
        assert list(entry.to_dict()) == ["step", *keys]
    with pytest.raises(TypeError, match="no key"):
        CheckpointEntry.make(step=0, not_a_key=1)


def test_series_flags_are_generated_from_the_settings_the_job_takes(monkeypatch, tmp_path):
    """gmts series' flags are SeriesSettings' fields (and RunControl's threads and quiet), declared once; the job
    receives them typed, defaults included; batch_size is no flag."""
    import gmts_analysis.run.trl_series as trl_series
    from gmts_analysis.cli import build_parser, main
    from gmts_analysis.options.config import RunControl
    from gmts_analysis.options.parser import parser_fields
    from gmts_analysis.run.series_types import SeriesSettings

    root = build_parser()
    sub = next(a for a in root._actions if a.__class__.__name__ == "_SubParsersAction")
    fields = parser_fields(sub.choices["series"])
    declared = [f.name for f in dataclasses.fields(SeriesSettings) if f.metadata.get("cli") is not False]
    assert sorted(set(fields) - {"debug"}) == sorted(declared + ["threads", "quiet"]) and "batch_size" not in fields
    for name in declared:
        assert fields[name] is next(f for f in dataclasses.fields(SeriesSettings) if f.name == name)

    seen = {}

    def fake(output_dir, s, rc):
        seen.update(output_dir=output_dir, s=s, rc=rc)
        return Path(s.out)

    monkeypatch.setattr(trl_series, "audit_series", fake)
    assert main(["series", "RUN", "--out", str(tmp_path / "o"), "--no-figures", "--steps", "0,2", "--threads", "1",
                 "--temperature", "0.5", "-q"]) == 0
    s, rc = seen["s"], seen["rc"]
    assert seen["output_dir"] == "RUN" and isinstance(s, SeriesSettings) and isinstance(rc, RunControl)
    assert s == SeriesSettings(out=str(tmp_path / "o"), figures=False, steps="0,2", temperature=0.5)
    assert rc.threads == 1 and rc.quiet is True
    assert main(["series", "RUN", "--threads", "1", "-q"]) == 0  # no --out: a new folder under runs/
    assert seen["s"].out.startswith("runs/series-") and seen["s"].figures is True


def test_every_trained_loss_field_reaches_the_probe():
    """The trained loss is passed to each checkpoint's probe by name: every TrainedLoss field is a probe option
    and arrives with its value (no dict spread in)."""
    from gmts_analysis.options.config import ProbeOptions, RunControl
    from gmts_analysis.run.series_types import SeriesSettings, TrainedLoss
    from gmts_analysis.run.trl_series import _CheckpointProbe

    loss = TrainedLoss.make(loss_type="dr_grpo", clip_low=0.1, clip_high=0.28, kl_beta=0.04, kl_bias_correction="off",
                            importance_sampling_level="sequence", temperature=0.7, max_completion_length=12)
    assert set(TrainedLoss.KEYS) <= {f.name for f in dataclasses.fields(ProbeOptions)}
    s = SeriesSettings(out="o", probes=8, seed=3, overwrite=True, truncate=True, fidelity="off")
    cfg = _CheckpointProbe(s, RunControl(threads=2, quiet=True), loss, 10, "ck").config(Path("r.jsonl"), Path("d"),
                                                                                         "sketch")
    assert {k: getattr(cfg, k) for k in TrainedLoss.KEYS} == loss.to_dict()
    assert (cfg.model, cfg.rollouts, cfg.out, cfg.grad_norm, cfg.probes, cfg.seed, cfg.threads, cfg.quiet,
            cfg.figures, cfg.overwrite, cfg.truncate, cfg.fidelity) == ("ck", "r.jsonl", "d", "sketch", 8, 3, 2, True,
                                                                        False, True, True, "off")


def test_one_series_service_records_each_step_then_compares(monkeypatch, tmp_path):
    """run_series: each step in order, the record after each (a killed series keeps what it finished), the
    comparison of the steps' run folders at the end, only from compare_from steps and on rank 0."""
    import gmts_analysis.run.series as series
    from gmts_analysis.run.series import SeriesStep, run_series

    compared = []
    monkeypatch.setattr(series, "compare_runs", lambda dirs: list(dirs))
    monkeypatch.setattr(series, "write_comparison", lambda cmp, out, figures: compared.append((cmp, out, figures)))
    steps = [SeriesStep(0, "base", "step-00000"), SeriesStep(5, "ck5", "step-00005")]
    recorded = []
    got = run_series(steps, tmp_path, lambda i, st: (i, st.checkpoint), record=lambda done: recorded.append(list(done)),
                     figures=False)
    assert got == [(0, "base"), (1, "ck5")] and recorded == [[(0, "base")], [(0, "base"), (1, "ck5")]]
    assert compared == [([tmp_path / "step-00000", tmp_path / "step-00005"], tmp_path / "compare", False)]
    compared.clear()
    run_series(steps[:1], tmp_path, lambda i, st: None, compare_from=2)
    monkeypatch.setenv("RANK", "1")
    run_series(steps, tmp_path, lambda i, st: None)
    assert compared == []


def test_probe_over_a_checkpoint_list_goes_through_the_service(monkeypatch, tmp_path):
    """gmts probe --model A,B: one probe per checkpoint through probe_checkpoint (step from its name, the base at 0),
    each into its own folder, then the comparison."""
    import gmts_analysis.run.series as series
    from gmts_analysis.options.config import ProbeConfig

    probed, compared = [], []
    monkeypatch.setattr(series, "run_probe", lambda cfg, extra: probed.append((cfg.model, cfg.out, extra)))
    monkeypatch.setattr(series, "compare_runs", lambda dirs: list(dirs))
    monkeypatch.setattr(series, "write_comparison", lambda cmp, out, figures: compared.append(cmp))
    cfg = ProbeConfig(model="x", rollouts="r.jsonl", out=str(tmp_path))
    assert series.probe_series(cfg, ["/m/base", "/m/checkpoint-20", "/n/checkpoint-20"]) == tmp_path / "compare"
    assert probed == [("/m/base", str(tmp_path / "base"), {"checkpoint": "/m/base", "step": 0}),
                      ("/m/checkpoint-20", str(tmp_path / "001_checkpoint-20"),
                       {"checkpoint": "/m/checkpoint-20", "step": 20}),
                      ("/n/checkpoint-20", str(tmp_path / "002_checkpoint-20"),
                       {"checkpoint": "/n/checkpoint-20", "step": 20})]
    assert compared == [[tmp_path / "base", tmp_path / "001_checkpoint-20", tmp_path / "002_checkpoint-20"]]


SERIES_FILES = ["run/series.py", "run/trl_series.py", "run/series_types.py", "run/series_dir.py", "run/heldout.py",
                "commands/series.py"]
SETTINGS_NAMES = {"cfg", "opts", "config", "settings", "s", "args", "rc", "control", "job", "ser"}


@pytest.mark.parametrize("rel", SERIES_FILES)
def test_series_files_read_settings_by_name(rel):
    """No getattr with a default on anything, and no settings parameter typed Any or left untyped, in the series
    files."""
    tree = ast.parse((ROOT / "gmts_analysis" / rel).read_text(encoding="utf-8"))
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" \
                and len(node.args) == 3:
            bad.append(f"line {node.lineno}: getattr with a default")
        if isinstance(node, (ast.FunctionDef, ast.Lambda)) and isinstance(node, ast.FunctionDef):
            for a in node.args.args + node.args.kwonlyargs:
                if a.arg in SETTINGS_NAMES and (a.annotation is None or ast.unparse(a.annotation) == "Any"):
                    bad.append(f"line {node.lineno}: {node.name}({a.arg}) untyped or Any")
    assert not bad, f"{rel}: " + "; ".join(bad)
