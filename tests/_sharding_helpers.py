"""Shared helpers of the scale-out tests (test_dist*.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
GROUP_SIZES = (3, 1, 4, 2, 5, 2, 3)  # 7 groups of uneven sizes, one singleton


def write_rollouts(path: Path, sizes=GROUP_SIZES, seed: int = 0, long_answer: str | None = None) -> Path:
    """Id rollouts: groups of ``sizes`` answers, uneven prompt and response lengths, mixed rewards.

    ``long_answer``: also add an answer of that id whose sequence is 60 tokens long.
    """
    import random

    rnd = random.Random(seed)
    rows = []
    for g, n in enumerate(sizes):
        prompt = [1] + [rnd.randrange(4, 100) for _ in range(rnd.randrange(1, 6))]
        for j in range(n):
            resp = [rnd.randrange(4, 100) for _ in range(rnd.randrange(2, 10))]
            rows.append({"prompt_ids": prompt, "response_ids": resp, "reward": float(rnd.random() < 0.5),
                         "answer_id": f"q{g}-{j}", "group_id": f"q{g}"})
    if long_answer is not None:
        rows.insert(4, {"prompt_ids": [1, 5, 6], "response_ids": [rnd.randrange(4, 100) for _ in range(57)],
                        "reward": 1.0, "answer_id": long_answer, "group_id": "q0"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def probe_args(model, rollouts, out, *extra: str) -> list[str]:
    return ["probe", "--model", str(model), "--rollouts", str(rollouts), "--out", str(out), "--device", "cpu",
            "--quiet", "--no-figures", "--fidelity", "off", "--threads", "1", *extra]


def subprocess_env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["TOKENIZERS_PARALLELISM"] = "false"
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "GMTS_TEST_FAIL_AFTER_CHUNKS", "GMTS_TEST_SLOW_S", "GMTS_TEST_OOM_ANSWER"):
        env.pop(k, None)
    env.update(extra)
    return env


def gmts_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gmts_analysis", *args]


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "gmts_analysis", *args]


def run(cmd: list[str], timeout: float = 240, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=False, cwd=REPO, env=subprocess_env(**env), capture_output=True, text=True,
                          timeout=timeout)


def tokens(out: Path) -> pd.DataFrame:
    return pd.read_parquet(out / "tokens.parquet")


def assert_same_rows(a: pd.DataFrame, b: pd.DataFrame) -> None:
    """Same rows in the same order (answer_id, position), same columns, values equal to 1e-6."""
    key = ["answer_id", "position"]
    assert not a.duplicated(key).any() and not b.duplicated(key).any(), "duplicate rows"
    assert list(a.columns) == list(b.columns)
    assert a[key].values.tolist() == b[key].values.tolist()
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_exact=False,
                                  rtol=1e-6, atol=1e-9)
