"""The probe end to end: exactness against a plain autograd loop, closed forms, invariance, CLI, bad input."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import make_rollouts, plain_loop_grad_norms

from gmts_analysis.cli import main
from gmts_analysis.options.config import ProbeConfig
from gmts_analysis.probing import kernel
from gmts_analysis.probing.settings import KernelSettings
from gmts_analysis.probing.tables import TOKEN_COLUMNS
from gmts_analysis.readers.models import load_model
from gmts_analysis.readers.rollouts import read_rollouts

CONTRACT_ANSWER_COLUMNS = ["answer_id", "group_id", "reward", "advantage", "length"]


def probe_rollouts(model, tok, answers, cfg, coefs=None):
    """The kernel on ``answers`` under the options ``cfg`` (split into the kernel's settings)."""
    return kernel.probe_answers(model, tok, answers, KernelSettings.of(cfg), coefs)


def answer_coefficients(answers, cfg):
    return kernel.answer_coefficients(answers, KernelSettings.of(cfg))


def _cfg(model_dir, rollouts, out=None, **kw):
    return ProbeConfig(model=str(model_dir), rollouts=str(rollouts), out=str(out) if out else None,
                       device="cpu", quiet=True, figures=False, fidelity="off", **kw)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("dtype, rtol", [("float32", 1e-4), ("float64", 1e-9)])
def test_grad_norm_logp_matches_plain_loop(tiny_model_dirs, tmp_path, arch, dtype, rtol):
    r = make_rollouts(tmp_path / "r.jsonl", n_groups=2, group_size=2)
    cfg = _cfg(tiny_model_dirs[arch], r, dtype=dtype, temperature=0.8)
    model, tok = load_model(cfg.model, "cpu", dtype)
    answers = read_rollouts(r, tok)
    res = probe_rollouts(model, tok, answers, cfg)
    worst = 0.0
    for a in answers:
        ids = torch.tensor(a.prompt_ids + a.response_ids)
        ref = plain_loop_grad_norms(model, ids, len(a.prompt_ids), 0.8).numpy()
        got = res.tokens.loc[res.tokens.answer_id == a.answer_id, "grad_norm_logp"].to_numpy()
        worst = max(worst, float(np.max(np.abs(got - ref) / ref)))
    assert worst <= rtol, f"{arch} {dtype}: max relative error {worst:.2e}"
    # the model is left as it was: attention implementation restored, no grads
    assert model.config._attn_implementation == "sdpa"
    assert all(p.grad is None for p in model.parameters())


def test_columns_and_closed_forms(tiny_model_dirs, tmp_path):
    r = make_rollouts(tmp_path / "r.jsonl")
    cfg = _cfg(tiny_model_dirs["qwen2"], r, temperature=1.3)
    model, tok = load_model(cfg.model, "cpu")
    answers = read_rollouts(r, tok)
    t = probe_rollouts(model, tok, answers, cfg).tokens
    for c in TOKEN_COLUMNS:
        assert c in t.columns, c
    assert len(t) == sum(a.length for a in answers)
    np.testing.assert_allclose(t.prob, np.exp(t.logprob), rtol=1e-6)
    np.testing.assert_allclose(t.grad_norm, np.abs(t.omega) * t.grad_norm_logp)
    np.testing.assert_allclose(t.gmts, t.entropy * np.abs(t.omega))
    np.testing.assert_allclose(t.omega, t.loss_weight * t.advantage)  # on-policy
    # logit_grad_norm against autograd w.r.t. the raw logits, with the temperature
    a = answers[0]
    ids = torch.tensor(a.prompt_ids + a.response_ids)
    z = model(input_ids=ids[None]).logits[0].detach().requires_grad_(True)
    from gmts_analysis.core.tokens import sequence_logprobs

    lp = sequence_logprobs(z, ids, len(a.prompt_ids), 1.3)
    rows = t[t.answer_id == a.answer_id]
    for k in range(a.length):
        (g,) = torch.autograd.grad(lp[k], z, retain_graph=True)
        assert abs(g.norm().item() - rows.logit_grad_norm.iloc[k]) < 1e-5
    # token-mean weights: 1 / total tokens
    np.testing.assert_allclose(t.loss_weight, 1.0 / len(t))
    assert t.position.tolist() == [p for a in answers for p in range(a.length)]


def test_equal_reward_group_gives_zero(tiny_model_dirs, tmp_path):
    r = tmp_path / "r.jsonl"
    rows = [{"prompt_ids": [1, 10, 11], "response_ids": [12, 13, 14, 15], "reward": 1.0, "group_id": "same"},
            {"prompt_ids": [1, 10, 11], "response_ids": [16, 17], "reward": 1.0, "group_id": "same"},
            {"prompt_ids": [1, 20], "response_ids": [21, 22, 23], "reward": 1.0, "group_id": "mixed"},
            {"prompt_ids": [1, 20], "response_ids": [24, 25], "reward": 0.0, "group_id": "mixed"}]
    r.write_text("".join(json.dumps(x) + "\n" for x in rows))
    cfg = _cfg(tiny_model_dirs["llama"], r)
    model, tok = load_model(cfg.model, "cpu")
    t = probe_rollouts(model, tok, read_rollouts(r, tok), cfg).tokens
    same = t[t.group_id == "same"]
    assert (same.advantage == 0).all() and (same.omega == 0).all()
    assert (same.gmts == 0).all() and (same.grad_norm == 0).all()
    assert (same.grad_norm_logp > 0).all()
    assert (t[t.group_id == "mixed"].grad_norm > 0).all()


def test_invariant_to_order_and_subsets(tiny_model_dirs, tmp_path):
    r = make_rollouts(tmp_path / "r.jsonl", n_groups=3, group_size=3, seed=3)
    cfg = _cfg(tiny_model_dirs["gpt2"], r)
    model, tok = load_model(cfg.model, "cpu")
    answers = read_rollouts(r, tok)
    coefs = answer_coefficients(answers, cfg)
    full = probe_rollouts(model, tok, answers, cfg, coefs).tokens
    order = [5, 0, 8, 2, 7, 1, 3, 6, 4]
    shuffled = probe_rollouts(model, tok, [answers[i] for i in order], cfg, [coefs[i] for i in order]).tokens
    one_by_one = pd.concat([probe_rollouts(model, tok, [a], cfg, [c]).tokens for a, c in zip(answers, coefs)])
    key = ["answer_id", "position"]
    for other in (shuffled, one_by_one):
        a = full.sort_values(key).reset_index(drop=True)
        b = other.sort_values(key).reset_index(drop=True)
        pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=1e-6, atol=1e-9)


