"""The training script's guards (examples/trl_grpo_word_problems.py, gmts_analysis.integrations.trl_train):
options checked before anything is loaded or written, a resume from the newest complete checkpoint only, a
finished run left alone, no silent start over a run, pickled resume files that never run code, the training
arguments saved as JSON, and the newcomer's warnings (issue 46 parts 4 and 5).

A tiny random llama (qwen2 for tied embeddings) with the character tokenizer; one thread; the script's ``main``
run in this process (one subprocess checks the exit status and stderr as a shell sees them)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")
pytest.importorskip("math_verify")

from gmts_analysis.integrations import trl_train  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CHAT = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'][-40:] }}\n{% endfor %}"
        "{% if add_generation_prompt %}a:{% endif %}")


def _tiny(path: Path, arch: str = "llama") -> Path:
    from gmts_analysis.toy.testing import save_tiny_model

    d = save_tiny_model(arch, path, seed=0)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHAT
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return d


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("tiny") / "model")


def _argv(out: Path, model: Path, **kw) -> list[str]:
    """The script's command line (no --logging_steps unless given: the script's own default is tested)."""
    base = {"output_dir": str(out), "model_name_or_path": str(model), "train_problems": 16, "eval_problems": 4,
            "per_device_train_batch_size": 4, "num_generations": 2, "max_completion_length": 6,
            "learning_rate": 5e-2, "lr_scheduler_type": "constant", "max_steps": 2, "save_steps": 1,
            "report_to": "none", "use_cpu": "true", "seed": 3, "threads": 1, "token_selection": "gmts",
            "selection_rho": 0.5, "disable_tqdm": "true", "bf16": "false"}
    base.update(kw)
    return [x for k, v in base.items() if v is not None for x in (f"--{k}", str(v))]


class _Marker:
    """A pickle that, unpickled by a plain loader, creates ``path`` (opens it for writing)."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture()
