"""Real processes: torchrun with 2 ranks (gloo, CPU) against one process; SIGKILL and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from _sharding_helpers import (
    REPO,
    assert_same_rows,
    gmts_cmd,
    probe_args,
    run,
    subprocess_env,
    tokens,
    torchrun_cmd,
    write_rollouts,
)

from gmts_analysis.cli import main


@pytest.fixture(scope="module")
def setup(tiny_model_dirs, tmp_path_factory):
    """The 7 uneven groups, and the uninterrupted one-process run (exact gradient norms)."""
    d = tmp_path_factory.mktemp("torchrun")
    r = write_rollouts(d / "r.jsonl", seed=1)
    model = tiny_model_dirs["qwen2"]
    ref = d / "one"
    assert main(probe_args(model, r, ref, "--answers-per-chunk", "2")) == 0
    return model, r, ref


def test_two_ranks_give_the_rows_of_one_process(setup, tmp_path):
    model, r, ref = setup
    out = tmp_path / "two"
    p = run(torchrun_cmd(2, *probe_args(model, r, out, "--answers-per-chunk", "2")))
    assert p.returncode == 0, p.stderr[-3000:]
    assert_same_rows(tokens(out), tokens(ref))
    m = json.loads((out / "manifest.json").read_text())
    ranks = m["distributed"]["ranks"]
    assert m["distributed"]["world_size"] == 2 and [x["rank"] for x in ranks] == [0, 1]
    assert all(x["n_probed"] > 0 for x in ranks) and sum(x["n_probed"] for x in ranks) == 20
    a = json.loads((ref / "stats.json").read_text())["cross_answer"]["entropy"]["spearman"]
    b = json.loads((out / "stats.json").read_text())["cross_answer"]["entropy"]["spearman"]
    assert a == pytest.approx(b, abs=1e-9)
    # progress and the final line on rank 0 only
    assert p.stderr.count("wrote ") == 1


def test_two_ranks_killed_then_resumed_on_one_process(setup, tmp_path):
    """Both ranks fail after one chunk each; the same command in one process finishes the run."""
    model, r, ref = setup
    out = tmp_path / "two"
    args = probe_args(model, r, out, "--answers-per-chunk", "2")
    p = run(torchrun_cmd(2, *args), GMTS_TEST_FAIL_AFTER_CHUNKS="1")
    assert p.returncode != 0
    assert not (out / "tokens.parquet").exists()
    recs = [json.loads(x.read_text()) for x in (out / "chunks").glob("c*.json")]
    assert sorted(rec["rank"] for rec in recs) == [0, 1]
    assert main(args) == 0  # a different world size resumes too
    assert_same_rows(tokens(out), tokens(ref))
    m = json.loads((out / "manifest.json").read_text())
    assert [x["world_size"] for x in m["distributed"]["attempts"]] == [2, 1]
    assert m["distributed"]["ranks"][0]["n_probed"] == 20 - 4


def test_sigkill_mid_chunk_then_resume(setup, tmp_path):
    model, r, ref = setup
    out = tmp_path / "run"
    args = probe_args(model, r, out, "--answers-per-chunk", "3")
    proc = subprocess.Popen(gmts_cmd(*args), cwd=REPO, env=subprocess_env(GMTS_TEST_SLOW_S="0.4"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        while len(list((out / "chunks").glob("c*.json"))) < 2:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no chunk recorded in time"
            time.sleep(0.05)
        time.sleep(0.5)  # inside the third chunk
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert not (out / "tokens.parquet").exists() and not (out / "manifest.json").exists()
    n_done = sum(len(json.loads(x.read_text())["answers"]) for x in (out / "chunks").glob("c*.json"))
    assert 6 <= n_done < 20
    assert main(args) == 0
    got = tokens(out)
    assert_same_rows(got, tokens(ref))  # same rows, none missing, no duplicates


def test_every_rank_reports_status_3(setup, tmp_path):
    """Issue 46: under torchrun only rank 0 exited 3 when the run dropped an answer still out of memory (the others
    had returned 0 before the merge). Every rank now waits for rank 0's merge and exits 3. (torchrun stops the
    other ranks once one has exited non-zero: a long --monitor-interval lets each rank's status show.)"""
    import re
    import sys

    model, r, _ = setup
    out = tmp_path / "two"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "--monitor-interval", "5", "-m", "gmts_analysis", *probe_args(model, r, out, "--answers-per-chunk", "2")]
    p = run(cmd, GMTS_TEST_OOM_ANSWER="q5-1")
    assert p.returncode != 0, p.stderr[-3000:]
    m = json.loads((out / "manifest.json").read_text())
    assert m["n_out_of_memory"] == 1 and m["n_answers"] == 19
    # torchrun's failure report: each failed rank with its exit code
    exits = dict(re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)", p.stderr))
    assert exits == {"0": "3", "1": "3"}, p.stderr[-3000:]
    assert p.stdout.count("still out of memory after the back-off") == 1  # the summary line, on rank 0 only
