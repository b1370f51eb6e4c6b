"""Scale-out of the probe in one process: shares, chunked runs, resume, refusal, faults, merge."""

from __future__ import annotations

import itertools
import json
import random

import numpy as np
import pandas as pd
import pytest
import torch
from _sharding_helpers import assert_same_rows, probe_args, tokens, write_rollouts

from gmts_analysis.cli import main
from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.probing import kernel as probe_mod
from gmts_analysis.probing.settings import KernelSettings
from gmts_analysis.readers.models import load_model
from gmts_analysis.readers.rollouts import Answer, read_rollouts
from gmts_analysis.run import finalize as finalize_mod
from gmts_analysis.run.sharding import merge as merge_mod
from gmts_analysis.run.sharding import shard_answers
from gmts_analysis.run.sharding.shard import answer_cost
from gmts_analysis.run.sharding.worker import InjectedFailure

FAST = ("--grad-norm", "none")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dirs):
    return tiny_model_dirs["qwen2"]


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """An uninterrupted single-process run (chunks of 3 answers) of the 7-group rollouts
    (``--grad-norm none`` to keep these tests fast; the exact engine is covered below and in
    test_sharding_torchrun.py)."""
    d = tmp_path_factory.mktemp("ref")
    r = write_rollouts(d / "r.jsonl")
    out = d / "run"
    assert main(probe_args(model_dir, r, out, *FAST, "--answers-per-chunk", "3")) == 0
    return r, out


# ---------------------------------------------------------------- shares

def _answers(sizes, seed=0):
    rnd = random.Random(seed)
    out = []
    for g, n in enumerate(sizes):
        p = [1] * rnd.randrange(1, 30)
        for j in range(n):
            out.append(Answer(answer_id=f"{g}-{j}", group_id=f"g{g}", prompt_ids=p,
                              response_ids=[5] * rnd.randrange(0, 200), reward=0.0))
    rnd.shuffle(out)  # groups interleaved in the input
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_shares_keep_groups_whole_cover_once_and_balance(world):
    answers = _answers([rnd_n for rnd_n in (3, 1, 7, 2, 5, 8, 2, 4, 6, 1, 3, 9)], seed=world)
    shares = shard_answers(answers, world)
    assert len(shares) == world
    flat = [i for s in shares for i in s]
    assert sorted(flat) == list(range(len(answers)))  # each answer exactly once
    for s in shares:
        assert s == sorted(s)  # input order inside a share
    rank_of = {i: r for r, s in enumerate(shares) for i in s}
    by_group: dict = {}
    for i, a in enumerate(answers):
        by_group.setdefault(a.group_id, set()).add(rank_of[i])
    assert all(len(r) == 1 for r in by_group.values())  # whole groups
    loads = [sum(answer_cost(answers[i]) for i in s) for s in shares]
    group_cost = {g: sum(answer_cost(a) for a in answers if a.group_id == g) for g in by_group}
    # greedy bound: the heaviest rank exceeds the mean by at most one group
    assert max(loads) <= sum(loads) / world + max(group_cost.values())
    assert shard_answers(answers, world) == shares  # deterministic


def test_more_ranks_than_groups_gives_empty_shares():
    answers = _answers([2, 3])
    shares = shard_answers(answers, 4)
    assert sorted(len(s) > 0 for s in shares) == [False, False, True, True]


# ---------------------------------------------------------------- one process, chunked

