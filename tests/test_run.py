"""`gmts run` end to end on the shipped `tiny` policy with a reduced sample: the same job as
`gmts probe` (chunk records, fingerprint, errors.jsonl), so a killed run resumes."""

import json

import pandas as pd
import pytest

from gmts_analysis.cli import main
from gmts_analysis.probing.tables import TOKEN_COLUMNS
from gmts_analysis.run.job import sample_work_dir
from gmts_analysis.run.sharding.worker import InjectedFailure

SMALL = ["--model", "tiny", "--num-prompts", "1", "--group-size", "3", "--quiet", "--seed", "1"]
FAST = [*SMALL, "--max-new-tokens", "12", "--no-figures", "--fidelity", "off", "--answers-per-chunk", "2"]


def test_gmts_run_tiny_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--out", str(out), *SMALL])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "entropy within" in printed and "gmts cross" in printed
    for d in ("arithmetic", "program", "logic"):
        assert d in printed
    for f in ("tokens.parquet", "answers.parquet", "stats.json", "manifest.json", "rollouts.jsonl", "report.html",
              "errors.jsonl"):
        assert (out / f).exists(), f
    assert list((out / "figures").glob("*.png"))
    assert not sample_work_dir(out).exists()  # the work file goes once the run is finished
    t = pd.read_parquet(out / "tokens.parquet")
    assert list(t.columns[: len(TOKEN_COLUMNS)]) == list(TOKEN_COLUMNS)
    assert set(t["domain"]) == {"arithmetic", "program", "logic"}
    assert t.grad_norm_logp.notna().all() and (t.grad_norm_logp > 0).all()
    stats = json.loads((out / "stats.json").read_text())
    assert set(stats["by_domain"]) == {"arithmetic", "program", "logic"}
    assert "update_fidelity" in stats
    answers = pd.read_parquet(out / "answers.parquet")
    assert len(answers) == 3 * 1 * 3
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == len(answers)
    assert [r["response_ids"] for r in rollouts] == [list(x) for x in answers["response_ids"]]
    assert all(r["reward"] in (0.0, 1.0) for r in rollouts)
    assert len(t) == sum(len(r["response_ids"]) for r in rollouts)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["job"] == "gmts run" and manifest["grad_norm_method"] == "exact"
    # the job's own records: a run fingerprint, one chunk record per answers_per_chunk answers (auto: 9 answers
    # over 8 records at most, so 2 a record and 5 records)
    assert manifest["config"]["answers_per_chunk"] == 2
    assert len(manifest["run_hash"]) == 64 and manifest["distributed"]["n_chunks"] == 5
    assert manifest["sampling"]["domains"] == ["arithmetic", "program", "logic"]
    # the run names the rollouts it holds, not the deleted work file; and the threads it ran on
    assert manifest["rollouts_file"] == "rollouts.jsonl"
    assert manifest["config"]["rollouts"] == str(out / "rollouts.jsonl")
    assert manifest["config"]["threads"] == manifest["torch_threads"] >= 1


