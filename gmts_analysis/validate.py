"""Checks that run before any work: option domains, answers a model can probe, finite results,
and the tables ``gmts stats`` / ``gmts figures`` read.

Every check raises :class:`~gmts_analysis.errors.GmtsError` with one line naming the flag,
file, line or column at fault, so a bad job costs seconds, not the whole probe.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from gmts_analysis.errors import GmtsError

SEED_MAX = 2**63 - 1


#: the most sketch directions --probes takes (K forward-mode passes per answer)
MAX_PROBES = 4096


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _number(cfg: Any, name: str) -> float | None:
    v = getattr(cfg, name, None)
    if v is None:
        return None
    if isinstance(v, bool):
        raise GmtsError(f"{_flag(name)}: expected a number, got {v!r}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise GmtsError(f"{_flag(name)}: expected a number, got {v!r}") from None


def _integer(cfg: Any, name: str) -> int | None:
    v = getattr(cfg, name, None)
    if v is None:
        return None
    if isinstance(v, bool):
        raise GmtsError(f"{_flag(name)}: expected an integer, got {v!r}")
    if isinstance(v, float):
        if not v.is_integer():
            raise GmtsError(f"{_flag(name)}: expected an integer, got {v!r}")
        return int(v)
    try:
        return int(str(v).strip())
    except (TypeError, ValueError):
        raise GmtsError(f"{_flag(name)}: expected an integer, got {v!r}") from None


def _check(ok: bool, name: str, domain: str, v: Any) -> None:
    if not ok:
        raise GmtsError(f"{_flag(name)}: must be {domain}, got {v}")


def validate_options(cfg: Any) -> None:
    """Every numeric option of a probe in its domain; the device exists; the verifier is known.

    Domains: temperature finite and > 0; clip_low and clip_high in [0, 1); clip_ratio_c > 1;
    kl_beta finite and >= 0; vllm_is_min >= 0 and < vllm_is_max; 2 <= probes <= MAX_PROBES; max_len,
    chunk_size (unless ``auto``), max_memory, answers_per_chunk >= 1; seed in [0, 2**63).
    Fields absent from ``cfg`` are skipped (it may be a :class:`~gmts_analysis.config.ProbeOptions`
    or a full :class:`~gmts_analysis.config.ProbeConfig`).
    """
    t = _number(cfg, "temperature")
    if t is not None:
        _check(math.isfinite(t) and t > 0, "temperature", "a finite number > 0", t)
    for name in ("clip_low", "clip_high"):
        v = _number(cfg, name)
        if v is not None:
            _check(math.isfinite(v) and 0 <= v < 1, name, "in [0, 1)", v)
    c = _number(cfg, "clip_ratio_c")
    if c is not None:
        _check(math.isfinite(c) and c > 1, "clip_ratio_c", "a finite number > 1", c)
    b = _number(cfg, "kl_beta")
    if b is not None:
        _check(math.isfinite(b) and b >= 0, "kl_beta", "a finite number >= 0", b)
    lo, hi = _number(cfg, "vllm_is_min"), _number(cfg, "vllm_is_max")
    if lo is not None:
        _check(math.isfinite(lo) and lo >= 0, "vllm_is_min", "a finite number >= 0", lo)
    if hi is not None:
        _check(math.isfinite(hi) and hi > 0, "vllm_is_max", "a finite number > 0", hi)
        if lo is not None and not lo < hi:
            raise GmtsError(f"--vllm-is-min {lo} must be below --vllm-is-max {hi}")
    p = _integer(cfg, "probes")
    if p is not None:
        _check(2 <= p <= MAX_PROBES, "probes", f"an integer in [2, {MAX_PROBES}] (a sketch needs two directions for "
               "its error bar; past a few thousand, --grad-norm exact costs less and is exact)", p)
    for name in ("max_len", "max_memory", "answers_per_chunk"):
        v = _integer(cfg, name)
        if v is not None:
            _check(v >= 1, name, "an integer >= 1", v)
    cs = getattr(cfg, "chunk_size", None)
    if cs is not None and str(cs).strip() != "auto":
        try:
            v = int(str(cs).strip())
        except ValueError:
            raise GmtsError(f"--chunk-size: expected an integer or 'auto', got {cs!r}") from None
        _check(v >= 1, "chunk_size", "an integer >= 1 or 'auto'", v)
    s = _integer(cfg, "seed")
    if s is not None:
        _check(0 <= s <= SEED_MAX, "seed", f"an integer in [0, {SEED_MAX}]", s)
    if getattr(cfg, "device", None) is not None:
        from gmts_analysis.models import resolve_device

        resolve_device(cfg.device)
    if getattr(cfg, "verifier", None):
        from gmts_analysis.verifiers import resolve_verifier

        resolve_verifier(cfg.verifier)


def check_answers(answers: Sequence[Any], model_name: str) -> None:
    """Refuse answers that would give an empty or meaningless run.

    A response given as non-empty text that tokenizes to no token means the tokenizer is not
    real (an empty vocabulary); answers with no response token at all leave nothing to probe.
    """
    for a in answers:
        text = getattr(a, "response", None)
        if isinstance(text, str) and text and not a.response_ids:
            raise GmtsError(f"{a.where}: response text of {len(text)} characters became 0 tokens: the tokenizer "
                            f"of --model {model_name} has no usable vocabulary (give response_ids, or a "
                            "checkpoint with its tokenizer files)")
        text = getattr(a, "prompt", None)
        if isinstance(text, str) and text and not a.prompt_ids:
            raise GmtsError(f"{a.where}: prompt text of {len(text)} characters became 0 tokens: the tokenizer "
                            f"of --model {model_name} has no usable vocabulary")
    if answers and not any(a.response_ids for a in answers):
        raise GmtsError(f"{answers[0].where.rsplit(':', 1)[0]}: every response is empty (0 tokens): nothing to probe")


def check_finite(cols: Mapping[str, Any], where: str, allow_nan: Sequence[str] = ()) -> None:
    """Raise naming the first float column of one answer's token columns with a non-finite value.

    ``allow_nan`` names columns that may be NaN (never infinite), e.g. ``grad_norm_logp``
    under ``--grad-norm none``.
    """
    for k, v in cols.items():
        if isinstance(v, (str, bytes)):
            continue
        try:
            arr = np.asarray(v)
        except Exception:  # ragged or object data: not a float column
            continue
        if arr.dtype.kind != "f" or arr.size == 0:
            continue
        bad = ~np.isfinite(arr)
        if k in allow_nan:
            bad &= ~np.isnan(arr)
        if bad.any():
            i = int(np.argmax(bad.reshape(-1)))
            raise GmtsError(f"{where}: non-finite {k} ({arr.reshape(-1)[i]}) at token {i}")


def check_finite_scalars(values: Mapping[str, float], where: str, allow_nan: Sequence[str] = ()) -> None:
    """Raise naming the first of ``values`` (an answer's advantage, weight, reward) that is not finite
    (``allow_nan``: may be NaN, never infinite)."""
    for k, v in values.items():
        x = float("nan") if v is None else float(v)
        if not math.isfinite(x) and not (k in allow_nan and math.isnan(x)):
            raise GmtsError(f"{where}: non-finite {k} ({v})")


# contract token columns that are null (NaN) when not computed (--grad-norm none)
NULLABLE_TOKEN_COLUMNS = ("grad_norm_logp", "grad_norm")


def validate_tokens_table(df: Any, path: Any, required: Sequence[str] | None = None) -> None:
    """A tokens table that ``gmts stats`` / ``gmts figures`` can use: every contract column present
    (none silently dropped), numeric columns numeric, at least one row."""
    from gmts_analysis.tables import TOKEN_COLUMNS

    required = TOKEN_COLUMNS if required is None else required
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise GmtsError(f"{path}: missing contract column(s) {', '.join(missing)} (a tokens table written by "
                        "gmts probe has them all)")
    if len(df) == 0:
        raise GmtsError(f"{path}: the tokens table has no rows")
    numeric = [c for c in required if c not in ("answer_id", "group_id", "token")]
    for c in numeric:
        kind = df[c].dtype.kind
        if kind not in "iufb":
            raise GmtsError(f"{path}: column '{c}' must be numeric, got {df[c].dtype}")


def validate_tokens_file(path: Any, required: Sequence[str] | None = None) -> None:
    """:func:`validate_tokens_table` on a parquet file: the schema, then the float contract columns'
    values (finite; the nullable ones may be NaN, never infinite)."""
    from pathlib import Path

    import pyarrow as pa
    import pyarrow.parquet as pq

    from gmts_analysis.tables import TOKEN_COLUMNS

    path = Path(path)
    if not path.is_file():
        raise GmtsError(f"{path}: no such file (a run directory holds tokens.parquet)")
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except Exception as e:  # pyarrow raises many types for files that are not parquet
        raise GmtsError(f"{path}: cannot read parquet ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    required = TOKEN_COLUMNS if required is None else required
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise GmtsError(f"{path}: missing contract column(s) {', '.join(missing)} (a tokens table written by "
                        "gmts probe has them all)")
    if meta.num_rows == 0:
        raise GmtsError(f"{path}: the tokens table has no rows")
    for c in required:
        if c in ("answer_id", "group_id", "token"):
            continue
        t = schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_null(t)):
            raise GmtsError(f"{path}: column '{c}' must be numeric, got {t}")
    # values: a probe writes every float contract column finite (grad_norm and grad_norm_logp are
    # null when not computed); NaN or inf elsewhere is a damaged or hand-edited table
    floats = [c for c in required if c not in ("answer_id", "group_id", "token", *NULLABLE_TOKEN_COLUMNS)
              and pa.types.is_floating(schema.field(c).type)]
    import numpy as np

    if floats:
        try:
            table = pq.read_table(path, columns=floats)
        except Exception as e:
            raise GmtsError(f"{path}: cannot read parquet ({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
        for c in floats:
            v = table.column(c).to_numpy(zero_copy_only=False)
            bad = ~np.isfinite(v)
            if bad.any():
                i = int(np.argmax(bad))
                raise GmtsError(f"{path}: column '{c}' has {int(bad.sum())} non-finite value(s) (first {v[i]} at row "
                                f"{i + 1}); a tokens table written by gmts probe has none")
    for c in NULLABLE_TOKEN_COLUMNS:
        if c in required and pa.types.is_floating(schema.field(c).type):
            v = pq.read_table(path, columns=[c]).column(c).to_numpy(zero_copy_only=False)
            if np.isinf(v).any():
                raise GmtsError(f"{path}: column '{c}' has infinite values; a tokens table written by gmts probe "
                                "has none")
