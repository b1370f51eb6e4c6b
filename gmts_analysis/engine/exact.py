"""The exact engine: per-token gradient norms from batched activation VJPs and ghost norms.

For a chunk of response tokens ``[s, e)`` the model runs once on the prefix
``input_ids[:P+e-1]`` (causal truncation: token ``t`` only depends on positions ``<= P+t-1``).
Inside ``torch.func.vjp`` every *tapped* module's output passes through :class:`_GhostTap`,
an identity whose backward turns (module input ``X``, output gradient ``G``) into the
squared norm of that module's parameter gradient and returns it as the gradient of a
zero *probe*. ``vmap`` over the chunk's cotangents gives, per token, every module's
squared norm at once; parameter gradients are never formed (weights do not require grad
during the call). The ghost norm of each module type is a rule in the registry of
:mod:`gmts_analysis.engine.plan`; the output head is closed form, no backward:
``||c_t||^2 (||h_t||^2 + [bias])`` with ``c_t = (e_y - p_t) / tau``
(:func:`gmts_analysis.core.tokens.head_grad_sq`); tied to the embedding:
``||E_t||^2 + ||H_t||^2 + 2 sum_u c_t[v_u] <E_t[u], h_t>`` over the prefix's tokens; anything
no rule accepts: per-token parameter gradients materialized by ``torch.func`` (exact, slower).

The chunk's forward is the only forward: the per-token closed forms (log-prob, entropy,
logit- and head-gradient norms, :func:`gmts_analysis.core.tokens.token_quantities`) come from its
logits and head inputs. The plan is made once per model (one short planning forward) and
cached; every forward counts the calls of every tapped module, so a module the planning pass
did not call (an expert no token was routed to) is still counted exactly, and one called
more than once is moved to the exact fallback and its chunk redone.

The logits must be ``f(lm_head(h))`` with ``f`` the elementwise transform the config declares
(soft-capping, scaling; the identity for most models; :mod:`gmts_analysis.engine.logit_transforms`),
checked on every chunk by :func:`gmts_analysis.engine.head.check_head_logits` (rounding bounds, so
rounding alone cannot fail it). With a transform, ``c_t`` above is ``f'(z_t) * (e_y - p_t) / tau``
(``z_t`` the head's output): the head's closed form, the cotangent and the tied cross term use it.

The backward starts at the head's input ``h`` with cotangent ``W^T c_t``, so the vocabulary
never enters the batched backward. Accumulation is float32 (float64 for float64 models).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from gmts_analysis.core.tokens import (
    TokenQuantities,
    compute_dtype,
    response_prefix,
    response_targets,
    token_quantities,
)
from gmts_analysis.engine.head import (  # noqa: F401 - re-exported: the check's home is head.py
    NumericalRefusal,
    check_head_logits,
    head_error_bound,
    matmul_unit_roundoff,
)
from gmts_analysis.engine.logit_transforms import (
    AppliedTransform,
    declared_post_processing,
    detect_logit_transform,
    logit_jacobian,
)
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.engine.plan import Capture, GhostRule, Plan, Tap, make_plan

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
        return g, ctx.spec.rule.sq_norm(g, x, aux, ctx.spec.info), None, None, None


@dataclass
class _Spec:
    rule: GhostRule
    info: dict


@dataclass
class _State:
    """Mutable state the forward hooks read while the model runs inside the transform."""

    plan: Plan
    acc: torch.dtype
    probes: dict[str, Tensor] = field(default_factory=dict)
    head_input: Tensor | None = None
    head_output: Tensor | None = None
    active: bool = False
    reentrant: bool = False
    calls: dict[str, int] = field(default_factory=dict)

    @contextlib.contextmanager
    def reenter(self):
        self.reentrant = True
        try:
            yield
        finally:
            self.reentrant = False


def _tap_hook(state: _State, tap: Tap):
    def hook(module, args, output):
        if state.reentrant or not state.active:
            return None
        state.calls[tap.name] = state.calls.get(tap.name, 0) + 1
        cap: Capture = tap.rule.capture(module, args, output, state.acc, tap.tied_head, state.reenter)
        return _GhostTap.apply(output, state.probes[tap.name], cap.x, cap.aux, _Spec(tap.rule, cap.info))

    return hook


def _head_hook(state: _State):
    def hook(module, args, output):
        if state.reentrant or not state.active:
            return
        state.calls[state.plan.head_name] = state.calls.get(state.plan.head_name, 0) + 1
        state.head_input = args[0]
        state.head_output = output

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


# model -> (key, plan): the plan depends only on the model (its trainable tensors, attention)
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _plan_key(model: nn.Module, named: list[tuple[str, nn.Parameter]]) -> tuple:
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (tuple((n, id(p), tuple(p.shape)) for n, p in named), impl, id(head), model.training)


def plan_key(model: nn.Module) -> tuple:
    """What the plan of ``model`` depends on (see :func:`cached_plan`)."""
    return _plan_key(model, trainable_parameters(model))


def planning_pass(model: nn.Module, sample_ids: Tensor) -> tuple[dict[str, int], dict[str, tuple[int, int]]]:
    """One no-grad forward on ``sample_ids`` ``(n,)``: calls per module (those holding
    parameters) and the (input, output) widths each module saw (for the memory estimate)."""
    calls: dict[str, int] = {}
    widths: dict[str, tuple[int, int]] = {}

    def count(name):
        def hook(module, args, output):
            calls[name] = calls.get(name, 0) + 1
            x0 = args[0] if args else None
            if isinstance(output, Tensor) and isinstance(x0, Tensor):
                widths[name] = (x0.shape[-1] if x0.is_floating_point() else 1, output.shape[-1])

        return hook

    handles = [
        m.register_forward_hook(count(n))
        for n, m in model.named_modules()
        if any(p is not None for p in m._parameters.values())
    ]
    try:
        with torch.no_grad():
            model(input_ids=sample_ids.unsqueeze(0), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return calls, widths


def cached_plan(model: nn.Module, named: list[tuple[str, nn.Parameter]], sample_ids: Tensor) -> Plan:
    """The model's plan, made on first use (one planning forward) and reused while the model's
    trainable tensors, attention implementation, head and train/eval mode stay the same."""
    key = _plan_key(model, named)
    hit = _PLANS.get(model)
    if hit is not None and hit[0] == key:
        return hit[1]
    calls, widths = planning_pass(model, sample_ids)
    plan = make_plan(model, calls, named)
    plan.widths = {t.name: widths[t.name] for t in plan.taps if t.name in widths}  # the memory model's widths
    _PLANS[model] = (key, plan)
    return plan


class _Redo(Exception):
    def __init__(self, names: set[str]):
        self.names = names


class ExactEngine:
    """Exact per-token gradient norms for one model; build once per call of :func:`grad_norms`.

    Use inside the context that switches attention to eager and turns ``requires_grad`` off
    (see :func:`gmts_analysis.engine.grad_norms`); hooks live between :meth:`install` and
    :meth:`remove`.
    """

    def __init__(self, model: nn.Module, acc: torch.dtype):
        self.model = model
        self.named = trainable_parameters(model)  # before requires_grad is switched off
        self.acc = acc
        self.handles: list = []
        self.keep = _accepts_logits_to_keep(model)
        self.n_heads = _n_heads(model)
        self.plan: Plan | None = None
        self.state: _State | None = None
        self.transform: AppliedTransform | None = None  # the logits' elementwise transform, if any
        self.declared = ""  # the config's post-processing fields (for a refusal's message)

    # ---- hooks -----------------------------------------------------------------------
    def install(self, sample_ids: Tensor) -> None:
        """Get the model's plan (cached; made on a short input the first time), install the hooks, and
        detect the logits' elementwise transform (``NotImplementedError`` for a config declaring several)."""
        self.transform = detect_logit_transform(self.model)
        self.declared = declared_post_processing(self.model)
        self.plan = cached_plan(self.model, self.named, sample_ids)
        self._hooks()

    def _hooks(self) -> None:
        self.remove()
        self.state = _State(plan=self.plan, acc=self.acc)
        for tap in self.plan.taps:
            self.handles.append(tap.module.register_forward_hook(_tap_hook(self.state, tap)))
        self.handles.append(self.plan.head.register_forward_hook(_head_hook(self.state)))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()

    # ---- memory model ----------------------------------------------------------------
    def bytes_per_token(self, L: int) -> int:
        """Rough transient bytes of one token's batched backward over a prefix of ``L`` positions."""
        es = torch.finfo(self.acc).bits // 8
        widths = [w for pair in self.plan.widths.values() for w in pair] or [1024]
        wmax = max(widths)
        per_pos = 8 * wmax + 3 * self.n_heads * L
        ghost = 0
        for tap in self.plan.taps:
            din, dout = self.plan.widths.get(tap.name, (1, 1))
            ghost = max(ghost, tap.rule.work(din, dout, L) * (2 if tap.tied_head else 1))
        direct = sum(p.numel() for p in self.plan.direct.values())
        # x2: calibrated against the measured RSS high-water on CPU (vmap keeps more alive)
        return 2 * es * (L * per_pos + ghost + direct)

    # ---- one chunk -------------------------------------------------------------------
    def chunk(self, input_ids: Tensor, P: int, s: int, e: int, temperature: float, sub: int | None = None
              ) -> tuple[dict[str, Tensor], TokenQuantities]:
        """Squared norms for response tokens ``[s, e)`` (dict module name -> ``(e-s,)`` tensor,
        acc dtype) and the tokens' closed forms, from one forward over the prefix and batched
        VJPs of ``sub`` tokens at a time (default all). A tap called more than once in the
        forward is moved to the exact fallback and the chunk redone."""
        for _ in range(len(self.plan.taps) + 1):
            try:
                return self._chunk(input_ids, P, s, e, temperature, sub)
            except _Redo as r:
                log.info("exact engine: %s called more than once per forward; using the exact fallback",
                         ", ".join(sorted(r.names)))
                self.plan.demote(r.names)
                self.plan.check_complete()
                self._hooks()
        raise RuntimeError("exact engine: the plan did not settle")  # pragma: no cover

    def _chunk(self, input_ids, P, s, e, temperature, sub):
        plan, acc = self.plan, self.acc
        c = e - s
        L = response_prefix(P, s, e)
        targets = response_targets(input_ids, P)[s:e]
        probes, tied_uniq = _zero_probes(plan, input_ids[:L], acc)
        direct = {n: p.detach() for n, p in plan.direct.items()}
        kwargs = {"input_ids": input_ids[:L].unsqueeze(0), "use_cache": False}
        if self.keep:
            kwargs["logits_to_keep"] = c
        h, vjp_fn, logits, head_out = self._vjp(_PrefixForward(self.model, self.state, kwargs, c), probes, direct)
        cf = _closed_forms(plan, h, head_out, logits, targets, temperature, acc, self.transform, self.declared)
        out = _squared_norms(plan, vjp_fn, cf, tied_uniq, c, sub, acc)
        return out, cf.q

    def _vjp(self, forward: _PrefixForward, probes: dict[str, Tensor], direct: dict[str, Tensor]):
        """``forward`` run once inside ``torch.func.vjp``: ``(h, vjp_fn, logits, head_out)``.
        Refuses a head called other than once, or a tied embedding called more than once;
        raises :class:`_Redo` naming any other tap called more than once."""
        plan, state = self.plan, self.state
        state.calls = {}
        state.active = True
        try:
            h, vjp_fn, (logits, head_out) = torch.func.vjp(forward, probes, direct, has_aux=True)
        finally:
            state.active = False
            state.probes = {}
            state.head_input = None
            state.head_output = None
        calls = state.calls
        if calls.get(plan.head_name, 0) != 1:
            raise NotImplementedError("the output head must be called exactly once per forward")
        many = {t.name for t in plan.taps if calls.get(t.name, 0) > 1}
        if many:
            if any(t.tied_head for t in plan.taps if t.name in many):
                raise NotImplementedError("the embedding tied to the head is called more than once per forward")
            raise _Redo(many)
        return h, vjp_fn, logits, head_out


