"""How the exact engine sees a model: ghost-norm rules per module type, and the plan.

**Rules.** A :class:`GhostRule` turns one module call's (input, output-gradient) into the
squared norm of that module's parameter gradient, without forming the gradient. Rules live in
one registry keyed by module type, as Opacus keeps its grad samplers::

    GHOST_RULES[MyLayer] = MyLayerRule()      # or register_ghost_rule(MyLayer, MyLayerRule())

:func:`rule_for` looks a module's type (and its base classes) up in :data:`GHOST_RULES`;
types it does not find are offered to :data:`STRUCTURAL_RULES` (rules that recognise a
family by shape rather than by class, e.g. the many ``*RMSNorm`` classes of ``transformers``);
a module no rule accepts is handled exactly by ``torch.func`` (see below). Ghost norms,
``X`` ``(L, d_in)``, ``G`` ``(L, d_out)`` (rows: every position the module saw in the call):

- linear (``nn.Linear``, GPT-2 ``Conv1D``) weight: ``||G^T X||^2`` or ``<G G^T, X X^T>``
  (whichever is cheaper); bias ``||sum_s g_s||^2``;
- LayerNorm / RMSNorm-like (output affine in an elementwise weight and bias):
  ``||sum_s g_s * u_s||^2`` (+ bias) with ``u`` = output at weight 1, bias 0 minus output at 0, 0;
- embedding: ``sum_v ||sum_{s: id_s = v} g_s||^2`` (rows of equal tokens summed; padding row
  excluded; times ``s^2`` for an embedding scaled by ``s``); for the embedding tied to the output
  head, the rows themselves (the head's part is added in closed form, with the cross term).

A subclass that overrides ``forward`` is not covered by its base class's rule.

**Plan.** Every trainable parameter (tied tensors once) is in exactly one place:

- the **head** (``model.get_output_embeddings()``, ``logits = h W^T (+ b)``): per-token
  gradient ``c_t (x) h_t``, ``c_t = (e_y - p_t) / tau``, in closed form;
- **taps**: modules a rule accepts that own their parameters alone and were called at most
  once in the planning pass. A module the planning pass did *not* call (an expert no token was
  routed to) is tapped too: the engine counts every tap's calls in every forward; a tap not
  called has an exactly-zero gradient for those tokens, and a tap called more than once is
  moved to ``direct`` and the chunk redone (:meth:`Plan.demote`);
- **direct**: everything else (unknown types, tensors shared between modules, modules
  called several times): per-token gradients materialized with ``torch.func`` (exact, slower).

:meth:`Plan.check_complete` raises a :class:`~gmts_analysis.errors.GmtsError` naming any
trainable parameter in none of the three.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gmts_analysis.engine.params import trainable_parameters
from gmts_analysis.errors import GmtsError


# ------------------------------------------------------------------------------------- rules
@dataclass
class Capture:
    """What one call of a tapped module leaves for its backward: ``x`` and ``aux`` tensors
    (saved for backward) and small static facts (``info``)."""

    x: Tensor
    aux: Tensor
    info: dict = field(default_factory=dict)


class GhostRule:
    """Squared parameter-gradient norms of one module type from (input, output gradient).

    Subclasses implement :meth:`fits` (does this module instance's parameter layout fit?),
    :meth:`capture` (at forward time, inside the transform; no gradient needed) and
    :meth:`sq_norm` (at backward time, once per token under ``vmap``)."""

    name = "rule"
    #: a layer-normalisation rule (used only for the memory estimate's layer count)
    is_norm = False

    def fits(self, module: nn.Module) -> bool:
        raise NotImplementedError

    def capture(self, module: nn.Module, args: tuple, output: Tensor, acc: torch.dtype, rows: bool,
                reenter: Any) -> Capture:
        raise NotImplementedError

    def sq_norm(self, g: Tensor, cap_x: Tensor, cap_aux: Tensor, info: dict) -> Tensor:
        raise NotImplementedError

    def work(self, din: int, dout: int, L: int) -> int:
        """Transient elements of one token's ghost norm over ``L`` positions (memory model)."""
        return 0


def _own(module: nn.Module) -> dict[str, Tensor]:
    return {k: p for k, p in module._parameters.items() if p is not None}


class LinearRule(GhostRule):
    """``y = x W^T + b`` (``nn.Linear``) or ``y = x W + b`` (GPT-2 ``Conv1D``)."""

    name = "linear"

    def fits(self, module):
        own = _own(module)
        return "weight" in own and set(own) <= {"weight", "bias"} and own["weight"].dim() == 2

    def capture(self, module, args, output, acc, rows, reenter):
        x = args[0].detach()
        xx = x.reshape(-1, x.shape[-1]).to(acc)
        own = _own(module)
        gram = xx.shape[0] < xx.shape[1]
        aux = xx @ xx.T if gram else xx.new_zeros(())
        return Capture(xx, aux, {"gram": gram, "bias": "bias" in own})

    def sq_norm(self, g, x, aux, info):
        g = g.reshape(-1, g.shape[-1]).to(x.dtype)
        total = ((g @ g.T) * aux).sum() if info["gram"] else (g.T @ x).pow(2).sum()
        if info["bias"]:
            total = total + g.sum(0).pow(2).sum()
        return total

    def work(self, din, dout, L):
        return L * L if L < din else din * dout


class EmbeddingRule(GhostRule):
    """``y = W[ids]`` (``nn.Embedding`` without ``max_norm``)."""

    name = "embedding"

    def fits(self, module):
        return isinstance(module, nn.Embedding) and module.max_norm is None and set(_own(module)) == {"weight"}

    def capture(self, module, args, output, acc, rows, reenter):
        ids = args[0].reshape(-1)
        uniq, inv = torch.unique(ids, return_inverse=True)
        if module.padding_idx is not None:
            inv = torch.where(ids == module.padding_idx, torch.full_like(inv, -1), inv)
        return Capture(ids.new_zeros((), dtype=acc), inv, {"n_unique": uniq.numel(), "rows": rows, "acc": acc})

    def sq_norm(self, g, x, inv, info):
        g = g.reshape(-1, g.shape[-1]).to(info["acc"])
        rows = g.new_zeros((info["n_unique"] + 1, g.shape[-1])).index_add(0, inv + 1, g)[1:]
        return rows if info["rows"] else rows.pow(2).sum()

    def work(self, din, dout, L):
        return L * dout


class ScaledEmbeddingRule(EmbeddingRule):
    """``y = W[ids] * s``, ``s`` a scalar ``embed_scale`` (the ``*ScaledWordEmbedding`` classes of
    ``transformers``: Gemma, BART, ...). Row gradients are ``s`` times the plain embedding's. As a
    structural rule it accepts those classes by name; each call checks ``y == W[ids] * s`` (else the
    engine is not used for the model)."""

    name = "scaled_embedding"

    def fits(self, module):
        scale = getattr(module, "embed_scale", None)
        return ("scaledwordembedding" in type(module).__name__.lower() and super().fits(module)
                and (isinstance(scale, (int, float)) or (isinstance(scale, Tensor) and scale.numel() == 1)))

    def capture(self, module, args, output, acc, rows, reenter):
        cap = super().capture(module, args, output, acc, rows, reenter)
        s = self.scale(module)
        plain = F.embedding(args[0], module.weight.detach(), module.padding_idx)
        if not torch.equal(output.detach(), plain * s.to(plain.device)):
            raise NotImplementedError(f"{type(module).__name__} is not W[ids] * embed_scale")
        cap.info["scale"] = float(s)
        return cap

    @staticmethod
    def scale(module: nn.Module) -> Tensor:
        """The module's ``embed_scale`` as a 0-d tensor in the weight's dtype (as its forward applies it)."""
        s = module.embed_scale
        return s.to(module.weight.dtype) if isinstance(s, Tensor) else torch.tensor(s, dtype=module.weight.dtype)

    def sq_norm(self, g, x, inv, info):
        return super().sq_norm(g * info["scale"], x, inv, info)


class LayerNormRule(GhostRule):
    """``nn.LayerNorm`` over the last axis: ``y = xhat * w + b``."""

    name = "layernorm"
    is_norm = True

    def fits(self, module):
        return isinstance(module, nn.LayerNorm) and len(module.normalized_shape) == 1 and bool(_own(module))

    def capture(self, module, args, output, acc, rows, reenter):
        x = args[0].detach()
        xhat = F.layer_norm(x.to(acc), module.normalized_shape, None, None, module.eps).reshape(-1, x.shape[-1])
        own = _own(module)
        return Capture(xhat.new_zeros(()), xhat, {"weight": "weight" in own, "bias": "bias" in own})

    def sq_norm(self, g, x, u, info):
        g = g.reshape(-1, g.shape[-1]).to(u.dtype)
        total = g.new_zeros(())
        if info["weight"]:
            total = total + (g * u).sum(0).pow(2).sum()
        if info["bias"]:
            total = total + g.sum(0).pow(2).sum()
        return total


class AffineNormRule(LayerNormRule):
    """Any normalisation whose output is affine in an elementwise ``weight`` (and ``bias``):
    ``y = A(x) + w * u(x) (+ b)`` (RMSNorm, ``(1 + w)`` variants). ``u`` is recovered as the
    output at weight 1, bias 0 minus the output at weight 0, bias 0. As a structural rule it
    accepts modules whose class name contains ``norm`` and whose parameters are 1-D of one shape."""

    name = "affine_norm"

    def fits(self, module):
        own = _own(module)
        if "weight" not in own or not set(own) <= {"weight", "bias"}:
            return False
        w = own["weight"]
        return w.dim() == 1 and all(p.shape == w.shape for p in own.values())

    def capture(self, module, args, output, acc, rows, reenter):
        w = module.weight
        one = {"weight": torch.ones_like(w)}
        zero = {"weight": torch.zeros_like(w)}
        if module._parameters.get("bias") is not None:
            one["bias"] = zero["bias"] = torch.zeros_like(w)
        with reenter(), torch.no_grad():
            u = torch.func.functional_call(module, one, args) - torch.func.functional_call(module, zero, args)
        own = _own(module)
        return Capture(u.new_zeros((), dtype=acc), u.reshape(-1, u.shape[-1]).to(acc),
                       {"weight": True, "bias": "bias" in own})


class _NormByName(AffineNormRule):
    def fits(self, module):
        return "norm" in type(module).__name__.lower() and super().fits(module)


LINEAR = LinearRule()
EMBEDDING = EmbeddingRule()
LAYER_NORM = LayerNormRule()
AFFINE_NORM = AffineNormRule()

#: module type -> rule; looked up along the type's MRO. Add a layer type here.
GHOST_RULES: dict[type, GhostRule] = {
    nn.Linear: LINEAR,
    nn.Embedding: EMBEDDING,
    nn.LayerNorm: LAYER_NORM,
}
if hasattr(nn, "RMSNorm"):
    GHOST_RULES[nn.RMSNorm] = AFFINE_NORM
#: where transformers defines GPT-2 style ``Conv1D`` (y = x W + b, W (in, out)): the same ghost norm as a linear
#: layer, registered by :func:`rule_for` once transformers has loaded that module (a model holding a Conv1D has),
#: so that planning never imports transformers itself
CONV1D_MODULE = "transformers.pytorch_utils"

#: rules tried, in order, for a type the registry does not know, or a subclass of a registered
#: type that overrides ``forward`` (families recognised by name and shape)
STRUCTURAL_RULES: list[GhostRule] = [_NormByName(), ScaledEmbeddingRule()]


def register_ghost_rule(module_type: type, rule: GhostRule) -> None:
    """Register ``rule`` for ``module_type`` (and its subclasses without a rule of their own)."""
    GHOST_RULES[module_type] = rule


def rule_for(module: nn.Module) -> GhostRule | None:
    """The ghost-norm rule for this module, or None (its parameters are then materialized).

    A registered type's rule covers a subclass only when the subclass keeps its ``forward``
    (OPT's positional embedding, Gemma's scaled embedding override it: a rule for the base
    class would give the wrong norm); such subclasses go to :data:`STRUCTURAL_RULES`."""
    conv1d = getattr(sys.modules.get(CONV1D_MODULE), "Conv1D", None)
    if conv1d is not None:
        GHOST_RULES.setdefault(conv1d, LINEAR)
    for cls in type(module).__mro__:
        rule = GHOST_RULES.get(cls)
        if rule is not None:
            if getattr(type(module), "forward", None) is getattr(cls, "forward", None):
                return rule if rule.fits(module) else None
            break
    for rule in STRUCTURAL_RULES:
        if rule.fits(module):
            return rule
    return None


# -------------------------------------------------------------------------------------- plan
@dataclass
class Tap:
    """A module whose parameter-gradient norms come from its input and output gradient."""

    name: str  # module name, e.g. "model.layers.0.self_attn.q_proj"
    module: nn.Module
    rule: GhostRule
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
    all_params: list[str] = field(default_factory=list)  # every trainable parameter (tied once)
    widths: dict[str, tuple[int, int]] = field(default_factory=dict)  # tap -> (d_in, d_out) seen
    n_params: int = 0

    @property
    def head_bias(self) -> bool:
        return any(n.endswith("bias") for n in self.head_param_names)

    def demote(self, names: set[str]) -> None:
        """Move taps ``names`` (called more than once in a forward) to the exact fallback."""
        keep = []
        for tap in self.taps:
            if tap.name not in names or tap.tied_head:
                keep.append(tap)
                continue
            for k, p in tap.module._parameters.items():
                n = f"{tap.name}.{k}" if tap.name else k
                if p is not None and n in tap.param_names:
                    self.direct[n] = p
                    self.direct_module[n] = tap.name
        self.taps = keep

    def check_complete(self) -> None:
        """Every trainable parameter is in the head, a tap or direct; else a GmtsError naming them."""
        covered = set(self.head_param_names) | set(self.direct)
        for tap in self.taps:
            covered.update(tap.param_names)
        missing = [n for n in self.all_params if n not in covered]
        if missing:
            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            raise GmtsError(f"exact gradient norms would leave out trainable parameters: {shown}")


def make_plan(model: nn.Module, calls: dict[str, int], named: list[tuple[str, nn.Parameter]] | None = None) -> Plan:
    """Sort the parameters of ``model``. ``calls``: module name -> times called in the planning
    forward; ``named``: the trainable parameters (default :func:`trainable_parameters`; pass them
    when ``requires_grad`` has been switched off for the call)."""
    named = trainable_parameters(model) if named is None else named
    first_name = {id(p): n for n, p in named}
    holders = _holders(model, first_name)
    head, head_name, emb_name = _output_head(model, calls, first_name, holders)
    head_param_names = [first_name[id(p)] for p in head._parameters.values() if p is not None and id(p) in first_name]
    if calls.get(head_name, 0) != 1:
        raise NotImplementedError("the output head must be called exactly once per forward")
    taps, direct, direct_module = _sort_modules(model, calls, first_name, holders, head, emb_name)
    plan = Plan(
        head=head,
        head_name=head_name,
        head_tied=emb_name is not None,
        head_param_names=head_param_names,
        taps=taps,
        direct=direct,
        direct_module=direct_module,
        all_params=[n for n, _ in named],
        n_params=sum(p.numel() for _, p in named),
    )
    plan.check_complete()
    return plan


def _holders(model: nn.Module, first_name: dict[int, str]) -> dict[int, list[tuple[str, str]]]:
    """Every ``(module name, local name)`` that holds each trainable tensor, keyed by ``id``."""
    holders: dict[int, list[tuple[str, str]]] = {}
    for mname, mod in model.named_modules(remove_duplicate=False):
        for pname, p in mod._parameters.items():
            if p is not None and id(p) in first_name:
                holders.setdefault(id(p), []).append((mname, pname))
    return holders


def _output_head(model: nn.Module, calls: dict[str, int], first_name: dict[int, str],
                 holders: dict[int, list[tuple[str, str]]]) -> tuple[nn.Linear, str, str | None]:
    """The linear output head, its module name and the name of the embedding its weight is
    tied to (``None``: untied); ``NotImplementedError`` for a head shared any other way (with
    more than one module, with a module no embedding rule fits, or one called other than once)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or not isinstance(head, nn.Linear):
        raise NotImplementedError("the exact engine needs a linear output head (get_output_embeddings())")
    head_name = next(n for n, m in model.named_modules() if m is head)
    head_w = head.weight
    emb_name = None
    hw_holders = [h for h in holders.get(id(head_w), []) if h[0] != head_name]
    if id(head_w) in first_name and hw_holders:
        if (
            len(hw_holders) == 1
            and isinstance(rule_for(modules[hw_holders[0][0]]), EmbeddingRule)
            and calls.get(hw_holders[0][0]) == 1
        ):
            emb_name = hw_holders[0][0]
        else:
            raise NotImplementedError("output head weight is shared in an unsupported way")
    return head, head_name, emb_name


def _sort_modules(model: nn.Module, calls: dict[str, int], first_name: dict[int, str],
                  holders: dict[int, list[tuple[str, str]]], head: nn.Linear, emb_name: str | None
                  ) -> tuple[list[Tap], dict[str, nn.Parameter], dict[str, str]]:
    """Every module but the head, in order, with trainable tensors not counted yet: a tap when a
    ghost rule fits, it is called at most once and owns its tensors alone (the tied embedding
    shares the head's), else its tensors go to the exact fallback. Returns ``(taps, direct,
    direct_module)``."""
    head_w = head.weight
    taps: list[Tap] = []
    direct: dict[str, nn.Parameter] = {}
    direct_module: dict[str, str] = {}
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
        rule = rule_for(mod)
        exclusive = all(len(holders[id(p)]) == 1 or (mname == emb_name and id(p) == id(head_w)) for _, p in own)
        all_own = len(own) == len(_own(mod))  # no frozen or already-counted tensor in the module
        if rule is not None and calls.get(mname, 0) <= 1 and exclusive and (all_own or mname == emb_name):
            taps.append(Tap(mname, mod, rule, [first_name[id(p)] for _, p in own], tied_head=(mname == emb_name)))
        else:
            for _, p in own:
                n = first_name[id(p)]
                direct[n] = p
                direct_module[n] = holders[id(p)][0][0]
        for _, p in own:
            done.add(id(p))
    return taps, direct, direct_module


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
