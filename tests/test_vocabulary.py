"""One vocabulary for every subcommand and the API (issue 23): the parsers are derived from the
option dataclasses, each concept has one name (TRL's where TRL has it) with its aliases, the same
defaults in the CLI and the API, --threads everywhere, examples in --help, and errors that name
an option as the caller spelled it."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from gmts_analysis.cli import as_spelled, build_parser, main
from gmts_analysis.commands.run import TOY_DEFAULTS as RUN_WORLD_DEFAULTS
from gmts_analysis.options import ALIAS_BY_NAME, ALIASES
from gmts_analysis.options.config import JobSettings, OutputOptions, ProbeConfig, RunControl, SamplingOptions
from gmts_analysis.sampling import domains as sampling_domains

COMMANDS = ["run", "sample", "probe", "merge", "stats", "compare", "figures", "rl", "rl-report", "toy-train", "bench"]
#: the subcommands whose every option is a dataclass field
DERIVED = {"sample": (SamplingOptions, OutputOptions, RunControl), "run": (SamplingOptions, ProbeConfig, RunControl),
           "probe": (ProbeConfig,)}
#: TRL's names that are our primary names, and where
TRL_PRIMARY = {"num_generations": ("sample", "run", "probe", "rl"),
               "max_completion_length": ("sample", "run", "probe", "rl"),
               "loss_type": ("run", "probe")}
#: TRL's names that are aliases of ours, and where each must be accepted
TRL_ALIASES = {"output_dir": ("sample", "run", "probe", "compare"), "epsilon": ("run", "probe"),
               "beta": ("run", "probe"), "top_entropy_quantile": ("run", "probe", "rl"),
               "model_name_or_path": ("sample", "run", "probe", "rl")}


@pytest.fixture(scope="module")
def parsers() -> dict[str, argparse.ArgumentParser]:
    root = build_parser()
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    return {name: sub.choices[name] for name in COMMANDS}


def _options(p: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in p._actions if a.option_strings and a.dest not in ("help", "debug")]


def _primary(a: argparse.Action) -> str:
    return max((s for s in a.option_strings if s.startswith("--")), key=len)


def test_each_concept_has_one_name_everywhere(parsers):
    names: dict[str, set[str]] = {}
    for cmd, p in parsers.items():
        for a in _options(p):
            flag = _primary(a)
            if isinstance(a, argparse._StoreFalseAction) and flag == "--no-" + a.dest.replace("_", "-"):
                continue  # the off switch of a concept (--no-figures)
            assert flag == "--" + a.dest.replace("_", "-"), f"gmts {cmd}: {flag} sets {a.dest}"
            # an alias name is never a primary one
            assert a.dest not in ALIAS_BY_NAME, f"gmts {cmd}: {flag} is an alias name, not a primary one"
            names.setdefault(a.dest, set()).add(flag)
    for dest, flags in names.items():
        assert len(flags) == 1, f"{dest} is spelled {sorted(flags)}"
    for name, cmds in TRL_PRIMARY.items():
        for cmd in cmds:
            assert name in {a.dest for a in _options(parsers[cmd])}, f"gmts {cmd}: no --{name}"


def test_derived_subcommands_come_from_the_dataclasses(parsers):
    for cmd, classes in DERIVED.items():
        fields = {}
        for cls in classes:
            for f in dataclasses.fields(cls):
                fields.setdefault(f.name, f)
        for a in _options(parsers[cmd]):
            if a.dest == "config":  # --config FILE.yaml (the parser's own)
                continue
            assert a.dest in fields, f"gmts {cmd}: --{a.dest} is not a field of {[c.__name__ for c in classes]}"
            f = fields[a.dest]
            if f.metadata.get("required") or (cmd, a.dest) in (("run", "domains"),):
                continue
            if cmd == "run" and a.dest in RUN_WORLD_DEFAULTS:  # chosen by world (toy or word) when not given
                assert a.default is None
                if f.default is not None:
                    assert RUN_WORLD_DEFAULTS[a.dest] == f.default, f"gmts run: toy default of --{a.dest}"
                continue
            assert a.default == f.default, f"gmts {cmd}: --{a.dest} default {a.default!r} != {f.default!r}"


def test_aliases_accepted_everywhere_their_option_is(parsers):
    for cmd, p in parsers.items():
        valued = {a.dest for a in _options(p)
                  if not isinstance(a, (argparse._StoreTrueAction, argparse._StoreFalseAction))}
        for al in ALIASES:  # every alias (TRL, verl, our old names) wherever its option takes a value
            if al.dest in valued:
                assert "--" + al.name in p._option_string_actions, f"gmts {cmd}: --{al.name} not accepted"
    for name, cmds in TRL_ALIASES.items():
        for cmd in cmds:
            assert "--" + name in parsers[cmd]._option_string_actions, f"gmts {cmd}: --{name} not accepted"


def test_threads_and_examples_on_every_subcommand(parsers):
    for cmd, p in parsers.items():
        assert "--threads" in p._option_string_actions, cmd
        ep = p.epilog or ""
        assert ep.startswith("examples:"), cmd
        n = sum(1 for line in ep.splitlines() if line.strip().startswith(f"gmts {cmd}"))
        assert 2 <= n <= 3, (cmd, n)
        assert "examples:\n  gmts " in p.format_help()


def test_sample_defaults_are_the_apis():
    import inspect

    import gmts_analysis.api as api

    sig = inspect.signature(api.sample)  # the API takes SamplingOptions' fields as keywords: one set of defaults
    assert "options" in sig.parameters and sig.parameters["options"].kind is inspect.Parameter.VAR_KEYWORD
    opts = sampling_domains.sampling_options("tiny", None, {"group_size": 4, "max_new_tokens": 16})
    assert (opts.num_generations, opts.max_completion_length, opts.device, opts.temperature) == (4, 16, "auto", 1.0)
    assert opts.domains == "arithmetic,program,logic"
    assert dataclasses.replace(opts, num_generations=8, max_completion_length=None, model="small",
                               domains=None) == SamplingOptions()
    with pytest.raises(Exception, match="did you mean 'num_prompts'"):
        sampling_domains.sampling_options("tiny", None, {"num_prompt": 2})


def test_job_settings_out_not_required():
    f = next(f for f in dataclasses.fields(JobSettings) if f.name == "out")
    assert not f.metadata.get("required") and "output_dir" in f.metadata["help"]


def test_errors_name_the_option_as_spelled():
    from gmts_analysis.api import api_spelling

    msg = "--loss-type dr_grpo divides by TRL's max_completion_length: pass --max-completion-length (or --max-len)"
    assert api_spelling(msg) == ("loss_type=dr_grpo divides by TRL's max_completion_length: pass "
                                 "max_completion_length= (or max_len=)")
    assert api_spelling("pass --kl-beta 0 to probe") == "pass kl_beta=0 to probe"
    assert api_spelling("pass --truncate to cut") == "pass truncate=True to cut"
    assert api_spelling("--num-generations: must be a positive integer") == "num_generations: must be a positive integer"
    assert api_spelling("gmts run --foo") == "gmts run --foo"
    assert as_spelled("--num-generations must be >= 2", ["sample", "--group_size", "1"]) == "--group_size must be >= 2"
    assert as_spelled("--num-generations must be >= 2", ["sample", "--num_generations=1"]) == \
        "--num_generations must be >= 2"
    assert as_spelled("--out x: exists", ["sample", "--output_dir", "x"]) == "--output_dir x: exists"


def test_cli_error_as_typed(capsys):
    assert main(["sample", "--model", "tiny", "--domains", "arithmetic", "--group_size", "1", "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "gmts: error: --group_size: must be an integer >= 2 (a group needs a baseline), got 1"


def test_threads_default_and_checks(monkeypatch):
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.util.threads import available_cores, check_threads, default_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("GMTS_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.delenv("GMTS_THREADS")
    assert default_threads() == 2  # an explicit OpenMP setting (torchrun's 1 per process) is kept
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr("gmts_analysis.util.threads.busy_cores_now", lambda: None)  # no /proc/stat
    monkeypatch.setattr("os.getloadavg", lambda: (0.0, 0.0, 0.0))
    assert default_threads() == available_cores()
    monkeypatch.setattr("os.getloadavg", lambda: (1e6, 0.0, 0.0))  # every core busy: one thread, never zero
    assert default_threads() == 1
    for bad in (0, -1, "two", 1.5, True):
        with pytest.raises(GmtsError, match="threads"):
            check_threads(bad)


def test_library_sets_no_threads_on_import():
    import subprocess
    import sys

    code = ("import torch; n = torch.get_num_threads(); import gmts_analysis, gmts_analysis.api, "
            "gmts_analysis.options.config, gmts_analysis.util.threads, gmts_analysis.probing.kernel; "
            "assert torch.get_num_threads() == n, (n, torch.get_num_threads())")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sample_trl_names_and_output_dir(tmp_path, monkeypatch):
    """The issue's command: gmts sample --num_generations 4 --max_completion_length 48 --output_dir x."""
    monkeypatch.chdir(tmp_path)
    rc = main(["sample", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "1", "--num_generations", "4",
               "--max_completion_length", "48", "--output_dir", "x", "--threads", "1", "-q"])
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "x" / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(len(r["response_ids"]) <= 48 for r in rows)


