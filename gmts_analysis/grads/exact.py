"""The exact engine: per-token gradient norms from batched activation VJPs and ghost norms.

For a chunk of response tokens ``[s, e)`` the model runs once on the prefix
``input_ids[:P+e-1]`` (causal truncation: token ``t`` only depends on positions ``<= P+t-1``).
Inside ``torch.func.vjp`` every *tapped* module's output passes through :class:`_GhostTap`,
an identity whose backward turns (module input ``X``, output gradient ``G``) into the
squared norm of that module's parameter gradient and returns it as the gradient of a
zero *probe*. ``vmap`` over the chunk's cotangents gives, per token, every module's
squared norm at once; parameter gradients are never formed (weights do not require grad
during the call). Ghost norms per module type, ``X`` ``(L, d_in)``, ``G`` ``(L, d_out)``:

- linear / Conv1D weight: ``||G^T X||^2`` or ``<G G^T, X X^T>`` (whichever is cheaper); bias ``||sum_s g_s||^2``
- LayerNorm / RMSNorm-like: ``||sum_s g_s * xhat_s||^2`` (+ bias), ``xhat`` recomputed from ``X``
- embedding: ``sum_v ||sum_{s: id_s = v} g_s||^2`` (rows of equal tokens summed; padding row excluded)
- output head (closed form, no backward): ``||c_t||^2 ||h_t||^2`` with ``c_t = (e_y - p_t) / tau``;
  tied to the embedding: ``||E_t||^2 + ||H_t||^2 + 2 sum_u c_t[v_u] <E_t[u], h_t>`` over the prefix's tokens
- anything else: per-token parameter gradients materialized by ``torch.func`` (exact, slower).

The backward starts at the head's input ``h`` with cotangent ``W^T c_t``, so the vocabulary
never enters the batched backward. Accumulation is float32 (float64 for float64 models).
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gmts_analysis.grads.plan import Plan, Tap, make_plan
from gmts_analysis.tokens import compute_dtype

log = logging.getLogger(__name__)


class _GhostTap(torch.autograd.Function):
    """Identity on ``out``; the backward returns the ghost norm as the gradient of ``probe``."""

    generate_vmap_rule = True

    @staticmethod
    def forward(out: Tensor, probe: Tensor, x: Tensor, aux: Tensor, spec: _Spec) -> Tensor:
        return out.view_as(out)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, _, x, aux, spec = inputs
        ctx.save_for_backward(x, aux)
        ctx.spec = spec

    @staticmethod
    def backward(ctx, g: Tensor):
        x, aux = ctx.saved_tensors
        return g, ctx.spec.ghost(g, x, aux), None, None, None


@dataclass
class _Spec:
    """What one tapped module needs to turn its output gradient into a squared norm."""

    kind: str
    acc: torch.dtype
    has_weight: bool = True
    has_bias: bool = False
    gram: bool = False  # linear: <G G^T, X X^T> instead of ||G^T X||^2
    n_unique: int = 0
    return_rows: bool = False  # tied embedding: return E (U, d) instead of ||E||^2

    def ghost(self, g: Tensor, x: Tensor, aux: Tensor) -> Tensor:
        g = g.reshape(-1, g.shape[-1]).to(self.acc)
        if self.kind == "embedding":
            rows = g.new_zeros((self.n_unique + 1, g.shape[-1])).index_add(0, aux + 1, g)[1:]
            return rows if self.return_rows else rows.pow(2).sum()
        total = g.new_zeros(())
        if self.has_bias:
            total = total + g.sum(0).pow(2).sum()
        if not self.has_weight:
            return total
        if self.kind in ("linear", "conv1d"):
            if self.gram:
                total = total + ((g @ g.T) * aux).sum()
            else:
                total = total + (g.T @ x).pow(2).sum()
        else:  # layernorm / affine_norm: aux is xhat (L, d)
            total = total + (g * aux).sum(0).pow(2).sum()
        return total


@dataclass
class _State:
    """Mutable state the forward hooks read while the model runs inside the transform."""

    plan: Plan
    acc: torch.dtype
    probes: dict[str, Tensor] = field(default_factory=dict)
    head_input: Tensor | None = None
    active: bool = False
    reentrant: bool = False
    calls: dict[str, int] = field(default_factory=dict)
    widths: dict[str, tuple[int, int]] = field(default_factory=dict)


def _tap_hook(state: _State, tap: Tap):
    mod = tap.module

    def hook(module, args, output):
        if state.reentrant:
            return None
        state.calls[tap.name] = state.calls.get(tap.name, 0) + 1
        if not state.active:
            x0 = args[0] if args else None
            if isinstance(output, Tensor) and isinstance(x0, Tensor):
                state.widths[tap.name] = (x0.shape[-1] if x0.is_floating_point() else 1, output.shape[-1])
            return None
        x = args[0].detach()
        acc = state.acc
        own = {k for k, p in mod._parameters.items() if p is not None}
        spec = _Spec(kind=tap.kind, acc=acc, has_bias="bias" in own, has_weight="weight" in own)
        aux = x.new_zeros((), dtype=acc)
        if tap.kind == "embedding":
            ids = x.reshape(-1)
            uniq, inv = torch.unique(ids, return_inverse=True)
            if mod.padding_idx is not None:
                inv = torch.where(ids == mod.padding_idx, torch.full_like(inv, -1), inv)
            spec.n_unique, spec.return_rows = uniq.numel(), tap.tied_head
            xx, aux = x.new_zeros((), dtype=acc), inv
        elif tap.kind in ("linear", "conv1d"):
            xx = x.reshape(-1, x.shape[-1]).to(acc)
            L, din = xx.shape
            spec.gram = L < din
            if spec.gram:
                aux = xx @ xx.T
        elif tap.kind == "layernorm":
            xx = x.new_zeros((), dtype=acc)
            aux = F.layer_norm(x.to(acc), mod.normalized_shape, None, None, mod.eps).reshape(-1, x.shape[-1])
        else:  # affine_norm: out = w * u(x) (+ b)  =>  u = f(x; w=1, b=0) - f(x; w=0, b=0)
            xx = x.new_zeros((), dtype=acc)
            w = mod.weight
            one = {"weight": torch.ones_like(w)}
            zero = {"weight": torch.zeros_like(w)}
            if mod._parameters.get("bias") is not None:
                one["bias"] = zero["bias"] = torch.zeros_like(w)
            state.reentrant = True
            try:
                with torch.no_grad():
                    u = torch.func.functional_call(mod, one, args) - torch.func.functional_call(mod, zero, args)
            finally:
                state.reentrant = False
            aux = u.reshape(-1, u.shape[-1]).to(acc)
        return _GhostTap.apply(output, state.probes[tap.name], xx, aux, spec)

    return hook


def _head_hook(state: _State):
    def hook(module, args, output):
        if state.reentrant:
            return
        state.calls[state.plan.head_name] = state.calls.get(state.plan.head_name, 0) + 1
        state.head_input = args[0]
        return

    return hook


def _count_hook(state: _State, name: str):
    def hook(module, args, output):
        if not state.reentrant:
            state.calls[name] = state.calls.get(name, 0) + 1

    return hook


def _accepts_logits_to_keep(model: nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _n_heads(model: nn.Module) -> int:
    cfg = getattr(model, "config", None)
    for key in ("num_attention_heads", "n_head", "num_heads"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return 16


class ExactEngine:
    """Exact per-token gradient norms for one model; build once per call of :func:`grad_norms`.

    Use inside the context that switches attention to eager and turns ``requires_grad`` off
    (see :func:`gmts_analysis.grads.grad_norms`); hooks live between :meth:`install` and
    :meth:`remove`.
    """

    def __init__(self, model: nn.Module, acc: torch.dtype):
        from gmts_analysis.models import trainable_parameters

        self.model = model
        self.named = trainable_parameters(model)  # before requires_grad is switched off
        self.acc = acc
        self.handles: list = []
        self.keep = _accepts_logits_to_keep(model)
        self.n_heads = _n_heads(model)
        self.plan: Plan | None = None
        self.state: _State | None = None

    # ---- hooks -----------------------------------------------------------------------
    def install(self, sample_ids: Tensor) -> None:
        """Count module calls on a short input, make the plan, install the ghost hooks."""
        model = self.model
        counts: dict[str, int] = {}
        tmp = _State(plan=None, acc=self.acc, calls=counts)  # type: ignore[arg-type]
        handles = [
            m.register_forward_hook(_count_hook(tmp, n))
            for n, m in model.named_modules()
            if any(p is not None for p in m._parameters.values())
        ]
        try:
            with torch.no_grad():
                model(input_ids=sample_ids.unsqueeze(0), use_cache=False)
        finally:
            for h in handles:
                h.remove()
        self.plan = make_plan(model, counts, self.named)
        self.state = _State(plan=self.plan, acc=self.acc)
        for tap in self.plan.taps:
            self.handles.append(tap.module.register_forward_hook(_tap_hook(self.state, tap)))
        self.handles.append(self.plan.head.register_forward_hook(_head_hook(self.state)))
        # record the widths of every tapped module (for the memory estimate)
        with torch.no_grad():
            model(input_ids=sample_ids.unsqueeze(0), use_cache=False)

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    # ---- memory model ----------------------------------------------------------------
    def bytes_per_token(self, L: int) -> int:
        """Rough transient bytes of one token's batched backward over a prefix of ``L`` positions."""
        es = torch.finfo(self.acc).bits // 8
        widths = [w for pair in self.state.widths.values() for w in pair] or [1024]
        wmax = max(widths)
        per_pos = 8 * wmax + 3 * self.n_heads * L
        ghost = 0
        for tap in self.plan.taps:
            din, dout = self.state.widths.get(tap.name, (1, 1))
            if tap.kind in ("linear", "conv1d"):
                ghost = max(ghost, L * L if L < din else din * dout)
            if tap.tied_head:
                ghost = max(ghost, min(L, 1 << 30) * dout * 2)
        direct = sum(p.numel() for p in self.plan.direct.values())
        # x2: calibrated against the measured RSS high-water on CPU (vmap keeps more alive)
        return 2 * es * (L * per_pos + ghost + direct)

    # ---- one chunk -------------------------------------------------------------------
    def chunk(self, input_ids: Tensor, P: int, s: int, e: int, temperature: float, sub: int | None = None):
        """Squared norms for response tokens ``[s, e)``: dict module name -> ``(e-s,)`` tensor (acc dtype).

        One forward over the prefix, then batched VJPs of ``sub`` tokens at a time (default all)."""
        plan, state, acc = self.plan, self.state, self.acc
        model = self.model
        c = e - s
        L = P + e - 1
        prefix = input_ids[:L].unsqueeze(0)
        targets = input_ids[P + s : P + e]
        dev = input_ids.device

        probes: dict[str, Tensor] = {}
        tied_uniq = None
        for tap in plan.taps:
            if tap.tied_head:
                ids = input_ids[:L]
                tied_uniq = torch.unique(ids)
                probes[tap.name] = torch.zeros(tied_uniq.numel(), tap.module.weight.shape[1], dtype=acc, device=dev)
            else:
                probes[tap.name] = torch.zeros((), dtype=acc, device=dev)
        direct = {n: p.detach() for n, p in plan.direct.items()}
        kwargs = {"input_ids": prefix, "use_cache": False}
        if self.keep:
            kwargs["logits_to_keep"] = c

        def f(probes_, direct_):
            state.probes = probes_
            if direct_:
                out = torch.func.functional_call(model, direct_, args=(), kwargs=kwargs)
            else:
                out = model(**kwargs)
            h = state.head_input[0, -c:]
            return h, out.logits[0, -c:].detach()

        state.active = True
        try:
            h, vjp_fn, logits = torch.func.vjp(f, probes, direct, has_aux=True)
        finally:
            state.active = False
            state.probes = {}
            state.head_input = None

        head = plan.head
        W = head.weight.detach()
        hb = head.bias.detach() if head.bias is not None else None
        with torch.no_grad():
            raw = F.linear(h.detach(), W, hb)
            if not torch.allclose(raw.float(), logits.float(), rtol=1e-4, atol=1e-5):
                raise NotImplementedError("model logits are not lm_head(h): logit post-processing is not supported")
            z = logits.to(acc)
            if temperature != 1.0:
                z = z / temperature
            p = torch.softmax(z, dim=-1)
            cvec = -p
            cvec[torch.arange(c, device=dev), targets] += 1.0
            cvec = cvec / temperature  # d logprob / d raw logits, (c, V)
            ct_h = (cvec @ W.to(acc)).to(h.dtype)  # (c, d)
            ct = torch.zeros((c,) + tuple(h.shape), dtype=h.dtype, device=dev)
            ar = torch.arange(c, device=dev)
            ct[ar, ar] = ct_h
        with torch.no_grad():
            hh = h.detach().to(acc)
            c2 = cvec.pow(2).sum(-1)
            head_sq = c2 * hh.pow(2).sum(-1)
            if hb is not None and any(n.endswith("bias") for n in plan.head_param_names):
                head_sq = head_sq + c2
        out: dict[str, Tensor] = {}
        sub = c if sub is None else max(1, int(sub))
        batched = torch.vmap(vjp_fn)
        for i in range(0, c, sub):
            j = min(c, i + sub)
            probe_g, direct_g = batched(ct[i:j])
            with torch.no_grad():
                part: dict[str, Tensor] = {}
                for tap in plan.taps:
                    val = probe_g[tap.name]
                    if tap.tied_head:
                        E = val  # (j-i, U, d)
                        proj = torch.einsum("cud,cd->cu", E, hh[i:j])  # <E_t[u], h_t>
                        cross = (proj * cvec[i:j][:, tied_uniq]).sum(-1)
                        part[tap.name] = E.pow(2).sum((1, 2)) + head_sq[i:j] + 2.0 * cross
                    else:
                        part[tap.name] = val.reshape(j - i)
                if not plan.head_tied:
                    part[plan.head_name] = head_sq[i:j]
                for n, g in direct_g.items():
                    m = plan.direct_module[n]
                    part[m] = part.get(m, 0) + g.to(acc).reshape(j - i, -1).pow(2).sum(-1)
                for name, v in part.items():
                    out.setdefault(name, torch.zeros(c, dtype=acc, device=dev))[i:j] = v
            del probe_g, direct_g
        return out


