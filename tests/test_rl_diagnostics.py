"""Live training diagnostics (gmts/... metrics): the cheap part equals the stats.json functions on
the same batch written as a tokens table; the gradient part equals the plain autograd loop and
scipy; the TRL callback runs 2 steps on CPU with a stock GRPOTrainer and its values reach TRL's
logs; SelectiveGRPOTrainer's option does the same; the verl hook reads verl's batch."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from gmts_analysis.integrations.diagnostics import (
    PREFIX,
    diagnose_batch,
    gradient_diagnostics,
    sample_answers,
    selection_diagnostics,
    trl_sequences,
    verl_diagnostics,
)


def _batch(seed=0, B=12, T=9, G=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    rewards[:G] = 1.0  # group 0: all equal -> A = 0
    adv = torch.zeros(B)
    for s in range(0, B, G):
        r = rewards[s : s + G]
        adv[s : s + G] = r - r.mean()
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * mask
    ent[:G] += 0.5 * mask[:G]  # the zero-advantage group is uncertain: entropy wastes picks on it
    lgn = torch.rand(B, T, generator=g, dtype=torch.float64) * mask
    groups = [f"g{i // G}" for i in range(B)]
    return ent, lgn, adv, mask, groups


def _table(ent, lgn, omega, mask, groups):
    rows = []
    for i in range(mask.shape[0]):
        for t in range(int(mask[i].sum())):
            rows.append({"answer_id": f"a{i:03d}", "group_id": groups[i], "position": t,
                         "entropy": float(ent[i, t]), "omega": float(omega[i, t]),
                         "gmts": float(ent[i, t]) * abs(float(omega[i, t])),
                         "gmts_lgn": float(lgn[i, t]) * abs(float(omega[i, t])), "grad_norm": np.nan})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("scope", ["batch", "group"])
@pytest.mark.parametrize("rho", [0.05, 0.2])
def test_selection_part_equals_stats_functions(scope, rho):
    from gmts_analysis.analysis import stats
    from gmts_analysis.core.selection import token_omega

    ent, lgn, adv, mask, groups = _batch()
    omega = token_omega(adv, mask)
    d = selection_diagnostics(ent, omega, mask, rho=rho, scope=scope, group_ids=groups, logit_grad_norm=lgn)
    df = _table(ent, lgn, omega, mask, groups)
    inf = stats.informative_mask(df)
    za = stats.zero_advantage(df, inf)
    assert d[PREFIX + "zero_advantage/token_share"] == pytest.approx(za["token_share"])
    assert d[PREFIX + "zero_advantage/answer_share"] == pytest.approx(za["answers"] / mask.shape[0])
    assert d[PREFIX + "zero_advantage/group_share"] == pytest.approx(za["groups"] / len(set(groups)))
    assert za["groups"] >= 1  # the batch has an all-equal group
    waste = stats.topk_and_waste(df, ["entropy", "gmts", "gmts_lgn"], inf, rhos=[rho])["selection_waste"][scope]
    rk = stats.rho_key(rho)
    for s in ("entropy", "gmts", "gmts_lgn"):
        assert d[PREFIX + f"selection_waste/{s}"] == pytest.approx(waste[s][rk]), s
    if scope == "batch":  # |omega| = 0 ranks last; enough informative tokens in the batch
        assert d[PREFIX + "selection_waste/gmts"] == 0.0
    else:  # group scope: the all-equal group must still fill its own quota with omega = 0 tokens
        assert d[PREFIX + "selection_waste/gmts"] > 0.0
    assert d[PREFIX + "selection_waste/entropy"] > 0.0
    # overlap: explicit sets from the table's own selections
    from gmts_analysis.core.selection import select_top

    e, gm, gl = (select_top(df, s, rho, scope) for s in ("entropy", "gmts", "gmts_lgn"))
    assert d[PREFIX + "overlap/entropy_gmts"] == pytest.approx((e & gm).sum() / gm.sum())
    assert d[PREFIX + "overlap/gmts_gmts_lgn"] == pytest.approx((gm & gl).sum() / gl.sum())


def _tiny():
    from gmts_analysis.toy.testing import build_tiny_model

    return build_tiny_model("qwen2", vocab_size=100, seed=0).eval()


def test_gradient_part_equals_autograd_loop_and_scipy():
    from gmts_analysis.core.selection import token_omega
    from gmts_analysis.engine import grad_norms
    from gmts_analysis.integrations.diagnostics import diagnostic_scores

    model = _tiny()
    ent, lgn, adv, mask, groups = _batch(seed=1)
    omega = token_omega(adv, mask)
    g = torch.Generator().manual_seed(3)
    B, T = mask.shape
    prompt_ids = torch.randint(4, 100, (B, 3), generator=g)
    completion_ids = torch.randint(4, 100, (B, T), generator=g)
    seqs = trl_sequences(prompt_ids, torch.ones_like(prompt_ids), completion_ids, mask)
    picks = sample_answers(omega, mask, 20, seed=5)
    assert sum(n for _, n in picks) == 20 and all(adv[r] != 0 for r, _ in picks)
    scores = diagnostic_scores(ent, omega, mask, lgn)
    d = gradient_diagnostics(model, seqs, picks, scores, omega)
    # independent: the per-token autograd loop and scipy
    within = {k: [] for k in scores}
    xs = {k: [] for k in scores}
    ys = []
    for r, n in picks:
        ids, P = seqs[r]
        gn = grad_norms(model, ids[: P + n], P, method="loop").norms.numpy()
        om = omega[r, :n].numpy()
        for k, s in scores.items():
            sv = s[r, :n].numpy()
            if n >= 5:
                within[k].append(spearmanr(sv, gn).statistic)
            xs[k].append(sv[om != 0])
        ys.append((np.abs(om) * gn)[om != 0])
    for k in scores:
        w = [v for v in within[k] if not math.isnan(v)]
        assert d[PREFIX + f"grad/within_answer/{k}"] == pytest.approx(np.mean(w), abs=1e-6)
        ref = spearmanr(np.concatenate(xs[k]), np.concatenate(ys)).statistic
        assert d[PREFIX + f"grad/cross_answer_informative/{k}"] == pytest.approx(ref, abs=1e-6)
    assert d[PREFIX + "grad/n_tokens"] == 20


def test_verl_hook_same_dictionary():
    ent, lgn, adv, mask, groups = _batch(seed=2)
    data = SimpleNamespace(
        batch={"old_entropys": ent.float(), "advantages": adv[:, None] * mask, "response_mask": mask.float(),
               "old_logit_grad_norm": lgn.float()},
        non_tensor_batch={"uid": np.array(groups, dtype=object)},
    )
    d = verl_diagnostics(data, rho=0.2, scope="group")
    from gmts_analysis.core.selection import token_omega

    ref = diagnose_batch(ent.float(), token_omega(adv, mask), mask, rho=0.2, scope="group", group_ids=groups,
                         logit_grad_norm=lgn.float())
    assert d.keys() == ref.keys()
    for k in d:
        assert d[k] == pytest.approx(ref[k], nan_ok=True), k
    assert all(k.startswith(PREFIX) for k in d)


# ----------------------------------------------------------------------------- TRL, 2 steps on CPU

trl = pytest.importorskip("trl")


def _trl_setup(tmp_path, cls, **kw):
    from datasets import Dataset

    from gmts_analysis.toy.domains import generate_problems
    from gmts_analysis.toy.testing import build_tiny_model
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()  # a tiny random Qwen2 as in test_rl_trl.py: diverse samples, mixed rewards
    model = build_tiny_model("qwen2", vocab_size=len(tok), seed=0)
    model.config.bos_token_id, model.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    model.config.pad_token_id = model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    probs = generate_problems("arithmetic", 4, seed=0, split="train")

    def reward(prompts, completions, **_):
        """Mixed inside a group whatever the policy: parity of the completion's character codes."""
        return [float(sum(map(ord, c)) % 2) for c in completions]

    base = {"output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 8, "num_generations": 4,
            "max_completion_length": 24, "max_steps": 2, "learning_rate": 1e-3, "logging_steps": 1,
            "report_to": "none", "use_cpu": True, "seed": 0, "save_strategy": "no", "disable_dropout": True,
            "dataloader_num_workers": 0}
    base.update(kw)
    return model, tok, Dataset.from_dict({"prompt": [p.prompt for p in probs]}), reward, base


