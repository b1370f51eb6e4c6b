"""The home-made GRPO loop with token selection (gmts rl): batching against the one shift in
tokens.py, the update against a hand-written loss, selection counts per step, the experiment
runner (resume, summary) and the CLI end to end on a tiny random Qwen2 (no TRL needed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from gmts_analysis.core.tokens import response_logits, response_targets, sequence_logprobs, token_quantities
from gmts_analysis.rl.trainer import RLConfig, batch_fidelity, collate, policy_forward, train


def _model():
    from gmts_analysis.toy.testing import build_tiny_model

    return build_tiny_model("qwen2", vocab_size=100, seed=0)


def _tok():
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def _rows():
    g = torch.Generator().manual_seed(0)
    rows = []
    for i, (P, L) in enumerate([(3, 5), (6, 1), (2, 9), (4, 4)]):
        rows.append({"prompt_ids": [1] + torch.randint(4, 100, (P - 1,), generator=g).tolist(),
                     "response_ids": torch.randint(4, 100, (L,), generator=g).tolist(), "group_id": f"g{i // 2}"})
    return rows


def parity_reward(row: dict) -> float:
    """Mixed rewards for a random model: 1 for an even response length."""
    return float(len(row["response_ids"]) % 2 == 0)


def test_batched_forward_matches_per_answer_reference():
    model, rows = _model(), _rows()
    batch = collate(rows, pad_id=0)
    lp, ent = policy_forward(model, batch, temperature=0.7)
    for i, r in enumerate(rows):
        ids = torch.tensor(r["prompt_ids"] + r["response_ids"])
        P, L = len(r["prompt_ids"]), len(r["response_ids"])
        with torch.no_grad():
            logits = model(input_ids=ids[None]).logits[0]
        ref = sequence_logprobs(logits, ids, P, 0.7)
        q = token_quantities(response_logits(logits, P), response_targets(ids, P), 0.7)
        torch.testing.assert_close(lp[i, :L].detach(), ref, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(ent[i, :L], q.entropy, atol=2e-5, rtol=1e-5)
        assert (lp[i, L:] == 0).all() and (ent[i, L:] == 0).all()
    assert batch["mask"].sum(-1).tolist() == [len(r["response_ids"]) for r in rows]


def test_update_fidelity_all_is_one_and_selection_gradient_is_the_loss_gradient():
    from gmts_analysis.core.selection import aggregate_loss, select_tokens, token_omega
    from gmts_analysis.engine.params import trainable_parameters

    model, rows = _model(), _rows()
    params = [p for _, p in trainable_parameters(model)]
    batch = collate(rows, pad_id=0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    with torch.enable_grad():
        lp, ent = policy_forward(model, batch)
        sel = select_tokens(ent, batch["mask"], 0.3)
        om = token_omega(adv, batch["mask"]).float()
        fid = batch_fidelity(lp, om, {"all": batch["mask"].bool(), "sel": sel}, params)
        # the training loss (on-policy, normalizer all) has gradient -sum_S omega grad logp
        loss = aggregate_loss(-adv[:, None] * torch.exp(lp - lp.detach()), batch["mask"], sel, "all")
        g_loss = torch.autograd.grad(loss, params, retain_graph=True)
        g_ref = torch.autograd.grad(-(om * sel * lp).sum(), params)
    assert fid["all"]["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert fid["all"]["norm_ratio"] == pytest.approx(1.0, abs=1e-6)
    assert 0 < fid["sel"]["norm_ratio"] and -1 <= fid["sel"]["cosine"] <= 1
    for a, b in zip(g_loss, g_ref):
        torch.testing.assert_close(a, b, atol=1e-7, rtol=1e-4)


@pytest.mark.parametrize("selection", ["all", "entropy", "gmts", "gmts_lgn", "random", "entropy_inf", "one_minus_prob_inf"])
def test_train_steps_select_exact_k_and_move_the_policy(selection):
    torch.manual_seed(0)
    model, tok = _model(), _tok()
    before = [p.detach().clone() for p in model.parameters()]
    cfg = RLConfig(model="test", selection=selection, max_steps=2, domains=("arithmetic", "logic"),
                   prompts_per_domain=2, num_generations=4, max_completion_length=16, eval_every=2, eval_prompts=4,
                   diag_every=2, diag_answers=2, lr=1e-2)
    rec = train(model, tok, cfg, reward_fn=parity_reward)
    assert [e["step"] for e in rec["evals"]] == [0, 2]
    assert set(rec["final_pass1"]) == {"arithmetic", "logic"}
    for s in rec["steps"]:
        want = s["n_tokens"] if selection == "all" else math.ceil(cfg.rho * s["n_tokens"] - 1e-9)
        assert s["n_selected"] == want
        assert 0.0 <= s["overlap_entropy_gmts"] <= 1.0
        assert math.isfinite(s["loss"])
        assert set(s["waste"]) >= {"entropy", "gmts", "gmts_lgn"}
        if selection in s["waste"]:  # the trained arm's waste is the share of its picks with A = 0
            assert s["waste"][selection] == pytest.approx(s["frac_selected_zero_adv"])
    diag = rec["steps"][1]
    assert diag["fidelity"]["gmts"]["norm_ratio"] > 0
    # the diagnostics take diag_answers answers among those with A != 0 (every answer of a group
    # whose rewards differ): 4 groups of 4 here
    n_mixed = round((1.0 - diag["frac_groups_zero_std"]) * 4)
    assert diag["grad_norm_corr"]["n_answers"] == min(cfg.diag_answers, 4 * n_mixed)
    if any(s["grad_norm"] > 0 for s in rec["steps"]):
        assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    json.dumps(rec, allow_nan=True)


def test_same_seed_same_run():
    cfg = RLConfig(model="test", selection="gmts", max_steps=2, domains=("arithmetic",), prompts_per_domain=3,
                   num_generations=4, max_completion_length=16, eval_every=5, eval_prompts=2, diag_every=0, lr=1e-2)
    a = train(_model(), _tok(), cfg, reward_fn=parity_reward, initial_eval={"arithmetic": 0.0})
    b = train(_model(), _tok(), cfg, reward_fn=parity_reward, initial_eval={"arithmetic": 0.0})
    def strip(r):
        return [{k: v for k, v in s.items() if not k.endswith("_s")} for s in r["steps"]]

    assert strip(a) == strip(b)


def test_experiment_resume_summary_and_cli(tmp_path):
    from gmts_analysis.cli import main
    from gmts_analysis.rl.experiment import run_experiment, summarise
    from gmts_analysis.toy.testing import save_tiny_model

    cfg = RLConfig(model="test", max_steps=1, domains=("logic",), prompts_per_domain=2, num_generations=2,
                   max_completion_length=8, eval_every=1, eval_prompts=3, diag_every=0)
    calls = []

    def load():
        calls.append(1)
        return _model(), _tok()

    out = tmp_path / "exp.json"
    r1 = run_experiment(cfg, ["all", "gmts"], [0, 1], out, load=load, reward_fn=parity_reward)
    n_loads = len(calls)
    assert n_loads == 1 + 4  # initial evaluation + one per run
    r2 = run_experiment(cfg, ["all", "gmts"], [0, 1], out, load=load, reward_fn=parity_reward)
    assert len(calls) == n_loads  # everything reused from <stem>.runs/
    assert r1["summary"] == r2["summary"]
    s = r1["summary"]["gmts"]["logic"]
    assert s["n_seeds"] == 2 and s["min"] <= s["mean"] <= s["max"]
    assert s["mean"] == pytest.approx(np.mean(s["values"]))
    assert set(summarise(r1["runs"], ["logic"])) == {"all", "gmts"}

    # reading an experiment back from its run files, also a partial one
    from gmts_analysis.rl.experiment import load_experiment, results_table, zero_std_share
    from gmts_analysis.rl.plots import plot_final_pass1, plot_selection_diagnostics

    back = load_experiment(out)
    assert back["complete"] and back["summary"] == r1["summary"] and len(back["runs"]) == 4
    zs = zero_std_share(back)
    assert zs["n_steps"] == 4 and 0.0 <= zs["min"] <= zs["mean"] <= zs["max"] <= 1.0
    want = np.mean([s["frac_groups_zero_std"] for r in r1["runs"] for s in r["steps"]])
    assert zs["mean"] == pytest.approx(want)
    rows = results_table({"c": back})
    assert {r["arm"] for r in rows} == {"all", "gmts"}
    g = next(r for r in rows if r["arm"] == "gmts")
    assert g["mean"] == pytest.approx(r1["summary"]["gmts"]["mean"]["mean"])
    assert g["delta_vs_all"] == pytest.approx(g["mean"] - r1["summary"]["all"]["mean"]["mean"])
    assert plot_final_pass1({"c": back}, tmp_path / "f.png").stat().st_size > 1000
    assert plot_selection_diagnostics({"c": back}, tmp_path / "d.png").stat().st_size > 1000
    out.unlink()
    (tmp_path / "exp.runs" / "gmts-s1.json").unlink()
    part = load_experiment(out)
    assert not part["complete"] and len(part["runs"]) == 3 and part["summary"]["gmts"]["mean"]["n_seeds"] == 1

    # the command line, on a checkpoint saved to disk the way a user's is
    ckpt = save_tiny_model("qwen2", tmp_path / "policy", seed=0)
    rc = main(["rl", "--model", str(ckpt), "--selection", "entropy", "random", "--seed", "3", "--max-steps", "1",
               "--domains", "program", "--prompts-per-domain", "1", "--group-size", "2", "--max-new-tokens", "8",
               "--eval-every", "1", "--eval-prompts", "2", "--diag-every", "1", "--diag-answers", "1",
               "--eval-seed", "77", "--out", str(tmp_path / "cli.json"), "--figures", str(tmp_path / "fig"), "--quiet"])
    assert rc == 0
    res = json.loads((tmp_path / "cli.json").read_text())
    assert set(res["summary"]) == {"entropy", "random"} and res["config"]["domains"] == ["program"]
    assert res["config"]["eval_seed"] == 77 and {r["config"]["eval_seed"] for r in res["runs"]} == {77}
    assert (tmp_path / "fig" / "rl_cli_curves.png").stat().st_size > 1000
    assert (tmp_path / "fig" / "rl_cli_diagnostics.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "argv",
    [["--rho", "1.5"], ["--domains", "nope"], ["--group-size", "1"], ["--lr", "0"]],
)
def test_cli_bad_input_is_one_line_error(argv, tmp_path, capsys):
    from gmts_analysis.cli import main

    rc = main(["rl", "--model", str(tmp_path / "missing"), "--out", str(tmp_path / "x.json"), *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gmts: error:")


def test_one_step_on_the_shipped_tiny_policy():
    """Real verifier rewards: the shipped policy has mixed groups, so the update is not empty."""
    from gmts_analysis.readers.models import data_dir, load_model

    if not (data_dir() / "policies" / "tiny" / "model.safetensors").exists():
        pytest.skip("shipped tiny policy not present")
    model, tok = load_model("tiny", "cpu")
    cfg = RLConfig(model="tiny", selection="gmts", max_steps=1, domains=("logic",), prompts_per_domain=3,
                   num_generations=6, eval_every=1, eval_prompts=10, diag_every=1, diag_answers=2)
    rec = train(model, tok, cfg)
    s = rec["steps"][0]
    assert 0.0 < s["reward_mean"] < 1.0 and s["grad_norm"] > 0
    assert s["frac_selected_zero_adv"] == 0.0  # GMTS never spends its budget on A = 0 answers here
    assert 0.0 <= rec["final_pass1"]["logic"] <= 1.0
    assert -1.0 <= s["fidelity"]["gmts"]["cosine"] <= 1.0


# ----------------------------------------------------------------------------- gmts_lgn selection


def test_gmts_lgn_scores_are_autograd_logit_grad_norm_times_abs_omega_and_select_the_top():
    """gmts_lgn = ||d logprob / d z|| * |omega|: the norm from autograd on the raw logits (tau = 0.7),
    the selection the exact top-k of that product by an explicit sort, per batch and per group."""
    import math as _m

    from gmts_analysis.core.selection import gmts_lgn_scores, selection_mask, token_omega

    g = torch.Generator().manual_seed(4)
    B, T, V, tau = 6, 7, 11, 0.7
    z = torch.randn(B, T, V, generator=g, dtype=torch.float64)
    tgt = torch.randint(0, V, (B, T), generator=g)
    lengths = torch.tensor([7, 3, 5, 1, 6, 4])
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    adv = torch.tensor([1.0, -1.0, 0.0, 0.0, 0.5, -0.5])
    groups = ["a", "a", "b", "b", "c", "c"]
    lgn = torch.zeros(B, T, dtype=torch.float64)
    for i in range(B):
        for t in range(T):
            zz = z[i, t].clone().requires_grad_(True)
            lp = torch.log_softmax(zz / tau, -1)[tgt[i, t]]
            (gz,) = torch.autograd.grad(lp, zz)
            lgn[i, t] = gz.norm()
    closed = token_quantities(z, tgt, tau).logit_grad_norm
    assert torch.allclose(closed, lgn, atol=1e-12)
    om = token_omega(adv, mask)
    s = gmts_lgn_scores(closed, adv, mask)
    assert torch.allclose(s, torch.where(mask.bool(), lgn * om.abs(), torch.zeros_like(lgn)), atol=1e-15)
    ent = torch.rand(B, T, generator=g)
    for scope in ("batch", "group"):
        for rho in (0.1, 0.3):
            sel = selection_mask("gmts_lgn", ent, adv, mask, rho=rho, scope=scope, group_ids=groups,
                                 logit_grad_norm=closed)
            scopes = {"all": list(range(B))} if scope == "batch" else {
                k: [i for i in range(B) if groups[i] == k] for k in dict.fromkeys(groups)}
            want = torch.zeros(B, T, dtype=torch.bool)
            for rows in scopes.values():
                toks = [(float(s[i, t]), i, t) for i in rows for t in range(int(lengths[i]))]
                k = _m.ceil(rho * len(toks) - 1e-9)
                for _, i, t in sorted(toks, key=lambda x: (-x[0], x[1], x[2]))[:k]:
                    want[i, t] = True
            assert torch.equal(sel, want), (scope, rho)
    # zero-advantage answers are never picked at batch scope while informative tokens remain
    sel = selection_mask("gmts_lgn", ent, adv, mask, rho=0.3, logit_grad_norm=closed)
    assert not sel[2:4].any()
    with pytest.raises(ValueError, match="logit_grad_norm"):
        selection_mask("gmts_lgn", ent, adv, mask)


def test_one_name_per_setting_from_flag_to_config_and_committed_records_still_read():
    """Each setting of gmts rl has one name from its flag to RLConfig (TRL's: model, max_steps, num_generations,
    max_completion_length); run records keep the keys they have always had (RECORD_KEYS), so every committed
    record of data/rl reads back into an RLConfig and is written again with the same keys, in the same order."""
    from dataclasses import fields
    from pathlib import Path

    from gmts_analysis.rl.config import RECORD_KEYS, RLOptions, config_of_record, record_config

    run_only = {"offline", "selection", "seed", "device", "threads", "out", "figures", "quiet"}  # per run or the CLI's
    flags = {f.name for f in fields(RLOptions)} - run_only
    assert flags <= {f.name for f in fields(RLConfig)}, sorted(flags - {f.name for f in fields(RLConfig)})
    cfg = RLOptions(num_generations=3, max_completion_length=7, max_steps=5, model="tiny").config(device="cpu")
    assert (cfg.num_generations, cfg.max_completion_length, cfg.max_steps, cfg.model) == (3, 7, 5, "tiny")
    rec = record_config(cfg)
    assert (rec["group_size"], rec["max_new_tokens"], rec["steps"], rec["policy"]) == (3, 7, 5, "tiny")
    assert set(RECORD_KEYS) <= {f.name for f in fields(RLConfig)}
    assert config_of_record({"num_generations": 4}) == RLConfig(num_generations=4)  # a field's own name reads too
    root = Path(__file__).resolve().parents[1] / "data" / "rl"
    paths = sorted(root.glob("*.runs/*-s*.json"))[:40] + sorted(root.glob("*.runs/initial.json"))[:5]
    assert paths, root
    for p in paths:
        conf = json.loads(p.read_text())["config"]
        back = json.loads(json.dumps(record_config(config_of_record(conf))))  # initial.json: the shared part
        assert {k: back[k] for k in conf} == conf and [k for k in back if k in conf] == list(conf), p
    from gmts_analysis.errors import GmtsError

    with pytest.raises(GmtsError, match="config.group_sizes: not a field"):
        config_of_record({"group_sizes": 4})