def _zero_probes(plan: Plan, prefix_ids: Tensor, acc: torch.dtype) -> tuple[dict[str, Tensor], Tensor | None]:
    """The zero probe of every tap (a scalar; for the tied embedding one row per distinct token
    of the prefix, (U, d)) and those distinct tokens (``None`` without a tied embedding tap)."""
    dev = prefix_ids.device
    probes: dict[str, Tensor] = {}
    tied_uniq = None
    for tap in plan.taps:
        if tap.tied_head:
            tied_uniq = torch.unique(prefix_ids)
            probes[tap.name] = torch.zeros(tied_uniq.numel(), tap.module.weight.shape[1], dtype=acc, device=dev)
        else:
            probes[tap.name] = torch.zeros((), dtype=acc, device=dev)
    return probes, tied_uniq


class _PrefixForward:
    """The function the chunk's VJP is taken of: ``(probes, direct parameters) -> h`` (c, d), the
    head's input at the chunk's tokens, with aux ``(logits (c, V), head output or None)``."""

    def __init__(self, model: nn.Module, state: _State, kwargs: dict, c: int) -> None:
        self.model, self.state, self.kwargs, self.c = model, state, kwargs, c

    def __call__(self, probes_: dict[str, Tensor], direct_: dict[str, Tensor]):
        state, c = self.state, self.c
        state.probes = probes_
        if direct_:
            out = torch.func.functional_call(self.model, direct_, args=(), kwargs=self.kwargs)
        else:
            out = self.model(**self.kwargs)
        h = state.head_input[0, -c:]
        z = state.head_output
        z = z[0, -c:].detach() if isinstance(z, Tensor) else None
        return h, (out.logits[0, -c:].detach(), z)