def test_chunked_run_equals_probe_rollouts(model_dir, reference, tmp_path):
    r, _ = reference
    out = tmp_path / "run"
    # exact gradient norms, per layer too
    assert main(probe_args(model_dir, r, out, "--answers-per-chunk", "3", "--grad-groups", "layer")) == 0
    cfg = ProbeConfig(model=str(model_dir), rollouts=str(r), out=None, device="cpu", quiet=True, grad_groups="layer")
    model, tok = load_model(cfg.model, "cpu")
    answers = read_rollouts(r, tok)
    res = probe_mod.probe_answers(model, tok, answers, KernelSettings.of(cfg))
    res.tokens.to_parquet(tmp_path / "t.parquet", index=False)
    res.answers.to_parquet(tmp_path / "a.parquet", index=False)
    res.grad_groups.to_parquet(tmp_path / "g.parquet", index=False)
    assert_same_rows(tokens(out), pd.read_parquet(tmp_path / "t.parquet"))
    pd.testing.assert_frame_equal(pd.read_parquet(out / "grad_groups.parquet"), pd.read_parquet(tmp_path / "g.parquet"),
                                  check_exact=False, rtol=1e-6)
    got = pd.read_parquet(out / "answers.parquet")
    assert set(got.pop("grad_norm_method")) == {"exact"}  # finishing a run adds each answer's method
    pd.testing.assert_frame_equal(got, pd.read_parquet(tmp_path / "a.parquet"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_errors"] == 0 and len(m["run_hash"]) == 64
    assert m["config"]["overwrite"] is False  # the manifest records the command as given
    assert m["distributed"]["n_chunks"] == 7  # 20 answers in chunks of 3
    assert (out / "errors.jsonl").read_text() == ""
    assert not (out / "chunks").exists() and not (out / "run.json").exists()  # the work area is gone
    assert not list(out.parent.glob(".run*"))


def test_rerun_of_a_finished_run_does_nothing(model_dir, reference, capsys):
    r, out = reference
    before = (out / "tokens.parquet").stat().st_mtime_ns
    capsys.readouterr()
    assert main(probe_args(model_dir, r, out, *FAST, "--answers-per-chunk", "3")) == 0
    assert "already complete" in capsys.readouterr().err
    assert (out / "tokens.parquet").stat().st_mtime_ns == before


# ---------------------------------------------------------------- resume

def test_killed_after_k_chunks_resumes_to_the_same_rows(model_dir, reference, tmp_path, monkeypatch):
    r, ref = reference
    out = tmp_path / "run"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "2")
    with pytest.raises(InjectedFailure):
        main(probe_args(model_dir, r, out, *FAST, "--debug", "--answers-per-chunk", "3"))
    assert not (out / "tokens.parquet").exists() and not (out / "manifest.json").exists()
    recs = sorted((out / "chunks").glob("c*.json"))
    assert len(recs) == 2
    done = {i for p in recs for i in json.loads(p.read_text())["answers"]}
    assert len(done) == 6
    # debris of a chunk killed mid-write: a table without its record, a temporary file
    (out / "chunks" / "c000000019-deadbeef00.tokens.parquet").write_bytes(b"torn")
    (out / "chunks" / ".c000000019-deadbeef00.json.1234.tmp").write_bytes(b"{")
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    # a different chunk size is fine: what is done is a set of answers
    assert main(probe_args(model_dir, r, out, *FAST, "--answers-per-chunk", "4")) == 0
    assert_same_rows(tokens(out), tokens(ref))
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["distributed"]["attempts"]) == 2
    assert m["distributed"]["ranks"][0]["n_probed"] == 20 - 6  # only the rest was probed again


def test_default_chunk_size_leaves_little_to_redo_and_resumes_an_old_run(model_dir, reference, tmp_path,
                                                                           monkeypatch):
    """#36: --answers-per-chunk defaulted to 16, so a killed probe of 16 answers restarted from answer 0. The
    default (auto) cuts a run into about 8 records (here 20 answers: 3 each) and records the value used; a run
    started with 16 (the old default) resumes with the new default."""
    r, ref = reference
    out = tmp_path / "run"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "1")
    with pytest.raises(InjectedFailure):
        main(probe_args(model_dir, r, out, *FAST, "--debug"))
    done = [i for p in (out / "chunks").glob("c*.json") for i in json.loads(p.read_text())["answers"]]
    assert len(done) == 3  # what a kill loses is at most one record: 3 answers, not all 16
    assert json.loads((out / "run.json").read_text())["config"]["answers_per_chunk"] == 3
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    assert main(probe_args(model_dir, r, out, *FAST)) == 0
    assert_same_rows(tokens(out), tokens(ref))
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["answers_per_chunk"] == m["distributed"]["answers_per_chunk"] == 3
    assert m["distributed"]["n_chunks"] == 7 and m["distributed"]["ranks"][0]["n_probed"] == 17
    # an old run, started with 16 answers per record (the default then) and killed after its first record
    old = tmp_path / "old"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "1")
    with pytest.raises(InjectedFailure):
        main(probe_args(model_dir, r, old, *FAST, "--debug", "--answers-per-chunk", "16"))
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    assert main(probe_args(model_dir, r, old, *FAST)) == 0  # resumed, not refused: how work is cut is no setting
    assert_same_rows(tokens(old), tokens(ref))
    m = json.loads((old / "manifest.json").read_text())
    assert m["distributed"]["ranks"][0]["n_probed"] == 4 and len(m["distributed"]["attempts"]) == 2
    assert m["distributed"]["n_chunks"] == 1 + 2  # the old record of 16, then the 4 left in records of 3
    # the rule: a rank's share / 8, rounded up, between 1 and 16
    from gmts_analysis.run.sharding.worker import answers_per_chunk

    assert [answers_per_chunk(None, n) for n in (0, 1, 8, 16, 20, 128, 129, 5000)] == [1, 1, 1, 2, 3, 16, 16, 16]
    assert answers_per_chunk(None, 20, world_size=2) == 2 and answers_per_chunk(5, 20) == 5