def test_api_probe_records_trl_names(tmp_path):
    import gmts_analysis as gmts
    from gmts_analysis.errors import GmtsError

    rows = gmts.sample("tiny", "arithmetic", num_prompts=1, num_generations=2, max_completion_length=8,
                       progress=False)
    for i, r in enumerate(rows):
        r["reward"] = float(i % 2)
    with pytest.raises(GmtsError) as e:
        gmts.probe("tiny", rows, loss_type="dr_grpo", progress=False)
    assert "max_completion_length=" in str(e.value) and "--" not in str(e.value)
    run = gmts.probe("tiny", rows, loss_type="dr_grpo", max_completion_length=256, epsilon=0.3, fidelity="off",
                     device="cpu", progress=False, threads=1)
    assert run.manifest["aliases"] == {"loss_type": "loss_type", "max_completion_length": "max_completion_length",
                                       "epsilon": "clip_low"}
    assert run.manifest["torch_threads"] == 1


def test_uncached_hub_id_fails_fast_in_one_line(monkeypatch):
    """A hub id that is not cached, with no network: one line, no download attempt (no retry storm)."""
    import transformers

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.readers import models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)

    def no_download(*a, **k):
        raise AssertionError("from_pretrained called: the hub would be contacted")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_download)
    with pytest.raises(GmtsError) as e:
        models.load_model("someorg/not-cached-model")
    msg = str(e.value)
    assert "\n" not in msg and "not in the local Hugging Face cache" in msg and "cannot be reached" in msg


