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
from gmts_analysis.util.io import require_regular, special_kind

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
    chunk_size (unless ``auto``), max_memory, answers_per_chunk, num_generations,
    max_completion_length >= 1; seed in [0, 2**63); rho in (0, 1]; steps parse; reward_weights one
    finite number per --reward-columns name.
    Fields absent from ``cfg`` are skipped (it may be a :class:`~gmts_analysis.options.config.ProbeOptions`
    or a full :class:`~gmts_analysis.options.config.ProbeConfig`).
    """
    _check_objective_numbers(cfg)
    _check_engine_numbers(cfg)
    _check_selection_numbers(cfg)
    _check_reader_options(cfg)
    _check_resolvable(cfg)


def _check_objective_numbers(cfg: Any) -> None:
    """The RL objective's numbers: temperature, the clip range, the dual clip, the KL weight and
    the vLLM importance-sampling bounds."""
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


def _check_engine_numbers(cfg: Any) -> None:
    """Sizes and seed: sketch directions, L_max, memory, answers per chunk, chunk size, seed."""
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


def _check_selection_numbers(cfg: Any) -> None:
    """The analysis fractions: the keep fraction rho and the uncertain-token threshold."""
    r = _number(cfg, "rho")
    if r is not None:
        _check(math.isfinite(r) and 0 < r <= 1, "rho", "a keep fraction in (0, 1]", r)
    u = _number(cfg, "uncertain_below")
    if u is not None:
        _check(math.isfinite(u) and 0 < u <= 1, "uncertain_below", "a probability in (0, 1]", u)


def _check_reader_options(cfg: Any) -> None:
    """How rollouts are read: group size, completion length limit, --steps, reward columns and
    their weights."""
    for name in ("num_generations", "max_completion_length"):
        v = _integer(cfg, name)
        if v is not None:
            _check(v >= 1, name, "an integer >= 1", v)
    if getattr(cfg, "steps", None) is not None:
        from gmts_analysis.readers.sources import parse_steps

        parse_steps(cfg.steps)
    if getattr(cfg, "reward_columns", None) is not None or getattr(cfg, "reward_weights", None) is not None:
        from gmts_analysis.readers.formats import _names, _weights

        cols = _names(getattr(cfg, "reward_columns", None), "--reward-columns")
        _weights(getattr(cfg, "reward_weights", None), None if cols is None else len(cols))


def _check_resolvable(cfg: Any) -> None:
    """The loss options together (--loss-type against --loss-agg, dr_grpo's L_max), the device
    and the verifier name resolve."""
    if hasattr(cfg, "loss_agg"):  # the loss options together (--loss-type against --loss-agg, dr_grpo's L_max)
        from gmts_analysis.core.objective import settings_of

        settings_of(cfg)
    if getattr(cfg, "device", None) is not None:
        from gmts_analysis.readers.models import resolve_device

        resolve_device(cfg.device)
    if getattr(cfg, "verifier", None):
        from gmts_analysis.readers.verifiers import resolve_verifier

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
    coerce_ids(answers)
    check_extra_columns(answers)


def coerce_ids(answers: Sequence[Any]) -> None:
    """Integer ``answer_id`` / ``group_id`` values outside int64 cannot be a parquet integer: when
    any answer has one, that field becomes a string in every answer (``2**64`` -> ``"18446744073709551616"``),
    decided once for the whole input so every chunk writes the same type (docs/definitions.md section 7)."""
    for name in ("answer_id", "group_id"):
        vals = [getattr(a, name, None) for a in answers]
        if any(isinstance(v, int) and not isinstance(v, bool) and not -2**63 <= v < 2**63 for v in vals):
            for a in answers:
                v = getattr(a, name, None)
                if v is not None and not isinstance(v, str):
                    setattr(a, name, str(v))


def _kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    return type(v).__name__


def check_extra_columns(answers: Sequence[Any]) -> None:
    """The rollouts' own extra columns, kept in answers.parquet as given, must each be one parquet
    type: refused at read time (before any answer is probed) when a column mixes types between
    rows (an int here, a string there) or holds an integer outside int64, naming the file, the
    column and the two rows. Ints mixed with floats are fine (stored as float); nulls are fine."""
    import pyarrow as pa

    keys: list[str] = []
    for a in answers:
        keys.extend(k for k in getattr(a, "extra", {}) if k not in keys)
    for k in keys:
        vals = [(a, a.extra[k]) for a in answers if k in a.extra and a.extra[k] is not None]
        big = next(((a, v) for a, v in vals if isinstance(v, int) and not isinstance(v, bool)
                    and not -2**63 <= v < 2**63), None)
        if big is not None:
            raise GmtsError(f"{big[0].where}: column '{k}' holds the integer {big[1]}, outside int64; write it "
                            "as a string, or drop the column")
        try:
            pa.array([v for _, v in vals])
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
            first = vals[0]
            kinds = {"int": "number", "float": "number"}
            other = next(((a, v) for a, v in vals if kinds.get(_kind(v), _kind(v)) != kinds.get(_kind(first[1]),
                                                                                               _kind(first[1]))),
                         vals[-1])
            raise GmtsError(f"{other[0].where}: column '{k}' is {_kind(other[1])} here but {_kind(first[1])} at "
                            f"{first[0].where}; an extra column must have one type in every row (make it "
                            "one type, or drop the column)") from None


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
    from gmts_analysis.probing.tables import TOKEN_COLUMNS

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

    from gmts_analysis.probing.tables import TOKEN_COLUMNS

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


def validate_run_dir(run_dir: Any) -> None:
    """What ``gmts stats`` and ``gmts figures`` read from a run directory, checked before any work:
    tokens.parquet (:func:`validate_tokens_file`: contract columns, types, finite values; integer
    positions; no (answer, position) row twice), answers.parquet when present (one row per answer;
    reward, advantage and loss_weight numeric and finite), and manifest.json and stats.json when
    present (JSON objects within :data:`gmts_analysis.util.io.MAX_JSON_BYTES`; the manifest's
    ``config`` an object). Each failure: one line naming the file and the field."""
    from pathlib import Path

    import pyarrow.parquet as pq

    from gmts_analysis.util.io import read_json_object

    d = Path(run_dir)
    tok = d / "tokens.parquet"
    validate_tokens_file(tok)
    try:
        ids = pq.read_table(tok, columns=["answer_id", "position"]).to_pandas()
    except Exception as e:  # noqa: BLE001 - one line naming the file
        raise GmtsError(f"{tok}: cannot read parquet ({type(e).__name__})") from None
    if ids["position"].dtype.kind not in "iu":
        raise GmtsError(f"{tok}: column 'position' must be integer, got {ids['position'].dtype}")
    dup = ids.duplicated(["answer_id", "position"])
    if dup.any():
        r = ids[dup].iloc[0]
        raise GmtsError(f"{tok}: {int(dup.sum())} row(s) twice (first: answer_id {r['answer_id']!r}, position "
                        f"{int(r['position'])}); a tokens table written by gmts probe has each token once")
    ans = d / "answers.parquet"
    if ans.exists():
        _validate_answers_file(ans)
    for name in ("manifest.json", "stats.json"):
        if (d / name).exists():
            obj = read_json_object(d / name)
            if name == "manifest.json" and "config" in obj and not isinstance(obj["config"], dict):
                raise GmtsError(f"{d / name}: field 'config' must be an object, got {type(obj['config']).__name__}")


def _validate_answers_file(path: Any) -> None:
    from gmts_analysis.util.io import read_parquet

    a = read_parquet(path)
    if "answer_id" in a.columns and a["answer_id"].duplicated().any():
        raise GmtsError(f"{path}: answer_id {a['answer_id'][a['answer_id'].duplicated()].iloc[0]!r} appears twice "
                        "(one row per answer)")
    for c in ("reward", "advantage", "loss_weight"):
        if c not in a.columns:
            continue
        if a[c].dtype.kind not in "iufb":
            raise GmtsError(f"{path}: column '{c}' must be numeric, got {a[c].dtype}")
        v = a[c].to_numpy(dtype=float)
        bad = ~np.isfinite(v)
        if bad.any():
            i = int(np.argmax(bad))
            raise GmtsError(f"{path}: column '{c}' has {int(bad.sum())} non-finite value(s) (first {v[i]} at row "
                            f"{i + 1}); an answers table written by gmts probe has none")


# ---------------------------------------------------------------- one pass over every option of every subcommand

def _int_value(flag: str, v: Any) -> int:
    if isinstance(v, bool) or isinstance(v, float) and not v.is_integer():
        raise GmtsError(f"{flag}: expected an integer, got {v!r}")
    try:
        return int(str(v).strip()) if not isinstance(v, (int, float)) else int(v)
    except (TypeError, ValueError):
        raise GmtsError(f"{flag}: expected an integer, got {v!r}") from None


def _float_value(flag: str, v: Any) -> float:
    if isinstance(v, bool):
        raise GmtsError(f"{flag}: expected a number, got {v!r}")
    try:
        return float(v)
    except (TypeError, ValueError):
        raise GmtsError(f"{flag}: expected a number, got {v!r}") from None


def _int_at_least(k: int, why: str = "") -> Any:
    def check(flag: str, v: Any) -> None:
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            n = _int_value(flag, x)
            if n < k:
                raise GmtsError(f"{flag}: must be an integer >= {k}{f' ({why})' if why else ''}, got {x}")
    return check


def _seed(flag: str, v: Any) -> None:
    for x in (v if isinstance(v, (list, tuple)) else [v]):
        n = _int_value(flag, x)
        if not 0 <= n <= SEED_MAX:
            raise GmtsError(f"{flag}: must be an integer in [0, {SEED_MAX}], got {x}")


def _positive_finite(flag: str, v: Any) -> None:
    x = _float_value(flag, v)
    if not (math.isfinite(x) and x > 0):
        raise GmtsError(f"{flag}: must be a finite number > 0, got {v}")


def _nonneg_finite(flag: str, v: Any) -> None:
    x = _float_value(flag, v)
    if not (math.isfinite(x) and x >= 0):
        raise GmtsError(f"{flag}: must be a finite number >= 0, got {v}")


def _difficulty(flag: str, v: Any) -> None:
    n = _int_value(flag, v)
    if not 1 <= n <= 3:
        raise GmtsError(f"{flag}: must be a difficulty level 1, 2 or 3, got {v}")


def _rho(flag: str, v: Any) -> None:
    x = _float_value(flag, v)
    if not (math.isfinite(x) and 0 < x <= 1):
        raise GmtsError(f"{flag}: must be a keep fraction in (0, 1], got {v}")


def _probability(flag: str, v: Any) -> None:
    x = _float_value(flag, v)
    if not (math.isfinite(x) and 0 < x <= 1):
        raise GmtsError(f"{flag}: must be a probability in (0, 1], got {v}")


def _device(flag: str, v: Any) -> None:
    from gmts_analysis.readers.models import resolve_device

    try:
        resolve_device(str(v))
    except GmtsError as e:
        msg = str(e)
        raise GmtsError(msg if msg.startswith(flag) else f"{flag}: {msg.split(': ', 1)[-1]}") from None


def _dtype(flag: str, v: Any) -> None:
    from gmts_analysis.readers.models import DTYPES

    if v not in DTYPES:
        raise GmtsError(f"{flag}: unknown dtype '{v}' (choose from {', '.join(DTYPES)})")


def _domains(flag: str, v: Any) -> None:
    """Sampling domains: the toy domains and the word problems (gmts run, gmts sample)."""
    from gmts_analysis.sampling.domains import domain_list

    domain_list(v, flag=flag)


def _toy_domains(flag: str, v: Any) -> None:
    """Training domains: the toy domains only (gmts rl)."""
    from gmts_analysis.sampling.domains import domain_list
    from gmts_analysis.toy.domains import DOMAINS

    domain_list(v, tuple(DOMAINS), flag)


def _verifier(flag: str, v: Any) -> None:
    from gmts_analysis.readers.verifiers import resolve_verifier

    resolve_verifier(v)


def _int_list(flag: str, v: Any) -> None:
    items = [x.strip() for x in str(v).split(",")]
    try:
        vals = [int(x) for x in items]
    except ValueError:
        raise GmtsError(f"{flag}: expected integers separated by commas, got '{v}'") from None
    if not vals or min(vals) < 1:
        raise GmtsError(f"{flag}: every value must be an integer >= 1, got '{v}'")


def _output_path(flag: str, v: Any) -> None:
    """Something can be created at ``v``: no existing ancestor is a file, no part is a dangling link."""
    from pathlib import Path

    p = Path(str(v)).expanduser()
    for q in (p, *p.parents):
        if q.is_symlink() and not q.exists():
            raise GmtsError(f"{flag} {v}: {q} is a symbolic link to {q.readlink()}, which does not exist")
        if q != p and q.exists() and not q.is_dir():
            raise GmtsError(f"{flag} {v}: {q} is a file, so nothing can be created under it")
    if ".." in p.parts:  # `nope/../run` would create nope/ first: resolved lexically, refused if nope/ is absent
        anc = Path(*p.parts[:p.parts.index("..")])
        if not anc.is_dir():
            raise GmtsError(f"{flag} {v}: {anc} does not exist (write the path without '..')")


def _input_file(flag: str, v: Any) -> None:
    from pathlib import Path

    for x in (v if isinstance(v, (list, tuple)) else [v]):
        p = Path(str(x))
        if not p.exists():
            raise GmtsError(f"{flag} {x}: no such file")
        if p.is_dir():
            raise GmtsError(f"{flag} {x}: is a directory, not a file")
        require_regular(p, f"{flag} {x}")


def _input_path(flag: str, v: Any) -> None:
    from pathlib import Path

    for x in (v if isinstance(v, (list, tuple)) else [v]):
        if not Path(str(x)).exists():
            raise GmtsError(f"{flag} {x}: no such file or directory")
        require_regular(str(x), f"{flag} {x}")


def _model(flag: str, v: Any) -> None:
    """A shipped policy name, a hub id, a model directory or a checkpoint list; an existing path
    that is a file (not a directory) is refused."""
    from pathlib import Path

    from gmts_analysis.readers.gguf import check_gguf_file, find_gguf

    p = Path(str(v))
    if (p.suffix.lower() == ".gguf" and (p.is_file() or p.is_symlink() or special_kind(p))) or \
            (p.is_dir() and find_gguf(p) is not None):  # a GGUF file, or the one in a folder: checked whole
        check_gguf_file(find_gguf(p) or p, flag)
        return
    if p.exists() and not p.is_dir():
        raise GmtsError(f"{flag} {v}: is a file; give a model directory, a .gguf file, a hub id, or "
                        "tiny | small | smollm2")
    from gmts_analysis.readers.models import ALIASES, REAL_MODELS, hub_cached, resolve_model_path

    s = str(v)
    if not p.exists() and "/" not in s and "," not in s and s not in ALIASES + REAL_MODELS:
        import difflib

        close = difflib.get_close_matches(s.lower(), ALIASES + REAL_MODELS, n=2, cutoff=0.6)
        close += [n for n in ALIASES + REAL_MODELS if s and n.startswith(s.lower()) and n not in close]
        if close and not hub_cached(s):  # a typo of a shipped name, not a hub id to download
            raise GmtsError(f"{flag} {v}: not a shipped model, a local directory or a cached hub id; did you "
                            f"mean {' or '.join(close[:2])}? (a hub id is written org/name)")
    resolve_model_path(s)


#: ``{dest: check}`` for every option taking a value, in every subcommand (``{command: {dest: check}}``
#: overrides where one name means something else there). ``check(flag, value)`` raises a
#: :class:`GmtsError` naming the flag. Options with ``choices`` are checked by argparse (and by
#: :func:`gmts_analysis.options.config.check_options` in the API); switches have no value to check.
OPTION_DOMAINS: dict[str, Any] = {
    "seed": _seed, "eval_seed": _seed, "temperature": _positive_finite, "rho": _rho, "device": _device, "dtype": _dtype,
    "num_prompts": _int_at_least(1), "group_size": _int_at_least(2), "max_new_tokens": _int_at_least(1),
    "answers_per_chunk": _int_at_least(1), "domains": _domains, "verifier": _verifier, "model": _model,
    "out": _output_path, "to": _output_path, "prompts": _input_file, "plan": _input_file, "update": _input_file,
    "rewards": _input_file,
    "rollouts": _input_path, "difficulty": _difficulty,
    "batch_size": _int_at_least(1), "n_boot": _int_at_least(1), "max_answers": _int_at_least(1),
    "max_steps": _int_at_least(1), "lr": _positive_finite, "prompts_per_domain": _int_at_least(1),
    "eval_every": _int_at_least(1), "eval_prompts": _int_at_least(1),
    "final_eval_prompts": _int_at_least(0),  # 0: --eval-prompts
    "diag_every": _int_at_least(0),  # 0: never
    "diag_answers": _int_at_least(1), "threads": _int_at_least(1), "layers": _int_at_least(1),
    "prompt_len": _int_at_least(1), "naive_tokens": _int_at_least(2),
    "naive_full_max": _int_at_least(0),  # 0: no full naive reference
    "max_memory": _int_at_least(1), "lengths": _int_list, "probes": _int_list, "models": _input_path,
    "num_generations": _int_at_least(2, "a group needs a baseline"), "max_completion_length": _int_at_least(1),  # TRL's names (sample, run, rl)
    "uncertain_below": _probability,
}
COMMAND_DOMAINS: dict[str, dict[str, Any]] = {
    "probe": {"probes": None, "max_memory": None, "seed": None, "temperature": None, "device": None,  # validate_options
              "num_generations": None, "max_completion_length": None, "uncertain_below": None},
    "bench": {"models": None},  # names or paths: checked when each loads
    "rl": {"figures": _output_path, "max_steps": _int_at_least(0), "domains": _toy_domains},  # 0: evaluate the start only (RLConfig)
    "sample": {"temperature": _nonneg_finite},  # 0: greedy
    "stats": {"n_boot": _int_at_least(0)},  # 0: no confidence intervals
}


def validate_namespace(command: str, args: Any) -> None:
    """One pass over the parsed options of ``gmts <command>``, before any model, file or directory
    work: every option with a domain in :data:`OPTION_DOMAINS`, then the probe options' domains and
    cross-option constraints (:func:`validate_options`) where the command takes them."""
    table = {**OPTION_DOMAINS, **COMMAND_DOMAINS.get(command, {})}
    for dest, value in vars(args).items():
        check = table.get(dest)
        if check is None or value is None:
            continue
        check(_flag(dest), value)
    if command == "probe":
        validate_options(args)
