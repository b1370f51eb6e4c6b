"""The engine's pinned numerics: autocast off and full-precision float32 matmuls inside, restored on exit.

A training loop's mixed precision must not reach the engine: under bf16 autocast a float32 model's
matmuls run in bfloat16, and with TF32 allowed (a training config's ``tf32=True``) its float32 matmuls
keep 10 mantissa bits; either makes the head check refuse (the logits are then no longer ``h W^T`` within
float32 rounding) or, worse, loses about 3 digits of the ghost norms while the run says exact.
:func:`pinned_numerics` turns both off for the call and puts back exactly what it found, on an exception
too.

PyTorch >= 2.9 keeps the float32 precision per backend (``torch.backends.<backend>.fp32_precision``) and
raises on reading the legacy flags (``allow_tf32``, ``get_float32_matmul_precision``) once the two APIs
were mixed; where the new API exists it is the one saved, set (``"ieee"``) and restored, leaf by leaf
(with ``set_float32_matmul_precision("highest")`` for code that reads the legacy view), so that no state
a caller set through either API changes, and nothing reads a flag that could raise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

#: autocast device types switched off inside the engine
AUTOCAST_DEVICES = ("cpu", "cuda")

# the backends' fp32_precision leaves (PyTorch >= 2.9), parents first
_LEAVES = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul", "mkldnn.conv",
           "mkldnn.rnn")


def _leaf(path: str):
    obj = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(getattr(obj, "fp32_precision", None), str) else None


def _new_api() -> bool:
    return _leaf("cuda.matmul") is not None


def legacy_matmul_precision(default: str | None = "medium") -> str | None:
    """``torch.get_float32_matmul_precision()``, or ``default`` (``"medium"``, the loosest) where reading it
    raises (the legacy and per-backend APIs mixed)."""
    try:
        return torch.get_float32_matmul_precision()
    except RuntimeError:
        return default


def fp32_matmul_unit_roundoff(device_type: str) -> float:
    """Unit roundoff of a float32 matmul's products on ``device_type`` under the current settings:
    ``2**-24`` (IEEE), ``2**-11`` (TF32), ``2**-8`` (bfloat16 passes); the loosest of what the legacy
    precision and the device's backend leaf allow."""
    u = {"highest": 2.0**-24, "high": 2.0**-11, "medium": 2.0**-8}.get(legacy_matmul_precision(), 2.0**-8)
    leaf = _leaf("cuda.matmul" if device_type == "cuda" else "mkldnn.matmul")
    mode = leaf.fp32_precision if leaf is not None else "none"
    u = max(u, {"tf32": 2.0**-11, "bf16": 2.0**-8}.get(mode, 0.0))
    if device_type == "cuda" and leaf is None and torch.backends.cuda.matmul.allow_tf32:
        u = max(u, 2.0**-11)
    return u


@contextlib.contextmanager
def pinned_numerics() -> Iterator[None]:
    """Autocast off (:data:`AUTOCAST_DEVICES`), TF32 and reduced float32 matmul precision off
    (``allow_tf32`` of cuBLAS and cuDNN False, ``float32_matmul_precision`` "highest"); everything
    restored on exit, exception or not. Nests."""
    with contextlib.ExitStack() as stack:
        for dev in AUTOCAST_DEVICES:
            stack.enter_context(torch.autocast(device_type=dev, enabled=False))
        stack.enter_context(_full_precision_matmuls())
        yield


@contextlib.contextmanager
def preserved_matmul_settings() -> Iterator[None]:
    """Whatever changes the float32 matmul settings inside (TF32 flags, matmul precision, the backends'
    ``fp32_precision``) is undone on exit, exception or not: the values found on entry are put back
    through the API that holds them (see the module docstring)."""
    if _new_api():
        leaves = [o for o in (_leaf(p) for p in _LEAVES) if o is not None]
        saved = [o.fp32_precision for o in leaves]
        prec = legacy_matmul_precision(default=None)
        try:
            yield
        finally:
            if prec is not None:
                torch.set_float32_matmul_precision(prec)
            for o, v in zip(leaves, saved):
                o.fp32_precision = v
        return
    legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision())
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(legacy[2])
        torch.backends.cuda.matmul.allow_tf32 = legacy[0]
        torch.backends.cudnn.allow_tf32 = legacy[1]


@contextlib.contextmanager
def _full_precision_matmuls() -> Iterator[None]:
    readable = legacy_matmul_precision(default=None) is not None  # unreadable: the APIs mixed; leaves decide
    with preserved_matmul_settings():
        if _new_api():
            for p in _LEAVES:
                if p and _leaf(p) is not None:  # the global default stays; every backend leaf says "ieee"
                    _leaf(p).fp32_precision = "ieee"
        else:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        if readable:
            torch.set_float32_matmul_precision("highest")
        yield


def numerics_state() -> dict[str, object]:
    """What :func:`pinned_numerics` sets, read without raising (for tests and messages): autocast per
    device, the backend leaves (new API) or the legacy flags."""
    state: dict[str, object] = {f"autocast_{d}": torch.is_autocast_enabled(d) for d in AUTOCAST_DEVICES}
    state.update({f"autocast_dtype_{d}": torch.get_autocast_dtype(d) for d in AUTOCAST_DEVICES})
    if _new_api():
        state.update({f"fp32_precision:{p or 'global'}": _leaf(p).fp32_precision for p in _LEAVES
                      if _leaf(p) is not None})
    for name, read in (("allow_tf32_cuda_matmul", lambda: torch.backends.cuda.matmul.allow_tf32),
                       ("allow_tf32_cudnn", lambda: torch.backends.cudnn.allow_tf32),
                       ("float32_matmul_precision", torch.get_float32_matmul_precision)):
        try:
            state[name] = read()
        except RuntimeError:
            state[name] = "unreadable"
    return state


__all__ = ["AUTOCAST_DEVICES", "fp32_matmul_unit_roundoff", "legacy_matmul_precision", "numerics_state",
           "pinned_numerics", "preserved_matmul_settings"]
