"""Reliability, second pass (issue 22): the fingerprint is derived, not listed."""

from __future__ import annotations

import dataclasses

import pytest

from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.run.sharding import state


def _another(f: dataclasses.Field, v):
    """A different valid-looking value of field ``f`` than ``v``."""
    choices = f.metadata.get("choices")
    if choices:
        return next(c for c in choices if c != v)
    if f.type in (bool, "bool"):
        return not v
    if f.type in (int, "int"):
        return 7 if v is None else v + 1
    if f.type in (float, "float"):
        return 0.5 if v is None else v / 2 + 0.01
    if f.type in (dict, "dict"):
        return {"--x": "y"}
    return "other" if v is None else f"{v}-other"


def _hash(cfg: ProbeConfig) -> str:
    return state.Fingerprint(model={"files": {}}, rollouts_sha256="0" * 64, config=state.result_config(cfg)).run_hash


BASE = ProbeConfig(model="tiny", rollouts="r.jsonl", out="run")


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(ProbeConfig)])
def test_fingerprint_is_derived_every_option_changes_it_or_is_listed_with_a_reason(name):
    f = next(f for f in dataclasses.fields(ProbeConfig) if f.name == name)
    other = dataclasses.replace(BASE, **{name: _another(f, getattr(BASE, name))})
    if name in state.NOT_IN_FINGERPRINT:
        assert len(state.NOT_IN_FINGERPRINT[name]) > 20  # a reason, not a placeholder
        assert _hash(other) == _hash(BASE)
    else:
        assert _hash(other) != _hash(BASE), f"--{name} changes results but not the fingerprint"


@pytest.mark.parametrize("name", ["num_generations", "reward_columns", "reward_weights", "steps", "chat_template",
                                  "max_completion_length", "rho"])
def test_fingerprint_is_derived_covers_the_options_issue_22_found_missing(name):
    assert name not in state.NOT_IN_FINGERPRINT
    f = next(f for f in dataclasses.fields(ProbeConfig) if f.name == name)
    assert _hash(dataclasses.replace(BASE, **{name: _another(f, getattr(BASE, name))})) != _hash(BASE)


def test_fingerprint_is_derived_the_cannot_change_list_names_real_fields():
    names = {f.name for f in dataclasses.fields(ProbeConfig)}
    assert set(state.NOT_IN_FINGERPRINT) <= names
    assert set(state.FINISH_FIELDS) <= set(state.NOT_IN_FINGERPRINT)


def test_fingerprint_is_derived_a_finished_run_with_other_finishing_is_not_complete(tiny_model_dirs, tmp_path):
    from _adversarial import assert_one_line_error, run_cli
    from _sharding_helpers import write_rollouts

    r = write_rollouts(tmp_path / "r.jsonl", sizes=(2, 2))
    argv = ["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(tmp_path / "run"),
            "--device", "cpu", "--grad-norm", "none", "--no-figures", "--quiet", "--fidelity", "off"]
    assert run_cli(argv)[0] == 0
    rc, err = run_cli(argv)
    assert rc == 0 and "already complete" in err
    assert_one_line_error(*run_cli([*argv[:-2], "--fidelity", "on"]), "--fidelity off -> on", "--overwrite")
    assert_one_line_error(*run_cli([*argv, "--rho", "0.3"]), "--rho 0.2 -> 0.3")