def no_load(monkeypatch):
    """Fails the test if the script gets as far as the model (converted, or loaded by the trainer)."""
    def boom(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(trl_train, "trainable_checkpoint", boom)
    monkeypatch.setattr(trl_train, "build_trainer", boom)


@pytest.fixture(scope="module")
def run2(tiny_dir, tmp_path_factory):
    """The script run in this process to step 2 (a checkpoint per step), every warning recorded."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("guards") / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert trl_train.main(_argv(out, tiny_dir)) == 0
    return out, [str(w.message) for w in caught]


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst


def _one_error_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("trl_grpo_word_problems: error: "), err
    assert "Traceback" not in err
    return lines[0]


# -- 1. options checked before anything is loaded or written

@pytest.mark.parametrize("flag,value", [("token_selection", "gmtss"), ("selection_rho", "0"),
                                        ("selection_rho", "1.5"), ("selection_rho", "nan"),
                                        ("selection_scope", "row"), ("selection_normalizer", "some"),
                                        ("max_completion_length", "0"), ("diagnostics_tokens", "-1"),
                                        ("diagnostics_every", "-1"), ("selection_rho", "abc")])
def test_a_bad_option_is_one_line_before_anything_is_loaded_or_written(flag, value, tiny_dir, tmp_path, capsys,
                                                                       no_load):
    out = tmp_path / "out"
    assert trl_train.main(_argv(out, tiny_dir, **{flag: value})) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert f"--{flag}" in line and value in line
    assert not out.exists()


def test_each_check_is_the_configs_own_and_names_the_flag(tiny_dir, tmp_path, capsys, monkeypatch, no_load):
    """The script checks nothing a second time: SelectiveGRPOConfig and WordProblemArguments refuse a value as they
    are built (their __post_init__, a FieldError naming the field), and the one line names the flag; TRL's own
    checks come in TRL's words. A value the config accepts, the script accepts (--diagnostics_tokens 0: only the
    cheap part of the diagnostics; the script refused it before)."""
    from gmts_analysis.errors import FieldError
    from gmts_analysis.integrations.trl_train import WordProblemArguments
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig

    with pytest.raises(FieldError, match="selection_rho must be in") as e:
        SelectiveGRPOConfig(output_dir=str(tmp_path / "x"), use_cpu=True, bf16=False, selection_rho=0.0)
    assert (e.value.field, e.value.value) == ("selection_rho", 0.0)
    with pytest.raises(FieldError, match="train_problems must be >= 1") as e:
        WordProblemArguments(train_problems=0)
    assert e.value.field == "train_problems"
    out = tmp_path / "out"
    assert trl_train.main(_argv(out, tiny_dir, train_problems=0)) == 2
    assert "--train_problems 0" in _one_error_line(capsys.readouterr().err)
    assert trl_train.main(_argv(out, tiny_dir, num_generations=3)) == 2  # TRL's own check, in its words
    assert "must be divisible by num_generations (3)" in _one_error_line(capsys.readouterr().err)
    assert not out.exists()
    _, args = trl_train.parse_arguments(_argv(out, tiny_dir, diagnostics_tokens=0))
    assert args.diagnostics_tokens == 0


def test_a_bad_option_from_the_shell_exits_2_without_a_traceback(tiny_dir, tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_grpo_word_problems.py"),
                        *_argv(out, tiny_dir, selection_rho=1.5)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2
    assert "--selection_rho 1.5" in _one_error_line(r.stderr) and not out.exists()


# -- 7. the newcomer's obstacles: per-step metrics, the deprecation warnings, the tied-weights message

def test_every_step_is_logged_unless_logging_steps_is_given(run2, tmp_path, tiny_dir):
    out, _ = run2
    hist = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert [h["step"] for h in hist if "reward" in h] == [1, 2]  # TRL's default (10) logs none of a 2-step run
    assert trl_train.parse_arguments(_argv(tmp_path / "o", tiny_dir))[1].logging_steps == 1
    assert trl_train.parse_arguments(_argv(tmp_path / "o", tiny_dir, logging_steps=5))[1].logging_steps == 5
    (tmp_path / "c.yaml").write_text("logging_steps: 3\n")
    a = trl_train.parse_arguments(["--config", str(tmp_path / "c.yaml"), *_argv(tmp_path / "o", tiny_dir)])
    assert a[1].logging_steps == 3


def test_no_gradient_checkpointing_deprecation_warning(run2):
    _, caught = run2
    assert not [m for m in caught if "gradient_checkpointing" in m], caught
    with warnings.catch_warnings(record=True) as other:  # only those: another FutureWarning still shows
        warnings.simplefilter("always")
        trl_train.quiet_known_warnings()
        warnings.warn("`gradient_checkpointing` is deprecated and will be removed in v6. Use x", FutureWarning, stacklevel=1)
        warnings.warn("`other_thing` is deprecated and will be removed in v6.", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in other] == ["`other_thing` is deprecated and will be removed in v6."]


def test_resuming_tied_embeddings_says_nothing_of_missing_keys(tmp_path):
    torch.set_num_threads(1)
    model = _tiny(tmp_path / "tied", "qwen2")  # tied embeddings, as SmolLM2
    out = tmp_path / "run"
    assert trl_train.main(_argv(out, model, max_steps=1)) == 0
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    h = Keep()
    logging.getLogger("transformers.trainer").addHandler(h)
    try:
        a, t = trl_train.parse_arguments(_argv(out, model, max_steps=2))
        tr = trl_train.train(a, t)
    finally:
        logging.getLogger("transformers.trainer").removeHandler(h)
    assert tr.state.global_step == 2
    assert not [m for m in seen if "missing keys" in m], seen
    m = tr.model
    assert m.lm_head.weight is m.model.embed_tokens.weight  # restored through the tie
    # any other missing key still reaches the log
    f = trl_train._TiedKeysFilter(m)
    rec = logging.LogRecord("transformers.trainer", logging.WARNING, "", 0,
                            "There were missing keys in the checkpoint model loaded: %s.", (["lm_head.weight"],), None)
    assert not f.filter(rec)
    rec.args = (["model.norm.weight"],)
    assert f.filter(rec)
    rec.args = (["lm_head.weight", "model.embed_tokens.weight"],)  # both twins missing: nothing restored them
    assert f.filter(rec)


# -- 6. the training arguments as JSON

def test_training_arguments_are_saved_as_sorted_json(run2):
    out, _ = run2
    text = (out / trl_train.TRAINING_ARGS_FILE).read_text()
    j = json.loads(text)
    assert list(j) == sorted(j)
    assert j["selection_rho"] == 0.5 and j["token_selection"] == "gmts" and j["max_steps"] == 2
    assert j["logging_steps"] == 1 and j["output_dir"] == str(out) and j["loss_type"] == "dapo"
    assert not list(out.glob(".*.tmp"))


def test_the_file_the_script_writes_is_the_one_series_reads(run2):
    """One name, one format: the script's gmts_training_args.json (flat to_dict()) is what readers.trl_output
    reads before any training_args.bin, for the output dir and for each of its checkpoints."""
    from gmts_analysis.readers import trl_output

    out, _ = run2
    assert trl_train.TRAINING_ARGS_FILE is trl_output.TRAINING_ARGS_JSON
    j = json.loads((out / trl_output.TRAINING_ARGS_JSON).read_text())
    for where in (out, out / "checkpoint-1"):
        a = trl_output.training_args(where)
        assert a.selection_rho == j["selection_rho"] == 0.5 and a.max_steps == 2 and a.loss_type == "dapo"


def test_the_layout_is_defined_once_in_readers():
    """The checkpoint regex, the weight files, the resume files and the training-arguments file name are stated
    in readers/trl_output.py alone (issue 47: one home of a training output dir's layout); the training script
    uses them."""
    import gmts_analysis
    from gmts_analysis.readers import trl_output

    pkg = Path(gmts_analysis.__file__).parent
    for needle in ('"gmts_training_args.json"', "checkpoint-(", '"model.safetensors", "model.safetensors.index.json"',
                   '"scheduler.pt"'):
        found = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if needle in p.read_text(encoding="utf-8"))
        assert found == ["readers/trl_output.py"], (needle, found)
    assert trl_train.WEIGHT_FILES is trl_output.WEIGHT_FILES and trl_train.RESUME_FILES is trl_output.RESUME_FILES
    assert trl_train.checkpoint_dirs is trl_output.checkpoint_dirs
    assert not hasattr(trl_train, "_step_dirs") and not hasattr(trl_train, "_has_model")


# -- 3. a finished run

def test_a_finished_run_says_so_and_trains_nothing(run2, tiny_dir, tmp_path, caplog, no_load):
    out = _copy(run2[0], tmp_path)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    with caplog.at_level(logging.INFO, logger="gmts_analysis"):
        assert trl_train.main(_argv(out, tiny_dir)) == 0
    assert "finished at step 2 of 2; nothing to do" in caplog.text
    assert not [h for h in logging.getLogger("gmts_analysis").handlers if isinstance(h, trl_train._Stderr)]
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before
    # pruned of its resume state (prune_finished_run), still finished, not refused
    trl_train.prune_finished_run(out)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gmts_analysis"):
        assert trl_train.main(_argv(out, tiny_dir)) == 0
    assert "finished at step 2 of 2" in caplog.text and not (out / "checkpoint-3").exists()


# -- 2. resume from the newest complete checkpoint

def test_an_incomplete_newer_checkpoint_is_skipped_with_a_warning(run2, tiny_dir, tmp_path, caplog):
    out = _copy(run2[0], tmp_path)
    c3 = out / "checkpoint-3"
    shutil.copytree(out / "checkpoint-2", c3)
    (c3 / "model.safetensors").unlink()  # a newer checkpoint without its model
    with caplog.at_level(logging.INFO, logger="gmts_analysis"):
        assert trl_train.main(_argv(out, tiny_dir, max_steps=3)) == 0
    assert f"skipping {c3} lacks its model" in caplog.text and "resuming from" in caplog.text
    assert json.loads((c3 / "trainer_state.json").read_text())["global_step"] == 3
    assert (c3 / "model.safetensors").is_file()


def _fake_checkpoint(d: Path, step: int, files=("config.json", "model.safetensors", "trainer_state.json",
                                                 "optimizer.pt", "scheduler.pt")) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        (d / f).write_text(json.dumps({"global_step": step, "max_steps": 4}) if f == "trainer_state.json" else "x")
    return d


def test_where_a_run_starts_is_read_from_the_folder_alone(tmp_path, monkeypatch):
    from gmts_analysis.errors import GmtsError

    out = tmp_path / "out"
    assert trl_train.plan_resume(out, 4) == trl_train.ResumePlan()  # nothing: step 0
    c1 = _fake_checkpoint(out / "checkpoint-1", 1)
    _fake_checkpoint(out / "checkpoint-2", 2, files=("config.json", "trainer_state.json"))  # no weights, no optimizer
    plan = trl_train.plan_resume(out, 4)
    assert plan.checkpoint == c1 and plan.finished is None
    assert plan.skipped == [f"{out / 'checkpoint-2'} lacks its model (config.json and weights), optimizer.pt, "
                            "scheduler.pt"]
    assert trl_train.plan_resume(out, 1).finished == (1, 1)
    assert trl_train.plan_resume(out, -1).finished is None  # by epochs: the recorded max_steps, 4
    (c1 / "trainer_state.json").write_text("{")
    with pytest.raises(GmtsError, match="checkpoint-1/trainer_state.json: not a readable trainer state"):
        trl_train.plan_resume(out, 4)
    (out / "checkpoint-01").mkdir()
    with pytest.raises(GmtsError, match="checkpoint-01 and checkpoint-1 are both step 1"):
        trl_train.plan_resume(out, 4)
    shutil.rmtree(out / "checkpoint-01")
    # a checkpoint without scheduler.pt cannot resume: transformers then loads neither optimizer nor scheduler
    (c1 / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 4}))
    (c1 / "scheduler.pt").unlink()
    from gmts_analysis.readers.trl_output import is_resumable, newest_resumable

    assert not is_resumable(c1) and newest_resumable(out)[0] is None
    with pytest.raises(GmtsError, match="none can resume"):
        trl_train.plan_resume(out, 4)
    # the final model saved at the top (save_model, save_state): finished unless more steps are asked for
    top = _fake_checkpoint(tmp_path / "final", 3, files=("config.json", "model.safetensors", "trainer_state.json"))
    _fake_checkpoint(top / "checkpoint-3", 3)
    assert trl_train.plan_resume(top, 3).finished == (3, 3)
    assert trl_train.plan_resume(top, 5).checkpoint == top / "checkpoint-3"
    (top / "trainer_state.json").unlink()
    shutil.rmtree(top / "checkpoint-3")
    assert trl_train.plan_resume(top, 5).finished == (None, 5)
    monkeypatch.chdir(top)  # --restart never moves the folder it runs in
    with pytest.raises(GmtsError, match="cannot move aside the folder this command runs in"):
        trl_train.move_run_aside(".")
    assert top.is_dir()


# -- 4. resume state gone: refused, then --restart

@pytest.mark.parametrize("how", ["pruned", "newest deleted"])
def test_no_resume_state_is_refused_and_restart_starts_over(how, run2, tiny_dir, tmp_path, capsys, caplog):
    out = _copy(run2[0], tmp_path)
    if how == "pruned":
        trl_train.prune_finished_run(out)
    else:
        shutil.rmtree(out / "checkpoint-2")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert trl_train.main(_argv(out, tiny_dir, max_steps=3)) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "none can resume" in line and "--restart" in line
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # nothing rewritten
    with caplog.at_level(logging.INFO, logger="gmts_analysis"):
        assert trl_train.main(_argv(out, tiny_dir, max_steps=2, restart="true")) == 0
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("run.replaced-")]
    assert len(aside) == 1 and str(aside[0]) in caplog.text
    assert {p.relative_to(aside[0]) for p in aside[0].rglob("*")} == {p.relative_to(out) for p in before}
    # a clean start: the same steps as the run never touched
    from safetensors.torch import load_file

    a, b = load_file(str(run2[0] / "checkpoint-2" / "model.safetensors")), load_file(
        str(out / "checkpoint-2" / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- 5. pickled resume files never run code

@pytest.mark.parametrize("name,fmt", [("optimizer.pt", "torch"), ("scheduler.pt", "torch"),
                                      ("rng_state.pth", "torch"), ("optimizer.pt", "pickle")])
def test_a_crafted_resume_file_is_refused_in_one_line_and_never_runs(name, fmt, run2, tiny_dir, tmp_path, capsys,
                                                                       no_load):
    import pickle

    out = _copy(run2[0], tmp_path)
    live = tmp_path / "live"
    f = out / "checkpoint-2" / name
    if fmt == "torch":
        torch.save(_Marker(live), f)
    else:
        f.write_bytes(pickle.dumps(_Marker(live)))
    if fmt == "torch":  # the planted file is live: a plain load runs it
        torch.load(f, weights_only=False)
    else:
        pickle.loads(f.read_bytes())
    assert live.exists()
    live.unlink()
    assert trl_train.main(_argv(out, tiny_dir, max_steps=3)) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(f) in line and "refused" in line and "nothing in it ran" in line
    assert not live.exists()


def test_a_crafted_resume_file_from_the_shell_is_one_line(run2, tiny_dir, tmp_path):
    import pickle

    out = _copy(run2[0], tmp_path)
    live = tmp_path / "live"
    f = out / "checkpoint-2" / "rng_state.pth"
    f.write_bytes(pickle.dumps(_Marker(live)))  # a plain pickle (torch warns of its protocol: not shown)
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "trl_grpo_word_problems.py"),
                        *_argv(out, tiny_dir, max_steps=3)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2 and str(f) in _one_error_line(r.stderr) and not live.exists()


def test_a_crafted_training_args_bin_is_never_read(run2, tiny_dir, tmp_path):
    out = _copy(run2[0], tmp_path)
    live = tmp_path / "live"
    torch.save(_Marker(live), out / "checkpoint-2" / "training_args.bin")
    assert trl_train.main(_argv(out, tiny_dir, max_steps=3)) == 0  # resuming never reads it
    assert not live.exists()
    assert json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
