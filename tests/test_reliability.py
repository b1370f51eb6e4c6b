"""Reliability (issue 13): never delete what is not ours, one job per run directory, validate
before work, finite or nothing, one line for every error, visible control characters."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import torch
from _adversarial import assert_finite_run, assert_one_line_error, assert_untouched, probe, run_cli, snapshot
from _sharding_helpers import write_rollouts

from gmts_analysis.run.sharding import state
from gmts_analysis.util import io as gio


@pytest.fixture(scope="module")
def model_dir(tiny_model_dirs):
    return tiny_model_dirs["qwen2"]


@pytest.fixture
def rollouts(tmp_path):
    return write_rollouts(tmp_path / "r.jsonl", sizes=(2, 3))


# ---------------------------------------------------------------- ownership


def test_overwrite_never_touches_a_directory_that_is_not_a_run(model_dir, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    r = write_rollouts(mine / "r.jsonl", sizes=(2, 2))
    (mine / "thesis.tex").write_text("years of work")
    before = snapshot(tmp_path)
    # the input inside --out: refused before anything
    line = assert_one_line_error(*run_cli(probe(model_dir, r, mine, "--overwrite")), "inside --out")
    assert "--rollouts" in line
    # another input, same directory: its files are not ours, --overwrite or not; never suggested
    r2 = write_rollouts(tmp_path / "r2.jsonl", sizes=(2, 2))
    before = snapshot(tmp_path)
    for extra in ((), ("--overwrite",)):
        line = assert_one_line_error(*run_cli(probe(model_dir, r2, mine, *extra)), "did not write", "thesis.tex")
        assert "--overwrite" not in line
    assert_untouched(before, snapshot(tmp_path))
    # the model directory inside --out is refused too
    assert_one_line_error(*run_cli(probe(model_dir, r2, Path(model_dir).parent, "--overwrite")), "--model",
                          "inside --out")


def test_out_cannot_be_the_working_directory_or_a_parent(model_dir, rollouts, tmp_path, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    before = snapshot(tmp_path)
    for out in (".", "..", str(tmp_path)):
        assert_one_line_error(*run_cli(probe(model_dir, rollouts, out, "--overwrite")), "current directory")
    assert_untouched(before, snapshot(tmp_path))


def test_out_under_a_file_or_unwritable(model_dir, rollouts, tmp_path):
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, rollouts / "out")), "is a file")
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, rollouts)), "not a directory")
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, "/proc/gmts-no-such/out")))
    assert_untouched(before, snapshot(tmp_path))


def test_overwrite_replaces_a_run_of_ours(model_dir, rollouts, tmp_path):
    out = tmp_path / "run"
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0
    rc, err = run_cli(probe(model_dir, rollouts, out, "--temperature", "0.7"))
    assert_one_line_error(rc, err, "different", "--overwrite")  # ours: replacing it is offered
    assert run_cli(probe(model_dir, rollouts, out, "--temperature", "0.7", "--overwrite"))[0] == 0
    assert json.loads((out / "manifest.json").read_text())["config"]["temperature"] == 0.7
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "run"]  # no lock, staging or work left


def test_check_ours_needs_a_marker_and_only_our_names(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "stats.json").write_text("{}")  # a name we write, but no manifest or run.json of ours
    with pytest.raises(gio.GmtsError, match="not a gmts run"):
        gio.check_ours(d)
    (d / "manifest.json").write_text('{"config": {}}')
    gio.check_ours(d)
    (d / ".stats.json.x1.tmp").write_text("")  # our temporaries are ours
    gio.check_ours(d)
    (d / "notes.md").write_text("")
    with pytest.raises(gio.GmtsError, match="notes.md"):
        gio.check_ours(d)


# ---------------------------------------------------------------- lock and recovery


def test_a_second_job_on_the_same_out_stops_at_once_and_changes_nothing(model_dir, rollouts, tmp_path):
    out = tmp_path / "run"
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0
    before = snapshot(tmp_path)
    fd = os.open(gio.lock_path(out), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another job holds it
        os.write(fd, b"pid 4242 on node7")
        for extra in ((), ("--overwrite", "--temperature", "0.5")):
            assert_one_line_error(*run_cli(probe(model_dir, rollouts, out, *extra)), "another gmts job", "pid 4242")
        assert_one_line_error(*run_cli(["merge", str(out), "--quiet"]), "another gmts job")
    finally:
        os.close(fd)
    after = snapshot(tmp_path)
    after.pop(gio.lock_path(out).name)
    assert_untouched(before, after)
    # the lock of a killed job (the file stays, the kernel dropped the flock) does not block
    assert run_cli(probe(model_dir, rollouts, out, "--overwrite", "--temperature", "0.5"))[0] == 0
    assert not gio.lock_path(out).exists()


def test_the_lock_is_reentrant_in_one_process_and_exclusive_across(tmp_path):
    out = tmp_path / "x"
    with gio.exclusive_lock(out) as p, gio.exclusive_lock(out):
        assert p.exists()
        fd = os.open(p, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert not p.exists()


def test_stale_staging_and_stranded_work_area_are_recovered(model_dir, rollouts, tmp_path, monkeypatch):
    ref = tmp_path / "ref"
    assert run_cli(probe(model_dir, rollouts, ref, "--answers-per-chunk", "2"))[0] == 0
    out = tmp_path / "run"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "1")
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, out, "--answers-per-chunk", "2")),
                          "InjectedFailure", "--debug")
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    # killed during finalization: the work area stepped aside, a staging directory half-written,
    # an empty directory put in the run's place
    os.replace(out, state.work_area_sibling(out))
    out.mkdir()
    partial = tmp_path / ".run.k1llEd_0.partial"
    partial.mkdir()
    gio.mark_ours(partial, "staging", out)  # a killed job's staging directory carries our marker
    (partial / "tokens.parquet").write_bytes(b"half")
    lookalike = tmp_path / ".run.l00kAl1k.partial"  # the same name pattern, no marker: someone else's
    lookalike.mkdir()
    (lookalike / "notes.txt").write_text("mine")
    assert run_cli(probe(model_dir, rollouts, out, "--answers-per-chunk", "2"))[0] == 0
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tokens.parquet"), pd.read_parquet(ref / "tokens.parquet"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [".run.l00kAl1k.partial", "r.jsonl", "ref", "run"]
    assert (lookalike / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- validation before work


@pytest.mark.parametrize("flag, value", [
    ("--temperature", "0"), ("--temperature", "nan"), ("--temperature", "-1"), ("--temperature", "inf"),
    ("--clip-low", "-5"), ("--clip-low", "1"), ("--clip-high", "nan"), ("--kl-beta", "-1"),
    ("--max-len", "0"), ("--probes", "0"), ("--probes", "1"), ("--probes", "100000000"), ("--chunk-size", "0"), ("--chunk-size", "x"),
    ("--answers-per-chunk", "0"), ("--max-memory", "0"), ("--seed", "-1"),
    ("--device", "meta"), ("--device", "mps"), ("--device", "cuda:97"), ("--device", "tpu"),
])
def test_options_out_of_domain_are_refused_before_anything(model_dir, rollouts, tmp_path, flag, value):
    if flag == "--device" and value.startswith("cuda") and torch.cuda.device_count() > 97:
        pytest.skip("a machine with 98 GPUs")
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, tmp_path / "run", flag, value)), flag)
    assert_untouched(before, snapshot(tmp_path))


def test_usage_errors_are_one_line(model_dir, rollouts, tmp_path):
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, tmp_path / "o", "--advantage", "median")),
                          "invalid choice")
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, tmp_path / "o", "--temperature", "warm")),
                          "--temperature")
    assert_one_line_error(*run_cli(["probe", "--model", "tiny"]), "required")


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory, tiny_model_dirs):
    """Checkpoints the probe must refuse: encoders, truncated, unknown type, a head missing."""
    from safetensors.torch import load_file, save_file
    from transformers import BertConfig, BertForMaskedLM, BertLMHeadModel, BertModel

    root = tmp_path_factory.mktemp("bad_models")
    cfg = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64)
    torch.manual_seed(0)
    BertForMaskedLM(cfg).save_pretrained(root / "bert_mlm")
    BertModel(cfg).save_pretrained(root / "bert")
    BertLMHeadModel(cfg).save_pretrained(root / "bert_lmhead_not_decoder")  # bidirectional attention
    out = {}
    src = Path(tiny_model_dirs["llama"])  # untied: lm_head.weight is its own tensor
    for name in ("trunc", "unknown_type", "no_head", "no_tok", "empty_tok"):
        d = root / name
        d.mkdir()
        for f in src.iterdir():
            (d / f.name).write_bytes(f.read_bytes())
        out[name] = d
    w = (out["trunc"] / "model.safetensors").read_bytes()
    (out["trunc"] / "model.safetensors").write_bytes(w[: len(w) // 2])
    c = json.loads((out["unknown_type"] / "config.json").read_text())
    c["model_type"] = "no_such_model"
    (out["unknown_type"] / "config.json").write_text(json.dumps(c))
    t = load_file(out["no_head"] / "model.safetensors")
    del t["lm_head.weight"]
    save_file(t, out["no_head"] / "model.safetensors", metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out["no_tok"] / f).unlink(missing_ok=True)
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out["empty_tok"] / f).unlink(missing_ok=True)
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab={}, unk_token=None))).save_pretrained(
        out["empty_tok"])
    out.update({k: root / k for k in ("bert_mlm", "bert", "bert_lmhead_not_decoder")})
    out["a_file"] = src / "config.json"
    return out


@pytest.mark.parametrize("name, needle", [
    ("bert_mlm", "BertForMaskedLM checkpoint, not a causal"),
    ("bert", "BertModel checkpoint, not a causal"),
    ("bert_lmhead_not_decoder", "not a causal"),
    ("trunc", "cannot load"),
    ("unknown_type", "no_such_model"),
    ("no_head", "lm_head.weight"),
    ("a_file", "is a file"),
])
def test_models_that_are_not_complete_causal_lms_are_refused(bad_models, tmp_path, name, needle):
    r = write_rollouts(tmp_path / "r.jsonl", sizes=(2,))
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(probe(bad_models[name], r, tmp_path / "run")), needle)
    assert_untouched(before, snapshot(tmp_path))


@pytest.mark.parametrize("name", ["no_tok", "empty_tok"])
def test_text_needs_a_real_tokenizer_ids_do_not(bad_models, tmp_path, name):
    r = tmp_path / "r.jsonl"
    r.write_text("".join(json.dumps({"prompt": "1+1=", "response": s, "reward": float(s == "2"), "group_id": 0})
                         + "\n" for s in ("2", "3")))
    assert_one_line_error(*run_cli(probe(bad_models[name], r, tmp_path / "run")), "tokenizer")
    assert not (tmp_path / "run").exists()
    ids = write_rollouts(tmp_path / "ids.jsonl", sizes=(2,))
    assert run_cli(probe(bad_models[name], ids, tmp_path / "run2"))[0] == 0


def test_unreadable_tokenizer_files_are_named_not_hidden(tmp_path, caplog):
    """Tokenizer files this transformers cannot read: ids still work, and the cause is logged
    (not a bare 'no tokenizer' later)."""
    import logging
    import shutil

    from gmts_analysis.readers.models import load_model, resolve_model_path

    d = tmp_path / "m"
    shutil.copytree(resolve_model_path("tiny"), d)
    (d / "tokenizer.json").write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.readers.models"):
        _, tok = load_model(str(d), device="cpu")
    assert tok is None
    msgs = [r.getMessage() for r in caplog.records if r.name == "gmts_analysis.readers.models"]
    assert len(msgs) == 1 and "tokenizer files cannot be loaded" in msgs[0] and "JSONDecodeError" in msgs[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.readers.models"):
        _, tok = load_model("tiny", device="cpu")  # a readable tokenizer: no warning
    assert tok is not None and not [r for r in caplog.records if r.name == "gmts_analysis.readers.models"]


# ---------------------------------------------------------------- finite or nothing


def test_a_non_finite_answer_goes_to_errors_jsonl(model_dir, rollouts, tmp_path, monkeypatch):
    from gmts_analysis.probing import kernel

    real = kernel.answer_coefficients

    def poisoned(answers, cfg):
        coefs = real(answers, cfg)
        coefs[1].advantage = float("inf")
        return coefs

    monkeypatch.setattr(kernel, "answer_coefficients", poisoned)
    out = tmp_path / "run"
    rc, err = run_cli(probe(model_dir, rollouts, out))
    assert rc == 0, err
    errors = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert len(errors) == 1 and errors[0]["index"] == 1 and "non-finite advantage" in errors[0]["reason"]
    t = assert_finite_run(out, grad_norm_none=True)
    assert t["answer_id"].nunique() == 4


def test_every_answer_failing_ends_with_one_line_pointing_at_errors(tmp_path, tiny_model_dirs):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "nan_model"
    d.mkdir()
    for f in Path(tiny_model_dirs["llama"]).iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    w = load_file(d / "model.safetensors")
    w["model.norm.weight"][:] = float("nan")
    save_file(w, d / "model.safetensors", metadata={"format": "pt"})
    r = write_rollouts(tmp_path / "r.jsonl", sizes=(2, 2))
    out = tmp_path / "run"
    line = assert_one_line_error(*run_cli(probe(d, r, out)), "every answer failed (4 of 4", "errors.jsonl")
    assert str(out / "errors.jsonl") in line
    assert len((out / "errors.jsonl").read_text().splitlines()) == 4
    assert not (out / "tokens.parquet").exists()


def test_check_finite_names_column_and_token():
    from gmts_analysis.probing.validate import check_finite

    check_finite({"a": [1.0, 2.0], "g": [float("nan")], "s": ["x"]}, "w", allow_nan=("g",))
    with pytest.raises(gio.GmtsError, match=r"w: non-finite a \(inf\) at token 1"):
        check_finite({"a": [1.0, float("inf")]}, "w")
    with pytest.raises(gio.GmtsError, match="non-finite g"):
        check_finite({"g": [float("-inf")]}, "w", allow_nan=("g",))  # NaN allowed, never infinity


# ---------------------------------------------------------------- stats, figures, merge: one line


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, model_dir):
    d = tmp_path_factory.mktemp("fin")
    r = write_rollouts(d / "r.jsonl", sizes=(3, 3))
    assert run_cli(probe(model_dir, r, d / "run"))[0] == 0
    return d / "run"


def _copy_run(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        if f.is_file():
            (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_stats_refuses_a_table_without_a_contract_column(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "run")
    t = pd.read_parquet(run / "tokens.parquet").drop(columns=["entropy"])
    t.to_parquet(run / "tokens.parquet", index=False)
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["stats", str(run), "--quiet"]), "missing contract column", "entropy")
    assert_one_line_error(*run_cli(["figures", str(run), "--quiet"]), "entropy")
    assert_untouched(before, snapshot(tmp_path))


@pytest.mark.parametrize("content", [b"", b"not a parquet file", b"PAR1garbagePAR1"])
def test_stats_and_figures_on_a_malformed_table(finished_run, tmp_path, content):
    run = _copy_run(finished_run, tmp_path / "run")
    (run / "tokens.parquet").write_bytes(content)
    assert_one_line_error(*run_cli(["stats", str(run), "--quiet"]), "tokens.parquet")
    assert_one_line_error(*run_cli(["figures", str(run), "--quiet"]), "tokens.parquet")


def test_stats_on_a_wrongly_typed_column(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "run")
    t = pd.read_parquet(run / "tokens.parquet")
    t["entropy"] = t["entropy"].astype(str)
    t.to_parquet(run / "tokens.parquet", index=False)
    assert_one_line_error(*run_cli(["stats", str(run), "--quiet"]), "'entropy' must be numeric")


def test_merge_of_what_is_not_a_run_is_one_line(finished_run, tmp_path):
    assert_one_line_error(*run_cli(["merge", str(tmp_path / "nope")]), "no such run directory")
    assert_one_line_error(*run_cli(["merge", str(finished_run), "--quiet"]), "already complete")


def test_unexpected_exceptions_are_one_line_with_a_debug_hint(model_dir, rollouts, tmp_path, monkeypatch):
    from gmts_analysis.run.sharding import run as run_mod

    def boom(*a, **k):
        raise ZeroDivisionError("a bug\nover two lines")

    monkeypatch.setattr(run_mod, "load_inputs", boom)
    line = assert_one_line_error(*run_cli(probe(model_dir, rollouts, tmp_path / "run")), "ZeroDivisionError",
                                 "a bug over two lines", "--debug")
    assert "Traceback" not in line
    with pytest.raises(ZeroDivisionError):
        run_cli([*probe(model_dir, rollouts, tmp_path / "run"), "--debug"])
    with pytest.raises(ZeroDivisionError):
        run_cli(["--debug", *probe(model_dir, rollouts, tmp_path / "run")])


# ---------------------------------------------------------------- report


def test_report_shows_control_and_bidi_characters_visibly():
    from gmts_analysis.views.report import _e

    s = _e("ab\u202ecd\u2066e\u200ff\x00g\x1bh\x85i\ud800j\nk\tl<m>")
    for cp in ("202E", "2066", "200F", "0000", "001B", "0085", "D800"):
        assert f"&lt;U+{cp}&gt;" in s
    assert not any(ch in s for ch in "\u202e\u2066\u200f\x00\x1b\x85\ud800")
    assert "\n" in s and "\t" in s and "&lt;m&gt;" in s


def test_outputs_of_stats_compare_and_sample_under_a_file_are_one_line(finished_run, tmp_path):
    f = tmp_path / "a_file"
    f.write_text("x")
    (tmp_path / "rollouts.jsonl").write_text("my own notes\n")
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["stats", str(finished_run), "--out", str(f / "stats.json"), "--quiet"]),
                          "a_file")
    assert_one_line_error(*run_cli(["compare", str(finished_run), "--out", str(f / "cmp"), "--quiet"]), "a_file")
    assert_one_line_error(*run_cli(["sample", "--domains", "arithmetic", "--out", str(f / "r.jsonl"), "--quiet"]),
                          "a_file")
    # a directory is TRL's output_dir: its rollouts.jsonl is the output, and a user's file of that name is kept
    assert_one_line_error(*run_cli(["sample", "--domains", "arithmetic", "--out", str(tmp_path), "--quiet"]),
                          "rollouts.jsonl", "not written by gmts")
    assert_untouched(before, snapshot(tmp_path))


def test_toy_train_overwrite_never_replaces_a_directory_that_is_not_a_policy(tmp_path):
    d = tmp_path / "policy"
    d.mkdir()
    (d / "thesis.tex").write_text("mine")
    line = assert_one_line_error(*run_cli(["toy-train", "--size", "tiny", "--out", str(d), "--overwrite",
                                           "--max-steps", "1", "--quiet"]), "did not write")
    assert "--overwrite" not in line and (d / "thesis.tex").read_text() == "mine"


def test_an_unwritable_location_is_refused_before_anything(model_dir, rollouts, tmp_path, monkeypatch):
    real = os.access
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == ro else real(p, mode))
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, ro / "run")), "not writable")
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, ro / "a" / "b")), "not writable")
    assert_untouched(before, snapshot(tmp_path))


def test_a_run_left_aside_by_a_killed_replacement_is_restored(model_dir, rollouts, tmp_path):
    out = tmp_path / "run"
    assert run_cli(probe(model_dir, rollouts, out))[0] == 0
    before = (out / "tokens.parquet").read_bytes()
    gio.mark_ours(out, "backup", out)  # killed between the two renames of io.swap_in
    os.replace(out, tmp_path / ".run.gmts-old-00c0ffee")
    (tmp_path / ".run.abcd1234.partial").mkdir()
    gio.mark_ours(tmp_path / ".run.abcd1234.partial", "staging", out)
    rc, err = run_cli(probe(model_dir, rollouts, out))
    assert rc == 0 and "already complete" in err, err
    assert (out / "tokens.parquet").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl", "run"]


def test_two_spellings_of_one_directory_share_one_lock(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert gio.lock_path(tmp_path / "link" / "run") == gio.lock_path(tmp_path / "real" / "run")
    assert gio.lock_path(tmp_path / "real" / "run/") == gio.lock_path(tmp_path / "real" / "." / "run")


def test_an_existing_unwritable_run_directory_is_refused_before_anything(model_dir, rollouts, tmp_path, monkeypatch):
    # an empty --out that cannot be written (chattr +i, a read-only mount): refused up front, not after probing
    real = os.access
    out = tmp_path / "run"
    out.mkdir()
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == out else real(p, mode))
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, out)), "not writable", str(out))
    assert list(out.iterdir()) == []


def test_out_as_a_symbolic_link_is_refused_and_the_link_kept(model_dir, rollouts, tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "lk").symlink_to(tmp_path / "real")
    (tmp_path / "dang").symlink_to(tmp_path / "nowhere")
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(probe(model_dir, rollouts, tmp_path / "lk")), "symbolic link")
    for out in (tmp_path / "dang", tmp_path / "dang" / "run"):
        assert_one_line_error(*run_cli(probe(model_dir, rollouts, out)), "symbolic link", "does not exist")
    assert_untouched(before, snapshot(tmp_path))
    assert (tmp_path / "lk").is_symlink() and list((tmp_path / "real").iterdir()) == []


@pytest.mark.parametrize("name,content", [("stats.json", "[1, 2]"), ("manifest.json", "[]"),
                                          ("stats.json", "\udcff"), ("manifest.json", "{\"a\": 1" + "0" * 5000 + "}")])
def test_figures_on_a_run_whose_json_is_not_an_object(finished_run, tmp_path, name, content):
    run = _copy_run(finished_run, tmp_path / "run")
    (run / name).write_bytes(content.encode("utf-8", "surrogateescape"))
    assert_one_line_error(*run_cli(["figures", str(run), "--report", "--quiet"]), name)


@pytest.mark.parametrize("column,value,needle", [("gmts", float("nan"), "non-finite"), ("entropy", float("inf"), "non-finite"),
                                                 ("grad_norm", float("inf"), "infinite")])
def test_stats_and_figures_refuse_non_finite_contract_values(finished_run, tmp_path, column, value, needle):
    run = _copy_run(finished_run, tmp_path / "run")
    t = pd.read_parquet(run / "tokens.parquet")
    t.loc[1, column] = value
    t.to_parquet(run / "tokens.parquet", index=False)
    before = snapshot(tmp_path)
    assert_one_line_error(*run_cli(["stats", str(run), "--quiet"]), column, needle)
    assert_one_line_error(*run_cli(["figures", str(run), "--quiet"]), column)
    assert_untouched(before, snapshot(tmp_path))


def test_stats_and_figures_accept_null_grad_norms(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "run")  # --grad-norm none writes them NaN
    assert pd.read_parquet(run / "tokens.parquet")["grad_norm"].isna().all()
    assert run_cli(["stats", str(run), "--quiet", "--n-boot", "10"])[0] == 0


def test_compare_never_writes_into_a_run_and_figures_refuse_a_bad_max_answers(finished_run, tmp_path):
    run = _copy_run(finished_run, tmp_path / "run")
    before = snapshot(tmp_path)
    for out in (run, run / "cmp"):
        assert_one_line_error(*run_cli(["compare", str(run), "--out", str(out), "--quiet"]), "inside the run")
    assert_one_line_error(*run_cli(["figures", str(run), "--max-answers", "-1", "--quiet"]), "--max-answers")
    assert_untouched(before, snapshot(tmp_path))
