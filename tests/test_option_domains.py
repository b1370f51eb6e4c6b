"""Reliability, second pass (issue 22): one validation pass before any model work, for every
option of every subcommand. The test walks the argparse parsers themselves, so a new option
is either given an out-of-domain value here or listed with the reason it has none."""

from __future__ import annotations

import argparse

import pytest
from _adversarial import assert_one_line_error, assert_untouched, run_cli, snapshot

from gmts_analysis.cli import build_parser

# out-of-domain values by destination ("{file}": an existing regular file, "{missing}": a path
# that does not exist, "{under_file}": a path under a regular file)
BAD = {
    "seed": "-1", "temperature": "0", "rho": "0", "device": "tpu", "dtype": "float8", "num_prompts": "0",
    "group_size": "1", "max_new_tokens": "0", "answers_per_chunk": "0", "domains": "nope", "verifier": "no-such",
    "model": "{file}", "out": "{under_file}", "to": "{under_file}", "figures": "{under_file}", "prompts": "{missing}",
    "rollouts": "{missing}", "difficulty": "0", "batch_size": "0", "n_boot": "0", "max_answers": "0",
    "max_steps": "0", "lr": "-1", "prompts_per_domain": "0", "eval_every": "0", "eval_prompts": "0", "final_eval_prompts": "-1", "eval_seed": "-1",
    "diag_every": "-1", "diag_answers": "0", "threads": "0", "layers": "0", "prompt_len": "0", "naive_tokens": "1",
    "naive_full_max": "-1", "max_memory": "0", "lengths": "8,x", "probes": "1", "config": "{missing}",
    "clip_low": "1", "clip_high": "-0.5", "clip_ratio_c": "1", "kl_beta": "-1", "vllm_is_min": "-1",
    "vllm_is_max": "0", "max_len": "0", "chunk_size": "0", "num_generations": "0", "max_completion_length": "0",
    "steps": "x-y", "reward_columns": "a,,b", "reward_weights": "1,2", "loss_type": "cispo",
    "uncertain_below": "1.5", "plan": "{missing}", "update": "{missing}", "rewards": "{missing}",
    "base": "{file}", "exact_subset": "-1", "token_answers": "-1",
}
BAD_BY_COMMAND = {("bench", "probes"): "8,0", ("rl", "seed"): "-1", ("sample", "temperature"): "-0.5",
                  ("stats", "n_boot"): "-1", ("sample", "difficulty"): "4",
                  ("rl", "max_steps"): "-1"}

# options without an out-of-domain value, with the reason
NO_BAD_VALUE = {
    "models": "gmts bench --models: names or paths, each checked when it loads (a measurement tool)",
}


def _base(command: str, tmp) -> list[str]:
    run, r = str(tmp / "run"), str(tmp / "r.jsonl")
    return {
        "run": ["run", "--out", run], "sample": ["sample", "--out", str(tmp / "s.jsonl")],
        "probe": ["probe", "--model", "tiny", "--rollouts", r, "--out", run], "merge": ["merge", run],
        "stats": ["stats", run], "compare": ["compare", run, run], "figures": ["figures", run],
        "rl": ["rl", "--out", str(tmp / "rl.json")], "toy-train": ["toy-train", "--size", "tiny", "--out", str(tmp / "pol")],
        "bench": ["bench", "--out", str(tmp / "b")], "rl-report": ["rl-report", str(tmp / "data")],
        "series": ["series", str(tmp / "trl"), "--out", str(tmp / "audit")],
    }[command]


def _options():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sorted(sub.choices.items()):
        for a in sp._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or a.dest in ("help", "debug"):
                continue
            yield name, a


def _cases():
    for name, a in _options():
        flag = a.option_strings[-1] if a.option_strings[-1].startswith("--") else a.option_strings[0]
        if a.nargs == 0:  # a switch: on or off, both in its domain
            continue
        yield pytest.param(name, flag, a.dest, a.choices, id=f"{name}{flag}")


def test_option_domains_every_option_is_walked():
    """Every option taking a value has an out-of-domain value here, choices, or a listed reason."""
    missing = [f"{n} --{a.dest}" for n, a in _options() if a.nargs != 0 and a.choices is None
               and (n, a.dest) not in BAD_BY_COMMAND and a.dest not in BAD and a.dest not in NO_BAD_VALUE]
    assert not missing, missing