def test_failure_during_the_final_rename_keeps_the_work(model_dir, reference, tmp_path, monkeypatch):
    r, ref = reference
    out = tmp_path / "run"

    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(finalize_mod, "write_result", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        main(probe_args(model_dir, r, out, *FAST, "--debug"))
    assert (out / "run.json").exists() and not (out / "tokens.parquet").exists()
    monkeypatch.undo()
    assert main(probe_args(model_dir, r, out, *FAST)) == 0
    assert_same_rows(tokens(out), tokens(ref))


# ---------------------------------------------------------------- refusal

def test_mismatch_is_refused_unless_overwrite(model_dir, tiny_model_dirs, reference, tmp_path, monkeypatch, capsys):
    r, ref = reference
    out = tmp_path / "run"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "1")
    with pytest.raises(InjectedFailure):
        main(probe_args(model_dir, r, out, *FAST, "--debug", "--answers-per-chunk", "4"))
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    capsys.readouterr()
    # another configuration
    assert main(probe_args(model_dir, r, out, *FAST, "--temperature", "0.7")) == 2
    err = capsys.readouterr().err
    assert "unfinished run of a different model, rollouts or configuration" in err
    assert "--temperature 1.0 -> 0.7" in err and "--overwrite" in err and "Traceback" not in err
    # another model (same architecture, other weights)
    assert main(probe_args(tiny_model_dirs["llama"], r, out, *FAST)) == 2
    assert "the model's files" in capsys.readouterr().err
    # another rollouts file content
    r2 = write_rollouts(tmp_path / "r2.jsonl", seed=5)
    assert main(probe_args(model_dir, r2, out, *FAST)) == 2
    assert "the rollouts file's content" in capsys.readouterr().err
    # options that do not change results are not part of the identity
    assert main(probe_args(model_dir, r, out, *FAST, "--answers-per-chunk", "7", "--chunk-size", "2")) == 0
    assert_same_rows(tokens(out), tokens(ref))
    # a finished run of another configuration is refused too, and replaced with --overwrite
    assert main(probe_args(model_dir, r, out, *FAST, "--temperature", "0.7")) == 2
    assert "finished run of a different" in capsys.readouterr().err
    assert main(probe_args(model_dir, r, out, *FAST, "--temperature", "0.7", "--overwrite")) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["temperature"] == 0.7 and len(m["distributed"]["attempts"]) == 1
    assert not np.allclose(tokens(out).entropy, tokens(ref).entropy)


def test_a_directory_that_is_not_a_run_is_refused(model_dir, reference, tmp_path, capsys):
    r, _ = reference
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(probe_args(model_dir, r, out, *FAST)) == 2
    err = capsys.readouterr().err
    assert "did not write (notes.txt)" in err and "--overwrite" not in err  # never offered for others' files
    assert (out / "notes.txt").read_text() == "mine"


# ---------------------------------------------------------------- faults

@pytest.fixture(scope="module")
def nan_model_dir(tmp_path_factory):
    """A tiny GPT-2 whose position embeddings from position 40 on are NaN: any sequence longer
    than 40 tokens gets non-finite logits, shorter ones are untouched."""
    from transformers import AutoModelForCausalLM

    from gmts_analysis.toy.testing import save_tiny_model

    d = save_tiny_model("gpt2", tmp_path_factory.mktemp("nan") / "m", seed=2)
    model = AutoModelForCausalLM.from_pretrained(d)
    with torch.no_grad():
        model.transformer.wpe.weight[40:] = float("nan")
    model.save_pretrained(d)
    return d


