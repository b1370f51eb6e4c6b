"""Helpers of the reliability and fuzz tests: run the CLI in-process, check the one-line-error
contract, check a finished run is finite, and snapshot a directory tree to prove nothing
outside ``--out`` was touched."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd

from gmts_analysis.cli import main

# columns that may be NaN by design: grad_norm(_logp) under --grad-norm none, rsi where entropy is 0
NAN_OK_NONE = ("grad_norm_logp", "grad_norm")
NAN_OK_ALWAYS = ("rsi",)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``(exit status, stderr)`` of ``gmts argv`` run in this process (stdout is discarded)."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            rc = main(argv)
        except SystemExit as e:  # argparse usage errors
            rc = e.code if isinstance(e.code, int) else 2
    return rc, err.getvalue()


def assert_one_line_error(rc: int, err: str, *needles: str) -> str:
    """Exit 2, no traceback, exactly one ``gmts: error:`` line and it is the last line; returns it."""
    assert "Traceback" not in err, err[-3000:]
    assert rc == 2, (rc, err[-3000:])
    lines = [x for x in err.splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("gmts: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], err[-3000:]
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


# answers.parquet columns gmts computes (other columns carry the rollouts' own extra fields as given)
ANSWER_FLOATS = ("reward", "advantage", "loss_weight")


def assert_finite_run(out: Path, grad_norm_none: bool) -> pd.DataFrame:
    """A finished run directory whose token float columns and computed answer columns are all finite."""
    for f in ("tokens.parquet", "answers.parquet", "stats.json", "manifest.json", "errors.jsonl"):
        assert (out / f).is_file(), f
    t = pd.read_parquet(out / "tokens.parquet")
    a = pd.read_parquet(out / "answers.parquet")[list(ANSWER_FLOATS)]
    allowed = NAN_OK_ALWAYS + (NAN_OK_NONE if grad_norm_none else ())
    for name, df in (("tokens", t), ("answers", a)):
        for c in df.columns:
            if df[c].dtype.kind != "f":
                continue
            v = df[c].to_numpy()
            if c in allowed:
                v = v[~np.isnan(v)]
            assert np.isfinite(v).all(), f"{name}.{c} has non-finite values"
    return t


def snapshot(root: Path, skip: Path | None = None) -> dict[str, str]:
    """``{relative path: content digest}`` of every file and directory under ``root``, except
    under ``skip`` (the run directory itself)."""
    snap = {}
    skip = skip.resolve() if skip is not None else None
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        if skip is not None and (d.resolve() == skip or skip in d.resolve().parents):
            dirnames[:] = []
            continue
        for n in dirnames:
            p = d / n
            if skip is not None and p.resolve() == skip:
                continue
            snap[str(p.relative_to(root)) + "/"] = "dir"
        for n in filenames:
            p = d / n
            if p.exists() and not p.is_file():  # a FIFO or device: opening it would block
                snap[str(p.relative_to(root))] = f"special {os.stat(p).st_mode:o}"
                continue
            try:
                snap[str(p.relative_to(root))] = hashlib.sha1(p.read_bytes()).hexdigest()
            except OSError:
                snap[str(p.relative_to(root))] = "unreadable"
    return snap


def assert_untouched(before: dict[str, str], after: dict[str, str]) -> None:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (added or removed or changed), f"outside --out: added {added}, removed {removed}, changed {changed}"


#: a probe's fastest settings: no gradient norms, fidelity or figures
FAST = ["--device", "cpu", "--grad-norm", "none", "--fidelity", "off", "--no-figures", "--quiet"]


def probe(model, rollouts, out, *extra: str) -> list[str]:
    return ["probe", "--model", str(model), "--rollouts", str(rollouts), "--out", str(out), *FAST, *extra]