@pytest.mark.parametrize("command, flag, dest, choices", list(_cases()))
def test_option_domains_refused_before_the_model_loads(command, flag, dest, choices, tmp_path, monkeypatch):
    if dest in NO_BAD_VALUE and (command, dest) not in BAD_BY_COMMAND:
        pytest.skip(NO_BAD_VALUE[dest])

    def no_model(*a, **k):
        raise AssertionError(f"a model was loaded before {flag} was refused")

    monkeypatch.setattr("gmts_analysis.readers.models.load_model", no_model)
    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_model)
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2], "response_ids": [3, 4], "reward": 1.0}\n')
    (tmp_path / "a_file").write_text("x")
    value = "zzz-not-a-choice" if choices is not None else BAD_BY_COMMAND.get((command, dest), BAD[dest])
    value = value.format(file=tmp_path / "a_file", missing=tmp_path / "missing.yaml",
                         under_file=tmp_path / "a_file" / "x")
    argv = [*_base(command, tmp_path), flag, value]
    before = snapshot(tmp_path)
    line = assert_one_line_error(*run_cli(argv))
    names = {flag, flag.replace("_", "-"), "--" + dest.replace("_", "-")}
    assert any(n in line for n in names), (argv, line)
    assert_untouched(before, snapshot(tmp_path))


@pytest.mark.parametrize("argv", [["sample", "--temperature", "0"], ["sample", "--num-generations", "2"],
                                  ["stats", "--n-boot", "0"], ["sample", "--difficulty", "3"],
                                  ["rl", "--max-steps", "0"], ["rl", "--diag-every", "0"],
                                  ["run", "--domains", "word"], ["sample", "--domains", "word"],
                                  ["run", "--domains", "arithmetic,word"]])
def test_option_domains_edges_inside_the_domain_are_accepted(argv):
    from gmts_analysis.probing.validate import validate_namespace

    ns = build_parser().parse_args([argv[0], *(["RUN"] if argv[0] == "stats" else ["--out", "x.json"]), *argv[1:]])
    validate_namespace(argv[0], ns, _checks(argv[0]))


def _checks(command: str) -> dict:
    """The declared checks of ``gmts <command>``'s options (what ``gmts`` runs before any work)."""
    import argparse

    from gmts_analysis.options.parser import parser_checks

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return parser_checks(sub.choices[command])


def test_option_domains_word_problems_sample_but_do_not_train():
    """--domains word is a sampling world (gmts run, gmts sample) and not a training domain (gmts rl)."""
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.probing.validate import validate_namespace

    ns = build_parser().parse_args(["rl", "--out", "x.json", "--domains", "arithmetic", "word"])
    with pytest.raises(GmtsError, match=r"^--domains: unknown domain\(s\) word \(choose from arithmetic, program, logic\)$"):
        validate_namespace("rl", ns, _checks("rl"))


def test_option_domains_shared_by_the_api():
    """The Python API refuses the same values (rho, num_generations, ...) before it loads a model."""
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.options.config import ProbeOptions
    from gmts_analysis.probing.settings import ProbeSettings

    for kw, needle in (({"rho": 0.0}, "--rho"), ({"rho": 1.5}, "--rho"), ({"num_generations": 0}, "--num-generations"),
                       ({"max_completion_length": 0}, "--max-completion-length"), ({"steps": "a"}, "--steps"),
                       ({"reward_weights": "1"}, "--reward-weights"), ({"loss_type": "cispo"}, "loss_type=cispo")):  # core's check: the keyword
        with pytest.raises(GmtsError, match=needle):
            ProbeSettings.of(ProbeOptions(**kw))


def test_option_domains_api_probe_refuses_before_loading(monkeypatch, tmp_path):
    import gmts_analysis as gmts
    from gmts_analysis.errors import GmtsError

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the option was refused")

    monkeypatch.setattr("gmts_analysis.readers.models.load_model", no_model)
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2], "response_ids": [3, 4], "reward": 1.0}\n')
    for kw in ({"rho": 0.0}, {"num_generations": 0}, {"steps": "x"}):
        with pytest.raises(GmtsError):
            gmts.probe("tiny", str(tmp_path / "r.jsonl"), progress=False, **kw)


