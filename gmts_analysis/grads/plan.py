"""How the engines see a model: which parameters get ghost norms, which are materialized.

A *plan* sorts every trainable parameter (tied tensors once) into:

- the **head** (``model.get_output_embeddings()``, a linear ``logits = h W^T (+ b)``):
  its per-token gradient is ``c_t (x) h_t`` at one position, ``c_t = (e_y - p_t) / tau``,
  handled in closed form;
- the **tied embedding** (an ``nn.Embedding`` sharing the head's weight), whose own part
  ``E_t`` is a scatter of output gradients over the prompt+prefix tokens; the tied total is
  ``||E_t + H_t||^2 = ||E_t||^2 + ||H_t||^2 + 2 <E_t, H_t>``;
- **tapped** modules of a known type (``nn.Linear``, GPT-2 ``Conv1D``, ``nn.Embedding``,
  ``nn.LayerNorm``, any elementwise-affine ``*Norm`` such as RMSNorm), each called exactly
  once per forward and owning its parameters alone: ghost norms from (input, output-gradient);
- **direct** parameters (anything else: unknown module types, parameters shared in other
  ways, modules called several times): their per-token gradients are materialized exactly
  with ``torch.func`` (slower, always correct).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from gmts_analysis.models import trainable_parameters

KINDS = ("linear", "conv1d", "embedding", "layernorm", "affine_norm")


@dataclass
class Tap:
    """A module whose parameter-gradient norms are computed from its input and output gradient."""

    name: str  # module name, e.g. "model.layers.0.self_attn.q_proj"
    module: nn.Module
    kind: str  # one of KINDS
    param_names: list[str]  # full names of its parameters (as in trainable_parameters)
    tied_head: bool = False  # the embedding whose weight is the output head's


@dataclass
class Plan:
    head: nn.Module
    head_name: str
    head_tied: bool  # head weight shared with an embedding tap
    head_param_names: list[str]
    taps: list[Tap]
    direct: dict[str, torch.nn.Parameter]  # full name -> parameter (materialized per token)
    direct_module: dict[str, str]  # full param name -> owning module name
    unused: list[str] = field(default_factory=list)  # params of modules never called
    n_params: int = 0


def _module_kind(module: nn.Module) -> str | None:
    own = {k: p for k, p in module._parameters.items() if p is not None}
    cls = type(module).__name__
    if isinstance(module, nn.Linear):
        return "linear" if set(own) <= {"weight", "bias"} else None
    if cls == "Conv1D" and hasattr(module, "nf") and set(own) <= {"weight", "bias"} and own["weight"].dim() == 2:
        return "conv1d"
    if isinstance(module, nn.Embedding):
        if module.max_norm is not None or set(own) != {"weight"}:
            return None
        return "embedding"
    if isinstance(module, nn.LayerNorm):
        if len(module.normalized_shape) != 1:
            return None
        return "layernorm"
    elementwise = (
        all(p.dim() == 1 and p.shape == own["weight"].shape for p in own.values()) if "weight" in own else False
    )
    if "norm" in cls.lower() and elementwise and set(own) <= {"weight", "bias"}:
        return "affine_norm"
    return None


def make_plan(model: nn.Module, calls: dict[str, int], named: list[tuple[str, nn.Parameter]] | None = None) -> Plan:
    """Sort the parameters of ``model``. ``calls``: module name -> times called in one forward;
    ``named``: the trainable parameters (default :func:`trainable_parameters`; pass them when
    ``requires_grad`` has been switched off for the call)."""
    named = trainable_parameters(model) if named is None else named
    first_name = {id(p): n for n, p in named}
    # every (module, local name) that holds each trainable tensor
    holders: dict[int, list[tuple[str, str]]] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None and id(p) in first_name:
                holders.setdefault(id(p), []).append((mname, pname))
    modules = dict(model.named_modules(remove_duplicate=False))

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not isinstance(head, nn.Linear):
        raise NotImplementedError("the exact engine needs a linear output head (get_output_embeddings())")
    head_name = next(n for n, m in model.named_modules() if m is head)
    head_w = head.weight
    head_tied = False
    emb_name = None
    hw_holders = [h for h in holders.get(id(head_w), []) if h[0] != head_name]
    if id(head_w) in first_name and hw_holders:
        if (
            len(hw_holders) == 1
            and _module_kind(modules[hw_holders[0][0]]) == "embedding"
            and calls.get(hw_holders[0][0]) == 1
        ):
            head_tied = True
            emb_name = hw_holders[0][0]
        else:
            raise NotImplementedError("output head weight is shared in an unsupported way")
    head_param_names = [first_name[id(p)] for p in head._parameters.values() if p is not None and id(p) in first_name]
    if calls.get(head_name, 0) != 1:
        raise NotImplementedError("the output head must be called exactly once per forward")

    taps: list[Tap] = []
    direct: dict[str, nn.Parameter] = {}
    direct_module: dict[str, str] = {}
    unused: list[str] = []
    done: set[int] = {id(p) for p in head._parameters.values() if p is not None}
    seen_mod: set[int] = set()
    for mname, mod in model.named_modules():
        if mod is head or id(mod) in seen_mod:
            continue
        seen_mod.add(id(mod))
        own = [(k, p) for k, p in mod._parameters.items() if p is not None and id(p) in first_name]
        own = [(k, p) for k, p in own if id(p) not in done or mname == emb_name]
        if not own:
            continue
        kind = _module_kind(mod)
        ncall = calls.get(mname, 0)
        exclusive = all(len(holders[id(p)]) == 1 or (mname == emb_name and id(p) == id(head_w)) for _, p in own)
        if ncall == 0:
            unused.extend(first_name[id(p)] for _, p in own)
        elif kind is not None and ncall == 1 and exclusive:
            taps.append(Tap(mname, mod, kind, [first_name[id(p)] for _, p in own], tied_head=(mname == emb_name)))
        else:
            for _, p in own:
                n = first_name[id(p)]
                direct[n] = p
                direct_module[n] = holders[id(p)][0][0]
        for _, p in own:
            done.add(id(p))
    return Plan(
        head=head,
        head_name=head_name,
        head_tied=head_tied,
        head_param_names=head_param_names,
        taps=taps,
        direct=direct,
        direct_module=direct_module,
        unused=unused,
        n_params=sum(p.numel() for _, p in named),
    )


def layer_group(model: nn.Module, module_name: str) -> str:
    """The ``layer`` group of a module: the ``ModuleList`` element it sits in
    (``model.layers.3``), else the module's own name (embedding, final norm, head)."""
    parts = module_name.split(".")
    mod = model
    for i, part in enumerate(parts):
        mod = getattr(mod, part, None) if not part.isdigit() else mod[int(part)]
        if isinstance(mod, nn.ModuleList) and i + 1 < len(parts):
            return ".".join(parts[: i + 2])
    return module_name
