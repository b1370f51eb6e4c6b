"""The output head's check, shared by the exact engine and the sketch: the model's logits must be
``f(lm_head(h))``, ``f`` the elementwise transform its config declares (the identity for most models;
:mod:`gmts_analysis.engine.logit_transforms`), with ``lm_head`` a plain linear map.

Both comparisons are bounded by rounding, never by a fixed tolerance, so rounding alone cannot fail
them (:func:`check_head_logits`); a failure is a :class:`NumericalRefusal` (that answer to the per-token
loop, with a warning; never cached, so the next answer is checked again).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from gmts_analysis.engine.logit_transforms import AppliedTransform, declared_post_processing, transform_deviation
from gmts_analysis.engine.numerics import fp32_matmul_unit_roundoff


class NumericalRefusal(NotImplementedError):
    """A refusal decided by comparing numbers (the logits against ``f(lm_head(h))``), not by what
    the model is made of: never cached, so that one answer's refusal does not decide the next."""


def matmul_unit_roundoff(dtype: torch.dtype, device: torch.device) -> float:
    """Unit roundoff of the accumulation of a ``dtype`` matmul on ``device``: float32 may run on
    TF32 / bfloat16 units where the matmul precision allows it
    (:func:`gmts_analysis.engine.numerics.fp32_matmul_unit_roundoff`; inside the engine it is pinned
    to IEEE float32); half types accumulate in float32 unless CUDA's reduced-precision reductions are
    allowed."""
    if dtype == torch.float64:
        return 2.0**-53
    u32 = fp32_matmul_unit_roundoff(device.type)
    if dtype in (torch.float16, torch.bfloat16):
        reduced = device.type == "cuda" and (
            torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction if dtype == torch.float16
            else torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
        return torch.finfo(dtype).eps / 2 if reduced else u32
    return u32


def head_error_bound(h: Tensor, W: Tensor, b: Tensor | None, out_dtype: torch.dtype, block: int = 8192
                     ) -> tuple[Tensor, Tensor]:
    """``(raw, tol)``, both ``(n, V)`` float64: ``raw = h W^T + b`` computed in float64 from the
    model's own ``h`` ``(n, d)``, ``W`` ``(V, d)``, ``b`` ``(V,)``, and a rigorous bound on how far
    the model's ``lm_head(h)`` can be from it by rounding alone: ``gamma_d (|h| |W|^T + |b|)``
    with ``gamma_d = d u / (1 - d u)`` (``u``: :func:`matmul_unit_roundoff`; a sum of ``d``
    products, Higham's bound; the float64 reference's own error is added the same way), plus
    half an ulp of the output for outputs narrower than the accumulation. ``tol`` is ``inf``
    where the bound is useless (``d u >= 1/2``). ``V`` is processed ``block`` rows at a time."""
    n, d = h.shape
    u = matmul_unit_roundoff(W.dtype, W.device)
    gam = (d * u / (1 - d * u) if d * u < 0.5 else math.inf) + 2 * d * 2.0**-53
    u_out = torch.finfo(out_dtype).eps / 2 if torch.finfo(out_dtype).eps / 2 > u else 0.0
    h64 = h.to(torch.float64)
    ha = h64.abs()
    raws, tols = [], []
    for i in range(0, W.shape[0], block):
        w = W[i:i + block].to(torch.float64)
        raw = h64 @ w.T
        mag = ha @ w.abs().T
        if b is not None:
            bb = b[i:i + block].to(torch.float64)
            raw = raw + bb
            mag = mag + bb.abs()
        raws.append(raw)
        tols.append(gam * mag + u_out * raw.abs() * (1 + 2 * gam))
    return torch.cat(raws, 1), torch.cat(tols, 1)


def check_transformed_logits(head_out: Tensor | None, logits: Tensor, transform: AppliedTransform | None,
                             declared: str = "") -> None:
    """Raise :class:`NumericalRefusal` unless the logits ``(c, V)`` are ``f(head_out)``: equal to the
    head module's output where ``transform`` is ``None``; within the rounding bound of
    :func:`gmts_analysis.engine.logit_transforms.transform_deviation` of the transform of it otherwise.
    NaN where both are NaN passes (the finiteness check's job). ``declared``: the config's
    post-processing fields, for the message."""
    if head_out is None or head_out.shape != logits.shape:
        raise NumericalRefusal("model logits are not the output head's output (post-processing such as "
                               "soft-capping or scaling is not supported)")
    both_nan = head_out.isnan() & logits.isnan()
    if transform is None:
        ho = head_out.to(logits.dtype)
        if bool(((ho == logits) | both_nan).all()):
            return
        diff = (logits.double() - head_out.double()).abs().max().item()
        said = f"; the config declares {declared}, which no registered logit transform claims" if declared else ""
        raise NumericalRefusal(f"model logits are not the output head's output (post-processing such as "
                               f"soft-capping or scaling is not supported; max |logit - lm_head(h)| = {diff:.3g}"
                               f"{said})")
    dev, tol = transform_deviation(head_out, logits, transform)
    bad = ~((dev <= tol) | both_nan)
    if bool(bad.any()):
        k = int(torch.argmax(torch.where(bad, dev - tol, torch.full_like(dev, -math.inf)).flatten()))
        raise NumericalRefusal(
            f"model logits are not {transform} of the output head's output (unrecognised post-processing "
            f"is not supported): off by {dev.flatten()[k].item():.3g}, past the rounding bound "
            f"{tol.flatten()[k].item():.3g}")


def check_head_logits(h: Tensor, head_out: Tensor | None, logits: Tensor, W: Tensor, b: Tensor | None,
                      transform: AppliedTransform | None = None, declared: str = "") -> None:
    """Raise :class:`NumericalRefusal` unless the model's logits ``(c, V)`` are ``f(lm_head(h))``.

    Two checks that rounding cannot fail: the logits must be ``transform`` of the head module's own
    output ``head_out`` (:func:`check_transformed_logits`: exactly equal without a transform; other
    post-processing changes them); and the head's output on the first and last token must lie within
    the rigorous rounding bound of :func:`head_error_bound` of ``h W^T + b`` in float64 (a head module
    whose forward is not a plain linear map)."""
    check_transformed_logits(head_out, logits, transform, declared)
    c = h.shape[0]
    rows = [0, c - 1] if c > 1 else [0]
    raw, tol = head_error_bound(h[rows], W, b, head_out.dtype)
    dev = (head_out[rows].to(torch.float64) - raw).abs()
    bad = dev > tol
    if bool(bad.any()):
        k = int(torch.argmax((dev - tol).flatten()))
        r, v = divmod(k, raw.shape[1])
        raise NumericalRefusal(
            f"the output head's output is not h W^T + b: logit {v} of row {rows[r]} is off by "
            f"{dev[r, v].item():.3g}, past the rounding bound {tol[r, v].item():.3g}")


__all__ = ["NumericalRefusal", "check_head_logits", "check_transformed_logits", "declared_post_processing",
           "head_error_bound", "matmul_unit_roundoff"]
