"""Forward-mode sketch of per-token gradient norms, with an exact 95% interval per token.

Split each token's gradient ``g_t`` into two orthogonal parts (disjoint coordinates):

- ``a_t``, known in closed form: the output head's part on vocabulary rows that never
  occur in the input (untied head: the whole head, ``||a_t||^2 = ||c_t||^2 ||h_t||^2`` with
  ``c_t = f'(z_t) * (e_y - p_t) / tau``, ``f`` the logits' elementwise transform of the head's output
  ``z_t``, the identity for most models: :mod:`gmts_analysis.engine.logit_transforms`; tied head: ``||h_t||^2 sum_{v not in U} c_t[v]^2``, ``U`` the
  token ids fed to the embedding, because the embedding part only touches rows in ``U``);
- ``b_t``, everything else, sketched: for a Gaussian direction ``v`` (``N(0, I)`` over the
  coordinates of ``b``) one ``torch.func.jvp`` gives ``v . b_t`` for every token at once
  (the body's JVP contracted with ``W^T c_t``, plus ``sum_{u in U} c_t[u] v_W[u] . h_t`` for a
  tied head). With ``K`` directions, ``S_t = mean_k (v_k . b_t)^2`` is distributed exactly
  as ``||b_t||^2 chi^2_K / K``.

Estimate: ``||g_t||^2 ~= ||a_t||^2 + S_t``. Interval: ``||b_t||^2`` lies in
``[K S_t / q_{0.975}, K S_t / q_{0.025}]`` (``q`` chi-square quantiles, K degrees of freedom)
with probability exactly 95%; adding the exact ``||a_t||^2`` and taking square roots keeps
the coverage, so ``[lo, hi]`` covers ``||g_t||`` for 95% of tokens (per token, not jointly).

Embedding tangents are applied to the embedding *outputs* (``v[ids]``), so only the rows of
tokens present in the input are drawn: cost does not grow with the vocabulary.

**The random stream.** The directions come from one ``torch.Generator`` on the model's device,
seeded with ``seed`` itself, drawn in the accumulation dtype directly on that device: per batch of
``k`` directions, one ``randn`` of ``(k, *shape)`` per parameter (in the model's parameter order),
then one per lookup embedding. On the CPU this is the stream the sketch always drew. The stream
depends on the device: CUDA's generator (Philox) gives other numbers than the CPU's (Mersenne
Twister) for the same seed, so one seed gives different (equally distributed) directions, hence
different estimates and intervals, on a CPU and on a GPU; the estimate's distribution, and the
intervals' coverage, are the same. It also depends on the directions per batch (the memory
budget, ``--max-memory``, and the out-of-memory back-off of :mod:`gmts_analysis.engine.memory`):
a batch of ``k`` draws ``k`` directions per parameter at once. A run records the stream's device
in ``manifest.json`` (``sketch_stream_device``).
"""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from gmts_analysis.core.tokens import (
    TokenQuantities,
    compute_dtype,
    head_grad_sq,
    response_prefix,
    response_targets,
    token_quantities,
)
from gmts_analysis.engine import exact  # check_head_logits through its module: tests replace it there
from gmts_analysis.engine.base import GradNorms, frozen_for_transforms
from gmts_analysis.engine.logit_transforms import declared_post_processing, detect_logit_transform, logit_jacobian
from gmts_analysis.engine.memory import current_limit, noting_batch, sketch_budget
from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.engine.plan import ScaledEmbeddingRule


def chi2_interval_factors(k: int, level: float = 0.95) -> tuple[float, float]:
    """Multipliers ``(lo, hi)`` on a mean of ``k`` squared Gaussian projections that give a
    ``level`` interval for the squared norm: ``[K / q_hi, K / q_lo]``."""
    from scipy.stats import chi2

    alpha = 1.0 - level
    return k / float(chi2.ppf(1 - alpha / 2, k)), k / float(chi2.ppf(alpha / 2, k))


