"""gmts sample --prompts: any checkpoint, its chat template, G answers per prompt, a TRL-style verifier,
ids written exactly as the policy saw and produced them; and the toy path still works."""

from __future__ import annotations

import json

import pytest

from gmts_analysis.cli import main
from gmts_analysis.errors import GmtsError

TEMPLATE = ("{% for m in messages %}<bos>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant: {% endif %}")


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory):
    from gmts_analysis.toy.testing import build_tiny_model
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = TEMPLATE
    model = build_tiny_model("qwen2", vocab_size=len(tok), seed=0)
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    d = tmp_path_factory.mktemp("chat_policy")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, tok


VERIFIER = '''
def reward(prompts, completions, completion_ids, solution, **kw):
    out = []
    for c, ids, s in zip(completions, completion_ids, solution):
        text = c[-1]["content"] if isinstance(c, list) else c
        assert isinstance(ids, list)
        out.append(None if s is None else float(len(text) % 2 == int(s)))
    return out
'''


def _prompts(tmp_path):
    rows = [{"prompt": [{"role": "user", "content": "2+3="}], "solution": "1"},
            {"prompt": "7*6=", "solution": "0"},
            {"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "9-4="}],
             "solution": None}]
    p = tmp_path / "prompts.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    v = tmp_path / "verify.py"
    v.write_text(VERIFIER)
    return rows, p, v


def _read(p):
    return [json.loads(line) for line in p.read_text().splitlines()]


def test_sample_prompts_file_with_chat_template(tmp_path, chat_policy):
    mdir, tok = chat_policy
    rows, p, v = _prompts(tmp_path)
    out = tmp_path / "r.jsonl"
    argv = ["sample", "--model", str(mdir), "--prompts", str(p), "--group-size", "3", "--max-new-tokens", "12",
            "--verifier", f"{v}:reward", "--seed", "5", "--quiet"]
    assert main(argv + ["--out", str(out)]) == 0
    got = _read(out)
    assert len(got) == 9 and [g["group_id"] for g in got] == ["p00000"] * 3 + ["p00001"] * 3 + ["p00002"] * 3
    for g in got:
        src = rows[int(g["group_id"][1:])]
        if isinstance(src["prompt"], list):
            want = tok.apply_chat_template(src["prompt"], add_generation_prompt=True, tokenize=True)
            want = want["input_ids"] if hasattr(want, "keys") else want
            assert g["prompt_ids"] == list(want)
            assert g["response"][0]["role"] == "assistant"
        else:
            assert g["prompt_ids"] == tok(src["prompt"])["input_ids"]
        ids = g["response_ids"]
        assert 1 <= len(ids) <= 12 and tok.eos_token_id not in ids[:-1]
        assert g["truncated"] == (ids[-1] != tok.eos_token_id)
        text = g["response"][-1]["content"] if isinstance(g["response"], list) else g["response"]
        assert text == tok.decode(ids, skip_special_tokens=True)
        if src["solution"] is None:
            assert g["reward"] == 0.0 and g["unscorable"] is True
        else:
            assert g["reward"] == float(len(text) % 2 == int(src["solution"]))
    # seeded per answer: the same file again, whatever the batch size
    out2 = tmp_path / "r2.jsonl"
    assert main(argv + ["--out", str(out2), "--batch-size", "2"]) == 0
    assert _read(out2) == got
    # and probing reads the ids as written
    import pandas as pd

    run = tmp_path / "run"
    assert main(["probe", "--model", str(mdir), "--rollouts", str(out), "--out", str(run), "--device", "cpu",
                 "--grad-norm", "none", "--no-figures", "--fidelity", "off", "--quiet"]) == 0
    ans = pd.read_parquet(run / "answers.parquet").set_index("answer_id")
    for g in got:
        assert list(ans.loc[g["answer_id"], "prompt_ids"]) == g["prompt_ids"]
        assert list(ans.loc[g["answer_id"], "response_ids"]) == g["response_ids"]


def test_shared_prompt_cache_samples_what_separate_prompts_sample(chat_policy):
    """A group's prompt run once and its KV cache gathered to every row: the same logits, so the same
    tokens, as every row running its own prompt (left padding of a shorter prompt included)."""
    import torch
    from transformers import AutoModelForCausalLM

    from gmts_analysis.sampling.generate import generate_from_ids, shared_prompt_cache

    mdir, tok = chat_policy
    model = AutoModelForCausalLM.from_pretrained(mdir).eval()
    a, b = tok("12+34=")["input_ids"], tok("7*6=")["input_ids"]
    prompts = [a, a, a, b, b]
    seeds = [11, 12, 13, 14, 15]
    args = (prompts, seeds, [tok.eos_token_id], tok.pad_token_id, 1.0, 10)
    shared = generate_from_ids(model, *args, batch_size=5, share_prompts=True)
    separate = generate_from_ids(model, *args, batch_size=5, share_prompts=False)
    assert shared == separate and len({tuple(x) for x in shared}) > 1
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    cache = shared_prompt_cache(model, prompts, ids, mask)
    assert cache is not None and cache.get_seq_length() == width - 1
    assert shared_prompt_cache(model, [a, b], ids[[0, 3]], mask[[0, 3]]) is None  # nothing repeats


