"""Update fidelity against a direct autograd computation on a tiny model."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from gmts_analysis.engine.fidelity import (
    compare,
    fidelity_for_run,
    fidelity_selections,
    selection_gradients,
    update_fidelity,
)
from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.testing import build_tiny_model


def _setup(arch="gpt2", n_answers=4, seed=0):
    torch.manual_seed(seed)
    model = build_tiny_model(arch, dtype=torch.float64, seed=seed)
    rng = np.random.default_rng(seed)
    batches, rows = [], []
    for i in range(n_answers):
        P, T = int(rng.integers(2, 5)), int(rng.integers(3, 8))
        ids = torch.tensor(rng.integers(3, 64, P + T), dtype=torch.long)
        batches.append((f"a{i}", ids, P))
        omega = float(rng.normal()) / 10
        for t in range(T):
            rows.append({"answer_id": f"a{i}", "group_id": f"g{i // 2}", "position": t, "omega": omega,
                         "entropy": float(rng.random()), "grad_norm": float(rng.random()),
                         "domain": "x" if i % 2 else "y"})
    df = pd.DataFrame(rows)
    df["gmts"] = df["entropy"] * df["omega"].abs()
    return model, batches, df


def _direct(model, batches, df, mask, tau=1.0):
    """g_S by hand: one summed objective over answers, log-softmax written out here."""
    params = [p for p in model.parameters()]  # parameters() yields a tied tensor once
    obj = 0.0
    for aid, ids, P in batches:
        sub = df[df["answer_id"] == aid].sort_values("position")
        m = torch.as_tensor(mask[sub.index.to_numpy()])
        om = torch.as_tensor(sub["omega"].to_numpy().copy())
        logits = model(input_ids=ids[None]).logits[0].double()
        logp = torch.log_softmax(logits[P - 1 : -1] / tau, dim=-1).gather(-1, ids[P:, None])[:, 0]
        obj = obj + (om * m * logp).sum()
    grads = torch.autograd.grad(obj, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1) for g, p in zip(grads, params)])


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_selection_gradients_match_direct_autograd(arch):
    model, batches, df = _setup(arch)
    masks = fidelity_selections(df, ["entropy", "gmts"], rho=0.3, n_random=2, seed=1)
    with torch.enable_grad():
        got = selection_gradients(model, batches, df, masks, temperature=0.7)
        for k, m in masks.items():
            ref = _direct(model, batches, df, m, tau=0.7)
            torch.testing.assert_close(got[k].double(), ref, rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in model.parameters())  # the model is left as given


def test_linearity_and_reference_identities():
    model, batches, df = _setup()
    a0 = (df["answer_id"] == "a0").to_numpy()
    masks = {"all": np.ones(len(df), bool), "a0": a0, "rest": ~a0, "none": np.zeros(len(df), bool)}
    g = selection_gradients(model, batches, df, masks)
    torch.testing.assert_close(g["a0"] + g["rest"], g["all"], rtol=1e-5, atol=1e-7)
    assert compare(g["all"], g["all"]) == pytest.approx({"cosine": 1.0, "norm_ratio": 1.0})
    assert float(g["none"].abs().sum()) == 0.0
    assert np.isnan(compare(g["none"], g["all"])["cosine"])
    # hand check of cosine and ratio on small vectors
    r = compare(torch.tensor([3.0, 4.0]), torch.tensor([6.0, 0.0]))
    assert r["cosine"] == pytest.approx(0.6) and r["norm_ratio"] == pytest.approx(5 / 6)


def test_update_fidelity_block():
    model, batches, df = _setup()
    out = update_fidelity(model, iter(batches), df, ["entropy", "gmts"], rho=0.2, n_random=3)
    assert set(out) == {"all", "oracle", "entropy", "gmts", "random", "random_std"}
    assert out["all"]["cosine"] == pytest.approx(1.0) and out["all"]["norm_ratio"] == pytest.approx(1.0)
    for k in ("oracle", "entropy", "gmts", "random"):
        assert -1.0 - 1e-9 <= out[k]["cosine"] <= 1.0 + 1e-9
        assert out[k]["norm_ratio"] >= 0
    # rho = 1 keeps everything: every selection is the full gradient
    out1 = update_fidelity(model, iter(batches), df, ["entropy"], rho=1.0, n_random=1)
    assert out1["entropy"]["cosine"] == pytest.approx(1.0) and out1["random"]["norm_ratio"] == pytest.approx(1.0)


def test_errors_are_clear():
    model, batches, df = _setup()
    masks = {"all": np.ones(len(df), bool)}
    with pytest.raises(GmtsError, match="GB"):
        selection_gradients(model, batches, df, masks, memory_budget_bytes=10)
    with pytest.raises(GmtsError, match="not given"):
        selection_gradients(model, batches[:-1], df, masks)
    aid, ids, P = batches[0]
    with pytest.raises(GmtsError, match="response tokens"):
        selection_gradients(model, [(aid, ids[:-1], P)] + batches[1:], df, masks)
    with pytest.raises(GmtsError, match="not in the tokens table"):
        fidelity_selections(df, ["surprisal"])


def test_fidelity_for_run_fills_slices():
    from gmts_analysis.readers.rollouts import Answer

    model, batches, df = _setup()
    answers = [Answer(answer_id=aid, group_id="g", prompt_ids=ids[:P].tolist(), response_ids=ids[P:].tolist(),
                      reward=0.0) for aid, ids, P in batches]
    res = fidelity_for_run(model, answers, df, temperature=1.0, seed=0, estimators=["entropy", "gmts"])
    assert res["fidelity"]["all"]["cosine"] == pytest.approx(1.0)
    assert set(res["fidelity_by_domain"]) == {"x", "y"} and res["fidelity_by_step"] == {}
    # compute_stats alone puts the blocks into the statistics' shape
    from gmts_analysis.analysis.stats import compute_stats

    stats = compute_stats(df, None, n_boot=0, min_groups=1, **res)
    assert stats["update_fidelity"] == res["fidelity"]
    for d in ("x", "y"):
        blk = stats["by_domain"][d]["update_fidelity"]
        assert blk["all"]["norm_ratio"] == pytest.approx(1.0)
        assert {"entropy", "gmts", "oracle", "random"} <= set(blk)
    # the domain block selects inside the domain and compares with the domain's full gradient
    from gmts_analysis.core.selection import select_top

    rows = np.flatnonzero((df["domain"] == "x").to_numpy())
    sub = df.iloc[rows].reset_index(drop=True)
    sel = np.zeros(len(df), bool)
    sel[rows] = select_top(sub, "entropy", 0.2, "batch")
    in_x = np.zeros(len(df), bool)
    in_x[rows] = True
    ref = compare(_direct(model, batches, df, sel), _direct(model, batches, df, in_x))
    assert stats["by_domain"]["x"]["update_fidelity"]["entropy"] == pytest.approx(ref, rel=1e-5)
