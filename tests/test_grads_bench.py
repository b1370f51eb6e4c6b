"""``gmts bench`` end to end on a tiny setting (correctness of the output, not timings)."""

from __future__ import annotations

import json

from gmts_analysis.cli import main


def test_bench_writes_table_and_json(tmp_path, capsys):
    rc = main(
        [
            "bench",
            "--models",
            "small",
            "--lengths",
            "12",
            "--probes",
            "3",
            "--naive-tokens",
            "2",
            "--prompt-len",
            "4",
            "--out",
            str(tmp_path),
            "-q",
        ]
    )
    assert rc == 0
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".md")
    res = json.loads((tmp_path / files[0]).read_text())
    methods = [r["method"] for r in res["rows"]]
    assert methods == [
        "fwd+bwd (1x, reference)",
        "naive loop (fwd+bwd per token)",
        "shared-forward loop",
        "exact engine",
        "sketch K=3",
    ]
    assert res["accuracy"][0]["exact_max_rel_err_vs_loop"] < 1e-4
    assert res["accuracy"][0]["exact_max_rel_err_vs_naive"] < 1e-4
    assert all(r["peak_mb"] >= 0 for r in res["rows"])
    assert res["memory_method"] and res["machine"]["cpu_count"] >= 1
    out = capsys.readouterr().out
    assert "| small | 12 | exact engine |" in out


def test_bench_rejects_bad_flags(tmp_path):
    assert main(["bench", "--lengths", "0", "--out", str(tmp_path)]) == 2
    assert main(["bench", "--models", "gpt5", "--lengths", "4", "--out", str(tmp_path)]) == 2