def test_bad_answer_goes_to_errors_jsonl(nan_model_dir, tmp_path, capsys):
    r = write_rollouts(tmp_path / "r.jsonl", long_answer="bad")
    out = tmp_path / "run"
    assert main(probe_args(nan_model_dir, r, out, *FAST, "--answers-per-chunk", "4")) == 0
    err = capsys.readouterr().err
    assert "1 answer(s) failed and were skipped" in err
    lines = (out / "errors.jsonl").read_text().splitlines()
    assert len(lines) == 1
    e = json.loads(lines[0])
    assert e["answer_id"] == "bad" and "non-finite logits" in e["reason"] and e["index"] == 4
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_errors"] == 1 and m["errors"][0]["answer_id"] == "bad"
    t = tokens(out)
    a = pd.read_parquet(out / "answers.parquet")
    assert "bad" not in set(t.answer_id) and "bad" not in set(a.answer_id)
    # the others are exactly what a probe of them gives with the batch-wide coefficients
    cfg = ProbeConfig(model=str(nan_model_dir), rollouts=str(r), out=None, device="cpu", quiet=True,
                      grad_norm="none")
    model, tok = load_model(cfg.model, "cpu")
    answers = read_rollouts(r, tok)
    coefs = probe_mod.answer_coefficients(answers, KernelSettings.of(cfg))
    keep = [i for i, x in enumerate(answers) if x.answer_id != "bad"]
    res = probe_mod.probe_answers(model, tok, [answers[i] for i in keep], KernelSettings.of(cfg),
                                  [coefs[i] for i in keep])
    res.tokens.to_parquet(tmp_path / "t.parquet", index=False)
    assert_same_rows(t, pd.read_parquet(tmp_path / "t.parquet"))
    # the batch-wide token-mean weight counts the failed answer's tokens too
    np.testing.assert_allclose(t.loss_weight, 1.0 / sum(x.length for x in answers))


def test_strict_stops_at_the_bad_answer(nan_model_dir, tmp_path, capsys):
    r = write_rollouts(tmp_path / "r.jsonl", long_answer="bad")
    out = tmp_path / "run"
    assert main(probe_args(nan_model_dir, r, out, *FAST, "--strict")) == 2
    err = capsys.readouterr().err
    assert "answer 'bad' failed" in err and "non-finite logits" in err and "--strict" in err
    assert not (out / "tokens.parquet").exists()
    # the answers before it were recorded: a rerun without --strict resumes from there
    done = [i for p in (out / "chunks").glob("c*.json") for i in json.loads(p.read_text())["answers"]]
    assert sorted(done) == [0, 1, 2, 3]