@dataclass
class _ClosedForms:
    """A chunk's closed forms and the cotangents of its batched backward."""

    q: TokenQuantities
    cvec: Tensor  # (c, V): d logprob / d z, z the head's output (f'(z) (e_y - p) / tau), acc dtype
    ct: Tensor  # (c, c, d): token t's cotangent W^T c_t at row t, zero elsewhere
    hh: Tensor  # (c, d) head input, acc dtype
    head_sq: Tensor  # (c,) the head's squared norm ||c_t||^2 (||h_t||^2 + [bias])


def _closed_forms(plan: Plan, h: Tensor, head_out: Tensor | None, logits: Tensor, targets: Tensor,
                  temperature: float, acc: torch.dtype, transform: AppliedTransform | None = None,
                  declared: str = "") -> _ClosedForms:
    """Check the logits are ``f(lm_head(h))`` (``f``: ``transform``, default the identity); the tokens'
    quantities, the head's closed form and the cotangents at ``h`` of the chunk's ``c`` tokens."""
    head = plan.head
    W = head.weight.detach()
    hb = head.bias.detach() if head.bias is not None else None
    c = targets.shape[0]
    with torch.no_grad():
        check_head_logits(h.detach(), head_out, logits, W, hb, transform, declared)
        q = token_quantities(logits, targets, temperature, head_input=h.detach(), head_bias=plan.head_bias,
                             with_head_cotangent=True, logit_jacobian=logit_jacobian(head_out, transform, acc))
        cvec = q.head_cotangent.to(acc)  # (c, V): d logprob / d z (the head's output)
        q.head_cotangent = q.head_cotangent_sq = None
        ct_h = (cvec @ W.to(acc)).to(h.dtype)  # (c, d)
        ct = torch.zeros((c,) + tuple(h.shape), dtype=h.dtype, device=targets.device)
        ar = torch.arange(c, device=targets.device)
        ct[ar, ar] = ct_h
        hh = h.detach().to(acc)
        head_sq = q.head_grad_norm.to(acc).pow(2)
    return _ClosedForms(q=q, cvec=cvec, ct=ct, hh=hh, head_sq=head_sq)


