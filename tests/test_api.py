"""The Python API (docs/definitions.md section 10): gmts.probe / Run / load_run / sample.

Every input form (a path, a loaded model, a DataFrame, a list of row dicts) must give the
same rows as ``gmts probe`` on the same rollouts file; save/load must round-trip exactly.
"""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from conftest import make_rollouts

import gmts_analysis as gmts
from gmts_analysis.cli import main

# sketch-free, fidelity-free and figure-free keeps every probe here well under a second
FAST = {"fidelity": "off", "device": "cpu"}
NUMERIC = ["logprob", "entropy", "omega", "grad_norm_logp", "grad_norm", "gmts", "head_grad_norm"]


@pytest.fixture(scope="module")
def fresh_llama(tmp_path_factory):
    """A random Llama the toolkit has never seen, saved with a tokenizer-free checkpoint."""
    from gmts_analysis.toy.testing import save_tiny_model

    return save_tiny_model("llama", tmp_path_factory.mktemp("fresh") / "llama", seed=7)


@pytest.fixture(scope="module")
def rollouts_file(tmp_path_factory):
    return make_rollouts(tmp_path_factory.mktemp("r") / "r.jsonl", n_groups=2, group_size=3, seed=3)


@pytest.fixture(scope="module")
def path_run(fresh_llama, rollouts_file):
    return gmts.probe(str(fresh_llama), str(rollouts_file), progress=False, **FAST)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_import_is_cheap_and_public_names():
    code = ("import sys, gmts_analysis as g; g.probe; g.Run; g.load_run; "
            "print(int('torch' in sys.modules), int('pandas' in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0"]
    for name in ("probe", "load_run", "sample", "Run"):
        assert name in gmts.__all__ and callable(getattr(gmts, name))


def test_probe_path_matches_cli(path_run, fresh_llama, rollouts_file, tmp_path):
    out = tmp_path / "cli"
    assert main(["probe", "--model", str(fresh_llama), "--rollouts", str(rollouts_file), "--out", str(out),
                 "--device", "cpu", "--fidelity", "off", "--no-figures", "--quiet"]) == 0
    cli = gmts.load_run(out)
    n_tokens = sum(len(r["response_ids"]) for r in _rows(rollouts_file))
    assert len(path_run.tokens) == n_tokens == len(cli.tokens)
    assert len(path_run.answers) == 6
    for c in NUMERIC:
        np.testing.assert_allclose(path_run.tokens[c].to_numpy(), cli.tokens[c].to_numpy(), rtol=1e-12, atol=0)
    assert path_run.stats == cli.stats
    assert path_run.manifest["grad_norm_method"] == "exact" and path_run.path is None
    # answers carry exactly what was probed
    assert [list(x) for x in path_run.answers["response_ids"]] == [r["response_ids"] for r in _rows(rollouts_file)]


def test_probe_loaded_model_dataframe_and_rows(path_run, fresh_llama, rollouts_file):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(fresh_llama, dtype=torch.float32)
    model.train()  # the probe uses eval mode and gives the caller's mode back
    rows = _rows(rollouts_file)
    by_rows = gmts.probe(model, rows, progress=False, **FAST)
    assert model.training
    by_frame = gmts.probe(model, pd.DataFrame(rows), progress=False, **FAST)
    for run in (by_rows, by_frame):
        assert list(run.tokens["answer_id"]) == list(path_run.tokens["answer_id"])
        for c in NUMERIC:
            np.testing.assert_allclose(run.tokens[c].to_numpy(), path_run.tokens[c].to_numpy(), rtol=1e-10)
        assert run.manifest["dtype"] == "float32" and run.manifest["device"] == "cpu"
    with pytest.raises(gmts.GmtsError, match="dtype"):
        gmts.probe(model, rows, dtype="bfloat16", progress=False, **FAST)


def test_options_change_numbers(path_run, fresh_llama, rollouts_file):
    hot = gmts.probe(str(fresh_llama), str(rollouts_file), temperature=2.0, progress=False, **FAST)
    assert hot.manifest["config"]["temperature"] == 2.0
    assert not np.allclose(hot.tokens["entropy"], path_run.tokens["entropy"])


def test_unknown_option_and_job_setting_refused(fresh_llama, rollouts_file):
    with pytest.raises(gmts.GmtsError, match="unknown option 'tempreature'.*did you mean 'temperature'"):
        gmts.probe(str(fresh_llama), str(rollouts_file), tempreature=0.5)
    with pytest.raises(gmts.GmtsError, match="'config_file' is a job setting"):
        gmts.probe(str(fresh_llama), str(rollouts_file), config_file="x.yaml")
    with pytest.raises(gmts.GmtsError, match="grad_norm='fast'"):
        gmts.probe(str(fresh_llama), str(rollouts_file), grad_norm="fast")
    with pytest.raises(gmts.GmtsError, match="rollouts"):
        gmts.probe(str(fresh_llama), 42)