def test_cli_end_to_end_writes_contract_files(tiny_model_dirs, tmp_path):
    r = make_rollouts(tmp_path / "r.jsonl", steps=True)
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(out),
               "--device", "cpu", "--quiet", "--no-figures", "--fidelity", "off", "--loss-agg", "seq-mean-token-mean"])
    assert rc == 0
    for f in ("tokens.parquet", "answers.parquet", "stats.json", "manifest.json"):
        assert (out / f).exists(), f
    t = pd.read_parquet(out / "tokens.parquet")
    assert list(t.columns[: len(TOKEN_COLUMNS)]) == list(TOKEN_COLUMNS)
    a = pd.read_parquet(out / "answers.parquet")
    for c in CONTRACT_ANSWER_COLUMNS:
        assert c in a.columns
    m = json.loads((out / "manifest.json").read_text())
    assert m["grad_norm_method"] == "exact" and m["dtype"] == "float32" and m["seed"] == 0
    assert m["config"]["loss_agg"] == "seq-mean-token-mean"
    s = json.loads((out / "stats.json").read_text())
    for k in ("within_answer", "cross_answer", "within_group", "topk_overlap"):
        assert "entropy" in s[k] or "batch" in s[k]
    # an existing run is not overwritten without --overwrite
    assert main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(out),
                 "--device", "cpu", "--quiet", "--no-figures"]) == 2


def test_cli_grad_norm_none(tiny_model_dirs, tmp_path):
    r = make_rollouts(tmp_path / "r.jsonl")
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_model_dirs["llama"]), "--rollouts", str(r), "--out", str(out),
                 "--grad-norm", "none", "--quiet", "--no-figures"]) == 0
    t = pd.read_parquet(out / "tokens.parquet")
    assert t.grad_norm_logp.isna().all()
    assert json.loads((out / "manifest.json").read_text())["grad_norm_method"] == "none"


@pytest.mark.parametrize("rows, extra, message", [
    ('{"prompt_ids": [1, 2], "response_ids": [3, 4000], "reward": 1, "answer_id": "x9"}\n', [],
     "answer 'x9': token id 4000"),
    ('{"prompt_ids": [1, 2], "response_ids": [' + ",".join(["5"] * 300) + '], "reward": 1, "answer_id": "long"}\n',
     [], "answer 'long' has 302 tokens, longer than the model's context (256); pass --truncate"),
    ('{"prompt": "a", "response": "b"}\n', [], "line 1: missing field 'reward'"),
    ('', [], "empty input"),
])
def test_cli_bad_input_one_line_no_traceback(tiny_model_dirs, tmp_path, capsys, rows, extra, message):
    r = tmp_path / "r.jsonl"
    r.write_text(rows)
    out = tmp_path / "run"
    rc = main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(out),
               "--quiet", "--no-figures", *extra])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert "Traceback" not in err
    assert not out.exists()  # nothing that looks like a finished run
    assert not list(tmp_path.glob(".run.*"))  # no temporary left behind


def test_cli_missing_paths(tiny_model_dirs, tmp_path, capsys):
    r = make_rollouts(tmp_path / "r.jsonl")
    assert main(["probe", "--model", str(tmp_path / "nomodel"), "--rollouts", str(r), "--out", str(tmp_path / "o"),
                 "--quiet"]) == 2
    assert "nomodel" in capsys.readouterr().err
    assert main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(tmp_path / "none.jsonl"),
                 "--out", str(tmp_path / "o"), "--quiet"]) == 2
    assert "none.jsonl: no such file or directory" in capsys.readouterr().err


def test_truncate_flag(tiny_model_dirs, tmp_path):
    r = tmp_path / "r.jsonl"
    r.write_text('{"prompt_ids": [1, 2], "response_ids": [' + ",".join(["5"] * 300) + '], "reward": 1}\n'
                 '{"prompt_ids": [1, 2], "response_ids": [6, 7], "reward": 0}\n')
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(out),
                 "--quiet", "--no-figures", "--truncate", "--grad-norm", "none", "--fidelity", "off"]) == 0
    t = pd.read_parquet(out / "tokens.parquet")
    assert (t.answer_id == 0).sum() == 254