def sketch_grad_norms(
    model: nn.Module,
    input_ids: Tensor,
    prompt_len: int,
    *,
    temperature: float = 1.0,
    probes: int = 32,
    seed: int = 0,
    max_memory: int | None = None,
):
    """Sketched ``||d logprob_t / d theta||`` with 95% intervals; see the module docstring.

    Returns :class:`gmts_analysis.engine.GradNorms` with ``method="sketch"``.
    """
    layout = _sketch_layout(model)
    acc = compute_dtype(next(model.parameters()).dtype)
    S = int(input_ids.shape[0])
    P = int(prompt_len)
    T = S - P
    ids = input_ids[: response_prefix(P, 0, T)].unsqueeze(0)  # the last token predicts nothing
    targets = response_targets(input_ids, P)
    es = torch.finfo(acc).bits // 8
    budget = int(max_memory) if max_memory else max(64 << 20, sum(p.numel() for _, p in layout.named) * es)
    lo_f, hi_f = chi2_interval_factors(probes)

    hooks = _SketchHooks()
    with frozen_for_transforms(model):
        try:
            hooks.install(layout)
            with torch.no_grad():
                logits, h, jac = _forward_once(model, layout, hooks, ids, T, acc)
                head = _closed_form_part(layout, hooks, logits, h, targets, temperature, acc, jac)
            sum_y2 = _sketched_part(layout, hooks, head, ids, S, T, probes=probes, seed=seed, budget=budget, acc=acc)
        finally:
            hooks.remove()

    est_b = (sum_y2 / probes).double().cpu()
    a2c = head.a2.double().cpu()
    norms = (a2c + est_b).sqrt()
    lo = (a2c + est_b * lo_f).sqrt()
    hi = (a2c + est_b * hi_f).sqrt()
    return GradNorms(norms=norms, lo=lo, hi=hi, groups=None, method="sketch", quantities=head.q)


@dataclass
class _SketchLayout:
    """How the sketch reaches each trainable parameter of a model: the head in closed form,
    embeddings fed by token ids through their outputs, the rest (``rest``) by direct tangents."""

    named: list[tuple[str, nn.Parameter]]  # every trainable parameter
    base: nn.Module
    head: nn.Linear
    head_tied: bool  # the head's weight is also an embedding's weight
    head_bias: bool  # the head has a trainable bias
    emb_mods: dict[str, nn.Embedding]  # lookup embeddings of the base, by module name
    scale: dict[str, float]  # their output scale (``W[ids] * s``)
    rest: dict[str, nn.Parameter]  # every other trainable parameter of the base


