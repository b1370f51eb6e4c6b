"""The shipped toy policies: load with the plain transformers API, match their cards.

pass@1 on a fresh set of held-out prompts (a seed the card did not use) must be within
15 points of the card's number, domain by domain, and inside the 30-80% band that makes
sampled groups have mixed rewards.
"""

from __future__ import annotations

import json

import pytest
import torch

from gmts_analysis.readers.models import data_dir
from gmts_analysis.toy.domains import DOMAINS

POLICIES = data_dir() / "policies"
PARAMS = {"tiny": (0, 500_000), "small": (2_000_000, 4_000_000)}
FRESH_SEED = 424_242  # differs from the card's evaluation seed
N_PROMPTS, SAMPLES = 64, 4


def _card(name: str) -> dict:
    path = POLICIES / name / "card.json"
    if not path.exists():
        pytest.fail(f"shipped policy {name} missing: {path}")
    return json.loads(path.read_text())


def test_shipped_files_within_budget():
    total = sum(p.stat().st_size for p in POLICIES.rglob("*") if p.is_file())
    assert total <= 25 * 1024 * 1024, total
    for name in PARAMS:
        files = {p.name for p in (POLICIES / name).iterdir()}
        assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "card.json",
                "README.md"} <= files, files


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_shipped_policy_matches_card(name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts_analysis.toy.card import evaluate_pass_at_1

    card = _card(name)
    path = POLICIES / name
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    n = sum(p.numel() for p in model.parameters())
    low, high = PARAMS[name]
    assert low < n < high and n == card["parameters"]
    assert len(tok) == model.config.vocab_size == 100
    settings = card["evaluation"]["settings"]
    assert settings["seed"] != FRESH_SEED
    torch.set_num_threads(2)
    fresh = evaluate_pass_at_1(model, tok, n_prompts=N_PROMPTS, samples=SAMPLES, seed=FRESH_SEED,
                               temperature=settings["temperature"], max_new_tokens=settings["max_new_tokens"])
    for domain in DOMAINS:
        ref = card["pass_at_1"][domain]
        got = fresh["domains"][domain]["pass_at_1"]
        assert abs(got - ref) <= 0.15, (name, domain, got, ref)
        assert fresh["domains"][domain]["mixed_group_share"] > 0.3, (name, domain)


# shipped cards outside the 30-80% band (documented in data/policies/README.md)
KNOWN_GAPS = {("small", "program")}


@pytest.mark.parametrize("name", sorted(PARAMS))
@pytest.mark.parametrize("domain", sorted(DOMAINS))
def test_card_pass_at_1_in_mixed_reward_band(name, domain, request):
    if (name, domain) in KNOWN_GAPS:
        request.applymarker(pytest.mark.xfail(strict=True, reason="known gap of the shipped checkpoint"))
    assert 0.3 <= _card(name)["pass_at_1"][domain] <= 0.8


def test_cli_sample_with_shipped_tiny(tmp_path):
    from gmts_analysis.cli import main

    out = tmp_path / "r.jsonl"
    argv = ["sample", "--model", "tiny", "--domains", "arithmetic", "--num-prompts", "4", "--group-size", "4",
            "--max-new-tokens", "64", "--seed", "0", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 16
    assert all(r["response_ids"][-1] == 2 or r["truncated"] for r in rows)
    first = out.read_bytes()
    assert main(argv) == 0
    assert out.read_bytes() == first  # same seed, same file
