"""Rollout readers (gmts, verl, TRL) and every bad input gets a one-line error naming the place."""

import json

import pandas as pd
import pytest

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.rollouts import ReaderOptions, read_rollouts, validate_against_model
from gmts_analysis.toy.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_text_rollouts_tokenize_prompt_with_specials_and_response_without(tmp_path, tok):
    p = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt": "1+1=", "response": "2", "reward": 1.0},
        {"prompt": "1+1=", "response": "3", "reward": 0.0},
        {"prompt": "2+2=", "response": "4", "reward": 1.0},
    ])
    ans = read_rollouts(p, tok)
    assert ans[0].prompt_ids == [tok.bos_token_id] + tok("1+1=", add_special_tokens=False)["input_ids"]
    assert ans[0].response_ids == tok("2", add_special_tokens=False)["input_ids"]
    assert [a.answer_id for a in ans] == [0, 1, 2]
    assert ans[0].group_id == ans[1].group_id != ans[2].group_id


def test_ids_used_as_given_and_groups_and_steps(tmp_path, tok):
    p = write_jsonl(tmp_path / "r.jsonl", [
        {"prompt_ids": [1, 5], "response_ids": [6, 7], "reward": 1, "step": 0, "answer_id": "a"},
        {"prompt_ids": [1, 5], "response_ids": [6], "reward": 0, "step": 1, "answer_id": "b"},
        {"prompt_ids": [1, 5], "response_ids": [8], "reward": 0, "step": 1, "answer_id": "c", "group_id": "g"},
    ])
    ans = read_rollouts(p, None)
    assert ans[0].response_ids == [6, 7]
    assert ans[0].group_id != ans[1].group_id  # same prompt, different step
    assert ans[2].group_id == "g"


def test_parquet_and_verl_and_trl(tmp_path, tok):
    df = pd.DataFrame({"prompt": ["a=", "a="], "response": ["1", "2"], "reward": [1.0, 0.0]})
    df.to_parquet(tmp_path / "r.parquet")
    assert len(read_rollouts(tmp_path / "r.parquet", tok)) == 2
    verl = write_jsonl(tmp_path / "v.jsonl", [
        {"input": "q1", "output": "x", "score": 1.0, "step": 3, "gts": "x"},
        {"input": "q1", "output": "y", "score": 0.0, "step": 3, "gts": "x"},
        {"input": "q1", "output": "x", "score": 1.0, "step": 4, "gts": "x"},
    ])
    ans = read_rollouts(verl, tok)
    assert [a.reward for a in ans] == [1.0, 0.0, 1.0]
    assert ans[0].group_id == ans[1].group_id != ans[2].group_id  # groups rebuilt from (step, input)
    assert ans[0].step == 3
    trl = pd.DataFrame({"step": [1, 1], "prompt": ["p", "p"], "completion": ["c1", "c2"],
                        "accuracy_reward": [1.0, 0.0], "format_reward": [0.5, 0.5], "advantage": [0.7, -0.7]})
    trl.to_parquet(tmp_path / "trl.parquet")
    with pytest.raises(GmtsError, match="several numeric columns could be rewards .accuracy_reward, format_reward"):
        read_rollouts(tmp_path / "trl.parquet", tok, fmt="trl")
    ans = read_rollouts(tmp_path / "trl.parquet", tok, fmt="trl",
                        options=ReaderOptions(reward_columns="accuracy_reward,format_reward"))
    assert [a.reward for a in ans] == [1.5, 0.5]
    assert ans[0].logged_advantage == 0.7 and ans[0].extra["logged_advantage"] == 0.7


def test_verifier_scores_missing_rewards(tmp_path, tok):
    p = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "q", "response": "yes"}, {"prompt": "q", "response": "no"}])
    ans = read_rollouts(p, tok, verifier=lambda prompts, completions, **kw: [float(c == "yes") for c in completions])
    assert [a.reward for a in ans] == [1.0, 0.0]