def _captured(cb):
    seen = []
    run = cb.run

    def wrapped(model, inputs):
        seen.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in inputs.items()})
        return run(model, inputs)

    cb.run = wrapped
    return seen


def test_trl_callback_two_steps_metrics_in_logs_and_equal_stats(tmp_path):
    from trl import GRPOConfig, GRPOTrainer

    from gmts_analysis.analysis import stats
    from gmts_analysis.integrations.diagnostics import GmtsDiagnosticsCallback

    model, tok, ds, reward, base = _trl_setup(tmp_path, GRPOConfig)
    tr = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**base), train_dataset=ds,
                     processing_class=tok)
    cb = GmtsDiagnosticsCallback(every=1, rho=0.2, scope="group", max_tokens=16).attach(tr)
    seen = _captured(cb)
    tr.train()
    # the diagnostics observe only: the same run without them has the same losses and weights
    model2, tok2, ds2, reward2, base2 = _trl_setup(tmp_path, GRPOConfig)
    plain = GRPOTrainer(model=model2, reward_funcs=reward2, args=GRPOConfig(**base2), train_dataset=ds2,
                        processing_class=tok2)
    plain.train()
    losses = [[h["loss"] for h in t.state.log_history if "loss" in h] for t in (tr, plain)]
    assert len(losses[0]) == 2 and losses[0] == losses[1]
    for a, b in zip(tr.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)
    assert len(cb.history) == 2 and len(seen) == 2
    logs = [h for h in tr.state.log_history if PREFIX + "selection_waste/entropy" in h]
    assert len(logs) == 2
    for (_step, m), h in zip(cb.history, logs):
        for k in (PREFIX + "zero_advantage/token_share", PREFIX + "selection_waste/gmts",
                  PREFIX + "overlap/entropy_gmts", PREFIX + "grad/cross_answer_informative/gmts"):
            assert h[k] == pytest.approx(m[k]), k
        assert m[PREFIX + "grad/n_tokens"] == 16  # the bound, reached: informative answers exist
        assert -1.0 <= m[PREFIX + "grad/cross_answer_informative/gmts"] <= 1.0
    # independent recomputation on the captured micro-batch: own forward, Categorical entropy,
    # omega != 0 iff A != 0 (on-policy, no KL), then the stats.json functions on the table
    for (_step, m), inp in zip(cb.history, seen):
        cm = inp["completion_mask"]
        ids = torch.cat([inp["prompt_ids"], inp["completion_ids"]], 1)
        att = torch.cat([inp["prompt_mask"], cm], 1)
        C = cm.shape[1]
        with torch.no_grad():
            logits = tr.model(input_ids=ids, attention_mask=att).logits[:, -C - 1 : -1].double()
        ent = torch.distributions.Categorical(logits=logits / tr.temperature).entropy() * cm
        A = inp["advantages"]
        rows = inp["gmts_row_ids"]
        groups = [f"g{int(r) // 4}" for r in rows]
        omega = (A[:, None] * cm / cm.sum()).double()
        df = _table(ent, torch.zeros_like(ent), omega, cm, groups)
        inf = stats.informative_mask(df)
        assert m[PREFIX + "zero_advantage/token_share"] == pytest.approx(stats.zero_advantage(df, inf)["token_share"])
        w = stats.topk_and_waste(df, ["entropy", "gmts"], inf, rhos=[0.2])["selection_waste"]["group"]
        assert m[PREFIX + "selection_waste/entropy"] == pytest.approx(w["entropy"]["0.2"])
        assert m[PREFIX + "selection_waste/gmts"] == pytest.approx(w["gmts"]["0.2"])


