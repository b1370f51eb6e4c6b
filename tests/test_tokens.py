"""Closed forms of gmts_analysis.core.tokens against autograd and hand values."""

import math

import pytest
import torch

from gmts_analysis.core.tokens import (
    gather_logprobs,
    response_logits,
    response_targets,
    sequence_logprobs,
    token_quantities,
)


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


def test_prefix_and_padded_shift_agree_with_response_logits():
    from gmts_analysis.core.tokens import gather_positions, response_positions, response_prefix

    g = torch.Generator().manual_seed(0)
    S, V = 11, 7
    logits = torch.randn(S, V, generator=g)
    for P in (1, 4, 10):
        T = S - P
        ref = response_logits(logits, P)
        # causal truncation: tokens [s, e) are the last e - s logits of the prefix of length L
        for s, e in ((0, T), (0, 1), (T - 1, T), (T // 2, T)):
            L = response_prefix(P, s, e)
            assert torch.equal(logits[:L][-(e - s):], ref[s:e])
        # a right-padded batch of rows with different prompt lengths
        pos = response_positions(P, T + 2, S)  # 2 padding slots, clamped
        got = gather_positions(logits[None], pos[None])[0]
        assert torch.equal(got[:T], ref) and bool((pos[T:] == S - 1).all())
    with pytest.raises(ValueError):
        response_prefix(0, 0, 1)
    with pytest.raises(ValueError):
        response_positions(0, 3, 5)


@pytest.mark.parametrize("tau", [1.0, 0.6])
def test_logit_grad_and_head_grad_against_autograd(tau):
    from gmts_analysis.core.tokens import head_grad_sq, logit_grad, logit_grad_sq, scaled_log_softmax

    g = torch.Generator().manual_seed(1)
    T, d, V = 5, 6, 9
    h = torch.randn(T, d, generator=g, dtype=torch.float64)
    head = torch.nn.Linear(d, V, dtype=torch.float64)
    y = torch.randint(0, V, (T,), generator=g)
    z = head(h).detach()
    logp = scaled_log_softmax(z, tau)
    c = logit_grad(logp, y, tau)
    lg2 = logit_grad_sq(logp, y, tau)
    q = token_quantities(z, y, tau, head_input=h, head_bias=True)
    for t in range(T):
        zz = z.clone().requires_grad_(True)
        (gz,) = torch.autograd.grad(gather_logprobs(zz, y, tau)[t], zz)
        torch.testing.assert_close(c[t], gz[t])
        gw, gb = torch.autograd.grad(gather_logprobs(head(h), y, tau)[t], [head.weight, head.bias])
        want = gw.pow(2).sum() + gb.pow(2).sum()
        torch.testing.assert_close(head_grad_sq(lg2, h, bias=True)[t], want)
        torch.testing.assert_close(q.head_grad_norm[t], want.sqrt())
        torch.testing.assert_close(lg2[t], gz[t].pow(2).sum())


def test_logit_grad_norm_stable_when_confident():
    """p_y near 1: the textbook 1 - 2p + sum p^2 cancels to 0 in float32; ours keeps the digits."""
    z = torch.tensor([[30.0, 0.0, -5.0, 1.0]])
    y = torch.tensor([0])
    got = token_quantities(z, y).logit_grad_norm
    p = torch.softmax(z.double(), -1)
    truth = ((1 - p[0, 0]) ** 2 + p[0, 1:].pow(2).sum()).sqrt()
    assert float(truth) > 0 and abs(float(got) / float(truth) - 1) < 1e-4
    pf = torch.softmax(z, -1)
    textbook = (1 - 2 * pf[0, 0] + pf.pow(2).sum()).clamp_min(0).sqrt()
    assert abs(float(textbook) / float(truth) - 1) > 0.5  # what the closed form used to give