def _sketch_layout(model: nn.Module) -> _SketchLayout:
    """The :class:`_SketchLayout` of ``model``; ``NotImplementedError`` for a model the sketch
    cannot split (no linear head or base model, a parameter outside both, a head tied to a
    non-embedding)."""
    named = trainable_parameters(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    base = getattr(model, "base_model", None)
    if not isinstance(head, nn.Linear) or base is None or base is model:
        raise NotImplementedError("the sketch needs a linear output head and a base model")
    trainable = {id(p): n for n, p in named}
    base_ids = {id(p) for p in base.parameters()}
    head_w = head.weight
    head_tied = id(head_w) in base_ids
    for n, p in named:
        if id(p) not in base_ids and p is not head_w and p is not head.bias:
            raise NotImplementedError(f"parameter {n} is neither in the base model nor the head")
    emb_mods, scale = _lookup_embeddings(base, trainable)
    emb_weight_ids = {id(m.weight) for m in emb_mods.values()}
    if head_tied and id(head_w) not in emb_weight_ids:
        raise NotImplementedError("the head is tied to something other than an embedding")
    rest = {n: p for n, p in base.named_parameters() if id(p) in trainable and id(p) not in emb_weight_ids}
    head_bias = head.bias is not None and id(head.bias) in trainable
    return _SketchLayout(named=named, base=base, head=head, head_tied=head_tied, head_bias=head_bias,
                        emb_mods=emb_mods, scale=scale, rest=rest)


def _lookup_embeddings(base: nn.Module, trainable: dict[int, str]) -> tuple[dict[str, nn.Embedding], dict[str, float]]:
    """Embedding modules of the base whose weight is used only through the lookup ``W[ids]``, or
    ``W[ids] * s`` (scale[name] = s), with their scales; other Embedding subclasses (OPT's offset
    positions) take their tangents like any other parameter."""
    emb_mods: dict[str, nn.Embedding] = {}
    scale: dict[str, float] = {}
    scaled = ScaledEmbeddingRule()
    for mname, mod in base.named_modules():
        if isinstance(mod, nn.Embedding) and id(mod.weight) in trainable and mod.max_norm is None:
            if type(mod).forward is nn.Embedding.forward:
                emb_mods[mname], scale[mname] = mod, 1.0
            elif scaled.fits(mod):
                emb_mods[mname], scale[mname] = mod, float(scaled.scale(mod))
    return emb_mods, scale


class _SketchHooks:
    """The forward hooks of one sketch: they capture the head's input, the base's output and the
    token ids each lookup embedding receives; while ``deltas`` holds a tensor for an embedding,
    its output gets that tensor added (the carrier of the embedding tangents)."""

    def __init__(self) -> None:
        self.captured: dict[str, Tensor] = {}
        self.emb_inputs: dict[str, Tensor] = {}
        self.deltas: dict[str, Tensor] = {}
        self.handles: list = []
        self.base_handle = None

    def install(self, layout: _SketchLayout) -> None:
        self.handles.append(layout.head.register_forward_hook(self._head))
        self.base_handle = layout.base.register_forward_hook(self._base)
        self.handles.append(self.base_handle)
        for name, mod in layout.emb_mods.items():
            self.handles.append(mod.register_forward_hook(functools.partial(self._embedding, name)))

    def remove(self) -> None:
        for hd in self.handles:
            hd.remove()

    def _head(self, module, args, output):
        self.captured["h"] = args[0]
        self.captured["head_out"] = output

    def _base(self, module, args, output):
        hs = getattr(output, "last_hidden_state", None)
        if hs is None and isinstance(output, tuple) and output:
            hs = output[0]
        self.captured["base"] = hs

    def _embedding(self, name, module, args, output):
        if name in self.deltas:
            return output + self.deltas[name]
        self.emb_inputs[name] = args[0].detach()
        return None


def _forward_once(model: nn.Module, layout: _SketchLayout, hooks: _SketchHooks, ids: Tensor, T: int,
                  acc: torch.dtype) -> tuple[Tensor, Tensor, Tensor | None]:
    """One plain forward pass: the response logits (T, V), the head input ``h`` (T, d), checked to be the
    base model's last hidden state, and ``f'(z)`` (T, V) of the logits' elementwise transform (``None``
    without one), with logits that are ``f`` of the head's own output, which lies within the rigorous
    rounding bound of ``h W^T + b`` (:func:`gmts_analysis.engine.exact.check_head_logits`, the exact engine's
    check: a float32 head on a real model differs from a float64 product by more than any fixed tolerance, and
    a fixed ``allclose`` refused SmolLM2 answers that are plain linear heads). ``NotImplementedError`` otherwise."""
    transform = detect_logit_transform(model)
    head = layout.head
    kw = {"input_ids": ids, "use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kw["logits_to_keep"] = T
    logits = model(**kw).logits[0, -T:]
    hooks.base_handle.remove()
    h = hooks.captured["h"][0, -T:]
    hb = hooks.captured.get("base")
    if not isinstance(hb, Tensor) or not torch.equal(hb[0, -T:], h):
        raise NotImplementedError("head input is not the base model's last hidden state")
    out = hooks.captured.get("head_out")
    z = out[0, -T:] if isinstance(out, Tensor) else None
    exact.check_head_logits(h, z, logits, head.weight, head.bias, transform, declared_post_processing(model))
    return logits, h, logit_jacobian(z, transform, acc)


@dataclass
class _ClosedFormPart:
    """What the sketch knows exactly: the token quantities, ``||a_t||^2`` and what the sketched
    part ``b_t`` is contracted with."""

    q: TokenQuantities
    h: Tensor  # (T, d) head input
    hh: Tensor  # (T, d) head input in the accumulation dtype
    u: Tensor  # (T, d): d logprob_t / d h_t = W^T (d logprob_t / d z_t)
    uniq: dict[str, Tensor]  # embedding rows that can receive gradient, per embedding module
    inv: dict[str, Tensor]  # each input position's row in ``uniq`` (-1: padding)
    tied_name: str | None  # the embedding the head is tied to
    cU: Tensor | None  # (T, U) d logprob_t / d z_t (the head's output) on the tied rows ``uniq[tied_name]``
    a2: Tensor  # (T,) ||a_t||^2


def _closed_form_part(layout: _SketchLayout, hooks: _SketchHooks, logits: Tensor, h: Tensor, targets: Tensor,
                      temperature: float, acc: torch.dtype, jac: Tensor | None = None) -> _ClosedFormPart:
    """The token quantities and the head's part ``a_t`` outside the input's rows, in closed form (``jac``:
    ``f'(z)`` (T, V) of the logits' elementwise transform, ``None`` for none)."""
    head_w = layout.head.weight
    q = token_quantities(logits, targets, temperature, head_input=h, head_bias=layout.head_bias,
                         with_head_cotangent=True, logit_jacobian=jac)
    cvec = q.head_cotangent.to(acc)  # (T, V): d logprob_t / d z_t, z the head's output
    c2 = q.head_cotangent_sq.to(acc)  # (T,): its squared norm
    q.head_cotangent = q.head_cotangent_sq = None
    hh = h.to(acc)
    u = cvec @ head_w.to(acc)  # (T, d): d logprob_t / d h_t
    uniq, inv = _embedding_rows(layout.emb_mods, hooks.emb_inputs)
    tied_name = next((n for n, m in layout.emb_mods.items() if m.weight is head_w), None) if layout.head_tied else None
    if tied_name is None:
        a2 = q.head_grad_norm.to(acc).pow(2)  # the whole head: ||c||^2 (||h||^2 + [bias])
        cU = None
    else:
        cU = cvec[:, uniq[tied_name]]  # (T, U)
        # the head's weight part on rows outside U (closed form), plus its bias part
        a2 = head_grad_sq((c2 - cU.pow(2).sum(-1)).clamp_min(0.0), hh, bias=False)
        if layout.head_bias:
            a2 = a2 + c2
    return _ClosedFormPart(q=q, h=h, hh=hh, u=u, uniq=uniq, inv=inv, tied_name=tied_name, cU=cU, a2=a2)


def _embedding_rows(emb_mods: dict[str, nn.Embedding], emb_inputs: dict[str, Tensor]
                    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Per embedding module, the distinct ids it was fed (``uniq``) and each position's index
    into them (``inv``, -1 where the id is the padding index)."""
    uniq, inv = {}, {}
    for name, mod in emb_mods.items():
        x = emb_inputs[name].reshape(-1)
        uq, iv = torch.unique(x, return_inverse=True)
        uniq[name], inv[name] = uq, iv
        if mod.padding_idx is not None:
            inv[name] = torch.where(x == mod.padding_idx, torch.full_like(iv, -1), iv)
    return uniq, inv


class _BodyJvp:
    """The base model's response hidden states as a function of its parameters and of additive
    embedding-output carriers, and their JVP along one direction."""

    def __init__(self, layout: _SketchLayout, hooks: _SketchHooks, inv: dict[str, Tensor], ids: Tensor, T: int,
                 primals_rest: dict[str, Tensor], primals_emb: dict[str, Tensor]) -> None:
        self.base, self.deltas, self.scale, self.inv = layout.base, hooks.deltas, layout.scale, inv
        self.ids, self.T = ids, T
        self.primals_rest, self.primals_emb = primals_rest, primals_emb

    def hidden(self, pr: dict[str, Tensor], pe: dict[str, Tensor]) -> Tensor:
        """(T, d) last hidden states with parameters ``pr`` and embedding carriers ``pe``."""
        self.deltas.clear()
        self.deltas.update(pe)
        try:
            out = torch.func.functional_call(self.base, pr, args=(),
                                             kwargs={"input_ids": self.ids, "use_cache": False})
        finally:
            self.deltas.clear()
        return out.last_hidden_state[0, -self.T:]

    def jvp(self, tr: dict[str, Tensor], te: dict[str, Tensor]) -> Tensor:
        """(T, d) directional derivative along parameter tangents ``tr`` and embedding-row tangents ``te``."""
        tan_e = {}
        for n, v in te.items():
            full = torch.cat([torch.zeros_like(v[:1]), v], 0)[self.inv[n] + 1]  # padding -> 0
            tan_e[n] = full.reshape(self.primals_emb[n].shape) * self.scale[n]
        return torch.func.jvp(self.hidden, (self.primals_rest, self.primals_emb), (tr, tan_e))[1]


def _sketched_part(layout: _SketchLayout, hooks: _SketchHooks, head: _ClosedFormPart, ids: Tensor, S: int,
                   T: int, *, probes: int, seed: int, budget: int, acc: torch.dtype) -> Tensor:
    """(T,) ``sum_k (v_k . b_t)^2`` over ``probes`` Gaussian directions: K forward-mode passes,
    batched with vmap over as many directions as ``budget`` bytes allow (``S``: the answer's
    length in tokens, prompt included; ``T``: its response tokens)."""
    es = torch.finfo(acc).bits // 8
    gen = stream_generator(ids.device, seed)
    primals_rest = {n: p.detach() for n, p in layout.rest.items()}
    primals_emb = {
        n: torch.zeros(ids.shape + (m.weight.shape[1],), dtype=m.weight.dtype, device=ids.device)
        for n, m in layout.emb_mods.items()
    }
    d_model = head.h.shape[-1]
    per_probe = es * (sum(p.numel() for p in layout.rest.values()) + 12 * S * max(d_model, 1) * 4)
    kb = max(1, min(probes, sketch_budget(budget, ids.device) // max(1, per_probe)))
    if current_limit().directions is not None:  # the out-of-memory back-off's cap
        kb = min(kb, current_limit().directions)
    body = _BodyJvp(layout, hooks, head.inv, ids, T, primals_rest, primals_emb)

    sum_y2 = torch.zeros(T, dtype=acc, device=ids.device)
    done = 0
    while done < probes:
        k = min(kb, probes - done)
        with noting_batch("directions", k):
            tr, te = _directions(gen, k, primals_rest, layout.emb_mods, head.uniq, acc)
            hdot = torch.vmap(body.jvp)(tr, te)  # (k, T, d)
            with torch.no_grad():
                sum_y2 += _projections(hdot, te, head, acc).pow(2).sum(0)
        del tr, te, hdot
        done += k
    return sum_y2


def stream_generator(device: torch.device | str, seed: int) -> torch.Generator:
    """The sketch's random stream: a generator on ``device`` (the model's) seeded with ``seed``
    (see the module docstring: the numbers depend on the device type)."""
    return torch.Generator(device=torch.device(device)).manual_seed(int(seed))


def _directions(gen: torch.Generator, k: int, primals_rest: dict[str, Tensor], emb_mods: dict[str, nn.Embedding],
                uniq: dict[str, Tensor], acc: torch.dtype) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``k`` Gaussian directions drawn from ``gen`` on its device, one ``randn`` per parameter:
    parameter tangents ``(k, *shape)``, then embedding-row tangents ``(k, U, d)`` on the rows in
    ``uniq``. Drawn in ``acc`` (as on the CPU before) and cast to the parameter's dtype."""
    dev = gen.device
    tr = {
        n: torch.randn((k,) + tuple(p.shape), generator=gen, dtype=acc, device=dev).to(device=p.device, dtype=p.dtype)
        for n, p in primals_rest.items()
    }
    te = {
        n: torch.randn((k, uniq[n].numel(), m.weight.shape[1]), generator=gen, dtype=acc, device=dev).to(
            device=m.weight.device, dtype=m.weight.dtype
        )
        for n, m in emb_mods.items()
    }
    return tr, te


def _projections(hdot: Tensor, te: dict[str, Tensor], head: _ClosedFormPart, acc: torch.dtype) -> Tensor:
    """(k, T) ``v_k . b_t``: the body's JVP contracted with ``d logprob_t / d h_t``, plus the tied
    head's rows in the input, ``sum_{u in U} c_t[u] v_W[u] . h_t``."""
    y = (hdot.to(acc) * head.u).sum(-1)  # (k, T)
    if head.cU is not None:
        vU = te[head.tied_name].to(acc)  # (k, U, d)
        y = y + torch.einsum("td,kud,tu->kt", head.hh, vU, head.cU)
    return y


__all__ = ["chi2_interval_factors", "math", "sketch_grad_norms", "stream_generator"]
