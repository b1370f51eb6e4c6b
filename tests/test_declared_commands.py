"""Declarative commands and settings checked once (issue 47 parts 1 and 2): each subcommand is a declared
:class:`~gmts_analysis.options.command.Command` whose job takes typed settings built by one generic builder,
and ``gmts probe`` checks the job's options once."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect

import pytest

from gmts_analysis.cli import COMMANDS, build_parser, main
from gmts_analysis.options.command import Command
from gmts_analysis.options.config import RunControl

#: every subcommand is declared
NOT_YET: set[str] = set()


def _sub(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


@pytest.mark.parametrize("name", [c for c in COMMANDS if c not in NOT_YET])
def test_every_command_is_declared_and_its_job_takes_typed_settings(name):
    module = importlib.import_module(f"gmts_analysis.commands.{name}")
    cmd = module.COMMAND
    assert isinstance(cmd, Command) and cmd.name == name.replace("_", "-")
    assert all(dataclasses.is_dataclass(c) for c in cmd.settings)
    params = list(inspect.signature(cmd.function()).parameters.values())
    assert len(params) == len(cmd.positionals) + len(cmd.settings)
    for p, cls in zip(params[len(cmd.positionals):], cmd.settings):  # each settings parameter is typed as its class
        assert p.annotation in (cls, cls.__name__), (name, p)
    # the parser runs the declared command (no hand-written run(args))
    assert _sub(build_parser(), cmd.name).get_default("func") == cmd.run


def test_the_builder_makes_the_typed_settings_from_the_parsed_arguments():
    from gmts_analysis.commands.compare import COMMAND, CompareOptions

    args = build_parser().parse_args(["compare", "a", "b", "--output_dir", "x", "--no-figures", "-q", "--threads", "1"])
    runs, opts, control = COMMAND.build(args)
    assert runs == ["a", "b"]
    assert opts == CompareOptions(out="x", overwrite=False, no_figures=True)
    assert control == RunControl(threads=1, quiet=True, offline=False)  # --offline is not offered: its default


def test_gmts_probe_checks_its_options_once(monkeypatch, tmp_path):
    """validate_options ran on the parsed namespace and again on the job's ProbeConfig; now once, on the config."""
    import gmts_analysis.probing.validate as validate

    real, calls = validate.validate_options, []

    def counted(cfg):
        calls.append(type(cfg).__name__)
        return real(cfg)

    monkeypatch.setattr(validate, "validate_options", counted)
    rollouts = tmp_path / "r.jsonl"
    rollouts.write_text("")
    rc = main(["probe", "--model", "tiny", "--rollouts", str(rollouts), "--out", str(tmp_path / "run"),
               "--threads", "1", "-q", "--no-figures"])
    assert rc == 2  # an empty rollouts file, refused after the options were checked
    assert calls == ["ProbeConfig"]


def test_gmts_run_checks_its_options_once_before_sampling(monkeypatch, tmp_path):
    """gmts run checked the probe options before sampling and the job checked them again; now the job is made
    (and its options checked) once, before anything is sampled, and that job probes the sampled rows."""
    import gmts_analysis.probing.validate as validate
    import gmts_analysis.run.job as job_mod

    real, calls = validate.validate_options, []

    def counted(cfg):
        calls.append(type(cfg).__name__)
        return real(cfg)

    def no_sampling(*a, **k):
        raise AssertionError("sampled before the options were refused")

    monkeypatch.setattr(validate, "validate_options", counted)
    monkeypatch.setattr(job_mod, "sample_rows", no_sampling)
    rc = main(["run", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "2", "--num-generations", "2",
               "--loss-type", "cispo", "--out", str(tmp_path / "run"), "--threads", "1", "-q", "--no-figures"])
    assert rc == 2 and calls == ["ProbeConfig"]  # refused by the one check, nothing sampled
    calls.clear()
    monkeypatch.undo()
    monkeypatch.setattr(validate, "validate_options", counted)
    rc = main(["run", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "2", "--num-generations", "2",
               "--max-completion-length", "8", "--out", str(tmp_path / "ok"), "--threads", "1", "-q",
               "--no-figures", "--fidelity", "off"])
    assert rc == 0 and calls == ["ProbeConfig"]  # sampled and probed under the one check


@pytest.mark.parametrize("name", [c.replace("_", "-") for c in COMMANDS])
def test_every_subcommand_has_quiet_and_debug(name):
    """cli.py reads args.quiet and args.debug of every subcommand directly."""
    dests = {a.dest for a in _sub(build_parser(), name)._actions}
    assert {"quiet", "debug"} <= dests


def test_gmts_rl_help_names_a_score_arm_registered_after_import():
    """The description of gmts rl lists the arms when the parser is built, not when its module was imported."""
    import gmts_analysis.commands.rl  # noqa: F401 - imported before the score is registered
    from gmts_analysis.core import scores
    from gmts_analysis.core.scores import Score

    new = Score("entropy_cube", ("entropy",), lambda q: q["entropy"] ** 3, "cubed entropy (nats^3), a test score",
                arm=True, diagnostic=True, color="#654321")
    with scores.registered(new):
        assert "entropy_cube" in _sub(build_parser(), "rl").description
    assert "entropy_cube" not in _sub(build_parser(), "rl").description
