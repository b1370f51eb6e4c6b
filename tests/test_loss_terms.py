"""Loss terms and aggregations as entries (issue 29 item 2): one aggregation table for omega's weights,
the training loss and the verl recipe's normalizer; omega is the sum of the registered terms, so a term
registered in one place reaches the probe, the TRL drop-in, the verl recipe and the diagnostics; the verl
integrations read the actor's config through verl_loss_settings and refuse an entropy bonus."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from gmts_analysis.core import loss_terms
from gmts_analysis.core.loss_terms import AGGREGATIONS, LossTerm
from gmts_analysis.core.vocabulary import LOSS_AGGS
from gmts_analysis.errors import GmtsError


def _batch(seed=0, B=4, T=7):
    g = torch.Generator().manual_seed(seed)
    ent = torch.rand(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.25, -1.0], dtype=torch.float64)
    mask = torch.ones(B, T)
    mask[1, 5:] = 0
    mask[3, 3:] = 0
    return ent, adv, mask


def test_one_aggregation_table():
    from gmts_analysis.core.objective import VERL_LOSS_AGG, answer_weights
    from gmts_analysis.core.selection_tensor import aggregate_loss
    from gmts_analysis.integrations.verl_recipe import selected_normalizer_factor

    assert tuple(AGGREGATIONS) == LOSS_AGGS and set(VERL_LOSS_AGG) == set(LOSS_AGGS)
    ent, adv, mask = _batch()
    L = mask.sum(-1).to(torch.float64)
    for name, agg in AGGREGATIONS.items():
        w = answer_weights(L, name, 9)
        torch.testing.assert_close(w, agg.weights(L, len(L), 9), rtol=0, atol=0)
        # the training loss of per-token terms x is sum_t w_i x_t under the same aggregation
        x = ent * mask
        torch.testing.assert_close(aggregate_loss(x, mask, loss_agg=name, max_len=9), (w[:, None] * x).sum(),
                                   rtol=1e-12, atol=0)
    sel = torch.zeros_like(mask, dtype=torch.bool)
    sel[:, :2] = True
    assert float(selected_normalizer_factor(mask, sel, "token-mean")) == float(mask.sum()) / 8
    with pytest.raises(ValueError, match="not defined"):
        selected_normalizer_factor(mask, sel, "token-sum")


def _position_term() -> LossTerm:
    """A test term whose omega grows with the token's position (changes every score's ranking)."""
    return LossTerm("t_position", (), trl=(), verl=(), active=lambda s: True,
                    omega=lambda p: 0.1 * p.W * p.m.cumsum(-1), doc="a test term")


@pytest.fixture
def position_term(monkeypatch):
    monkeypatch.setitem(loss_terms.LOSS_TERMS, "t_position", _position_term())


def test_a_registered_term_reaches_every_integration(position_term):
    from gmts_analysis.core.advantages import omega as answer_omega
    from gmts_analysis.core.objective import trl_loss_settings
    from gmts_analysis.core.selection import select_tokens, token_omega, token_scores
    from gmts_analysis.core.trl_args import TrlLossArgs
    from gmts_analysis.integrations.diagnostics import selection_diagnostics, verl_diagnostics
    from gmts_analysis.integrations.verl_recipe import verl_selection_mask

    ent, adv, mask = _batch()
    m = mask.double()
    w = 1.0 / m.sum()
    expected = (w * adv[:, None] + 0.1 * w * m.cumsum(-1)) * m  # policy (on-policy: w A) + the new term
    # the probe (one answer's omega)
    om1 = answer_omega(float(w), 1.0, [-.5] * 7)
    assert om1 == pytest.approx((w * 1.0 + 0.1 * w * torch.arange(1, 8)).tolist())
    # the tensors every drop-in uses
    torch.testing.assert_close(token_omega(adv, mask), expected, rtol=1e-12, atol=1e-15)
    # the TRL drop-in: the same omega under TRL's settings
    trl = trl_loss_settings(TrlLossArgs(loss_type="dapo", beta=0.0))
    s = token_scores("gmts", ent, adv, mask, settings=trl)
    torch.testing.assert_close(s, ent * expected.abs(), rtol=1e-12, atol=1e-15)
    # the verl recipe and its diagnostics
    want = select_tokens(ent * expected.abs(), mask, 0.3, "batch")
    got = verl_selection_mask(ent, adv[:, None] * mask, mask, selection="gmts", rho=0.3)
    assert torch.equal(got, want)
    data = SimpleNamespace(batch={"old_entropys": ent, "advantages": adv[:, None] * mask, "response_mask": mask},
                           non_tensor_batch={})
    d = verl_diagnostics(data, rho=0.3, max_tokens=0)
    assert d == selection_diagnostics(ent, expected, mask, rho=0.3)


def test_verl_reads_the_actor_config_and_refuses_an_entropy_bonus():
    from gmts_analysis.integrations.diagnostics import verl_diagnostics
    from gmts_analysis.integrations.verl_recipe import apply_token_selection, verl_selection_mask, verl_settings

    ent, adv, mask = _batch()
    actor = {"loss_agg_mode": "seq-mean-token-mean", "clip_ratio": 0.2, "entropy_coeff": 0.0}
    assert verl_settings(actor).loss_agg == "seq-mean-token-mean"
    data = SimpleNamespace(batch={"old_entropys": ent, "advantages": adv[:, None] * mask, "response_mask": mask},
                           non_tensor_batch={})
    apply_token_selection(data, selection="gmts", rho=0.5, actor=actor)
    want = verl_selection_mask(ent, adv[:, None] * mask, mask, selection="gmts", rho=0.5,
                               loss_agg_mode="seq-mean-token-mean")
    assert torch.equal(data.batch["token_selection_mask"], want)
    for call in (lambda: apply_token_selection(data, actor={**actor, "entropy_coeff": 0.01}),
                 lambda: apply_token_selection(data, entropy_coeff=0.01),
                 lambda: verl_diagnostics(data, entropy_coeff=0.01, max_tokens=0)):
        with pytest.raises(GmtsError, match="entropy_coeff=0.01 .entropy bonus. is not modelled"):
            call()