def test_selective_trainer_option_and_gmts_lgn(tmp_path):
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer

    model, tok, ds, reward, base = _trl_setup(tmp_path, SelectiveGRPOConfig)
    args = SelectiveGRPOConfig(**base, token_selection="gmts_lgn", selection_rho=0.1, diagnostics_every=1,
                               diagnostics_tokens=8)
    tr = SelectiveGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    tr.train()
    logs = [h for h in tr.state.log_history if PREFIX + "selection_waste/gmts_lgn" in h]
    assert len(logs) == 2 and len(tr.diagnostics.history) == 2
    assert all(0.0 <= h[PREFIX + "overlap/gmts_gmts_lgn"] <= 1.0 for h in logs)
    sel = [h["gmts/selection/frac_selected"] for h in tr.state.log_history if "gmts/selection/frac_selected" in h]
    assert sel and all(0.0 < f <= 1.0 for f in sel)  # the trainer's own metric, in the gmts/ namespace


def test_grad_seconds_covers_the_whole_diagnostic(tmp_path, monkeypatch):
    """gmts/grad/seconds is everything the callback adds to a step: a slow no-grad forward (outside the
    gradient part) is counted in it."""
    import time

    from trl import GRPOConfig, GRPOTrainer

    from gmts_analysis.integrations import diagnostics

    slow = 0.4
    real = diagnostics.completion_quantities

    def slow_forward(*a, **k):
        time.sleep(slow)
        return real(*a, **k)

    monkeypatch.setattr(diagnostics, "completion_quantities", slow_forward)
    model, tok, ds, reward, base = _trl_setup(tmp_path, GRPOConfig, max_steps=1)
    tr = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**base), train_dataset=ds,
                     processing_class=tok)
    cb = diagnostics.GmtsDiagnosticsCallback(every=1, rho=0.2, max_tokens=4).attach(tr)
    tr.train()
    (_, m), = cb.history
    assert m[PREFIX + "grad/seconds"] >= slow
    logged = [h[PREFIX + "grad/seconds"] for h in tr.state.log_history if PREFIX + "grad/seconds" in h]
    assert logged == [pytest.approx(m[PREFIX + "grad/seconds"])]