def exact_chunks(
    T: int, P: int, chunk_size: int | str, engine: ExactEngine, budget: int, block: int = 64
) -> list[tuple[int, int, int]]:
    """Blocks ``(s, e, sub)`` covering ``T`` tokens: one forward over the prefix of block
    ``[s, e)``, then batched VJPs of ``sub`` tokens at a time. An integer ``chunk_size`` is
    both. ``auto``: ``sub`` = as many tokens as fit ``budget`` bytes at this prefix length
    (shorter prefixes allow more), and the block spans at least ``block`` tokens so the
    forward is amortized (its truncation waste is under ``block`` positions per token)."""
    if chunk_size != "auto":
        c = int(chunk_size)
        return [(s, min(T, s + c), c) for s in range(0, T, c)]
    chunks = []
    s = 0
    sub = 1
    while s < T:
        for _ in range(3):
            L = P + s + max(sub, block)
            sub = max(1, min(T - s, 256, budget // max(1, engine.bytes_per_token(L))))
        e = min(T, s + max(sub, block))
        chunks.append((s, e, sub))
        s = e
    return chunks


def default_budget(engine: ExactEngine, seq_len: int) -> int:
    """Default transient-memory budget (bytes): an estimate of what one forward and backward of
    the whole answer allocates (a full parameter gradient plus the activations it saves,
    about two floats per tapped output per position, and the attention probabilities), at
    least 16 MiB. The engine's peak then stays near 2x one forward-and-backward."""
    es = torch.finfo(engine.acc).bits // 8
    n = sum(p.numel() for _, p in engine.named)
    outs = sum(w[1] for w in engine.state.widths.values()) if engine.state else 0
    n_layers = max(1, sum(1 for t in engine.plan.taps if t.kind in ("layernorm", "affine_norm")) // 2)
    acts = seq_len * (2 * outs + n_layers * engine.n_heads * 4)
    return max(16 << 20, es * (n + acts))


def model_acc_dtype(model: nn.Module) -> torch.dtype:
    return compute_dtype(next(model.parameters()).dtype)


__all__ = ["ExactEngine", "default_budget", "exact_chunks", "math", "model_acc_dtype"]
