"""Toy sampling: determinism, batch independence, rollout format, the `gmts sample` CLI, and the
char tokenizer loading through AutoTokenizer beside a Qwen2 checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from gmts_analysis.toy.domains import DOMAINS
from gmts_analysis.toy.sample import answer_seed, generate_responses, sample_rollouts, write_rollouts
from gmts_analysis.toy.tokenizer import CHARS, build_char_tokenizer
from gmts_analysis.toy.train import PolicySpec, build_policy, count_parameters

SPEC = PolicySpec("test", hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64, steps=1)


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    """A random-weight toy-architecture policy saved like a shipped one."""
    path = tmp_path_factory.mktemp("policy")
    tok = build_char_tokenizer()
    model = build_policy(SPEC, len(tok), seed=0)
    n = count_parameters(model)
    assert 20_000 < n < 60_000, n  # a misspelt config field would give a different size
    assert model.config.tie_word_embeddings and model.config.model_type == "qwen2"
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def policy(policy_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    return model, AutoTokenizer.from_pretrained(policy_dir)


def test_saved_tokenizer_loads_identically(policy):
    """AutoTokenizer beside a qwen2 config (transformers picks Qwen2Tokenizer) keeps every char."""
    _, loaded = policy
    ref = build_char_tokenizer()
    text = CHARS + "  a=3; b=a+4;\n\n(T&~F)|F= #12 "
    for t in (text, "7+5=12,4+8+1=13 #432", " ", "\n"):
        ids = ref(t, add_special_tokens=False)["input_ids"]
        assert loaded(t, add_special_tokens=False)["input_ids"] == ids
        assert len(ids) == len(t)
        assert loaded.decode(ids) == t == ref.decode(ids)
        assert loaded(t)["input_ids"] == [ref.bos_token_id] + ids
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id) == (0, 1, 2)
    assert len(loaded) == len(ref) == 100


def test_rollouts_format_and_rewards(policy):
    model, tok = policy
    rows = sample_rollouts(model, tok, "arithmetic", num_prompts=3, group_size=4, temperature=1.0,
                           max_new_tokens=12, seed=0, batch_size=5)
    assert len(rows) == 12
    assert len({r["answer_id"] for r in rows}) == 12
    assert [r["group_id"] for r in rows] == [f"arithmetic-{i:04d}" for i in range(3) for _ in range(4)]
    dom = DOMAINS["arithmetic"]
    for r in rows:
        assert r["prompt_ids"] == tok(r["prompt"])["input_ids"] and r["prompt_ids"][0] == tok.bos_token_id
        ids = r["response_ids"]
        assert 1 <= len(ids) <= 12
        assert tok.eos_token_id not in ids[:-1]
        assert r["truncated"] == (ids[-1] != tok.eos_token_id)
        assert r["response"] == tok.decode(ids, skip_special_tokens=True)
        assert r["reward"] == dom.verify(r["prompt"], r["response"])
        assert r["domain"] == "arithmetic" and r["difficulty"] in dom.difficulties
    # a random model's answers in one group differ: sampling, not greedy
    assert len({tuple(r["response_ids"]) for r in rows[:4]}) > 1


def test_sampling_is_deterministic_and_batch_independent(policy):
    model, tok = policy
    a = sample_rollouts(model, tok, "logic", 3, 3, 1.0, 10, seed=5, batch_size=4)
    b = sample_rollouts(model, tok, "logic", 3, 3, 1.0, 10, seed=5, batch_size=9)
    assert a == b
    c = sample_rollouts(model, tok, "logic", 3, 3, 1.0, 10, seed=6, batch_size=9)
    assert [r["response_ids"] for r in a] != [r["response_ids"] for r in c]
    # reversing the order of the rows (other batch neighbours, other padding) changes nothing
    prompts = [r["prompt"] for r in a]
    seeds = [answer_seed(5, "logic", i, j) for i in range(3) for j in range(3)]
    rev = generate_responses(model, tok, prompts[::-1], seeds[::-1], 1.0, 10, batch_size=4)
    assert rev[::-1] == [r["response_ids"] for r in a]


def test_sampling_matches_the_policy_distribution():
    """Gumbel-max with per-answer noise samples from softmax(z / tau): check the first token's frequencies."""
    from gmts_analysis.toy.sample import _gumbel

    torch.manual_seed(0)
    logits = torch.randn(8) * 2
    tau = 0.7
    g = _gumbel(list(range(4000)), 1, 8)[:, 0, :]
    draws = torch.argmax(logits / tau + g, dim=-1)
    freq = torch.bincount(draws, minlength=8).double() / len(draws)
    p = torch.softmax(logits.double() / tau, -1)
    assert torch.allclose(freq, p, atol=4 * (p * (1 - p) / len(draws)).sqrt().max().item() + 1e-3)