def test_in_memory_model_without_a_path_and_out_setting(tmp_path):
    """A model built in memory (no checkpoint, no name) on id rollouts; ``out=`` also saves it."""
    from gmts_analysis.toy.testing import build_tiny_model

    model = build_tiny_model("gpt2", seed=11)
    assert model.get_input_embeddings().weight.shape[0] == 64
    rows = _rows(make_rollouts(tmp_path / "r.jsonl", n_groups=2, group_size=2, seed=5, vocab=64))
    run = gmts.probe(model, rows, quiet=True, out=tmp_path / "saved", figures=False, **FAST)
    assert run.manifest["model_path"] == "<in-memory model>"
    assert (run.tokens["grad_norm_logp"] > 0).all()
    assert run.path == tmp_path / "saved" and gmts.load_run(run.path).equals(run)
    assert not (run.path / "report.html").exists()


def test_save_load_roundtrip(path_run, tmp_path):
    saved = path_run.save(tmp_path / "run")
    for f in ("tokens.parquet", "answers.parquet", "stats.json", "manifest.json", "report.html"):
        assert (saved / f).is_file(), f
    assert sorted(p.name for p in (saved / "figures").glob("*.png"))
    back = gmts.load_run(saved)
    assert isinstance(back, gmts.Run) and back.path == saved
    assert back.equals(path_run) and back == path_run
    pd.testing.assert_frame_equal(back.tokens, path_run.tokens)
    pd.testing.assert_frame_equal(back.answers, path_run.answers)
    assert back.stats == path_run.stats and back.manifest == path_run.manifest
    with pytest.raises(gmts.GmtsError, match="not empty"):
        path_run.save(saved, figures=False)
    # equals can fail
    changed = gmts.load_run(saved)
    changed.tokens.loc[0, "entropy"] += 1e-9
    assert not changed.equals(path_run) and changed != path_run


def test_in_memory_figures_and_report(path_run, tmp_path):
    fig = path_run.figure("within_vs_cross")
    assert fig is not None and fig.axes
    html = path_run.report()
    assert html.startswith("<!DOCTYPE html>") and "data:image/png;base64," in html
    assert path_run.report(tmp_path / "r.html").read_text() == html
    written = path_run.figures(tmp_path / "figs")
    assert {p.suffix for p in written} == {".png", ".pdf"}
    with pytest.raises(gmts.GmtsError, match="unknown figure"):
        path_run.figure("nope")


def test_sample_then_probe_tiny():
    rows = gmts.sample("tiny", "arithmetic", num_prompts=1, group_size=2, max_new_tokens=8, seed=5, progress=False)
    assert len(rows) == 2 and {r["domain"] for r in rows} == {"arithmetic"}
    assert rows == gmts.sample("tiny", ["arithmetic"], num_prompts=1, group_size=2, max_new_tokens=8, seed=5,
                               progress=False)
    run = gmts.probe("tiny", rows, grad_norm="none", progress=False, **FAST)
    assert len(run.tokens) == sum(len(r["response_ids"]) for r in rows)
    assert list(run.answers["reward"]) == [r["reward"] for r in rows]
    with pytest.raises(gmts.GmtsError, match="poetry"):
        gmts.sample("tiny", "poetry")


def test_shipped_data_is_package_data():
    """Every shipped file (policies, example run) is inside the package and matched by the
    package-data globs of pyproject.toml, so a wheel or a non-editable install carries it."""
    import fnmatch
    import importlib.resources
    from pathlib import Path

    import tomllib

    from gmts_analysis.readers.models import resolve_model_path
    from gmts_analysis.util.resources import data_dir, example_run_dir

    pkg = Path(importlib.resources.files("gmts_analysis"))
    assert data_dir() == pkg / "data"
    for name in ("tiny", "small"):
        assert Path(resolve_model_path(name)) == pkg / "data" / "policies" / name
    globs = tomllib.loads((pkg.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "gmts_analysis"]
    files = [p.relative_to(pkg).as_posix() for p in (pkg / "data").rglob("*") if p.is_file()]
    needed = {"data/policies/tiny/model.safetensors", "data/policies/small/config.json",
              "data/example_run/tokens.parquet", "data/example_run/stats.json"}
    assert needed <= set(files)
    # setuptools globs do not cross "/" with "*": check each file against them the same way
    unmatched = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert unmatched == []
    from gmts_analysis.analysis.runs import read_run

    assert len(read_run(example_run_dir(), compute_missing_stats=False).answers) == 192


def test_text_rollouts_with_a_loaded_model_and_its_tokenizer(fresh_llama):
    """Text rows are tokenized with the tokenizer passed in: prompt with special tokens, response without."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(fresh_llama)
    tok = AutoTokenizer.from_pretrained(fresh_llama)
    rows = [{"prompt": "2+3=", "response": r, "reward": float(i % 2), "group_id": "g"}
            for i, r in enumerate(["5", "6", "5 ok", "7"])]
    run = gmts.probe(model, rows, tokenizer=tok, quiet=True, **FAST)
    want = [tok(r["response"], add_special_tokens=False)["input_ids"] for r in rows]
    assert [list(x) for x in run.answers["response_ids"]] == want
    assert list(run.answers["prompt_ids"][0]) == tok("2+3=", add_special_tokens=True)["input_ids"]
    assert len(run.tokens) == sum(map(len, want))
