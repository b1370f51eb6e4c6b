"""One declaration per option (issue 29): docs/cli.md's generated blocks are current, and an option
added in one place (one dataclass field) is a flag, an API keyword, a --config key, a checked value,
a manifest field and a docs/cli.md row, with its TRL name, without touching another file."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_cli_doc_is_current():
    from gmts_analysis.cli import cli_doc_blocks
    from gmts_analysis.options.reference import render_blocks

    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert render_blocks(text, cli_doc_blocks()) == text, (
        "docs/cli.md is out of date: python -c \"from gmts_analysis.cli import write_cli_doc; write_cli_doc()\"")


def test_add_argument_only_in_the_parser_builder():
    """Flags are declared, never written with add_argument (positional arguments aside)."""
    import re

    allowed = {"options/parser.py", "analysis/summary.py"}  # summary: a __main__ helper
    for p in sorted((ROOT / "gmts_analysis").rglob("*.py")):
        rel = p.relative_to(ROOT / "gmts_analysis").as_posix()
        if rel in allowed:
            continue
        for m in re.finditer(r"add_argument\(\s*(\S+)", p.read_text(encoding="utf-8")):
            assert not m.group(1).startswith(("\"-", "'-")), f"{rel}: add_argument({m.group(1)} (declare it as a field)"


def test_every_flag_is_a_declared_field():
    from gmts_analysis.cli import build_parser
    from gmts_analysis.options.parser import parser_fields

    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        if name == "stats":
            continue
        fields = parser_fields(p)
        for a in p._actions:
            if a.option_strings and a.dest != "help":
                assert a.dest in fields, f"gmts {name}: {a.option_strings} is not declared"


NEW_FIELD = '''
    new_knob: float = opt(0.5, "a knob added by a test", group="RL objective", metavar="KNOB",
                          check=checks.rho, aliases=(alias("trl_knob", "TRL GRPOConfig.trl_knob"),))
'''

SCRIPT = r'''
import argparse, dataclasses, json, sys
from pathlib import Path
from gmts_analysis.cli import build_parser, cli_doc_blocks, main
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import ProbeConfig, options_from_kwargs
from gmts_analysis.options.parser import from_args

out = {}
root = build_parser()
sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
out["probe_help"] = "--new-knob KNOB" in sub.choices["probe"].format_help()
out["run_help"] = "--new-knob KNOB" in sub.choices["run"].format_help()
ns = root.parse_args(["probe", "--model", "tiny", "--rollouts", "r.jsonl", "--trl_knob", "0.25"])
out["cli_alias"] = [ns.new_knob, ns.aliases]
out["api"] = options_from_kwargs({"new_knob": 0.3}).new_knob
out["api_alias"] = options_from_kwargs({"trl_knob": 0.4}).new_knob
Path("k.yaml").write_text("new_knob: 0.7\n")
ns = root.parse_args(["probe", "--model", "tiny", "--rollouts", "r.jsonl", "--config", "k.yaml"])
out["config_file"] = ns.new_knob
out["manifest"] = dataclasses.asdict(from_args(ProbeConfig, ns))["new_knob"]  # build_manifest's "config"
try:
    options_from_kwargs({"new_knob": 2.0})
    from gmts_analysis.probing.validate import validate_options
    validate_options(options_from_kwargs({"new_knob": 2.0}))
    out["api_check"] = None
except GmtsError as e:
    out["api_check"] = str(e)
Path("r.jsonl").write_text('{"prompt_ids": [1], "response_ids": [2], "reward": 1}\n')
out["cli_check"] = main(["probe", "--model", "tiny", "--rollouts", "r.jsonl", "--new-knob", "2", "--out", "o"])
out["docs"] = [line for line in cli_doc_blocks()["options"].splitlines() if "new-knob" in line]
print(json.dumps(out))
'''


def test_an_option_added_in_one_place_is_everywhere(tmp_path):
    pkg = tmp_path / "src" / "gmts_analysis"
    shutil.copytree(ROOT / "gmts_analysis", pkg, ignore=shutil.ignore_patterns("__pycache__", "data"))
    os.symlink(ROOT / "gmts_analysis" / "data", pkg / "data")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "cli.md", tmp_path / "docs" / "cli.md")
    cfg = pkg / "options" / "config.py"
    text = cfg.read_text(encoding="utf-8")
    anchor = "\n    seed: int = opt(0, \"seed for sketches"
    assert text.count(anchor) == 1
    cfg.write_text(text.replace(anchor, NEW_FIELD.rstrip("\n") + anchor), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "src"), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["probe_help"] and got["run_help"]
    assert got["cli_alias"] == [0.25, {"--trl_knob": "new_knob"}]
    assert got["api"] == 0.3 and got["api_alias"] == 0.4
    assert got["config_file"] == 0.7 and got["manifest"] == 0.7
    assert got["api_check"] == "--new-knob: must be a keep fraction in (0, 1], got 2.0"
    assert got["cli_check"] == 2 and "--new-knob: must be a keep fraction in (0, 1], got 2.0" in r.stderr
    assert any("`--new-knob KNOB`" in line and "`--trl_knob`" in line and "(default: 0.5)" in line
               for line in got["docs"]), got["docs"]
