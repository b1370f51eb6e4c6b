"""Adversarial inputs through ``gmts probe`` in-process (issue 13).

For every input, one of two outcomes and nothing else:

- exit 2 with exactly one stderr line ``gmts: error: ...`` (the last line), no traceback; or
- exit 0 with a finished run whose float columns are all finite (``grad_norm(_logp)`` may be
  NaN under ``--grad-norm none``, ``rsi`` where the entropy is 0, by definition; answers.parquet's
  extra columns carry the rollouts' own fields as given);

and in both cases no file outside ``--out`` is created, changed or removed (the temporary
directory holding the inputs is snapshotted before and after).

Two parts: a table of named cases (the inputs of issue 13 and more: bad bytes, deep or huge
JSON, bad ids, rewards and log-probs, steps, 50 MB of text, bad options, models and output
locations), and a property-based generator (hypothesis) over the rollouts schema. Bounded:
the shipped ``tiny`` policy (0.45M parameters), ``--grad-norm none``, no fidelity, no figures.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest
from _adversarial import assert_finite_run, assert_one_line_error, assert_untouched, run_cli, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

MODEL = "tiny"  # shipped policy: Qwen2, vocabulary 100, context 256, a character tokenizer
FAST = ["--device", "cpu", "--grad-norm", "none", "--fidelity", "off", "--no-figures", "--quiet"]
OK, ERR, ANY = "ok", "error", "any"


def _rows(*rows: dict) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _pair(**over: Any) -> bytes:
    """Two answers of one group (ids), with ``over`` applied to both."""
    a = {"prompt_ids": [1, 6, 77], "response_ids": [7, 8, 9], "reward": 1.0, "group_id": "g", "answer_id": "a"}
    b = {"prompt_ids": [1, 6, 77], "response_ids": [9, 8], "reward": 0.0, "group_id": "g", "answer_id": "b"}
    return _rows({**a, **over}, {**b, **over})


def _text_pair(response: str = "2", **over: Any) -> bytes:
    a = {"prompt": "1+1=", "response": response, "reward": 1.0, "group_id": 0, **over}
    b = {"prompt": "1+1=", "response": "3", "reward": 0.0, "group_id": 0}
    return _rows(a, b)


def _parquet_bytes() -> bytes:
    import io

    buf = io.BytesIO()
    pd.DataFrame([json.loads(x) for x in _pair().decode().splitlines()]).to_parquet(buf, index=False)
    return buf.getvalue()


VALID = _pair()

# name -> (rollouts bytes, or a callable(tmp) -> rollouts path; extra args; expected outcome; needle in the error)
CASES: dict[str, tuple[bytes | Callable[[Path], Path], list[str], str, str]] = {
    # --- the file itself
    "valid_ids": (VALID, [], OK, ""),
    "valid_text": (_text_pair(), [], OK, ""),
    "empty_file": (b"", [], ERR, "r.jsonl"),
    "blank_lines": (b"\n\n  \n", [], ERR, "r.jsonl"),
    "nul_bytes": (b"\x00" * 64, [], ERR, "r.jsonl"),
    "binary_garbage": (bytes(range(256)) * 4, [], ERR, "r.jsonl"),
    "invalid_utf8": (b'{"prompt": "1+1=", "response": "\xff\xfe2", "reward": 1}\n', [], ERR, "r.jsonl"),
    "utf16": (_text_pair().decode().encode("utf-16"), [], ANY, ""),
    "utf8_bom": (b"\xef\xbb\xbf" + VALID, [], OK, ""),
    "crlf": (VALID.replace(b"\n", b"\r\n"), [], OK, ""),
    "truncated_last_line": (VALID[:-10], [], ERR, "r.jsonl"),
    "deep_json_list": (b"[" * 100_000 + b"]" * 100_000 + b"\n", [], ERR, "r.jsonl"),
    "deep_json_object": (b'{"prompt_ids": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", [], ERR, "r.jsonl"),
    "huge_int_literal": (b'{"prompt_ids": [1, 1' + b"0" * 5000 + b'], "response_ids": [7], "reward": 1}\n', [], ERR,
                         "r.jsonl"),
    "huge_int_reward": (b'{"prompt_ids": [1], "response_ids": [7], "reward": 1' + b"0" * 400 + b"}\n", [], ERR,
                        "r.jsonl"),
    "json_scalars": (b"1\n2\n", [], ERR, "r.jsonl"),
    "json_list_of_ints": (b"[1, 2, 3]", [], ERR, "r.jsonl"),
    "top_level_object": (b'{"rows": []}\n', [], ERR, "r.jsonl"),
    "parquet_named_jsonl": (_parquet_bytes(), [], OK, ""),
    "parquet_truncated": (lambda d: _write(d / "r.parquet", _parquet_bytes()[:-40]), [], ERR, "r.parquet"),
    "rollouts_is_a_directory": (lambda d: _mkdir(d / "rdir"), [], ERR, "rdir"),
    "rollouts_missing": (lambda d: d / "nope.jsonl", [], ERR, "nope.jsonl"),
    # --- text
    "lone_surrogate_prompt": (_rows({"prompt": "\ud800", "response": "2", "reward": 1.0, "group_id": 0},
                                    {"prompt": "\ud800", "response": "3", "reward": 0.0, "group_id": 0}), [], ANY, ""),
    "lone_surrogate_response": (_text_pair("\udfff"), [], ANY, ""),
    "bidi_and_controls_in_text": (_text_pair("2\u202e\u2066\x00\x1b"), [], OK, ""),
    "text_50mb": (lambda d: _write(d / "r.jsonl", _text_pair("7" * 50_000_000)), [], ERR, "r.jsonl"),
    "text_longer_than_context": (_text_pair("7" * 300), [], ERR, "context"),
    "text_longer_than_context_truncate": (_text_pair("7" * 300), ["--truncate"], OK, ""),
    "empty_response_text": (_text_pair(""), [], ANY, ""),
    "prompt_not_text": (_text_pair(prompt=12), [], ERR, "prompt"),
    # --- ids
    "ids_negative": (_pair(response_ids=[7, -1]), [], ERR, "response_ids"),
    "ids_out_of_vocab": (_pair(response_ids=[7, 100]), [], ERR, "response_ids"),
    "ids_huge": (_pair(response_ids=[7, 2**70]), [], ERR, "response_ids"),
    "ids_float": (_pair(response_ids=[7.0, 8.5]), [], ERR, "response_ids"),
    "ids_bool": (_pair(response_ids=[True, 8]), [], ERR, "response_ids"),
    "ids_nested": (_pair(response_ids=[[7], [8]]), [], ERR, "response_ids"),
    "ids_string": (_pair(response_ids="789"), [], ERR, "response_ids"),
    "empty_prompt_ids": (_pair(prompt_ids=[]), [], ERR, "prompt"),
    "all_responses_empty": (_pair(response_ids=[]), [], ERR, ""),
    "too_long_for_context": (_pair(response_ids=[7] * 300), [], ERR, "context"),
    "missing_response": (_rows({"prompt_ids": [1], "reward": 1.0}), [], ERR, "response"),
    "duplicate_answer_id": (_pair(answer_id="same"), [], ERR, "answer_id"),
    "answer_id_object": (_pair(answer_id={"a": 1}), [], ANY, ""),
    "group_id_list": (_pair(group_id=[1, 2]), [], ANY, ""),
    # --- rewards, log-probs, steps
    "reward_missing": (_rows({"prompt_ids": [1], "response_ids": [7]}), [], ERR, "reward"),
    "reward_string": (_pair(reward="1"), [], ERR, "reward"),
    "reward_bool": (_pair(reward=True), [], ERR, "reward"),
    "reward_nan_literal": (VALID.replace(b'"reward": 1.0', b'"reward": NaN'), [], ANY, ""),
    "reward_infinity_literal": (VALID.replace(b'"reward": 1.0', b'"reward": Infinity'), [], ERR, "reward"),
    "reward_pm_1e308": (VALID.replace(b'"reward": 1.0', b'"reward": 1e308').replace(b'"reward": 0.0',
                                                                                    b'"reward": -1e308'), [], ERR, "reward"),
    "reward_1e300": (VALID.replace(b'"reward": 1.0', b'"reward": 1e300'), [], ANY, ""),
    "old_logprobs_-1e308": (_pair(response_ids=[7, 8], old_logprobs=[-1e308, -1.0]), [], ERR, "old_logprobs"),
    "old_logprobs_positive": (_pair(response_ids=[7, 8], old_logprobs=[0.5, -1.0]), [], ERR, "old_logprobs"),
    "old_logprobs_wrong_length": (_pair(response_ids=[7, 8], old_logprobs=[-1.0]), [], ERR, "old_logprobs"),
    "old_logprobs_strings": (_pair(response_ids=[7, 8], old_logprobs=["a", "b"]), [], ERR, "old_logprobs"),
    "ref_logprobs_nan": (_pair(response_ids=[7, 8]).replace(b'"reward"', b'"ref_logprobs": [NaN, -1], "reward"'),
                         [], ERR, "ref_logprobs"),
    "step_mixed_types": (_rows({**json.loads(_pair().decode().splitlines()[0]), "step": 1},
                               {**json.loads(_pair().decode().splitlines()[1]), "step": "one"}), [], ANY, ""),
    "step_list": (_pair(step=[1, 2]), [], ANY, ""),
    "step_float": (_pair(step=1.5), [], ANY, ""),
    # --- options
    **{f"option_{flag[2:]}_{v}": (VALID, [flag, v], ERR, flag) for flag, v in [
        ("--temperature", "0"), ("--temperature", "nan"), ("--temperature", "-1"), ("--temperature", "inf"),
        ("--clip-low", "-5"), ("--clip-high", "1.5"), ("--kl-beta", "nan"), ("--max-len", "0"),
        ("--probes", "0"), ("--chunk-size", "0"), ("--answers-per-chunk", "0"), ("--seed", "-1"),
        ("--device", "meta"), ("--device", "mps"), ("--device", "cuda:99"), ("--verifier", "no_such_verifier"),
    ]},
    "option_format_unknown": (VALID, ["--format", "csv"], ERR, "--format"),
    # --- models
    "model_is_a_file": (VALID, ["--model", "@r.jsonl"], ERR, "--model"),
    "model_missing_dir": (VALID, ["--model", "@no_such_model_dir"], ERR, "--model"),
    "model_dir_without_config": (VALID, ["--model", "@empty_dir"], ERR, "config.json"),
    "model_bert_mlm": (VALID, ["--model", "$bert_mlm"], ERR, "not a causal"),
    "model_nan_weights": (VALID, ["--model", "$nan"], ERR, "every answer failed"),
    # --- output locations
    "out_under_a_file": (VALID, ["--out", "@r.jsonl/run"], ERR, "is a file"),
    "out_is_a_file": (VALID, ["--out", "@r.jsonl"], ERR, "not a directory"),
    "out_holds_the_rollouts": (lambda d: _write(d / "run" / "r.jsonl", VALID), ["--overwrite"], ERR, "inside --out"),
    "out_foreign_overwrite": (VALID, ["--out", "@foreign", "--overwrite"], ERR, "did not write"),
    "out_unwritable": (VALID, ["--out", "/proc/gmts-no-such/run"], ERR, ""),
    "out_dangling_symlink": (lambda d: _link(d / "dang", d / "nowhere", d), ["--out", "@dang"], ERR, "does not exist"),
    "out_under_dangling_symlink": (lambda d: _link(d / "dang", d / "nowhere", d), ["--out", "@dang/run"], ERR,
                                   "does not exist"),
    "out_symlink_to_empty_dir": (lambda d: _link(d / "lk", _mkdir(d / "real"), d), ["--out", "@lk"], ERR,
                                 "symbolic link"),
}


def _write(p: Path, data: bytes) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(data)
    return p


def _link(link: Path, target: Path, d: Path) -> Path:
    """``link`` -> ``target`` beside valid rollouts; returns the rollouts."""
    link.symlink_to(target)
    return _write(d / "r.jsonl", VALID)


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


@pytest.fixture(scope="module")
def fuzz_models(tmp_path_factory):
    """Checkpoints for the model cases: a BertForMaskedLM config (refused from its config alone;
    test_reliability.py loads real encoder weights), and the tiny policy with NaN weights."""
    from safetensors.torch import load_file, save_file

    from gmts_analysis.readers.models import resolve_model_path

    root = tmp_path_factory.mktemp("fuzz_models")
    (root / "bert_mlm").mkdir()
    (root / "bert_mlm" / "config.json").write_text(json.dumps({
        "architectures": ["BertForMaskedLM"], "model_type": "bert", "vocab_size": 100, "hidden_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64}))
    nan = root / "nan"
    nan.mkdir()
    for f in Path(resolve_model_path("tiny")).iterdir():
        if f.is_file():
            (nan / f.name).write_bytes(f.read_bytes())
    w = load_file(nan / "model.safetensors")
    key = next(k for k in w if k.endswith("norm.weight"))
    w[key][:] = float("nan")
    save_file(w, nan / "model.safetensors", metadata={"format": "pt"})
    return {"bert_mlm": root / "bert_mlm", "nan": nan}


def check_outcome(argv: list[str], root: Path, out: Path, expect: str = ANY, needle: str = "") -> tuple[int, str]:
    """Run ``gmts argv`` and assert the contract of this file; returns ``(rc, stderr)``."""
    before = snapshot(root, skip=out)
    rc, err = run_cli(argv)
    assert "Traceback" not in err, err[-3000:]
    assert rc in (0, 2), (rc, err[-3000:])
    if rc == 2:
        assert_one_line_error(rc, err, needle)
    else:
        assert_finite_run(out, grad_norm_none="none" in argv)
    assert_untouched(before, snapshot(root, skip=out))
    if expect != ANY:
        assert rc == (0 if expect == OK else 2), (expect, err[-2000:])
    return rc, err


@pytest.mark.parametrize("name", list(CASES))
def test_adversarial_case(name, tmp_path, fuzz_models):
    content, extra, expect, needle = CASES[name]
    (tmp_path / "empty_dir").mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    r = content(tmp_path) if callable(content) else _write(tmp_path / "r.jsonl", content)
    args = {"--model": MODEL, "--rollouts": str(r), "--out": str(tmp_path / "run")}
    rest = list(extra)
    for flag in ("--model", "--out"):
        if flag in rest:
            v = rest[rest.index(flag) + 1]
            args[flag] = (str(tmp_path / v[1:]) if v.startswith("@") else
                          str(fuzz_models[v[1:]]) if v.startswith("$") else v)
            del rest[rest.index(flag):rest.index(flag) + 2]
    argv = ["probe", *(x for kv in args.items() for x in kv), *FAST, *rest]
    out = Path(args["--out"])
    t0 = time.perf_counter()
    check_outcome(argv, tmp_path, out if out.is_relative_to(tmp_path) else tmp_path / "run", expect, needle)
    assert time.perf_counter() - t0 < 60, "an adversarial input must cost seconds, not minutes"


# ---------------------------------------------------------------- property-based: the rollouts schema

_texts = st.text(max_size=8) | st.sampled_from(["1+1=", "\ud800", "\u202e2", "", "7" * 300])
_ids = st.lists(st.integers(-3, 104) | st.sampled_from([2**63, -(2**63)]), max_size=6)
_floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([1e308, -1e308, 0.0, 1.0, -0.5])
_scalars = (st.none() | st.booleans() | st.integers(-(10**20), 10**20) | _floats | _texts
            | st.lists(st.integers(0, 9), max_size=3) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_OVERRIDES = {
    "prompt": _texts | _scalars, "response": _texts | _scalars, "prompt_ids": _ids | _scalars,
    "response_ids": _ids | _scalars, "reward": _floats | _scalars, "group_id": _scalars, "answer_id": _scalars,
    "step": _scalars, "domain": _scalars, "old_logprobs": st.lists(_floats, max_size=4) | _scalars,
    "ref_logprobs": st.lists(_floats, max_size=4) | _scalars, "extra_field": _scalars,
}


@st.composite
def rollouts_rows(draw) -> list[dict]:
    """1-5 rows: valid id rows (so that runs often finish) with random fields overridden or removed."""
    rows = []
    for i in range(draw(st.integers(1, 5))):
        row: dict[str, Any] = {"prompt_ids": [1, 6, 77], "response_ids": draw(st.lists(st.integers(4, 99), min_size=1,
                                                                                        max_size=4)),
                               "reward": float(draw(st.integers(0, 1))), "group_id": i % 2}
        row.update(draw(st.fixed_dictionaries({}, optional=_OVERRIDES)))
        for k in draw(st.lists(st.sampled_from(sorted(row)), max_size=1)):
            row.pop(k, None)
        rows.append(row)
    return rows


_OPTIONS = st.sampled_from([[], [], [], ["--truncate"], ["--advantage", "batch"], ["--loss-agg", "seq-mean-token-sum-norm"],
                            ["--kl-beta", "0.1"], ["--clip-low", "0.999"], ["--temperature", "1e-30"],
                            ["--temperature", "1e30"], ["--max-len", "1"], ["--answers-per-chunk", "1"]])


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=rollouts_rows(), options=_OPTIONS)
def test_random_rollouts_finish_finite_or_fail_in_one_line(rows, options):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        r = root / "r.jsonl"
        r.write_text("".join(json.dumps(x) + "\n" for x in rows), encoding="utf-8", errors="surrogatepass")
        out = root / "run"
        check_outcome(["probe", "--model", MODEL, "--rollouts", str(r), "--out", str(out), *FAST, *options],
                      root, out)


# ---------------------------------------------------------------- command sequences over one directory tree (issue 22)
#
# Generated sequences of gmts commands (probe, probe killed after a chunk, probe failing late with
# a full disk, rerun with changed options, --overwrite, stats, compare, sample) over one tree that
# also holds the user's files and directories that look like ours. After every step: no byte
# outside the step's named outputs changed (the named --out, its own hidden siblings, the files
# it names), the look-alikes are intact, and every finished run is internally consistent.

_SEQ_RUNS = ("A", "B")
_SEQ_OPTIONS = ([], ["--temperature", "0.5"], ["--rho", "0.3"], ["--advantage", "batch"])
_SEQ_STEP = st.one_of(
    st.tuples(st.just("probe"), st.sampled_from(_SEQ_RUNS), st.sampled_from(range(len(_SEQ_OPTIONS))),
              st.booleans()),
    st.tuples(st.just("killed"), st.sampled_from(_SEQ_RUNS), st.sampled_from(range(len(_SEQ_OPTIONS))),
              st.booleans()),
    st.tuples(st.just("disk_full"), st.sampled_from(_SEQ_RUNS), st.sampled_from(range(len(_SEQ_OPTIONS))),
              st.just(True)),
    st.tuples(st.just("stats"), st.sampled_from(_SEQ_RUNS), st.just(0), st.booleans()),
    st.tuples(st.just("compare"), st.just("A"), st.just(0), st.just(False)),
    st.tuples(st.just("sample"), st.just("A"), st.just(0), st.just(False)),
)


def _plant_user_tree(root: Path) -> list[Path]:
    (root / "notes.txt").write_text("the user's notes")
    planted = []
    for name in (".A.AbCd1234.partial", ".A.gmts-old-deadbeef", ".A.gmts-work-0badf00d", ".B.gmts-next",
                 ".B.gmts-sample", "estimators.csv"):
        p = root / name
        if name.endswith(".csv"):
            p.write_text("the user's table")
        else:
            p.mkdir()
            (p / "mine.txt").write_text("not gmts's")
        planted.append(p)
    return planted


def assert_consistent_run(out: Path) -> None:
    """A finished run agrees with itself: every token's answer is in answers.parquet with the same
    advantage and loss weight, lengths add up to the token count, stats.json counts the same tokens,
    and the listing names exactly the files present."""
    import numpy as np

    t = pd.read_parquet(out / "tokens.parquet")
    a = pd.read_parquet(out / "answers.parquet")
    m = t.merge(a[["answer_id", "advantage", "loss_weight"]], on="answer_id", suffixes=("", "_a"), how="left")
    assert m["advantage_a"].notna().all()
    assert np.allclose(m["advantage"], m["advantage_a"], atol=1e-6), "tokens and answers disagree on advantages"
    assert np.allclose(m["loss_weight"], m["loss_weight_a"], rtol=1e-5, atol=1e-9)
    assert int(a["length"].sum()) == len(t)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["meta"]["n_tokens"] == len(t)
    listed = set(json.loads((out / ".gmts-files").read_text()))
    assert listed == {p.name for p in out.iterdir()} - {".gmts-files"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["run_hash"] == manifest["run_fingerprint"]["run_hash"]


def _outside(snap: dict[str, str], named: list[str]) -> dict[str, str]:
    return {k: v for k, v in snap.items() if not any(k == n or k.startswith(n + "/") or k.startswith("." + n + ".")
                                                        for n in named)}


@settings(max_examples=6, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(steps=st.lists(_SEQ_STEP, min_size=2, max_size=5))
def test_command_sequences_touch_only_their_outputs_and_leave_consistent_runs(steps):
    import errno
    import os

    from _sharding_helpers import write_rollouts

    import gmts_analysis.analysis.stats as stats_mod

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        r = write_rollouts(root / "r.jsonl", sizes=(2, 2))
        planted = _plant_user_tree(root)
        planted_snap = {p.name: snapshot(p) if p.is_dir() else p.read_bytes() for p in planted}
        for kind, run, opt, flag in steps:
            out = root / run
            argv = ["probe", "--model", MODEL, "--rollouts", str(r), "--out", str(out), *FAST, *_SEQ_OPTIONS[opt],
                    "--answers-per-chunk", "1", *(["--overwrite"] if flag else [])]
            named = [run]
            patch = None
            if kind == "killed":
                os.environ["GMTS_TEST_FAIL_AFTER_CHUNKS"] = "1"
            elif kind == "disk_full":
                def full(*a, _out=out, **k):
                    raise OSError(errno.ENOSPC, "No space left on device", str(_out))
                patch, stats_mod.write_stats = stats_mod.write_stats, full
            elif kind == "stats":
                if not (out / "manifest.json").exists():
                    continue
                argv = ["stats", str(out), "--n-boot", "5", "-q", *(["--out", str(root / "s.json")] if flag else [])]
                named = ["s.json"] if flag else [run]
            elif kind == "compare":
                if not all((root / x / "stats.json").exists() for x in _SEQ_RUNS):
                    continue
                argv = ["compare", str(root / "A"), str(root / "B"), "--out", str(root / "cmp"), "--no-figures", "-q"]
                named = ["cmp"]
            elif kind == "sample":
                argv = ["sample", "--model", MODEL, "--domains", "arithmetic", "--num-prompts", "1", "--group-size",
                        "2", "--max-new-tokens", "4", "--device", "cpu", "--out", str(root / "s.jsonl"), "-q"]
                named = ["s.jsonl"]
            before = snapshot(root)
            try:
                rc, err = run_cli(argv)
            finally:
                os.environ.pop("GMTS_TEST_FAIL_AFTER_CHUNKS", None)
                if patch is not None:
                    stats_mod.write_stats = patch
            assert "Traceback" not in err and rc in (0, 2), (kind, rc, err[-2000:])
            if rc == 2:
                assert_one_line_error(rc, err)
            if kind == "killed":  # rerun at once with other options: refused, or a run of one configuration
                rerun = [x for x in argv if x != "--overwrite"]
                i = rerun.index(_SEQ_OPTIONS[opt][0]) if _SEQ_OPTIONS[opt] else len(rerun)
                rerun[i:i + len(_SEQ_OPTIONS[opt])] = _SEQ_OPTIONS[(opt + 3) % len(_SEQ_OPTIONS)]
                rc, err = run_cli(rerun)
                assert "Traceback" not in err and rc in (0, 2), (kind, rc, err[-2000:])
            if kind in ("killed", "disk_full") and rc == 2 and (before.get(f"{run}/manifest.json")):
                # a failed replacement leaves the previous finished run byte for byte
                assert {k: v for k, v in snapshot(root).items() if k == run or k.startswith(run + "/")} == {
                    k: v for k, v in before.items() if k == run or k.startswith(run + "/")}
            assert _outside(snapshot(root), named) == _outside(before, named), (kind, run)
            for p in planted:
                assert (snapshot(p) if p.is_dir() else p.read_bytes()) == planted_snap[p.name], p
            for x in _SEQ_RUNS:
                if (root / x / "manifest.json").exists():
                    assert_consistent_run(root / x)