def test_intervals_from_few_groups_warn(caplog):
    import logging

    from gmts_analysis.run.stats_job import warn_few_groups

    with caplog.at_level(logging.WARNING, logger="gmts_analysis.analysis.stats"):
        assert warn_few_groups({"meta": {"n_groups": 2, "n_boot": 1000, "ci_unit": "group"}})
    assert "from 2 group(s), fewer than 10" in caplog.text
    assert not warn_few_groups({"meta": {"n_groups": 24, "n_boot": 1000}})
    assert not warn_few_groups({"meta": {"n_groups": 2, "n_boot": 0}})  # no intervals, nothing to warn about


@pytest.mark.parametrize("api_kw, cli_flags, api_msg, cli_msg", [
    ({"loss_type": "dr_grpo"}, ["--loss-type", "dr_grpo"],
     "loss_type=dr_grpo divides by TRL's max_completion_length: pass max_completion_length= (or max_len=)",
     "--loss-type dr_grpo divides by TRL's max_completion_length: pass --max-completion-length (or --max-len)"),
    ({"advantage": "logged"}, ["--advantage", "logged"],
     "advantage=logged: 4 answer(s) have no finite logged advantage (first: row 0)",
     "--advantage logged: 4 answer(s) have no finite logged advantage (first: row 0)"),
])
def test_formula_errors_name_the_keyword_in_the_api_and_the_flag_in_the_cli(tmp_path, capsys, api_kw, cli_flags,
                                                                           api_msg, cli_msg):
    """The formula code (core/) names a setting by its keyword; the same bad value names the keyword through
    the API and the flag through the CLI."""
    from conftest import make_rollouts

    import gmts_analysis as gmts
    from gmts_analysis.errors import GmtsError

    rollouts = make_rollouts(tmp_path / "r.jsonl", n_groups=2, group_size=2, seed=1)
    with pytest.raises(GmtsError) as e:
        gmts.probe("tiny", str(rollouts), progress=False, grad_norm="none", fidelity="off", **api_kw)
    assert str(e.value) == api_msg
    argv = ["probe", "--model", "tiny", "--rollouts", str(rollouts), "--out", str(tmp_path / "p"), "--device", "cpu",
            "--grad-norm", "none", "--fidelity", "off", "--no-figures", "--quiet", *cli_flags]
    assert main(argv) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("gmts: error:")]
    assert errors == [f"gmts: error: {cli_msg}"]


def test_trainer_errors_name_the_field_and_the_cli_its_flag():
    """gmts rl's trainer configuration (rl/config) names its fields; the CLI layer writes gmts rl's flags for them
    (each field has its flag's name: max_steps is --max-steps, model --model, num_generations --num-generations)."""
    from gmts_analysis.cli import flag_spelling, keyword_flags
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.rl.config import RLConfig

    flags = keyword_flags(build_parser(), "rl")
    for cfg, api_msg, cli_msg in [
        (RLConfig(rho=1.5), "rho=1.5: must be in (0, 1]", "--rho 1.5: must be in (0, 1]"),
        (RLConfig(max_steps=-1), "max_steps=-1: must be >= 0", "--max-steps -1: must be >= 0"),
        (RLConfig(num_generations=1), "num_generations=1: must be >= 2", "--num-generations 1: must be >= 2"),
        (RLConfig(selection="best"), "selection: unknown 'best' (choose from ",
         "--selection: unknown 'best' (choose from "),
    ]:
        with pytest.raises(GmtsError) as e:
            cfg.check()
        assert str(e.value).startswith(api_msg) and "--" not in str(e.value)
        assert flag_spelling(str(e.value), flags).startswith(cli_msg)
    assert flag_spelling("model=x: the checkpoint ships no tokenizer", flags) == \
        "--model x: the checkpoint ships no tokenizer"
    assert flag_spelling("see TRL's max_completion_length: rho and a=b", flags) == \
        "see TRL's max_completion_length: rho and a=b"  # only keywords, only as keywords