@pytest.mark.parametrize("content, message", [
    ('{"prompt": "a", "response": "b", "reward": 1}\n{"prompt": "a", \n', "line 2: invalid JSON"),
    ('{"response": "b", "reward": 1}\n', "line 1: missing field 'prompt'"),
    ('{"prompt": "a", "reward": 1}\n', "line 1: missing field 'response'"),
    ('{"prompt": "a", "response": "b"}\n', "line 1: missing field 'reward'"),
    ('{"prompt": "a", "response": "b", "reward": NaN}\n', "line 1: field 'reward' is nan"),
    ('{"prompt": "a", "response": "b", "reward": Infinity}\n', "line 1: field 'reward' is inf"),
    ('{"prompt": "a", "response": "b", "reward": "high"}\n', "line 1: field 'reward' must be a number"),
    ('{"prompt_ids": [1, "x"], "response": "b", "reward": 1}\n', "line 1: field 'prompt_ids'"),
    ('\n\n', "empty input"),
    ('[1, 2]', "expected a JSON object"),
    ('{"prompt": "a", "response": "b", "reward": 1, "answer_id": 1}\n'
     '{"prompt": "a", "response": "c", "reward": 1, "answer_id": 1}\n', "not unique"),
    ('{"prompt": "a", "response_ids": [5, 6], "reward": 1, "old_logprobs": [0.1]}\n',
     "'old_logprobs' has 1 values for 2"),
])
def test_bad_input_one_line_errors(tmp_path, tok, content, message):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(GmtsError) as e:
        read_rollouts(p, tok)
    assert message in str(e.value)
    assert str(p) in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(GmtsError, match="not found"):
        read_rollouts(tmp_path / "nope.jsonl")


def test_vocab_and_context_checks(tmp_path, tok):
    p = write_jsonl(tmp_path / "r.jsonl", [{"prompt_ids": [1, 2], "response_ids": [3, 99], "reward": 1.0,
                                            "answer_id": "ans7"}])
    ans = read_rollouts(p, tok)
    with pytest.raises(GmtsError, match=r"answer 'ans7': token id 99 .* outside the vocabulary"):
        validate_against_model(ans, 50, None, False)
    with pytest.raises(GmtsError, match=r"answer 'ans7' has 4 tokens, longer than the model's context \(3\).*--truncate"):
        validate_against_model(ans, 100, 3, False)
    assert validate_against_model(ans, 100, 3, True) == 1
    assert ans[0].response_ids == [3]
    # a prompt that alone fills the context: --truncate (which cuts responses) is not offered
    with pytest.raises(GmtsError, match=r"its prompt alone has 2 tokens.*longer context") as e:
        validate_against_model(read_rollouts(p, tok), 100, 2, True)
    assert "--truncate" not in str(e.value)


# ---------------------------------------------------------------- adversarial inputs (issue: never a traceback)

GOOD = '{"prompt": "a", "response": "b", "reward": 1}\n'