def _squared_norms(plan: Plan, vjp_fn, cf: _ClosedForms, tied_uniq: Tensor | None, c: int, sub: int | None,
                   acc: torch.dtype) -> dict[str, Tensor]:
    """Per module, the (c,) squared norms of the chunk's tokens from batched VJPs of ``sub``
    tokens at a time (default all)."""
    dev = cf.ct.device
    out: dict[str, Tensor] = {}
    sub = c if sub is None else max(1, int(sub))
    batched = torch.vmap(vjp_fn)
    for i in range(0, c, sub):
        j = min(c, i + sub)
        probe_g, direct_g = batched(cf.ct[i:j])
        with torch.no_grad():
            part = _block_squared_norms(plan, probe_g, direct_g, cf, tied_uniq, i, j, acc)
            for name, v in part.items():
                out.setdefault(name, torch.zeros(c, dtype=acc, device=dev))[i:j] = v
        del probe_g, direct_g, part
    return out


def _block_squared_norms(plan: Plan, probe_g: dict[str, Tensor], direct_g: dict[str, Tensor], cf: _ClosedForms,
                         tied_uniq: Tensor | None, i: int, j: int, acc: torch.dtype) -> dict[str, Tensor]:
    """Per module, the (j-i,) squared norms of tokens ``[i, j)`` from their VJP: ghost norms of
    the taps (the tied embedding with the head's part and their cross term), the untied head in
    closed form, the fallback's materialized gradients summed per module."""
    part: dict[str, Tensor] = {}
    for tap in plan.taps:
        val = probe_g[tap.name]
        if tap.tied_head:
            E = val  # (j-i, U, d)
            proj = torch.einsum("cud,cd->cu", E, cf.hh[i:j])  # <E_t[u], h_t>
            cross = (proj * cf.cvec[i:j][:, tied_uniq]).sum(-1)
            part[tap.name] = E.pow(2).sum((1, 2)) + cf.head_sq[i:j] + 2.0 * cross
        else:
            part[tap.name] = val.reshape(j - i)
    if not plan.head_tied:
        part[plan.head_name] = cf.head_sq[i:j]
    for n, g in direct_g.items():
        m = plan.direct_module[n]
        part[m] = part.get(m, 0) + g.to(acc).reshape(j - i, -1).pow(2).sum(-1)
    return part


