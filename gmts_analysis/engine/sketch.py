"""Forward-mode sketch of per-token gradient norms, with an exact 95% interval per token.

Split each token's gradient ``g_t`` into two orthogonal parts (disjoint coordinates):

- ``a_t``, known in closed form: the output head's part on vocabulary rows that never
  occur in the input (untied head: the whole head, ``||a_t||^2 = ||c_t||^2 ||h_t||^2`` with
  ``c_t = (e_y - p_t) / tau``; tied head: ``||h_t||^2 sum_{v not in U} c_t[v]^2``, ``U`` the
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
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gmts_analysis.core.tokens import compute_dtype, head_grad_sq, response_prefix, response_targets, token_quantities
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
    from gmts_analysis.engine import GradNorms, frozen_for_transforms

    named = trainable_parameters(model)
    acc = compute_dtype(next(model.parameters()).dtype)
    S = int(input_ids.shape[0])
    P = int(prompt_len)
    T = S - P
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

    # embedding modules of the base whose weight is used only through the lookup ``W[ids]``, or
    # ``W[ids] * s`` (scale[name] = s), and the tied head; other Embedding subclasses (OPT's offset
    # positions) take their tangents like any other parameter
    emb_mods: dict[str, nn.Embedding] = {}
    scale: dict[str, float] = {}
    scaled = ScaledEmbeddingRule()
    for mname, mod in base.named_modules():
        if isinstance(mod, nn.Embedding) and id(mod.weight) in trainable and mod.max_norm is None:
            if type(mod).forward is nn.Embedding.forward:
                emb_mods[mname], scale[mname] = mod, 1.0
            elif scaled.fits(mod):
                emb_mods[mname], scale[mname] = mod, float(scaled.scale(mod))
    emb_weight_ids = {id(m.weight) for m in emb_mods.values()}
    if head_tied and id(head_w) not in emb_weight_ids:
        raise NotImplementedError("the head is tied to something other than an embedding")
    rest = {n: p for n, p in base.named_parameters() if id(p) in trainable and id(p) not in emb_weight_ids}

    ids = input_ids[: response_prefix(P, 0, T)].unsqueeze(0)  # the last token predicts nothing
    targets = response_targets(input_ids, P)
    head_bias = head.bias is not None and id(head.bias) in trainable
    keep = "logits_to_keep" in inspect.signature(model.forward).parameters
    n_params = sum(p.numel() for _, p in named)
    es = torch.finfo(acc).bits // 8
    budget = int(max_memory) if max_memory else max(64 << 20, n_params * es)
    lo_f, hi_f = chi2_interval_factors(probes)

    captured: dict[str, Tensor] = {}
    emb_inputs: dict[str, Tensor] = {}
    deltas: dict[str, Tensor] = {}
    handles = []

    def head_hook(module, args, output):
        captured["h"] = args[0]

    def base_hook(module, args, output):
        hs = getattr(output, "last_hidden_state", None)
        if hs is None and isinstance(output, tuple) and output:
            hs = output[0]
        captured["base"] = hs

    def emb_hook(name):
        def hook(module, args, output):
            if name in deltas:
                return output + deltas[name]
            emb_inputs[name] = args[0].detach()
            return None

        return hook

    with frozen_for_transforms(model):
        try:
            handles.append(head.register_forward_hook(head_hook))
            base_handle = base.register_forward_hook(base_hook)
            handles.append(base_handle)
            for name, mod in emb_mods.items():
                handles.append(mod.register_forward_hook(emb_hook(name)))
            with torch.no_grad():
                kw = {"input_ids": ids, "use_cache": False}
                if keep:
                    kw["logits_to_keep"] = T
                logits = model(**kw).logits[0, -T:]
                base_handle.remove()
                h = captured["h"][0, -T:]
                hb = captured.get("base")
                if (
                    not isinstance(hb, Tensor)
                    or not torch.equal(hb[0, -T:], h)
                    or not torch.allclose(F.linear(h[[0, -1]], head_w, head.bias).float(), logits[[0, -1]].float(),
                                          rtol=1e-4, atol=1e-5)
                ):
                    raise NotImplementedError("head input is not the base model's last hidden state")
                q = token_quantities(logits, targets, temperature, head_input=h, head_bias=head_bias,
                                     with_logit_grad=True)
                cvec = q.logit_grad.to(acc)  # (T, V): d logprob_t / d raw logits
                q.logit_grad = None
                hh = h.to(acc)
                u = cvec @ head_w.to(acc)  # (T, d): d logprob_t / d h_t
                c2 = q.logit_grad_norm.to(acc).pow(2)
                # embedding rows that can receive gradient, per embedding module
                uniq, inv = {}, {}
                for name, mod in emb_mods.items():
                    x = emb_inputs[name].reshape(-1)
                    uq, iv = torch.unique(x, return_inverse=True)
                    uniq[name], inv[name] = uq, iv
                    if mod.padding_idx is not None:
                        inv[name] = torch.where(x == mod.padding_idx, torch.full_like(iv, -1), iv)
                tied_name = next((n for n, m in emb_mods.items() if m.weight is head_w), None) if head_tied else None
                if tied_name is None:
                    a2 = q.head_grad_norm.to(acc).pow(2)  # the whole head: ||c||^2 (||h||^2 + [bias])
                    cU = None
                else:
                    cU = cvec[:, uniq[tied_name]]  # (T, U)
                    # the head's weight part on rows outside U (closed form), plus its bias part
                    a2 = head_grad_sq((c2 - cU.pow(2).sum(-1)).clamp_min(0.0), hh, bias=False)
                    if head_bias:
                        a2 = a2 + c2

            # --- the sketch: K forward-mode passes, batched with vmap over directions ---
            gen = torch.Generator(device="cpu").manual_seed(int(seed))
            primals_rest = {n: p.detach() for n, p in rest.items()}
            primals_emb = {
                n: torch.zeros(ids.shape + (m.weight.shape[1],), dtype=m.weight.dtype, device=ids.device)
                for n, m in emb_mods.items()
            }
            d_model = h.shape[-1]
            per_probe = es * (sum(p.numel() for p in rest.values()) + 12 * S * max(d_model, 1) * 4)
            kb = max(1, min(probes, budget // max(1, per_probe)))

            def fn(pr, pe):
                deltas.clear()
                deltas.update(pe)
                try:
                    out = torch.func.functional_call(base, pr, args=(), kwargs={"input_ids": ids, "use_cache": False})
                finally:
                    deltas.clear()
                return out.last_hidden_state[0, -T:]

            def one(tr, te):
                tan_e = {}
                for n, v in te.items():
                    full = torch.cat([torch.zeros_like(v[:1]), v], 0)[inv[n] + 1]  # padding -> 0
                    tan_e[n] = full.reshape(primals_emb[n].shape) * scale[n]
                return torch.func.jvp(fn, (primals_rest, primals_emb), (tr, tan_e))[1]

            sum_y2 = torch.zeros(T, dtype=acc, device=ids.device)
            done = 0
            while done < probes:
                k = min(kb, probes - done)
                tr = {
                    n: torch.randn((k,) + tuple(p.shape), generator=gen, dtype=acc).to(device=p.device, dtype=p.dtype)
                    for n, p in primals_rest.items()
                }
                te = {
                    n: torch.randn((k, uniq[n].numel(), m.weight.shape[1]), generator=gen, dtype=acc).to(
                        device=m.weight.device, dtype=m.weight.dtype
                    )
                    for n, m in emb_mods.items()
                }
                hdot = torch.vmap(one)(tr, te)  # (k, T, d)
                with torch.no_grad():
                    y = (hdot.to(acc) * u).sum(-1)  # (k, T)
                    if cU is not None:
                        vU = te[tied_name].to(acc)  # (k, U, d)
                        y = y + torch.einsum("td,kud,tu->kt", hh, vU, cU)
                    sum_y2 += y.pow(2).sum(0)
                done += k
        finally:
            for hd in handles:
                hd.remove()

    est_b = (sum_y2 / probes).double().cpu()
    a2c = a2.double().cpu()
    norms = (a2c + est_b).sqrt()
    lo = (a2c + est_b * lo_f).sqrt()
    hi = (a2c + est_b * hi_f).sqrt()
    return GradNorms(norms=norms, lo=lo, hi=hi, groups=None, method="sketch", quantities=q)


__all__ = ["chi2_interval_factors", "math", "sketch_grad_norms"]
