"""The registry of per-token scores (gmts_analysis.core.scores): a score registered in one place is an
estimator column of the probe's tables and statistics, a selection arm of the core selection, of
``gmts rl`` (CLI choice, RLConfig, a training step), of the TRL and verl drop-ins, a live diagnostic and
a line colour of the RL figures; unregistered, it is gone from all of them. The built-in registry
reproduces the former hand-written lists."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch

from gmts_analysis.core import scores
from gmts_analysis.core.scores import Score, get_score
from gmts_analysis.errors import GmtsError

NEW = "entropy_sq"
COLOR = "#123456"


def _entropy_sq() -> Score:
    return Score(NEW, ("entropy",), lambda q: q["entropy"] * q["entropy"], "squared entropy (nats^2), a test score",
                 arm=True, diagnostic=True, color=COLOR)


@pytest.fixture
def entropy_sq():
    """Registers the new score for one test and removes it afterwards (whatever the test did)."""
    with scores.registered(_entropy_sq()) as s:
        yield s
    assert NEW not in scores.SELECTION_ARMS


def test_builtin_registry_reproduces_the_former_lists():
    from gmts_analysis.core.estimators import ESTIMATORS, MASKED, SAME_WITHIN_ANSWER, ZERO_WHERE_OMEGA_ZERO
    from gmts_analysis.integrations.diagnostics import SCORES
    from gmts_analysis.rl.config import DEFAULT_ARMS, SELECTION_ARMS
    from gmts_analysis.rl.plots import ARMS, COLORS

    assert tuple(ESTIMATORS) == ("entropy", "entropy_inf", "gmts", "abs_omega", "surprisal", "one_minus_prob",
                                 "one_minus_prob_inf", "rsi", "logit_grad_norm", "gmts_lgn", "head_grad_norm",
                                 "gmts_head")
    assert SELECTION_ARMS == ("all", "entropy", "gmts", "gmts_lgn", "random", "entropy_inf", "one_minus_prob_inf")
    assert ARMS == SELECTION_ARMS and DEFAULT_ARMS == ("all", "entropy", "gmts", "gmts_lgn", "random")
    assert ZERO_WHERE_OMEGA_ZERO == ("entropy_inf", "gmts", "abs_omega", "one_minus_prob_inf", "gmts_lgn", "gmts_head")
    assert dict(SAME_WITHIN_ANSWER) == {"entropy_inf": "entropy", "gmts": "entropy",
                                        "one_minus_prob_inf": "one_minus_prob", "gmts_lgn": "logit_grad_norm",
                                        "gmts_head": "head_grad_norm"}
    assert dict(MASKED) == {"entropy_inf": "entropy", "one_minus_prob_inf": "one_minus_prob"}
    assert SCORES == ("entropy", "gmts", "gmts_lgn")
    assert COLORS["gmts"] == "#d62728" and set(COLORS) == set(SELECTION_ARMS)


def test_registry_refuses_bad_scores():
    with pytest.raises(GmtsError, match="already registered"):
        scores.register(Score("gmts", ("entropy",), lambda q: q["entropy"], "dup"))
    with pytest.raises(GmtsError, match="unknown quantity 'logits'"):
        scores.register(Score("bad", ("logits",), lambda q: q["logits"], "bad"))
    with pytest.raises(GmtsError, match="no function"):
        scores.register(Score("bad", (), None, "bad"))
    assert "bad" not in scores.ESTIMATOR_NAMES


def test_new_score_is_an_estimator_column_of_the_probe_tables_and_statistics(entropy_sq, tmp_path, tiny_model_dirs):
    from _adversarial import probe, run_cli
    from conftest import make_rollouts

    out = tmp_path / "run"
    rc, err = run_cli(probe(tiny_model_dirs["qwen2"], make_rollouts(tmp_path / "r.jsonl"), out))
    assert rc == 0, err[-2000:]
    t = pd.read_parquet(out / "tokens.parquet")
    assert NEW in t.columns
    np.testing.assert_array_equal(t[NEW].to_numpy(), (t["entropy"] * t["entropy"]).to_numpy())
    st = json.loads((out / "stats.json").read_text())
    for block in ("cross_answer", "within_answer", "selection_waste"):
        assert NEW in (st[block]["batch"] if block == "selection_waste" else st[block]), block


def _batch(seed=0, B=8, T=7, G=4):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).long()
    rewards = torch.randint(0, 2, (B,), generator=g).float()
    adv = torch.zeros(B)
    for s in range(0, B, G):
        adv[s:s + G] = rewards[s:s + G] - rewards[s:s + G].mean()
    ent = torch.rand(B, T, generator=g, dtype=torch.float64) * 2 * mask
    groups = [f"g{i // G}" for i in range(B)]
    return ent, adv, mask, groups


def test_new_score_is_a_selection_arm_of_the_core_selection(entropy_sq):
    from gmts_analysis.core.selection import SELECTIONS, select_tokens, selection_mask, token_scores

    assert NEW in SELECTIONS
    ent, adv, mask, groups = _batch()
    s = token_scores(NEW, ent, adv, mask)
    torch.testing.assert_close(s, torch.where(mask.bool(), ent * ent, torch.zeros_like(ent)), rtol=0, atol=0)
    for scope in ("batch", "group"):
        got = selection_mask(NEW, ent, adv, mask, rho=0.3, scope=scope, group_ids=groups)
        assert torch.equal(got, select_tokens(ent * ent, mask, 0.3, scope, groups))
    scores.unregister(NEW)
    with pytest.raises(ValueError, match="unknown token selection"):
        token_scores(NEW, ent, adv, mask)
    scores.register(_entropy_sq())  # for the fixture's teardown


def test_new_score_is_a_gmts_rl_arm_cli_config_and_training(entropy_sq):
    from gmts_analysis.cli import build_parser
    from gmts_analysis.rl.config import RLConfig
    from gmts_analysis.rl.plots import ARMS, COLORS
    from gmts_analysis.rl.trainer import train
    from gmts_analysis.toy.testing import build_tiny_model
    from gmts_analysis.toy.tokenizer import build_char_tokenizer

    args = build_parser().parse_args(["rl", "--selection", NEW, "gmts", "--seed", "0"])
    assert args.selection == [NEW, "gmts"]
    assert NEW in ARMS and COLORS[NEW] == COLOR
    cfg = RLConfig(model="test", selection=NEW, max_steps=1, domains=("arithmetic",), prompts_per_domain=2, num_generations=4,
                   max_completion_length=12, eval_every=1, eval_prompts=2, diag_every=0, lr=1e-2)
    cfg.check()
    torch.manual_seed(0)
    rec = train(build_tiny_model("qwen2", vocab_size=100, seed=0), build_char_tokenizer(), cfg,
                reward_fn=lambda row: float(len(row["response_ids"]) % 2 == 0), initial_eval={"arithmetic": 0.0})
    (step,) = rec["steps"]
    assert step["n_selected"] == math.ceil(cfg.rho * step["n_tokens"] - 1e-9)
    assert NEW in step["waste"]
    scores.unregister(NEW)
    with pytest.raises(GmtsError, match=f"unknown '{NEW}'"):
        cfg.check()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["rl", "--selection", NEW])
    scores.register(_entropy_sq())


def test_new_score_in_verl_recipe_and_live_diagnostics(entropy_sq):
    from gmts_analysis.core.selection import select_tokens, token_omega
    from gmts_analysis.integrations.diagnostics import diagnostic_scores, selection_diagnostics
    from gmts_analysis.integrations.verl_recipe import verl_selection_mask

    ent, adv, mask, groups = _batch(seed=1)
    got = verl_selection_mask(ent, adv[:, None] * mask, mask, selection=NEW, rho=0.25, scope="group", uid=groups)
    assert torch.equal(got, select_tokens(ent * ent, mask, 0.25, "group", groups))
    omega = token_omega(adv, mask)
    sc = diagnostic_scores(ent, omega, mask)
    assert list(sc) == ["entropy", "gmts", NEW]
    torch.testing.assert_close(sc[NEW], ent * ent * mask, rtol=0, atol=0)
    d = selection_diagnostics(ent, omega, mask, rho=0.25, group_ids=groups)
    sel = select_tokens(ent * ent, mask, 0.25, "batch")
    waste = float((sel & (omega == 0)).sum()) / int(sel.sum())
    assert d[f"gmts/selection_waste/{NEW}"] == waste


def test_new_score_in_the_trl_trainer(entropy_sq, tmp_path):
    pytest.importorskip("trl")
    from test_rl_trl import _args, _train

    from gmts_analysis.core.selection import select_tokens
    from gmts_analysis.integrations.trl_trainer import TOKEN_SELECTIONS, SelectiveGRPOTrainer

    assert NEW in TOKEN_SELECTIONS

    class Recording(SelectiveGRPOTrainer):
        records: list = []

        def _selection_mask(self, inputs, entropies, logps, lgn, mask):
            out = super()._selection_mask(inputs, entropies, logps, lgn, mask)
            Recording.records.append({"out": out, "ent": entropies.detach(), "mask": mask,
                                      "rows": inputs["selection_row_ids"]})
            return out

    tr = _train(Recording, _args(tmp_path, token_selection=NEW, selection_rho=0.25, max_steps=1))
    assert tr.token_selection == NEW and Recording.records
    for rec in Recording.records:
        order = torch.argsort(rec["rows"])
        s = rec["ent"].double() ** 2
        want = select_tokens(s[order], rec["mask"][order], 0.25, "batch")
        assert torch.equal(rec["out"].bool()[order], want)


def test_scaled_scores_and_views_follow_the_registry():
    g = get_score("gmts")
    q = {"entropy": torch.tensor([1.0, 2.0]), "omega": torch.tensor([-0.5, 0.0])}
    assert torch.equal(g.fn(q), torch.tensor([0.5, 0.0]))
    with scores.registered(Score("tmp_score", ("prob",), lambda q: q["prob"], "tmp")):
        from gmts_analysis.core.estimators import ESTIMATORS

        assert "tmp_score" in ESTIMATORS and "tmp_score" not in scores.SELECTION_ARMS
    assert "tmp_score" not in scores.ESTIMATOR_NAMES
