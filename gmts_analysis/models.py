"""Load a causal LM and its tokenizer; the shipped-policy aliases; attention switching.

``tiny`` and ``small`` name the policies shipped in ``data/policies/``; anything
else is a local directory or a hub id (loaded with ``local_files_only`` unless the
caller allows the network: the toolkit never downloads at run time by default).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

import torch

from gmts_analysis.errors import GmtsError

ALIASES = ("tiny", "small")
DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def data_dir() -> Path:
    """The project's ``data/`` directory (``GMTS_DATA_DIR`` overrides)."""
    env = os.environ.get("GMTS_DATA_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "data"


def resolve_model_path(name: str) -> str:
    """Map ``tiny``/``small`` to ``data/policies/<name>``; other names pass through."""
    if name in ALIASES:
        path = data_dir() / "policies" / name
        if not (path / "config.json").exists():
            raise GmtsError(f"{path}: shipped policy '{name}' not found (expected config.json there)")
        return str(path)
    return name


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """``auto`` -> ``cuda`` if available else ``cpu``; ``cuda[:N]`` checked to exist."""
    if isinstance(spec, torch.device):
        return spec
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except RuntimeError:
        raise GmtsError(f"--device: unknown device '{spec}' (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise GmtsError(f"--device {spec}: CUDA is not available on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise GmtsError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s)")
    return dev


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise GmtsError(f"--dtype: unknown dtype '{name}' (choose from {', '.join(DTYPES)})")
    return DTYPES[name]


def load_model(
    name_or_path: str,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    allow_network: bool = False,
):
    """Load ``(model, tokenizer)`` in eval mode on ``device``.

    The tokenizer is ``None`` when the checkpoint ships none (ids-only rollouts still work).
    Raises :class:`GmtsError` for a missing path or an unloadable checkpoint.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    local = Path(path).exists()
    # a hub id is "name" or "org/name"; anything else that does not exist is a missing directory
    looks_like_path = path.startswith((".", "/", "~")) or path.strip("/").count("/") > 1
    if not local and not allow_network and looks_like_path:
        raise GmtsError(f"--model {name_or_path}: no such directory")
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    kw = {} if allow_network else {"local_files_only": True}
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dt, **kw)
    except OSError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GmtsError(f"--model {name_or_path}: cannot load ({first})") from None
    model.to(dev)
    model.eval()
    tokenizer = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    return model, tokenizer


@contextlib.contextmanager
def attention_implementation(model: torch.nn.Module, impl: str = "eager") -> Iterator[torch.nn.Module]:
    """Temporarily switch the model's attention implementation (restored on every path).

    Function transforms (``torch.func.vmap`` over VJPs, forward-mode ``jvp``) have no
    batching rule for SDPA's fused backward; ``eager`` attention always works.
    """
    config = getattr(model, "config", None)
    old = getattr(config, "_attn_implementation", None)
    if config is None or old is None or old == impl:
        yield model
        return
    model.set_attn_implementation(impl)
    try:
        yield model
    finally:
        model.set_attn_implementation(old)


def trainable_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """Named trainable parameters, each shared (tied) tensor once (first name wins)."""
    seen: set[int] = set()
    out = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        out.append((name, p))
    return out


def context_length(model: torch.nn.Module) -> int | None:
    """The model's maximum sequence length, when its config says."""
    cfg = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