def test_out_of_memory_halves_the_batch_used_last_and_reports_a_dropped_answer(model_dir, reference, tmp_path,
                                                                                 monkeypatch, capsys):
    """Each retry halves the batch the engine said it used when it ran out of memory (here a
    fake engine batching all of an answer's tokens), down to one; an answer out of memory even
    there (here: an error outside any batch, halved from what ``auto`` takes at most) is dropped,
    and the run says so in errors.jsonl, the manifest, its printed summary and its exit status."""
    from gmts_analysis.engine import memory
    from gmts_analysis.run.sharding.merge import EXIT_OUT_OF_MEMORY

    r, ref = reference
    real = probe_mod.probe_answer
    tried: dict = {}

    def flaky(model, answer, coef, settings, token_text=None):
        lim = memory.current_limit().tokens
        tried.setdefault(answer.answer_id, []).append(lim)
        if answer.answer_id == "q2-0":  # never fits, and not inside a batch
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        used = answer.length if lim is None else min(lim, answer.length)
        if answer.length > 4 and used > 2:
            with memory.noting_batch("tokens", used):
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return real(model, answer, coef, settings, token_text)

    monkeypatch.setattr(probe_mod, "probe_answer", flaky)
    out = tmp_path / "run"
    assert main(probe_args(model_dir, r, out, *FAST)) == EXIT_OUT_OF_MEMORY
    long_ok = next(k for k, v in tried.items() if len(v) > 1 and k != "q2-0")
    sizes = tried[long_ok]
    assert sizes[0] is None and all(b == a // 2 for a, b in itertools.pairwise(sizes[1:]))
    assert sizes[-1] <= 2 < sizes[-2]
    q2 = tried["q2-0"]
    assert q2[0] is None and q2[-1] == 1 and all(b == a // 2 for a, b in itertools.pairwise(q2[1:]))
    errs = [json.loads(x) for x in (out / "errors.jsonl").read_text().splitlines()]
    assert [e["answer_id"] for e in errs] == ["q2-0"] and errs[0]["out_of_memory"] is True
    assert "out of memory after" in errs[0]["reason"] and "tokens per batched VJP" in errs[0]["reason"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_errors"] == 1 and m["n_out_of_memory"] == 1
    printed = capsys.readouterr().out
    assert "1 of 20 answers failed and were skipped, 1 still out of memory after the back-off" in printed
    ref_t = tokens(ref)
    got = tokens(out)
    assert_same_rows(got, ref_t[ref_t.answer_id != "q2-0"].reset_index(drop=True))


def test_out_of_memory_retries_are_bounded(model_dir, tmp_path, monkeypatch, capsys):
    from gmts_analysis.engine import memory

    r = write_rollouts(tmp_path / "r.jsonl", sizes=(2, 2), long_answer="long")
    tried = []

    def always(model, answer, coef, settings, token_text=None):
        lim = memory.current_limit().tokens
        tried.append(lim)
        with memory.noting_batch("tokens", 256 if lim is None else lim):
            raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(memory, "OOM_RETRIES", 2)
    monkeypatch.setattr(probe_mod, "probe_answer", always)
    assert main(probe_args(model_dir, r, tmp_path / "run", *FAST, "--strict")) == 2  # --strict: stops there
    err = capsys.readouterr().err
    assert "answer 'q0-0' failed: AnswerOutOfMemory: out of memory after 3 tries at 256, 128, 64 tokens per " \
           "batched VJP (floor 1, at most 2 retries)" in err
    assert tried == [None, 128, 64]


# ---------------------------------------------------------------- merge

def test_merge_command_from_parts_or_chunks(model_dir, reference, tmp_path, monkeypatch, capsys):
    r, ref = reference
    out = tmp_path / "run"

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(merge_mod, "write_merged_run", stop)  # rank 0 dies after every part is written
    assert main(probe_args(model_dir, r, out, *FAST)) == 130
    monkeypatch.undo()
    assert (out / "parts" / "part-00000-of-00001.json").exists()
    assert main(["merge", str(out), "--device", "cpu", "--quiet"]) == 0
    assert_same_rows(tokens(out), tokens(ref))
    assert main(["merge", str(out), "--quiet"]) == 2
    assert "already complete" in capsys.readouterr().err

    # without parts: straight from the chunk records; an unfinished run is refused
    out2 = tmp_path / "run2"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "1")
    with pytest.raises(InjectedFailure):
        main(probe_args(model_dir, r, out2, *FAST, "--debug", "--answers-per-chunk", "5"))
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    assert main(["merge", str(out2), "--quiet"]) == 2
    assert "15 of 20 answers are not probed yet" in capsys.readouterr().err
    monkeypatch.setattr(merge_mod, "write_merged_run", stop)
    assert main(probe_args(model_dir, r, out2, *FAST)) == 130
    monkeypatch.undo()
    for p in (out2 / "parts").iterdir():
        p.unlink()
    assert main(["merge", str(out2), "--device", "cpu", "--quiet"]) == 0
    assert_same_rows(tokens(out2), tokens(ref))


def test_merge_reports_status_3_for_answers_dropped_out_of_memory(model_dir, reference, tmp_path, monkeypatch,
                                                                   capsys):
    """Issue 46: ``gmts merge`` exited 0 where ``gmts probe`` exits 3 (the run finished, answers dropped still out
    of memory after the back-off). It exits 3 and prints the line saying so."""
    from gmts_analysis.run.sharding.merge import EXIT_OUT_OF_MEMORY

    r, _ = reference
    real = probe_mod.probe_answer

    def q2_never_fits(model, answer, coef, settings, token_text=None):
        if answer.answer_id == "q2-0":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, answer, coef, settings, token_text)

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(probe_mod, "probe_answer", q2_never_fits)
    monkeypatch.setattr(merge_mod, "write_merged_run", stop)  # rank 0 dies after every part is written
    out = tmp_path / "run"
    assert main(probe_args(model_dir, r, out, *FAST)) == 130
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["merge", str(out), "--device", "cpu", "--quiet"]) == EXIT_OUT_OF_MEMORY
    err = capsys.readouterr().err
    assert "1 of 20 answers failed and were skipped, 1 still out of memory after the back-off (exit status 3)" in err
    assert json.loads((out / "manifest.json").read_text())["n_out_of_memory"] == 1
