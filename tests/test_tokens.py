"""Closed forms of gmts_analysis.tokens against autograd and hand values."""

import math

import pytest
import torch

from gmts_analysis.tokens import gather_logprobs, response_logits, response_targets, sequence_logprobs, token_quantities


@pytest.mark.parametrize("tau", [1.0, 0.7, 1.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_logit_grad_norm_matches_autograd(tau, dtype):
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(9, 17, generator=g) * 3).to(dtype)
    y = torch.randint(0, 17, (9,), generator=g)
    q = token_quantities(z, y, tau)
    zz = z.clone().requires_grad_(True)
    for t in range(9):
        (grad,) = torch.autograd.grad(gather_logprobs(zz, y, tau)[t], zz)
        assert torch.allclose(grad.norm(), q.logit_grad_norm[t].to(dtype), rtol=1e-6 if dtype == torch.float64 else 1e-4)
    p = torch.softmax(z / tau, -1)
    closed = torch.sqrt(1 - 2 * p[torch.arange(9), y] + (p * p).sum(-1)) / tau
    torch.testing.assert_close(q.logit_grad_norm, closed)


def test_entropy_uniform_is_log_v():
    V = 50
    q = token_quantities(torch.zeros(4, V), torch.tensor([0, 1, 2, 3]))
    torch.testing.assert_close(q.entropy, torch.full((4,), math.log(V)))
    torch.testing.assert_close(q.prob, torch.full((4,), 1.0 / V))
    torch.testing.assert_close(q.logprob, torch.full((4,), -math.log(V)))


def test_entropy_matches_definition_and_handles_zero_probs():
    z = torch.tensor([[0.0, -1e4, 2.0], [5.0, 5.0, -3.0]])
    q = token_quantities(z, torch.tensor([0, 1]))
    p = torch.softmax(z.double(), -1)
    ref = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)
    torch.testing.assert_close(q.entropy.double(), ref, rtol=1e-6, atol=1e-7)
    assert torch.isfinite(q.entropy).all()


def test_low_precision_logits_computed_in_float32():
    z = torch.randn(5, 11).to(torch.bfloat16)
    q = token_quantities(z, torch.arange(5))
    assert q.entropy.dtype == torch.float32
    assert q.logprob.dtype == torch.float32


def test_shift_by_one():
    S, V, P = 7, 5, 3
    logits = torch.arange(S).float()[:, None].expand(S, V)  # row s holds value s
    ids = torch.arange(S) % V
    rl = response_logits(logits, P)
    assert rl.shape == (S - P, V)
    assert rl[:, 0].tolist() == [2.0, 3.0, 4.0, 5.0]  # positions P-1 .. S-2
    assert response_targets(ids, P).tolist() == ids[P:].tolist()
    lp = sequence_logprobs(torch.randn(2, S, V), torch.randint(0, V, (2, S)), P)
    assert lp.shape == (2, S - P)
    with pytest.raises(ValueError):
        response_logits(logits, 0)
