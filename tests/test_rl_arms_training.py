"""What the referee's experiment (docs/studies/referee.md section 7) adds to gmts rl: dynamic sampling (groups with
all-equal rewards leave the batch), the final pass@1 on its own, larger prompt set, and mass capture in
the live diagnostics, each checked against what it must equal on a tiny random Qwen2."""

from __future__ import annotations

import math

import pytest
import torch

from gmts_analysis.rl import trainer as T
from gmts_analysis.rl.trainer import RLConfig, collate, mass_capture, train


def _model():
    from gmts_analysis.toy.testing import build_tiny_model

    return build_tiny_model("qwen2", vocab_size=100, seed=0)


def _tok():
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    return build_char_tokenizer()


def parity_reward(row: dict) -> float:
    """Mixed rewards for a random model: 1 for an even response length."""
    return float(len(row["response_ids"]) % 2 == 0)


def _cfg(**kw) -> RLConfig:
    base = dict(model="test", max_steps=3, domains=("arithmetic",), prompts_per_domain=4, num_generations=4,
                max_completion_length=12, eval_every=3, eval_prompts=2, diag_every=0, lr=1e-2, rho=0.3)
    base.update(kw)
    return RLConfig(**base)


def _strip(rec: dict) -> list[dict]:
    """The per-step records without timings and without the arm-specific waste entries."""
    return [{k: v for k, v in s.items() if not k.endswith("_s") and k != "waste"} for s in rec["steps"]]


def test_dynamic_sampling_entropy_inf_is_entropy():
    """With binary rewards and dynamic sampling every kept answer has A != 0, so the masked baseline
    selects exactly what entropy selects: the two runs are the same run (losses, updates, pass@1)."""
    runs = {}
    for arm in ("entropy", "entropy_inf"):
        torch.manual_seed(0)
        runs[arm] = train(_model(), _tok(), _cfg(selection=arm, dynamic_sampling=True), reward_fn=parity_reward,
                          initial_eval={"arithmetic": 0.0})
    a, b = runs["entropy"], runs["entropy_inf"]
    assert _strip(a) == _strip(b)
    assert a["final_pass1"] == b["final_pass1"]
    kept_steps = [s for s in a["steps"] if not s.get("skipped")]
    assert kept_steps, "the parity reward gives mixed groups"
    for s in kept_steps:
        assert s["frac_tokens_zero_adv"] == 0.0  # every kept group has signal
        assert s["n_groups_kept"] == round(s["n_groups"] * (1.0 - s["frac_groups_zero_std"]))
        assert s["n_selected"] == math.ceil(0.3 * s["n_tokens"] - 1e-9)


def test_without_dynamic_sampling_the_zero_groups_stay():
    rec = train(_model(), _tok(), _cfg(selection="entropy"), reward_fn=parity_reward, initial_eval={"arithmetic": 0.0})
    for s in rec["steps"]:
        assert s["n_groups_kept"] == s["n_groups"] == 4
        assert "skipped" not in s


def test_dynamic_sampling_skips_a_batch_without_signal():
    """A constant reward: every group leaves, no step updates the policy, each step says so."""
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    rec = train(model, _tok(), _cfg(selection="gmts", dynamic_sampling=True), reward_fn=lambda row: 1.0,
                initial_eval={"arithmetic": 0.0})
    assert [s["step"] for s in rec["steps"]] == [1, 2, 3]
    for s in rec["steps"]:
        assert s["skipped"] is True and s["n_groups_kept"] == 0 and s["n_groups"] == 4
        assert s["frac_groups_zero_std"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


@pytest.mark.parametrize("final", [0, 6])
def test_final_pass1_on_its_own_prompt_set(final, monkeypatch):
    calls = []

    def fake_evaluate(model, tokenizer, cfg, n_prompts=None):
        n = n_prompts or cfg.eval_prompts
        calls.append(n)
        return {d: 1.0 / n for d in cfg.domains}  # tells the prompt count back

    monkeypatch.setattr(T, "evaluate", fake_evaluate)
    rec = train(_model(), _tok(), _cfg(selection="all", final_eval_prompts=final), reward_fn=parity_reward,
                initial_eval={"arithmetic": 0.0})
    assert rec["final_eval_prompts"] == (final or 2)
    assert [e["step"] for e in rec["evals"]] == [0, 3]
    if final:
        assert calls == [2, 6]  # the curve keeps eval_prompts; the final pass@1 is measured once more
        assert rec["final_pass1"] == {"arithmetic": 1.0 / 6}
    else:
        assert calls == [2]
        assert rec["final_pass1"] == rec["evals"][-1]["pass1"]


def _hand_norms(model, row: dict, temperature: float) -> list[float]:
    """||grad_theta log p_t|| of every response token by one autograd.grad per token (float64 sums)."""
    params = [p for p in model.parameters() if p.requires_grad]
    ids = torch.tensor([list(row["prompt_ids"]) + list(row["response_ids"])])
    P = len(row["prompt_ids"])
    out = []
    for t, target in enumerate(row["response_ids"]):
        logits = model(input_ids=ids).logits[0, P + t - 1].float() / temperature
        lp = torch.log_softmax(logits, -1)[target]
        grads = torch.autograd.grad(lp, params, allow_unused=True)
        out.append(math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads if g is not None)))
    return out


def test_mass_capture_is_a_ratio_of_hand_sums():
    """mass(S) / mass(true top-rho) with mass = sum |omega_t| * ||grad log p_t||, recomputed by a plain
    per-token autograd loop; the true top-rho holds 1.0, any other selection at most 1.0."""
    torch.manual_seed(0)
    model = _model().float()
    g = torch.Generator().manual_seed(1)
    rows = []
    for i, (P, L) in enumerate([(3, 5), (6, 2), (2, 7), (4, 4)]):
        rows.append({"prompt_ids": [1] + torch.randint(4, 100, (P - 1,), generator=g).tolist(),
                     "response_ids": torch.randint(4, 100, (L,), generator=g).tolist(), "group_id": f"g{i // 2}"})
    batch = collate(rows, 0, torch.device("cpu"))
    mask = batch["mask"]
    omega = torch.randn(mask.shape, generator=g) * mask
    omega[1] = 0.0  # an answer without signal carries no mass
    cfg = _cfg(rho=0.4, temperature=1.0)
    mass = torch.zeros(mask.shape, dtype=torch.float64)
    for i, r in enumerate(rows):
        if i == 1:
            continue
        L = len(r["response_ids"])
        mass[i, :L] = omega[i, :L].abs().double() * torch.tensor(_hand_norms(model, r, 1.0), dtype=torch.float64)
    k = math.ceil(0.4 * int(mask.sum()) - 1e-9)
    flat = mass[mask.bool()]
    best = float(flat.sort(descending=True).values[:k].sum())
    top = torch.zeros_like(mask, dtype=torch.bool)
    top[mask.bool()] = mass[mask.bool()] >= flat.sort(descending=True).values[k - 1]
    first = torch.zeros_like(top)
    first[:, 0] = True  # the first token of every answer: 4 picks, one in the answer without signal
    got = mass_capture(model, rows, omega, mask, {"top": top, "first": first}, cfg, [r["group_id"] for r in rows])
    assert got["top"] == pytest.approx(1.0, rel=1e-5)
    want = float(mass[first].sum()) / best
    assert got["first"] == pytest.approx(want, rel=1e-4)
    assert 0.0 < got["first"] < 1.0
