"""Elementwise functions a model applies to its output head's output, as entries.

A causal LM's logits are ``l = f(z)`` with ``z = h W^T (+ b)`` the head's output and ``f`` elementwise:
the identity for most models, soft-capping ``c tanh(z / c)`` (Gemma 2, Gemma 3's
``final_logit_softcapping``), a scale ``z / s`` (Granite's ``logits_scaling``) or ``z s`` (Cohere's
``logit_scale``, HyperCLOVA X's ``logits_scaling``, Falcon-H1's ``lm_head_multiplier``). The head's
closed form carries ``f``'s derivative: for token ``t`` the gradient with respect to ``z`` is
``f'(z_t) * (d logprob_t / d l_t)`` (elementwise, ``(V,)``), and the head's parameter gradient, the
cotangent at ``h`` and the tied embedding's cross term use that vector
(:func:`gmts_analysis.core.tokens.token_quantities`, ``logit_jacobian``).

A transform is one :class:`LogitTransform` in :data:`LOGIT_TRANSFORMS` (name, ``detect(config) -> params
or None``, ``forward(z, params)``, ``derivative(z, params)``); :func:`register_logit_transform` adds one
(a model of your own: detect it from a config field of yours)::

    register_logit_transform(LogitTransform(
        "asinh_cap", detect=lambda cfg: {"c": cfg.asinh_cap} if getattr(cfg, "asinh_cap", None) else None,
        forward=lambda z, p: p["c"] * torch.asinh(z / p["c"]),
        derivative=lambda z, p: 1 / torch.sqrt(1 + (z / p["c"]) ** 2)))

The detection only proposes: every chunk's logits are checked to be ``f(head output)`` within a rounding
bound (:func:`transform_deviation`, by :func:`gmts_analysis.engine.head.check_head_logits`), so a config
that names a transform its model does not apply, or post-processing no entry recognises, sends the answer
to the per-token loop with a warning, never to a wrong norm.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

Params = dict[str, float]


@dataclass(frozen=True)
class LogitTransform:
    """One elementwise logit transform ``l = forward(z, params)``.

    ``detect(config)``: the parameters for a model of this config, or ``None`` (not this transform);
    ``forward(z, params)``: the transform as the model computes it (same operations, same order, so the
    check's rounding bound stays tight); ``derivative(z, params)``: ``f'(z)``, elementwise, same shape."""

    name: str
    detect: Callable[[Any], Params | None]
    forward: Callable[[Tensor, Params], Tensor]
    derivative: Callable[[Tensor, Params], Tensor]


@dataclass(frozen=True)
class AppliedTransform:
    """A transform with the parameters detected for one model."""

    transform: LogitTransform
    params: Params

    def __call__(self, z: Tensor) -> Tensor:
        return self.transform.forward(z, self.params)

    def derivative(self, z: Tensor) -> Tensor:
        """``f'(z)``, elementwise, ``z``'s shape and dtype."""
        d = self.transform.derivative(z, self.params)
        return d.expand_as(z).to(z.dtype) if isinstance(d, Tensor) else torch.full_like(z, float(d))

    def __str__(self) -> str:
        args = ", ".join(f"{k}={v:g}" for k, v in self.params.items())
        return f"{self.transform.name}({args})"


#: name -> transform, tried in this order by :func:`detect_logit_transform`
LOGIT_TRANSFORMS: dict[str, LogitTransform] = {}


def register_logit_transform(t: LogitTransform) -> LogitTransform:
    """Add (or replace) ``t`` in :data:`LOGIT_TRANSFORMS`; returns it."""
    LOGIT_TRANSFORMS[t.name] = t
    return t


def config_number(config: Any, key: str) -> float | None:
    """``config.key`` (or its text config's) as a float, ``None`` when absent or not a number."""
    for cfg in (config, _text_config(config)):
        v = getattr(cfg, key, None)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    try:
        return get() if callable(get) else None
    except Exception:  # noqa: BLE001 - a config without a text part
        return None


def _model_type(config: Any) -> str:
    return str(getattr(config, "model_type", "") or "")


def _softcap(config: Any) -> Params | None:
    c = config_number(config, "final_logit_softcapping")
    return {"cap": c} if c is not None and c > 0 else None


def _scale_by(key: str, families: tuple[str, ...]) -> Callable[[Any], Params | None]:
    def detect(config: Any) -> Params | None:
        s = config_number(config, key)
        if s is None or s == 1.0 or s == 0.0 or not _model_type(config).startswith(families):
            return None
        return {"scale": s}

    return detect


def _multiplier(config: Any) -> Params | None:
    for key, families in (("logit_scale", ("cohere",)), ("logits_scaling", ("hyperclovax",)),
                          ("lm_head_multiplier", ("falcon_h1",))):
        p = _scale_by(key, families)(config)
        if p is not None:
            return p
    return None


register_logit_transform(LogitTransform(
    "softcap", _softcap,
    forward=lambda z, p: torch.tanh(z / p["cap"]) * p["cap"],
    derivative=lambda z, p: torch.cosh(z / p["cap"]).pow(-2),  # sech^2: no cancellation near the cap
))
register_logit_transform(LogitTransform(
    "divide", _scale_by("logits_scaling", ("granite",)),
    forward=lambda z, p: z / p["scale"], derivative=lambda z, p: 1.0 / p["scale"],
))
register_logit_transform(LogitTransform(
    "multiply", _multiplier, forward=lambda z, p: z * p["scale"], derivative=lambda z, p: p["scale"],
))

#: config fields that post-process the head's output in some transformers families, and their no-op
#: value (``None``: off when absent or <= 0); named in refusals when no entry claims them
POST_PROCESSING_FIELDS = {"final_logit_softcapping": None, "logits_scaling": 1.0, "logit_scale": 1.0,
                          "lm_head_multiplier": 1.0}


def declared_post_processing(model: nn.Module) -> str:
    """``field=value`` of the config fields of :data:`POST_PROCESSING_FIELDS` set to something other
    than their no-op, or ``""`` (for messages: whether the model applies them is for the check to say)."""
    cfg = getattr(model, "config", None)
    found = []
    for key, noop in POST_PROCESSING_FIELDS.items():
        v = config_number(cfg, key)
        if v is not None and v != noop and (noop is not None or v > 0):
            found.append(f"{key}={v:g}")
    return ", ".join(found)


def detect_logit_transform(model: nn.Module) -> AppliedTransform | None:
    """The transform the model's config declares (``None``: the logits should be the head's output).
    ``NotImplementedError`` when several entries claim the config: their order is unknown."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    hits = []
    for t in LOGIT_TRANSFORMS.values():
        params = t.detect(cfg)
        if params is not None:
            hits.append(AppliedTransform(t, dict(params)))
    if len(hits) > 1:
        raise NotImplementedError(f"the config declares several logit transforms ({', '.join(map(str, hits))}): "
                                  "the order they apply in is unknown")
    return hits[0] if hits else None


def transform_deviation(z: Tensor, logits: Tensor, transform: AppliedTransform) -> tuple[Tensor, Tensor]:
    """``(dev, tol)``, float64 of ``logits``' shape: ``|logits - f(z)|`` with ``f(z)`` in float64 from the
    head's output ``z``, and a bound on what rounding alone gives: ``8 u (|f(z)| + |z f'(z)|)`` plus the
    smallest normal, ``u`` the unit roundoff of the narrower of ``z``'s and ``logits``' dtypes (the
    argument's rounding moves ``f`` by ``|z f'(z)| u``, the function's own and the output's by a few ulps
    of ``|f(z)|``; 8 leaves room for a library ``tanh`` of a few ulps). A wrong transform is off by far
    more: a scale by its relative difference, an absent cap by ``z - c tanh(z/c)``."""
    z64 = z.to(torch.float64)
    ref = transform(z64)
    dev = (logits.to(torch.float64) - ref).abs()
    u = max(torch.finfo(z.dtype).eps, torch.finfo(logits.dtype).eps) / 2
    tiny = max(torch.finfo(z.dtype).tiny, torch.finfo(logits.dtype).tiny)
    tol = 8 * u * (ref.abs() + (z64 * transform.derivative(z64)).abs()) + tiny
    return dev, tol


def logit_jacobian(z: Tensor | None, transform: AppliedTransform | None, dtype: torch.dtype) -> Tensor | None:
    """``f'(z)`` ``(..., V)`` in ``dtype`` from the head's output ``z``, or ``None`` for no transform."""
    if transform is None or z is None:
        return None
    return transform.derivative(z.to(dtype))


__all__ = ["LOGIT_TRANSFORMS", "POST_PROCESSING_FIELDS", "AppliedTransform", "LogitTransform", "config_number",
           "declared_post_processing", "detect_logit_transform", "logit_jacobian", "register_logit_transform",
           "transform_deviation"]