def test_gmts_run_killed_mid_probe_resumes_to_the_same_rows(tmp_path, monkeypatch, capsys):
    ref = tmp_path / "ref"
    assert main(["run", "--out", str(ref), *FAST]) == 0
    out = tmp_path / "run"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "2")
    with pytest.raises(InjectedFailure):
        main(["run", "--out", str(out), *FAST, "--debug"])
    assert not (out / "tokens.parquet").exists()
    recs = sorted((out / "chunks").glob("c*.json"))
    assert len(recs) == 2  # 4 of the 9 answers recorded
    assert (sample_work_dir(out) / "rollouts.jsonl").exists()
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    assert main(["run", "--out", str(out), *FAST]) == 0
    a, b = pd.read_parquet(ref / "tokens.parquet"), pd.read_parquet(out / "tokens.parquet")
    pd.testing.assert_frame_equal(a, b)
    pd.testing.assert_frame_equal(pd.read_parquet(ref / "answers.parquet"), pd.read_parquet(out / "answers.parquet"))
    m = json.loads((out / "manifest.json").read_text())
    assert len(m["distributed"]["attempts"]) == 2
    assert m["distributed"]["ranks"][0]["n_probed"] == 9 - 4  # only the rest was probed again
    assert m["run_hash"] == json.loads((ref / "manifest.json").read_text())["run_hash"]
    assert (out / "rollouts.jsonl").read_text() == (ref / "rollouts.jsonl").read_text()
    assert not sample_work_dir(out).exists()
    # the same command on the finished run does nothing; other arguments are refused
    before = (out / "tokens.parquet").stat().st_mtime_ns
    assert main(["run", "--out", str(out), *FAST]) == 0
    assert (out / "tokens.parquet").stat().st_mtime_ns == before
    capsys.readouterr()
    assert main(["run", "--out", str(out), *FAST, "--temperature", "0.5"]) == 2
    assert "different" in capsys.readouterr().err


def test_gmts_run_rejects_unknown_domain(tmp_path, capsys):
    rc = main(["run", "--model", "tiny", "--out", str(tmp_path / "r"), "--domains", "arithmetic,poetry", "--quiet"])
    assert rc == 2
    assert "poetry" in capsys.readouterr().err


def test_gmts_merge_finishes_a_killed_gmts_run_as_gmts_run_would(tmp_path, monkeypatch):
    """Every answer probed, the job killed before its final step: `gmts merge` writes the same
    directory `gmts run` would have (its sampled rollouts.jsonl and manifest entries included)."""
    out = tmp_path / "run"
    monkeypatch.setenv("GMTS_TEST_FAIL_AFTER_CHUNKS", "5")  # 9 answers, 2 per record: the 5th is the last
    with pytest.raises(InjectedFailure):  # --debug: the CLI re-raises instead of printing one line
        main(["--debug", "run", "--out", str(out), *FAST])
    monkeypatch.delenv("GMTS_TEST_FAIL_AFTER_CHUNKS")
    assert not (out / "manifest.json").exists()
    assert main(["merge", str(out), "--no-figures", "--fidelity", "off", "--quiet"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["job"] == "gmts run" and m["sampling"]["group_size"] == 3
    rows = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert rows == [json.loads(line) for line in (sample_work_dir(out) / "rollouts.jsonl").read_text().splitlines()]
    t = pd.read_parquet(out / "tokens.parquet")
    assert len(t) == sum(len(r["response_ids"]) for r in rows)


def test_gmts_run_sigkilled_mid_probe_resumes_to_the_same_rows(tmp_path):
    """A real SIGKILL of the `gmts run` process (not an in-process failure) while records are
    being written: the same command again gives the uninterrupted run's rows, bit for bit."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "gmts_analysis", "run", *FAST]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ref, out = tmp_path / "ref", tmp_path / "run"
    subprocess.run([*cmd, "--out", str(ref)], check=True, env=env, capture_output=True)
    proc = subprocess.Popen([*cmd, "--out", str(out)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(list((out / "chunks").glob("c*.json"))) >= 1:
            break
        time.sleep(0.02)
    killed = proc.poll() is None
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if not killed or (out / "tokens.parquet").exists():
        pytest.skip("the run finished before it could be killed")
    subprocess.run([*cmd, "--out", str(out)], check=True, env=env, capture_output=True)
    pd.testing.assert_frame_equal(pd.read_parquet(ref / "tokens.parquet"), pd.read_parquet(out / "tokens.parquet"))
    pd.testing.assert_frame_equal(pd.read_parquet(ref / "answers.parquet"), pd.read_parquet(out / "answers.parquet"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["run_hash"] == json.loads((ref / "manifest.json").read_text())["run_hash"]
    assert len(m["distributed"]["attempts"]) == 2
