"""The command line surface: every documented subcommand (docs/definitions.md section 9) exists; `python -m gmts_analysis` is the same CLI."""

import subprocess
import sys

import pytest

from gmts_analysis.cli import build_parser, main

SPEC_COMMANDS = {"run", "sample", "probe", "stats", "figures", "bench", "toy-train"}
SPEC_PROBE_FLAGS = {"--model", "--rollouts", "--out", "--device", "--dtype", "--temperature", "--advantage",
                    "--loss-agg", "--grad-norm", "--probes", "--chunk-size", "--format"}


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices


def test_spec_subcommands_and_probe_flags():
    subs = _subparsers()
    assert SPEC_COMMANDS <= set(subs), SPEC_COMMANDS - set(subs)
    probe_flags = {s for a in subs["probe"]._actions for s in a.option_strings}
    assert SPEC_PROBE_FLAGS <= probe_flags, SPEC_PROBE_FLAGS - probe_flags


def test_help_exits_zero(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "probe" in capsys.readouterr().out


def test_python_dash_m_is_the_same_cli():
    r = subprocess.run([sys.executable, "-m", "gmts_analysis", "probe", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--grad-norm" in r.stdout and "--loss-agg" in r.stdout


def test_unknown_option_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["probe", "--model", "x", "--rollouts", "y", "--out", "z", "--advantage", "median"])
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("argv, needle", [
    (["probe", "--model", "tiny", "--rollouts", "NOPE.jsonl", "--out", "{tmp}/o"], "NOPE.jsonl"),
    (["run", "--model", "tiny", "--domains", "poetry", "--out", "{tmp}/o"], "poetry"),
    (["sample", "--domains", "poetry", "--out", "{tmp}/r.jsonl"], "poetry"),
    (["stats", "{tmp}/nope"], "nope"),
    (["figures", "{tmp}/nope"], "nope"),
    (["merge", "{tmp}/nope"], "nope"),
    (["compare", "{tmp}/nope", "--out", "{tmp}/c"], "nope"),
    (["probe", "--model", "tiny", "--rollouts", "x", "--out", "o", "--grad-norm", "bogus"], "invalid choice"),
    (["stats"], "RUN_DIR"),
    (["no-such-command"], "invalid choice"),
])
def test_every_subcommand_error_is_one_line_exit_2(argv, needle, tmp_path, capsys):
    """``gmts: error: ...`` naming what is wrong, the last and only error line, exit 2, no traceback."""
    try:
        rc = main([a.replace("{tmp}", str(tmp_path)) for a in argv])
    except SystemExit as e:  # usage errors
        rc = e.code
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == 2 and "Traceback" not in err, err
    assert [x for x in lines if x.startswith("gmts: error:")] == [lines[-1]] and needle in lines[-1], err


def test_debug_flag_before_or_after_the_subcommand():
    p = build_parser()
    assert p.parse_args(["--debug", "stats", "x"]).debug is True
    assert p.parse_args(["stats", "x", "--debug"]).debug is True
    assert p.parse_args(["stats", "x"]).debug is False
