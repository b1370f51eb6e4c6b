"""The exact engine's plan: every parameter accounted for on every answer, the rule registry,
the per-model plan cache, and the closed forms the engine returns from its own forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import plain_loop_grad_norms
from torch import nn

from gmts_analysis.core.tokens import response_logits, response_targets, token_quantities
from gmts_analysis.engine import forward_quantities, grad_norms
from gmts_analysis.engine.exact import _PLANS, cached_plan, planning_pass
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.engine.plan import GHOST_RULES, LINEAR, make_plan, rule_for
from gmts_analysis.errors import GmtsError
from gmts_analysis.toy.testing import build_tiny_model


def _ids(n: int, vocab: int = 64, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def _rel(a, b) -> float:
    return float(((a - b).abs() / b.abs()).max())


class ToyMoE(nn.Module):
    """Top-1 routing over three experts (softmax gate), plus a 'late' expert that runs (twice)
    only on positions 12 and later (causal: position s depends on inputs <= s only). A short
    planning pass never calls it."""

    def __init__(self, d: int, dtype: torch.dtype):
        super().__init__()
        self.router = nn.Linear(d, 3, bias=False, dtype=dtype)
        self.experts = nn.ModuleList(nn.Linear(d, d, dtype=dtype) for _ in range(3))
        self.long = nn.Linear(d, d, dtype=dtype)

    def forward(self, x):
        shape = x.shape
        late = x[..., 12:, :]
        flat = x.reshape(-1, shape[-1])
        gate = torch.softmax(self.router(flat), -1)
        choice = gate.argmax(-1)
        out = torch.zeros_like(flat)
        for k, expert in enumerate(self.experts):
            idx = (choice == k).nonzero().squeeze(-1)
            if idx.numel():
                out = out.index_add(0, idx, expert(flat[idx]) * gate[idx, k : k + 1])
        out = out.reshape(shape)
        if late.shape[-2]:
            extra = 0.5 * self.long(torch.tanh(self.long(late)))
            out = torch.cat([out[..., :12, :], out[..., 12:, :] + extra], dim=-2)
        return out


def test_modules_not_called_by_the_planning_pass_are_counted():
    model = build_tiny_model("llama", dtype=torch.float64)
    d = model.config.hidden_size
    torch.manual_seed(0)
    model.model.layers[1].mlp = ToyMoE(d, torch.float64)
    ids, P = _ids(24), 6
    calls, _ = planning_pass(model, ids[:8])
    assert calls.get("model.layers.1.mlp.long", 0) == 0  # the planning pass never sees it
    ref = plain_loop_grad_norms(model, ids, P)
    got = grad_norms(model, ids, P, chunk_size=5, groups="module")
    assert _rel(got.norms, ref) < 1e-9
    # the late expert was called twice per forward once the prefix passed 12: moved to the fallback
    plan = _PLANS[model][1]
    assert "model.layers.1.mlp.long.weight" in plan.direct
    assert float(got.groups["model.layers.1.mlp.long"][-1]) > 0
    # every expert that saw a token has a gradient; the router too
    assert float(got.groups["model.layers.1.mlp.router"].max()) > 0
    # a fresh model whose plan comes from a short answer, then a long one: still exact
    _PLANS.pop(model)
    grad_norms(model, ids[:9], P)
    assert _rel(grad_norms(model, ids, P, chunk_size="auto").norms, ref) < 1e-9


def test_every_parameter_is_accounted_for_or_named():
    model = build_tiny_model("llama")
    calls, _ = planning_pass(model, _ids(8))
    plan = make_plan(model, calls)
    covered = set(plan.head_param_names) | set(plan.direct) | {n for t in plan.taps for n in t.param_names}
    assert covered == {n for n, _ in trainable_parameters(model)}
    plan.taps = [t for t in plan.taps if t.name != "model.layers.0.mlp.up_proj"]
    with pytest.raises(GmtsError, match=r"model\.layers\.0\.mlp\.up_proj\.weight"):
        plan.check_complete()


class MyProj(nn.Module):
    """A linear layer that is not an nn.Linear (a type the registry does not know)."""

    def __init__(self, inner: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(inner.weight.detach().clone())
        self.bias = nn.Parameter(torch.linspace(-0.1, 0.1, inner.out_features, dtype=inner.weight.dtype))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def test_registry_one_line_to_add_a_type():
    model = build_tiny_model("qwen2", dtype=torch.float64)
    attn = model.model.layers[0].self_attn
    attn.o_proj = MyProj(attn.o_proj)
    ids, P = _ids(20), 5
    ref = plain_loop_grad_norms(model, ids, P)
    assert rule_for(attn.o_proj) is None
    unknown = grad_norms(model, ids, P, chunk_size=7)  # materialized by torch.func
    assert "model.layers.0.self_attn.o_proj.weight" in _PLANS[model][1].direct
    try:
        GHOST_RULES[MyProj] = LINEAR  # the one line
        assert rule_for(attn.o_proj) is LINEAR
        _PLANS.pop(model)
        known = grad_norms(model, ids, P, chunk_size=7)
        plan = _PLANS[model][1]
        assert not plan.direct and any(t.name == "model.layers.0.self_attn.o_proj" for t in plan.taps)
    finally:
        GHOST_RULES.pop(MyProj, None)
    assert _rel(unknown.norms, ref) < 1e-9 and _rel(known.norms, ref) < 1e-9


def test_gpt2_conv1d_has_the_linear_rule_without_the_engine_importing_transformers():
    """The engine imports no transformers (docs/architecture.md, "Deferred imports"); transformers' GPT-2
    ``Conv1D`` still gets the linear layer's ghost rule once a model holding one exists."""
    import subprocess
    import sys

    code = ("import sys; import gmts_analysis.engine, gmts_analysis.engine.sketch; "
            "print('transformers' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    from transformers.pytorch_utils import Conv1D

    assert rule_for(Conv1D(6, 4)) is LINEAR


def test_plan_made_once_per_model_and_invalidated():
    model = build_tiny_model("gpt2")
    ids, P = _ids(30), 10
    n = {"fwd": 0}
    h = model.register_forward_pre_hook(lambda m, a: n.__setitem__("fwd", n["fwd"] + 1))
    try:
        grad_norms(model, ids, P, chunk_size=10)
        first = n["fwd"]
        plan = _PLANS[model][1]
        n["fwd"] = 0
        grad_norms(model, ids, P, chunk_size=10)
        assert n["fwd"] == 2 and first == 3  # one forward per chunk; the planning pass only once
        assert _PLANS[model][1] is plan
        # a changed parameter set makes a new plan
        model.transformer.h[0].mlp.c_fc.bias.requires_grad_(False)
        grad_norms(model, ids, P, chunk_size=10)
        assert _PLANS[model][1] is not plan
        model.transformer.h[0].mlp.c_fc.bias.requires_grad_(True)
        plan = cached_plan(model, trainable_parameters(model), ids[:8])
        model.config._attn_implementation = "sdpa" if model.config._attn_implementation == "eager" else "eager"
        assert cached_plan(model, trainable_parameters(model), ids[:8]) is not plan
    finally:
        h.remove()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_engine_closed_forms_equal_a_separate_forward(arch):
    model = build_tiny_model(arch, dtype=torch.float64)
    ids, P, tau = _ids(26), 7, 0.8
    with torch.no_grad():
        out = model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
    q = token_quantities(response_logits(out.logits[0], P), response_targets(ids, P), tau)
    h = out.hidden_states[-1][0, P - 1 : -1]
    head_ref = q.logit_grad_norm * h.pow(2).sum(-1).sqrt()  # no head bias in these models
    for got in (
        grad_norms(model, ids, P, temperature=tau, chunk_size=6).quantities,
        grad_norms(model, ids, P, temperature=tau, method="sketch", probes=4).quantities,
        forward_quantities(model, ids, P, tau),
    ):
        for name in ("logprob", "prob", "entropy", "logit_grad_norm"):
            torch.testing.assert_close(getattr(got, name), getattr(q, name), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got.head_grad_norm, head_ref, rtol=1e-12, atol=1e-12)
        assert got.finite


def _untied_copy(model):
    import copy

    m = copy.deepcopy(model)
    m.config.tie_word_embeddings = False
    head = m.get_output_embeddings()
    head.weight = nn.Parameter(head.weight.detach().clone())
    return m


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_head_grad_norm_is_the_output_head_group(arch):
    """head_grad_norm = the norm of the token's gradient on the output projection alone.

    Untied (llama): the engine's ``lm_head`` module group, to float tolerance. Tied (gpt2,
    qwen2): the tied tensor's group also holds the input embedding's use, so the projection
    alone is the ``lm_head`` group of the same model with the tie broken (same function, same
    values): that is what we compare with."""
    model = build_tiny_model(arch, dtype=torch.float64)
    ids, P = _ids(22), 6
    got = grad_norms(model, ids, P, groups="module", chunk_size=8)
    head = got.quantities.head_grad_norm
    if arch == "llama":
        ref = got.groups["lm_head"].sqrt()
    else:
        assert "lm_head" not in got.groups
        ref = grad_norms(_untied_copy(model), ids, P, groups="module", chunk_size=8).groups["lm_head"].sqrt()
    assert _rel(head.double(), ref) < 1e-10
    # and in float32, to float tolerance
    m32 = build_tiny_model(arch)
    g32 = grad_norms(m32, ids, P, groups="module")
    ref32 = g32.groups["lm_head"].sqrt() if arch == "llama" else grad_norms(
        _untied_copy(m32), ids, P, groups="module").groups["lm_head"].sqrt()
    assert _rel(g32.quantities.head_grad_norm.double(), ref32) < 1e-5


def test_head_bias_counted():
    model = build_tiny_model("llama", dtype=torch.float64)
    head = model.lm_head
    model.lm_head = nn.Linear(head.in_features, head.out_features, bias=True, dtype=torch.float64)
    with torch.no_grad():
        model.lm_head.weight.copy_(head.weight)
        model.lm_head.bias.uniform_(-0.5, 0.5)
    ids, P = _ids(18), 5
    got = grad_norms(model, ids, P, groups="module", chunk_size=4)
    assert _rel(got.quantities.head_grad_norm, got.groups["lm_head"].sqrt()) < 1e-10
    assert _rel(got.norms, plain_loop_grad_norms(model, ids, P)) < 1e-9
    assert _rel(forward_quantities(model, ids, P).head_grad_norm, got.quantities.head_grad_norm) < 1e-12
