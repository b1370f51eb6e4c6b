"""`gmts run` end to end on the shipped `tiny` policy with a reduced sample."""

import json

import pandas as pd

from gmts_analysis.cli import main
from gmts_analysis.tables import TOKEN_COLUMNS


def test_gmts_run_tiny_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["run", "--policy", "tiny", "--out", str(out), "--num-prompts", "1", "--group-size", "3",
               "--quiet", "--seed", "1"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "entropy within" in printed and "gmts cross" in printed
    for d in ("arithmetic", "program", "logic"):
        assert d in printed
    for f in ("tokens.parquet", "answers.parquet", "stats.json", "manifest.json", "rollouts.jsonl", "report.html"):
        assert (out / f).exists(), f
    assert list((out / "figures").glob("*.png"))
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
    assert all(r["reward"] in (0.0, 1.0) for r in rollouts)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["job"] == "gmts run" and manifest["grad_norm_method"] == "exact"


def test_gmts_run_rejects_unknown_domain(tmp_path, capsys):
    rc = main(["run", "--policy", "tiny", "--out", str(tmp_path / "r"), "--domains", "arithmetic,poetry", "--quiet"])
    assert rc == 2
    assert "poetry" in capsys.readouterr().err