def test_diagnosed_steps_are_1_then_every_nth_and_off_by_default(tmp_path):
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig, SelectiveGRPOTrainer

    model, tok, ds, reward, base = _trl_setup(tmp_path, SelectiveGRPOConfig, max_steps=3, max_completion_length=8)
    args = SelectiveGRPOConfig(**base, token_selection="entropy", selection_cutoff="quantile", diagnostics_every=2,
                               diagnostics_tokens=0)
    tr = SelectiveGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok)
    tr.train()
    assert [s for s, _ in tr.diagnostics.history] == [0, 2]  # global_step before the update
    logged = [h for h in tr.state.log_history if PREFIX + "selection_waste/entropy" in h]
    assert [h["step"] for h in logged] == [1, 3]  # as TRL logs them
    assert all(h[PREFIX + "cutoff_quantile"] == 1.0 for h in logged)
    assert all(PREFIX + "grad/seconds" in h for h in logged)  # the cost is logged, gradient part or not
    # off unless set
    model, tok, ds, reward, base = _trl_setup(tmp_path, SelectiveGRPOConfig, max_steps=1, max_completion_length=8)
    plain = SelectiveGRPOTrainer(model=model, reward_funcs=reward, args=SelectiveGRPOConfig(**base), train_dataset=ds,
                                 processing_class=tok)
    assert plain.args.diagnostics_every == 0 and plain.diagnostics is None


def test_diagnostics_cutoff_quantile_selects_as_trl():
    ent, lgn, adv, mask, groups = _batch()
    omega = adv[:, None].double() * mask
    from gmts_analysis.core.selection import select_tokens

    d = selection_diagnostics(ent, omega, mask, rho=0.3, cutoff="quantile")
    sel = select_tokens(ent, mask, 0.3, cutoff="quantile")
    assert d[PREFIX + "selection_waste/entropy"] == float((sel & (omega == 0)).sum()) / int(sel.sum())
    with pytest.raises(ValueError, match="cutoff"):
        from gmts_analysis.integrations.diagnostics import GmtsDiagnosticsCallback

        GmtsDiagnosticsCallback(cutoff="exact")