# blocks of the CPU's ``auto`` chunking (see exact_chunks)
CPU_BLOCK = 16


def exact_chunks(
    T: int, P: int, chunk_size: int | str, engine: ExactEngine, budget: int, block: int = 64,
    cap: int | None = None,
) -> list[tuple[int, int, int]]:
    """Blocks ``(s, e, sub)`` covering ``T`` tokens: one forward over the prefix of block
    ``[s, e)``, then batched VJPs of ``sub`` tokens at a time. An integer ``chunk_size`` is
    both. ``auto``: ``sub`` = as many tokens as fit ``budget`` bytes at this prefix length
    (shorter prefixes allow more), and the block spans at least ``block`` tokens so the
    forward is amortized (its truncation waste is under ``block`` positions per token);
    with ``cap``, blocks of ``cap`` tokens (``sub`` at most ``cap``): the batched backward of
    a block runs over the block's whole prefix, so short blocks waste fewer positions where a
    forward per few tokens is cheap next to their backward (CPU: :data:`CPU_BLOCK`; measured
    12-17% faster on the SmolLM2-135M shape at T=64, and not slower on the toy shapes)."""
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
        if cap:
            sub = min(sub, cap)
        e = min(T, s + (cap if cap else max(sub, block)))
        chunks.append((s, e, sub))
        s = e
    return chunks


def default_budget(engine: ExactEngine, seq_len: int) -> int:
    """Default transient-memory budget (bytes): an estimate of what one forward and backward of
    the whole answer allocates (a full parameter gradient plus the activations it saves,
    about two floats per tapped output per position, and the attention probabilities), at
    least 64 MiB (below that, tiny models batch one or two tokens per VJP and pay Python
    overhead: measured 25% slower end to end at 16 MiB on the 128-wide toy shape). The
    engine's peak then stays near 2x one forward-and-backward for models past toy size."""
    es = torch.finfo(engine.acc).bits // 8
    n = sum(p.numel() for _, p in engine.named)
    outs = sum(w[1] for w in engine.plan.widths.values()) if engine.plan else 0
    n_layers = max(1, sum(1 for t in engine.plan.taps if t.rule.is_norm) // 2)
    acts = seq_len * (2 * outs + n_layers * engine.n_heads * 4)
    return max(64 << 20, es * (n + acts))


def model_acc_dtype(model: nn.Module) -> torch.dtype:
    return compute_dtype(next(model.parameters()).dtype)


__all__ = ["ExactEngine", "NumericalRefusal", "cached_plan", "check_head_logits", "default_budget", "exact_chunks",
           "head_error_bound", "model_acc_dtype", "plan_key", "planning_pass"]
