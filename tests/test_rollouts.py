"""Rollout readers (gmts, verl, TRL) and every bad input gets a one-line error naming the place."""

import json

import pandas as pd
import pytest

from gmts_analysis.errors import GmtsError
from gmts_analysis.rollouts import ReaderOptions, read_rollouts, validate_against_model
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
