"""A training run's folder is untrusted input (issue 46): nothing in it runs code (a planted pickle in every file
that could be unpickled never writes its marker), ``gmts series`` owns its ``--out`` as every writer does, and
nothing is silently wrong (unscorable answers counted, defaulted loss said, few prompts cautioned).

The run folder is made by hand as TRL leaves it (tiny random llama checkpoints, ``training_args.bin`` saved by
``torch.save`` as transformers' Trainer saves it), so the tests need no training; one thread."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from _adversarial import assert_one_line_error, run_cli

from gmts_analysis.errors import GmtsError

pytest.importorskip("trl")

FAST = ["--num-prompts", "2", "--num-generations", "2", "--token-answers", "0", "--max-completion-length", "3",
        "--grad-norm", "exact", "--threads", "1", "--no-figures", "--fidelity", "off"]


class Plant:
    """A pickle that writes a marker file when unpickled (the attack)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _grpo(out: Path, **kw):
    from trl import GRPOConfig

    return GRPOConfig(output_dir=str(out), report_to="none", use_cpu=True, max_completion_length=3, **kw)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A TRL output directory as TRL and the example script leave it: base model recorded, two checkpoints with
    weights, trainer state, training_args.bin and resume state, held-out problems."""
    from gmts_analysis.toy.testing import save_tiny_model

    root = tmp_path_factory.mktemp("trlrun")
    base = save_tiny_model("llama", root / "base", seed=0)
    run = root / "run"
    run.mkdir()
    for step in (1, 2):
        c = save_tiny_model("llama", run / f"checkpoint-{step}", seed=step)
        torch.save(_grpo(run), c / "training_args.bin")
        (c / "trainer_state.json").write_text(json.dumps({"global_step": step, "log_history": []}))
    (run / "gmts_script_args.json").write_text(json.dumps({"model_path": str(base)}))
    (run / "problems_heldout.jsonl").write_text("".join(
        json.dumps({"prompt": f"{a}+{a}=", "solution": str(2 * a)}) + "\n" for a in (1, 2, 3)))
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def test_real_training_args_read_without_unpickling(run_dir, tmp_path):
    """A real TRL-saved training_args.bin of each arguments class reads back its fields; no class is built."""
    from transformers import TrainingArguments

    from gmts_analysis.core.trl_args import TrlLossArgs
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig
    from gmts_analysis.readers.saved_args import read_training_args_bin
    from gmts_analysis.readers.trl_output import defaulted_loss_fields, probe_loss_options, training_args

    a = training_args(run_dir / "checkpoint-2")
    assert a.saved_class == "trl.trainer.grpo_config.GRPOConfig" and a.loss_type == "dapo"
    assert a.max_completion_length == 3 and a.lr_scheduler_type == "linear" and not defaulted_loss_fields(TrlLossArgs.of(a))
    assert probe_loss_options(TrlLossArgs.of(a))["max_completion_length"] == 3
    for cls, kw in ((SelectiveGRPOConfig, {"token_selection": "gmts", "selection_rho": 0.5}), (TrainingArguments, {})):
        torch.save(cls(output_dir=str(tmp_path), report_to="none", use_cpu=True, **kw), tmp_path / "a.bin")
        b = read_training_args_bin(tmp_path / "a.bin")
        assert b.saved_class.endswith(cls.__name__) and b.output_dir == str(tmp_path)
    assert b.saved_class.endswith("TrainingArguments") and "loss_type" in defaulted_loss_fields(TrlLossArgs.of(b))
    torch.save(SelectiveGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, token_selection="gmts",
                                   selection_rho=0.5), tmp_path / "a.bin")
    assert read_training_args_bin(tmp_path / "a.bin").selection_rho == 0.5
    assert not defaulted_loss_fields(TrlLossArgs.of(read_training_args_bin(tmp_path / "a.bin")))  # a GRPO configuration
    # a run trained before the drop-in moved to integrations/trl/ saved its config under the old module name
    old = SelectiveGRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, selection_rho=0.25)
    module = SelectiveGRPOConfig.__module__
    try:
        SelectiveGRPOConfig.__module__ = "gmts_analysis.integrations.trl_trainer"
        torch.save(old, tmp_path / "old.bin")
    finally:
        SelectiveGRPOConfig.__module__ = module
    b = read_training_args_bin(tmp_path / "old.bin")
    assert b.saved_class == "gmts_analysis.integrations.trl_trainer.SelectiveGRPOConfig" and b.selection_rho == 0.25
    # the rarer fields a real run may set: FSDP options, debug options, a dtype object, a device
    a = _grpo(tmp_path, fsdp="full_shard", debug="underflow_overflow", model_init_kwargs={"dtype": torch.bfloat16})
    torch.save(a, tmp_path / "a.bin")
    b = read_training_args_bin(tmp_path / "a.bin")
    assert b.fsdp == a.fsdp and b.debug == [getattr(x, "value", x) for x in a.debug] == ["underflow_overflow"]
    assert b.model_init_kwargs == {"dtype": "torch.bfloat16"}


@pytest.mark.parametrize("how", ["reduce", "inside", "plain_pickle", "tensor"])
def test_planted_training_args_never_run(run_dir, tmp_path, how):
    """Each crafted training_args.bin is refused in one line naming the file; its marker never appears."""
    from gmts_analysis.readers.trl_output import training_args

    run = _copy(run_dir, tmp_path)
    marker = tmp_path / "MARKER"
    f = run / "checkpoint-2" / "training_args.bin"
    if how == "reduce":
        torch.save(Plant(marker), f)
    elif how == "inside":  # the attack hidden in a field of a real GRPOConfig
        a = _grpo(run)
        a.run_name = Plant(marker)
        torch.save(a, f)
    elif how == "plain_pickle":
        import pickle

        f.write_bytes(pickle.dumps(Plant(marker)))
    else:
        torch.save({"x": torch.zeros(2)}, f)
    with pytest.raises(GmtsError, match="training_args.bin") as e:
        training_args(run / "checkpoint-2")
    assert "\n" not in str(e.value) and not marker.exists()
    rc, err = run_cli(["series", str(run), "--out", str(tmp_path / "audit"), *FAST])
    assert_one_line_error(rc, err, "training_args.bin")
    assert not marker.exists() and not (tmp_path / "audit" / "series.json").exists()


def test_json_training_args_are_read_first(run_dir, tmp_path):
    """gmts_training_args.json (the example script's) is read before training_args.bin, which is then not
    opened at all (a planted one never runs)."""
    from gmts_analysis.readers.trl_output import training_args

    run = _copy(run_dir, tmp_path)
    marker = tmp_path / "MARKER"
    torch.save(Plant(marker), run / "checkpoint-2" / "training_args.bin")
    (run / "gmts_training_args.json").write_text(json.dumps(_grpo(run, loss_type="dr_grpo").to_dict()))
    a = training_args(run / "checkpoint-2")
    assert a.loss_type == "dr_grpo" and a.saved_class is None and not marker.exists()


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth", "pytorch_model.bin"])
def test_planted_checkpoint_files_never_run(run_dir, tmp_path, name):
    """Resume state files are never read by the audit; a weights .bin is read by transformers with
    weights_only=True (a crafted one is refused in one line). The marker never appears."""
    run = _copy(run_dir, tmp_path)
    marker = tmp_path / "MARKER"
    c = run / "checkpoint-1"
    torch.save(Plant(marker), c / name)
    if name == "pytorch_model.bin":
        (c / "model.safetensors").unlink()
    (run / "rollouts").mkdir()
    (run / "rollouts" / "rollouts_rank0_00002.jsonl").write_text("".join(json.dumps(
        {"prompt_ids": [1, 5, 6], "response_ids": [7, 8], "reward": float(i), "group_id": "0", "answer_id": f"a{i}"})
        + "\n" for i in range(2)))
    rc, err = run_cli(["series", str(run), "--out", str(tmp_path / "audit"), "--steps", "1", *FAST])
    assert "Traceback" not in err and not marker.exists(), err[-2000:]
    if name == "pytorch_model.bin":
        assert_one_line_error(rc, err, "checkpoint-1")
    else:
        assert rc == 0, err[-2000:]
    # gmts probe --rollouts OUTPUT_DIR on the same folder, its training_args.bin planted too
    torch.save(Plant(marker), run / "checkpoint-2" / "training_args.bin")
    rc, err = run_cli(["probe", "--model", str(run / "checkpoint-2"), "--rollouts", str(run), "--out",
                       str(tmp_path / "p"), "--threads", "1", "-q", "--no-figures", "--fidelity", "off"])
    assert rc == 0 and not marker.exists(), err[-2000:]
    rc, err = run_cli(["probe", "--model", str(c), "--rollouts", str(run), "--out", str(tmp_path / "p1"),
                       "--threads", "1", "-q", "--no-figures", "--fidelity", "off"])
    assert "Traceback" not in err and not marker.exists(), err[-2000:]
    assert rc == 0 or name == "pytorch_model.bin"


@pytest.mark.parametrize("where", ["run", "checkpoint", "rollouts", "link", "foreign", "foreign_series"])
def test_series_refuses_an_out_that_is_not_its_own(run_dir, tmp_path, where):
    """--out inside the run (directly or through a link) or a folder of someone else's: one line, nothing
    written there, the user's files intact."""
    run = _copy(run_dir, tmp_path)
    (run / "rollouts").mkdir()
    (run / "rollouts" / "rollouts_rank0_00001.jsonl").write_text("{}\n")
    out = {"run": run / "audit", "checkpoint": run / "checkpoint-1" / "audit", "rollouts": run / "rollouts" / "a",
           "link": tmp_path / "link" / "audit", "foreign": tmp_path / "mine", "foreign_series": tmp_path / "mine"}[where]
    if where == "link":
        (tmp_path / "link").symlink_to(run)
    if where == "foreign":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    if where == "foreign_series":  # names a series writes, but not written by gmts
        (out / "samples").mkdir(parents=True)
        (out / "series.json").write_text('{"mine": 1}')
        (out / "samples" / "step-00000.jsonl").write_text("mine\n")
    before = sorted(str(p) for p in run.rglob("*"))
    rc, err = run_cli(["series", str(run), "--out", str(out), *FAST])
    line = assert_one_line_error(rc, err, f"--out {out}")
    assert "choose" in line
    assert sorted(str(p) for p in run.rglob("*")) == before
    if where.startswith("foreign"):
        assert (out / ("notes.txt" if where == "foreign" else "series.json")).read_text() in ("mine", '{"mine": 1}')
        assert where == "foreign" or (out / "samples" / "step-00000.jsonl").read_text() == "mine\n"


def test_duplicate_steps_and_cispo_name_their_folder(run_dir, tmp_path):
    run = _copy(run_dir, tmp_path)
    shutil.copytree(run / "checkpoint-2", run / "checkpoint-02")
    rc, err = run_cli(["series", str(run), "--out", str(tmp_path / "a"), *FAST])
    assert_one_line_error(rc, err, "checkpoint-02 and checkpoint-2 are both step 2")
    shutil.rmtree(run / "checkpoint-02")
    torch.save(_grpo(tmp_path / "elsewhere", loss_type="cispo"), run / "checkpoint-2" / "training_args.bin")
    rc, err = run_cli(["series", str(run), "--out", str(tmp_path / "a"), *FAST])
    line = assert_one_line_error(rc, err, str(run / "checkpoint-2" / "training_args.bin"), "cispo")
    assert "elsewhere" not in line
    assert not (tmp_path / "a").exists()


def test_series_records_what_it_could_not_know_and_resumes(run_dir, tmp_path, caplog):
    """Unscorable answers counted (pass@1 refused, not 0.0), a plain TrainingArguments' defaulted loss said and
    recorded, few prompts cautioned, the cost said first; no empty folders; the same command resumes (nothing
    sampled again) and --overwrite is a fix that exists."""
    import logging

    from transformers import TrainingArguments

    run = _copy(run_dir, tmp_path)
    (run / "problems_heldout.jsonl").write_text("".join(
        json.dumps({"prompt": f"{a}+{a}=", "solution": [a]}) + "\n" for a in (1, 2)))  # a solution of the wrong type
    for st in (1, 2):
        torch.save(TrainingArguments(output_dir=str(run), report_to="none", use_cpu=True),
                   run / f"checkpoint-{st}" / "training_args.bin")
    out = tmp_path / "audit"
    argv = ["series", str(run), "--out", str(out), "--steps", "0,2", *FAST]
    with caplog.at_level(logging.INFO):
        rc, err = run_cli(argv)
    assert rc == 0, err[-3000:]
    text = caplog.text + err
    assert "estimated cost: 2 checkpoints" in text and "--max-completion-length" in text
    assert text.index("estimated cost") < text.index("step-00000")
    assert "not a GRPO configuration" in text and "loss_type" in text
    rec = json.loads((out / "series.json").read_text())
    assert "loss_type" in rec["loss_defaulted"] and rec["loss_source"].endswith("training_args.bin")
    for c in rec["checkpoints"]:
        assert c["n_unscorable"] == 4 and c["pass1"] is None and c["ci_low"] is None
        assert "could be scored" in c["pass1_refused"] and c["caution"].startswith("too small: 2 prompts")
    assert not (out / "batches").exists() and not (out / "exact_subset").exists()
    assert not [d for d in out.rglob("*") if d.is_dir() and not any(d.iterdir())]
    stamps = {p: p.stat().st_mtime_ns for p in (out / "samples").iterdir()}
    rc, err = run_cli(argv)
    assert rc == 0 and {p: p.stat().st_mtime_ns for p in (out / "samples").iterdir()} == stamps
    (out / ".gmts-owner").unlink()  # a series made before folders were marked: its series.json proves it ours
    (out / ".step-00000.gmts-lock").write_text("")  # left by a killed run: gmts's own, not a foreign file
    rc, err = run_cli(argv)
    assert rc == 0 and (out / ".gmts-owner").is_file(), err[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (out / "samples").iterdir()} == stamps
    rc, err = run_cli(argv[:-len(FAST)] + ["--seed", "1"] + FAST)  # another sampling: the sub-run's message
    assert_one_line_error(rc, err, "--overwrite")
    rc, err = run_cli(argv + ["--seed", "1", "--overwrite"])
    assert rc == 0, err[-3000:]
    # a checkpoint replaced in place: its probe refuses (--overwrite named), and --overwrite samples it again
    from gmts_analysis.toy.testing import save_tiny_model

    shutil.rmtree(run / "checkpoint-2")
    save_tiny_model("llama", run / "checkpoint-2", seed=7)
    torch.save(TrainingArguments(output_dir=str(run), report_to="none", use_cpu=True),
               run / "checkpoint-2" / "training_args.bin")
    rc, err = run_cli(argv + ["--seed", "1"])
    assert_one_line_error(rc, err, "step-00002", "--overwrite")
    before = (out / "samples" / "step-00002.jsonl").stat().st_mtime_ns
    rc, err = run_cli(argv + ["--seed", "1", "--overwrite"])
    assert rc == 0 and (out / "samples" / "step-00002.jsonl").stat().st_mtime_ns != before, err[-3000:]


def test_pass1_counts_unscorable_and_keeps_its_value_otherwise():
    from gmts_analysis.run.heldout import MIN_PASS1_PROMPTS, pass_at_1

    rows = [{"group_id": f"g{i // 2}", "reward": float(i % 3 == 0)} for i in range(60)]
    a = pass_at_1(rows)
    assert a["n_unscorable"] == 0 and "caution" not in a and a["n_prompts"] == 30 >= MIN_PASS1_PROMPTS
    assert a["pass1"] == pytest.approx(sum(r["reward"] for r in rows) / 60)
    rows[0]["unscorable"] = True
    rows[0]["reward"] = 0.0
    b = pass_at_1(rows)
    assert b["n_unscorable"] == 1 and b["pass1"] == pytest.approx(sum(r["reward"] for r in rows[1:]) / 59)


def test_pass1_figure_says_too_small_and_skips_unscored_steps():
    from gmts_analysis.run.heldout import pass_at_1
    from gmts_analysis.views.token_moves import fig_pass1

    rows = [{"group_id": f"g{i // 2}", "reward": float(i % 2)} for i in range(6)]
    ok = {"step": 0, **pass_at_1(rows)}
    none = {"step": 5, **pass_at_1([{**r, "unscorable": True} for r in rows])}
    fig = fig_pass1([ok, none])
    ax = fig.axes[0]
    assert "too small: 3 prompts" in ax.get_title() and list(ax.get_xticks()) == [0, 5]


def test_truncate_is_a_fix_that_exists(tmp_path):
    """Answers longer than the model's context: the message's fix (--truncate) is an option of gmts series."""
    from gmts_analysis.toy.testing import save_tiny_model

    run = tmp_path / "run"
    c = save_tiny_model("llama", run / "checkpoint-1", seed=1, max_len=12)
    torch.save(_grpo(run), c / "training_args.bin")
    (run / "problems_heldout.jsonl").write_text(json.dumps({"prompt": "1+1=", "solution": "2"}) + "\n")
    argv = ["series", str(run), "--out", str(tmp_path / "a"), *FAST, "--max-completion-length", "12"]
    rc, err = run_cli(argv)
    assert_one_line_error(rc, err, "longer than the model's context", "pass --truncate")
    rc, err = run_cli(argv + ["--truncate"])
    assert rc == 0, err[-3000:]


def _tamper(run: Path, how: str) -> str:
    """Tamper a copy of the run folder; returns what the one-line refusal must name."""
    ta = run / "checkpoint-2" / "training_args.bin"
    if how == "args_fifo":
        ta.unlink()
        os.mkfifo(ta)
        return "training_args.bin"
    if how == "args_link_to_device":
        ta.unlink()
        ta.symlink_to("/dev/zero")
        return "training_args.bin"
    if how == "args_zip_bomb":
        import zipfile

        ta.unlink()
        with zipfile.ZipFile(ta, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr("archive/data.pkl", b"\0" * (8 << 20))
        return "too large"
    if how == "args_truncated":
        ta.write_bytes(ta.read_bytes()[:200])
        return "training_args.bin"
    if how == "args_json_not_object":
        (run / "gmts_training_args.json").write_text("[1, 2]")
        return "gmts_training_args.json"
    if how == "args_json_broken":
        (run / "gmts_training_args.json").write_text("{loss_type")
        return "gmts_training_args.json"
    if how == "script_args_broken":
        (run / "gmts_script_args.json").write_text("not json")
        return "gmts_script_args.json"
    if how == "base_missing":
        (run / "gmts_script_args.json").write_text(json.dumps({"model_path": str(run / "nope")}))
        return "nope"
    if how == "weights_missing":
        (run / "checkpoint-1" / "model.safetensors").unlink()
        return "checkpoint-1"
    if how == "config_broken":
        (run / "checkpoint-1" / "config.json").write_text("{")
        return "checkpoint-1"
    if how == "heldout_broken":
        (run / "problems_heldout.jsonl").write_text("{no\n")
        return "problems_heldout.jsonl"
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["args_fifo", "args_link_to_device", "args_zip_bomb", "args_truncated",
                                 "args_json_not_object", "args_json_broken", "script_args_broken", "base_missing",
                                 "weights_missing", "config_broken", "heldout_broken"])
def test_tampered_run_folder_is_refused_in_one_line(run_dir, tmp_path, how):
    run = _copy(run_dir, tmp_path)
    needle = _tamper(run, how)
    rc, err = run_cli(["series", str(run), "--out", str(tmp_path / "audit"), *FAST])
    assert_one_line_error(rc, err, needle)
    assert not (tmp_path / "audit" / "series.json").exists()


def test_layout_checkpoints_by_step_completeness_and_resume(run_dir, tmp_path):
    """readers/trl_output.py, the one home of the layout: checkpoints by step, duplicates named, the newest
    resumable checkpoint with the newer incomplete ones it passed over."""
    from gmts_analysis.readers import trl_output as t

    run = _copy(run_dir, tmp_path)
    assert [s for s, _ in t.checkpoint_dirs(run)] == [1, 2] and t.CHECKPOINT_RE.match("checkpoint-7")
    assert t.newest_resumable(run) == (None, [run / "checkpoint-2", run / "checkpoint-1"])  # no optimizer.pt
    (run / "checkpoint-1" / "optimizer.pt").write_bytes(b"x")
    assert t.missing_for_resume(run / "checkpoint-1") == ["scheduler.pt"]  # transformers would skip the optimizer
    (run / "checkpoint-1" / "scheduler.pt").write_bytes(b"x")
    (run / "checkpoint-3").mkdir()  # cut short: no config.json
    assert t.newest_resumable(run) == (run / "checkpoint-1", [run / "checkpoint-3", run / "checkpoint-2"])
    assert [s for s, _ in t.checkpoint_dirs(run)] == [1, 2] and len(t.checkpoint_dirs(run, complete=False)) == 3
    shutil.copytree(run / "checkpoint-1", run / "checkpoint-001")
    with pytest.raises(GmtsError, match="checkpoint-001 and checkpoint-1 are both step 1"):
        t.checkpoint_dirs(run)
    # which file holds the trained loss: the run's JSON arguments first, else the checkpoint's own .bin
    assert t.training_args_file(run / "checkpoint-2") == run / "checkpoint-2" / "training_args.bin"
    (run / "gmts_training_args.json").write_text("{}")
    assert t.training_args_file(run / "checkpoint-2") == t.training_args_file(run) == run / "gmts_training_args.json"


def test_a_crafted_pickle_cannot_hide_what_the_reader_says(tmp_path):
    """A field named like the reader's own attributes is dropped (it cannot pose as another class)."""
    from transformers import TrainingArguments

    from gmts_analysis.readers.saved_args import read_training_args_bin

    a = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    a.__dict__["saved_class"] = "trl.trainer.grpo_config.GRPOConfig"
    a.__dict__["fields"] = 1
    torch.save(a, tmp_path / "training_args.bin")
    b = read_training_args_bin(tmp_path / "training_args.bin")
    assert b.saved_class == "transformers.training_args.TrainingArguments" and callable(b.fields)


def test_base_is_recorded_as_the_user_named_it_and_old_series_keep_theirs(run_dir, tmp_path):
    """The example script records the shipped name it was given (smollm2, tiny, small) beside the path it resolved
    to on the training machine: the series uses the name (no machine path in its manifests); a series made with
    the path goes on with it (it resumes)."""
    from gmts_analysis.readers.trl_output import read_trl_output
    from gmts_analysis.run.trl_series import _keep_recorded_base

    run = _copy(run_dir, tmp_path)
    (run / "gmts_script_args.json").write_text(json.dumps({"model_name_or_path": "tiny",
                                                           "model_path": "/elsewhere/policies/tiny"}))
    t = read_trl_output(run)
    assert t.checkpoints[0] == (0, "tiny") and "model_name_or_path" in t.base_source
    out = tmp_path / "audit"
    out.mkdir()
    (out / "series.json").write_text(json.dumps({"checkpoints": [{"step": 0, "checkpoint": "/elsewhere/policies/tiny"}]}))
    _keep_recorded_base(str(out), None, t)
    assert t.checkpoints[0] == (0, "/elsewhere/policies/tiny")
    (run / "gmts_script_args.json").write_text(json.dumps({"model_name_or_path": "./my-model", "model_path": "/abs/m"}))
    assert read_trl_output(run).checkpoints[0] == (0, "/abs/m")


def test_planted_parquet_extension_type_never_runs(run_dir, tmp_path):
    """A parquet rollouts file whose field claims arrow.py_extension_type with a pickle as its metadata
    (CVE-2023-47248): pyarrow >= 14.0.1 never unpickles it; gmts probe reads the column as text."""
    import pickle

    import pyarrow as pa
    import pyarrow.parquet as pq

    marker = tmp_path / "MARKER"
    evil = pa.field("completion", pa.string(), metadata={b"ARROW:extension:name": b"arrow.py_extension_type",
                                                       b"ARROW:extension:metadata": pickle.dumps(Plant(marker))})
    schema = pa.schema([pa.field("step", pa.int64()), pa.field("prompt", pa.string()), evil,
                        pa.field("acc", pa.float64())])
    pq.write_table(pa.table({"step": [1, 1], "prompt": ["1+1=", "1+1="], "completion": ["2", "3"], "acc": [1.0, 0.0]},
                            schema=schema), tmp_path / "completions_00001.parquet")
    rc, err = run_cli(["probe", "--model", str(run_dir / "checkpoint-1"), "--rollouts",
                       str(tmp_path / "completions_00001.parquet"), "--out", str(tmp_path / "p"), "--threads", "1",
                       "-q", "--no-figures", "--fidelity", "off"])
    assert "Traceback" not in err and not marker.exists(), err[-2000:]
    assert rc == 0, err[-2000:]


def test_a_broken_logged_batch_is_refused_in_one_line(run_dir, tmp_path):
    """--own-batches reads the run's logged rollouts (untrusted): a line that is not a JSON object is one error
    naming the file and the line (it was a JSONDecodeError traceback)."""
    run = _copy(run_dir, tmp_path)
    (run / "rollouts").mkdir()
    (run / "rollouts" / "rollouts_rank0_00001.jsonl").write_text('{"prompt_ids": [1]}\n{no\n')
    rc, err = run_cli(["series", str(run), "--out", str(tmp_path / "audit"), "--steps", "0", *FAST, "--own-batches"])
    assert_one_line_error(rc, err, "rollouts_rank0_00001.jsonl", "line 2")


def test_a_fifo_named_series_json_is_refused_not_waited_on(tmp_path):
    """An --out holding a FIFO named series.json (no owner marker): refused as not a series of gmts, at once (the
    check read it with read_text and waited for a writer forever)."""
    import threading

    from gmts_analysis.run.series_dir import check_series_out

    out = tmp_path / "audit"
    out.mkdir()
    os.mkfifo(out / "series.json")
    got: dict = {}

    def check():
        try:
            check_series_out(out, {})
        except GmtsError as e:
            got["error"] = str(e)

    t = threading.Thread(target=check, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "check_series_out waited on the FIFO"
    assert "is not a gmts series" in got["error"] and "\n" not in got["error"]