def test_option_domains_out_with_dotdot_leaves_no_stray_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2], "response_ids": [3, 4], "reward": 1.0}\n')
    assert_one_line_error(*run_cli(["probe", "--model", "tiny", "--rollouts", "r.jsonl", "--out", "nope/../run"]),
                          "nope")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.jsonl"]


# ---------------------------------------------------------------- 7. --config within limits

_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("name, content, needle", [
    ("bomb.yaml", _BOMB.encode(), "anchors"),
    ("alias.yaml", b"rho: &r 0.3\nclip_low: *r\n", "anchors"),
    ("utf16.yaml", "rho: 0.3\n".encode("utf-16"), "UTF-16"),
    ("latin1.yaml", "verifier: caf\xe9\n".encode("latin-1"), "not valid UTF-8"),
    ("deep.yaml", b"rho: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested deeper"),
    ("deepmap.yaml", b"".join(b"  " * i + b"k%d:\n" % i for i in range(40)) + b"  " * 40 + b"v\n", "nested deeper"),
    ("huge.yaml", b"# " + b"x" * (2 << 20) + b"\n", "larger than"),
    ("int.yaml", b"seed: " + b"9" * 5000 + b"\n", "digits"),
])
def test_config_limits_refused_in_one_line_with_bounded_memory(tmp_path, name, content, needle):
    import tracemalloc

    f = tmp_path / name
    f.write_bytes(content)
    tracemalloc.start()
    try:
        rc, err = run_cli(["probe", "--config", str(f), "--model", "tiny", "--rollouts", str(f), "--out",
                           str(tmp_path / "run")])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = assert_one_line_error(rc, err, needle)
    assert name in line
    assert peak < 64 * 2**20, peak
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 6. columns coerced or refused at read time


def _rows(**extra_by_row):
    import json

    rows = []
    for g in range(2):
        for j in range(2):
            i = 2 * g + j
            r = {"prompt_ids": [1, 5, 6], "response_ids": [7, 8, 9], "reward": float(j), "group_id": f"g{g}",
                 "answer_id": f"a{i}", "extra": 1}
            r.update({k: v[i] for k, v in extra_by_row.items()})
            rows.append(json.dumps(r) + "\n")
    return "".join(rows)


@pytest.mark.parametrize("name, content, needle", [
    ("mixed.jsonl", _rows(extra=[1, 2, "x", 4]), "column 'extra' is str here but int"),
    ("bigint.jsonl", _rows(extra=[1, 2, 3, 2**64]), "outside int64"),
])
def test_columns_at_read_time_refused_before_any_answer_is_probed(tiny_model_dirs, tmp_path, monkeypatch, name,
                                                                   content, needle):
    def no_probe(*a, **k):
        raise AssertionError("answers were probed before the bad column was refused")

    monkeypatch.setattr("gmts_analysis.run.sharding.run.probe_share", no_probe)
    f = tmp_path / name
    f.write_text(content)
    before = snapshot(tmp_path)
    line = assert_one_line_error(*run_cli(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(f),
                                           "--out", str(tmp_path / "run"), "--device", "cpu", "--quiet"]), needle)
    assert name in line
    assert_untouched(before, snapshot(tmp_path))


def test_columns_at_read_time_ids_beyond_int64_are_kept_as_strings(tiny_model_dirs, tmp_path):
    import pandas as pd

    f = tmp_path / "r.jsonl"
    f.write_text(_rows(answer_id=[2**64, 3, 4, 5], group_id=[2**70, 2**70, 1, 1]))
    out = tmp_path / "run"
    rc, err = run_cli(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(f), "--out", str(out),
                       "--device", "cpu", "--grad-norm", "none", "--fidelity", "off", "--no-figures", "--quiet"])
    assert rc == 0, err
    a = pd.read_parquet(out / "answers.parquet")
    assert a["answer_id"].tolist() == [str(2**64), "3", "4", "5"]
    assert set(pd.read_parquet(out / "tokens.parquet")["group_id"]) == {str(2**70), "1"}