def test_sample_prompts_errors(tmp_path, chat_policy):
    from gmts_analysis.sampling.generate import prompt_ids, read_prompts

    mdir, tok = chat_policy
    rows, p, v = _prompts(tmp_path)
    assert main(["sample", "--model", str(mdir), "--prompts", str(p), "--domains", "logic",
                 "--out", str(tmp_path / "x.jsonl")]) == 2  # both sources (neither: the three toy domains)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1+1"}\n')
    with pytest.raises(GmtsError, match="row 1: field 'prompt'"):
        read_prompts(bad)
    with pytest.raises(GmtsError, match="chat-template off"):
        prompt_ids(tok, rows[0]["prompt"], "off")
    assert prompt_ids(tok, "7*6=", "on") == _template_ids(tok, "7*6=")


def _template_ids(tok, text):
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def test_toy_domain_path_still_works(tmp_path):
    out = tmp_path / "toy.jsonl"
    assert main(["sample", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "2", "--group-size", "2",
                 "--max-new-tokens", "8", "--out", str(out), "--quiet"]) == 0
    rows = _read(out)
    assert len(rows) == 4 and all(r["reward"] in (0.0, 1.0) for r in rows)


ZERO_VERIFIER = '''
def reward(prompts, completions, **kw):
    return [0.0 for _ in completions]
'''


def test_no_reward_variance_warns_with_what_to_do(tmp_path, chat_policy, capsys):
    """#36: 4 x 4 answers all scored 0 printed "mean reward 0.000" and nothing more; now one line on stderr says
    that no group carries gradient and what to change."""
    mdir, _ = chat_policy
    _, p, _ = _prompts(tmp_path)
    v = tmp_path / "zero.py"
    v.write_text(ZERO_VERIFIER)
    out = tmp_path / "z.jsonl"
    assert main(["sample", "--model", str(mdir), "--prompts", str(p), "--group-size", "2", "--max-new-tokens", "4",
                 "--verifier", f"{v}:reward", "--out", str(out), "--quiet"]) == 0
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if "learning signal" in x]
    assert len(lines) == 1, err
    assert "no learning signal: none of the 3 groups has reward variance" in lines[0]
    for advice in ("--num-generations", "--num-prompts", "--temperature", "--difficulty", "--verifier math"):
        assert advice in lines[0]


def test_signal_warning_threshold():
    from gmts_analysis.sampling.signal import flat_groups, signal_warning

    rows = [{"group_id": g, "reward": r} for g, rs in (("a", (0, 0)), ("b", (1, 1)), ("c", (0, 0)), ("d", (0, 1)))
            for r in rs]
    assert flat_groups(rows) == (3, 4)
    assert signal_warning(3, 4) is None  # 75%: not more than the threshold
    assert signal_warning(4, 5).startswith("little learning signal: 4 of 5 groups (80%) have no reward variance")
    assert signal_warning(0, 0) is None
    # an unscorable answer is left out of its group's rewards (as TRL leaves it out of the baseline)
    assert flat_groups([{"group_id": "a", "reward": 1.0}, {"group_id": "a", "reward": 0.0, "unscorable": True}]) == (1, 1)


def test_toy_domains_warn_when_no_group_has_signal(tmp_path, capsys, monkeypatch):
    """The toy path (gmts sample --domains, and gmts run / gmts.sample through sample_rows) warns the same."""
    import gmts_analysis.sampling.domains as dom

    real = dom.sample_domains

    def all_zero(*a, **k):
        rows = real(*a, **k)
        return [{**r, "reward": 0.0} for r in rows]

    monkeypatch.setattr(dom, "sample_domains", all_zero)
    out = tmp_path / "toy.jsonl"
    assert main(["sample", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "2", "--group-size", "2",
                 "--max-new-tokens", "8", "--out", str(out), "--quiet"]) == 0
    assert "no learning signal: none of the 2 groups has reward variance" in capsys.readouterr().err
    from gmts_analysis.api import sample

    sample("tiny", "arithmetic", num_prompts=2, num_generations=2, max_completion_length=8, progress=False)
    assert "gmts: sample: no learning signal" in capsys.readouterr().err  # main's handler (stderr) is still set


def test_gmts_run_warns_after_its_summary(tmp_path, capsys):
    """gmts run: the tiny policy scores 0 on every answer; the warning closes its summary (and sampling said it)."""
    out = tmp_path / "run"
    assert main(["run", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "2", "--num-generations", "2",
                 "--max-completion-length", "8", "--no-figures", "--quiet", "--threads", "1", "--out", str(out)]) == 0
    cap = capsys.readouterr()
    lines = [x for x in cap.err.splitlines() if "no learning signal: none of the 2 groups" in x]
    assert [x.split(": no learning")[0] for x in lines] == ["gmts: sample", f"gmts: {out}"]
    assert "Too small to compare" in cap.out