@pytest.mark.parametrize("name, content, message", [
    ("r.jsonl", GOOD.encode() + b'{"prompt": "a\xff", "response": "b", "reward": 1}\n', "line 2: not valid UTF-8"),
    ("r.jsonl", GOOD.encode("utf-16"), "line 1: UTF-16 text"),
    ("r.jsonl", b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    ("r.jsonl", b'{"prompt": "a", "response": "b", "reward": ' + b"9" * 5000 + b"}\n", "line 1: invalid JSON"),
    ("r.jsonl", b'{"prompt": "a", "response": "b\\ud800", "reward": 1}\n', "line 1: field 'response' holds a lone"),
    ("r.jsonl", GOOD.encode() + b'{"prompt": "a", "response": "b", "reward": 1, "step": [1]}\n',
     "line 2: field 'step' must be an integer or text, got list"),
    ("r.jsonl", b'{"prompt": "a", "response": "b", "reward": 1, "step": 1}\n'
                b'{"prompt": "a", "response": "b", "reward": 1, "step": "x"}\n', "line 2: field 'step' is 'x'"),
    ("r.jsonl", b'{"prompt": "a", "response": "b", "reward": 1e308}\n', "line 1: field 'reward' is 1e+308, outside"),
    ("r.jsonl", b'{"prompt": "a", "response": "b", "reward": -Infinity}\n', "line 1: field 'reward' is -inf"),
    ("r.jsonl", b'{"prompt": "a", "response_ids": [5, 6], "reward": 1, "old_logprobs": [-0.1, 0.5]}\n',
     "line 1: field 'old_logprobs' item 2 is 0.5 > 0"),
    ("r.jsonl", b'{"prompt": "a", "response_ids": [5, 6], "reward": 1, "ref_logprobs": [-1e308, -1]}\n',
     "line 1: field 'ref_logprobs' item 1 is -1e+308, below -1000"),
    ("r.jsonl", b'{"prompt": "a", "response_ids": [5, 6], "reward": 1, "old_logprobs": [NaN, -1]}\n',
     "line 1: field 'old_logprobs' has a non-finite value"),
    ("r.jsonl", b"", "no rollouts in the file (empty input)"),
    ("r.jsonl", b'{"prompt": [{"role": "user"}], "response": "b", "reward": 1}\n',
     "line 1: field 'prompt': message 1 must be an object with 'role' and 'content'"),
])
def test_adversarial_files_one_line_errors(tmp_path, tok, name, content, message):
    p = tmp_path / name
    p.write_bytes(content)
    with pytest.raises(GmtsError) as e:
        read_rollouts(p, tok)
    assert message in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_parquet_detected_by_magic_bytes_and_directory_steps(tmp_path, tok):
    df = pd.DataFrame({"prompt": ["a=", "a="], "response": ["1", "2"], "reward": [1.0, 0.0]})
    df.to_parquet(tmp_path / "rollouts.data")  # not named *.parquet
    assert [a.reward for a in read_rollouts(tmp_path / "rollouts.data", tok)] == [1.0, 0.0]
    d = tmp_path / "dir"
    d.mkdir()
    write_jsonl(d / "step_3.jsonl", [{"prompt": "a", "response": "b", "reward": 1.0}])
    write_jsonl(d / "step_12.jsonl", [{"prompt": "a", "response": "c", "reward": 0.0}])
    ans = read_rollouts(d, tok)
    assert [a.step for a in ans] == [3, 12]  # from the names, in step order (not name order)
    assert ans[0].group_id != ans[1].group_id
    (d / "notes.jsonl").write_text(GOOD)
    with pytest.raises(GmtsError, match="'notes.jsonl' has no step number in its name"):
        read_rollouts(d, tok)


def test_long_text_refused_before_tokenizing(tmp_path, tok):
    import time

    p = tmp_path / "big.jsonl"
    with open(p, "w") as f:
        f.write(json.dumps({"prompt": "a", "response": "x" * 50_000_000, "reward": 1.0}) + "\n")
    calls = []

    class Spy:
        def __getattr__(self, k):
            return getattr(tok, k)

        def __len__(self):
            return len(tok)

        def __call__(self, text, **kw):
            calls.append(len(text))
            return tok(text, **kw)

    t0 = time.perf_counter()
    with pytest.raises(GmtsError, match=r"line 1: field 'response' has 50,000,000 characters, more than the model's "
                                        r"context of 256 tokens can hold"):
        read_rollouts(p, Spy(), options=ReaderOptions(max_tokens=256))
    assert time.perf_counter() - t0 < 10 and max(calls, default=0) < 1000  # the response was never tokenized
    ans = read_rollouts(p, Spy(), options=ReaderOptions(max_tokens=256, truncate=True))
    assert max(calls) <= 256 * max(len(t) for t in tok.get_vocab()) and len(ans[0].response_ids) >= 256


def test_empty_vocabulary_tokenizer_refused(tmp_path):
    class Empty:
        eos_token = eos_token_id = None

        def __len__(self):
            return 0

    p = write_jsonl(tmp_path / "r.jsonl", [{"prompt": "a", "response": "b", "reward": 1.0}])
    with pytest.raises(GmtsError, match="line 1: text 'prompt' given but the model's tokenizer has an empty vocabulary"):
        read_rollouts(p, Empty())


def test_directory_errors(tmp_path, tok):
    d = tmp_path / "empty"
    d.mkdir()
    with pytest.raises(GmtsError, match="no rollout files in the directory"):
        read_rollouts(d, tok)
    (d / "1.jsonl").write_text(GOOD)
    (d / "2.jsonl").write_text("")
    with pytest.raises(GmtsError, match=r"2\.jsonl: no rollouts in the file \(empty input\)"):
        read_rollouts(d, tok)
    (d / "2.jsonl").write_text('{"input": "q", "output": "a", "score": 1.0}\n')
    with pytest.raises(GmtsError, match=r"2\.jsonl: a verl file among gmts files"):
        read_rollouts(d, tok)