def test_greedy_is_argmax(policy):
    model, tok = policy
    rows = sample_rollouts(model, tok, "program", 2, 2, temperature=0.0, max_new_tokens=6, seed=0)
    assert rows[0]["response_ids"] == rows[1]["response_ids"]
    enc = tok(rows[0]["prompt"], return_tensors="pt")
    with torch.no_grad():
        first = model(**enc).logits[0, -1].argmax().item()
    assert rows[0]["response_ids"][0] == first


def test_write_rollouts_jsonl(tmp_path, policy):
    model, tok = policy
    rows = sample_rollouts(model, tok, "program", 2, 2, 1.0, 8, seed=1)
    out = tmp_path / "r.jsonl"
    write_rollouts(out, rows)
    back = [json.loads(line) for line in out.read_text().splitlines()]
    assert back == rows


def test_cli_sample_end_to_end(tmp_path, policy_dir):
    from gmts_analysis.cli import main

    outs = []
    for name in ("a.jsonl", "b.jsonl"):
        out = tmp_path / name
        argv = ["sample", "--model", str(policy_dir), "--domains", "program", "--num-prompts", "3",
                "--group-size", "2", "--temperature", "1.0", "--max-new-tokens", "16", "--seed", "3",
                "--out", str(out), "--quiet"]
        assert main(argv) == 0
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    rows = [json.loads(x) for x in outs[0].decode().splitlines()]
    assert len(rows) == 6 and {"prompt", "prompt_ids", "response", "response_ids", "reward", "group_id",
                               "answer_id", "domain"} <= set(rows[0])


@pytest.mark.parametrize("bad", [["--domains", "chess"], ["--num-prompts", "0"], ["--temperature", "-1"],
                                 ["--model", "/no/such/dir"], ["--difficulty", "7"]])
def test_cli_sample_bad_input(tmp_path, policy_dir, bad, capsys):
    from gmts_analysis.cli import main

    argv = ["sample", "--model", str(policy_dir), "--domains", "logic", "--out", str(tmp_path / "x.jsonl"),
            "--quiet"]
    argv += bad
    assert main(argv) == 2
    assert "gmts: error:" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()


def test_training_reduces_loss_and_continues_exactly():
    """SFT lowers the loss; continuing from a warm-restart snapshot equals the uninterrupted run."""
    from dataclasses import replace

    from gmts_analysis.toy.train import train_policy

    spec = replace(SPEC, steps=6, batch_size=8, warmup_steps=2, lr=3e-3, restart_steps=(3,))
    full, _, info = train_policy(spec, seed=0, threads=1, progress=False, log_every=1)
    losses = [c["loss"] for c in info["loss_curve"]]
    assert len(losses) == 6 and losses[-1] < losses[0]
    assert info["parameters"] == count_parameters(full)
    head, _, _ = train_policy(spec, seed=0, steps=3, threads=1, progress=False)
    rest, _, _ = train_policy(spec, seed=0, threads=1, progress=False, init_model=head, start_step=3)
    for (n, a), (_, b) in zip(full.named_parameters(), rest.named_parameters()):
        assert torch.equal(a, b), n
    with pytest.raises(ValueError):
        train_policy(spec, seed=0, threads=1, progress=False, init_model=rest, start_step=2)
