"""Checks that run before any work: option domains, answers a model can probe, finite results,
and the tables ``gmts stats`` / ``gmts figures`` read.

Every check raises :class:`~gmts_analysis.errors.GmtsError` with one line naming the flag,
file, line or column at fault, so a bad job costs seconds, not the whole probe.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Mapping, Sequence

from gmts_analysis.core.estimators import ESTIMATORS
from gmts_analysis.core.vocabulary import TOKEN_COLUMNS
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.checks import check_fields
from gmts_analysis.options.config import ProbeOptions
from gmts_analysis.options.fields import fields_of, flag
from gmts_analysis.readers.formats import _names, _weights
from gmts_analysis.readers.sources import parse_steps
from gmts_analysis.util.io import read_json_object, read_parquet


def validate_options(cfg: ProbeOptions) -> None:
    """Every probe option in its domain (the ``check`` of its declaration in
    :class:`~gmts_analysis.options.config.ProbeOptions`), then what holds between options: the vLLM
    bounds in order, --steps and the reward weights parse, the device and the verifier resolve. The
    loss options together are checked where they are resolved, right after this
    (:meth:`gmts_analysis.probing.settings.ProbeSettings.of`, the one place that calls this: a probe's
    options are checked once, where they are split into the parts each layer reads). ``cfg``: the options
    alone, or a whole :class:`~gmts_analysis.options.config.ProbeConfig`.
    """
    fields = fields_of(ProbeOptions)
    check_fields(fields, {k: getattr(cfg, k) for k in fields})
    lo, hi = cfg.vllm_is_min, cfg.vllm_is_max
    if lo is not None and hi is not None and not float(lo) < float(hi):
        raise GmtsError(f"--vllm-is-min {float(lo)} must be below --vllm-is-max {float(hi)}")
    _check_reader_options(cfg)


def _check_reader_options(cfg: ProbeOptions) -> None:
    """How rollouts are read: group size, completion length limit, --steps, reward columns and
    their weights."""
    if cfg.steps is not None:
        parse_steps(cfg.steps)
    if cfg.reward_columns is not None or cfg.reward_weights is not None:
        cols = _names(cfg.reward_columns, "--reward-columns")
        _weights(cfg.reward_weights, None if cols is None else len(cols))


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
    import numpy as np

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


#: id columns of the tables: strings or whole numbers
ID_COLUMNS = ("answer_id", "group_id")
#: contract token columns of whole numbers
INTEGER_TOKEN_COLUMNS = ("position", "token_id")


def _arrow_kind(t: Any) -> str:
    """``"null"`` (a column of nothing but nulls), ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"int_list"``
    or ``"other"``: what a parquet column's arrow type ``t`` holds, as the checks below name it."""
    import pyarrow as pa

    for test, kind in ((pa.types.is_null, "null"), (pa.types.is_integer, "int"), (pa.types.is_floating, "float"),
                       (pa.types.is_boolean, "bool"), (pa.types.is_string, "str"), (pa.types.is_large_string, "str")):
        if test(t):
            return kind
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and (pa.types.is_integer(t.value_type)
                                                                 or pa.types.is_null(t.value_type)):
        return "int_list"
    return "other"


def _check_kind(path: Any, c: str, t: Any, allowed: Sequence[str], what: str, null_ok: bool = False) -> str:
    """The kind of column ``c`` (arrow type ``t``) when it is one of ``allowed``; else one line naming the file and
    the column. A column of nothing but nulls (arrow's null type) is refused unless ``null_ok``: gmts writes
    numbers there (NaN, not null, where a quantity was not computed)."""
    kind = _arrow_kind(t)
    if kind == "null" and not null_ok:
        raise GmtsError(f"{path}: column '{c}' holds no values (every row null, type null); expected {what}")
    if kind != "null" and kind not in allowed:
        raise GmtsError(f"{path}: column '{c}' must be {what}, got {t}")
    return kind


def _first_row(mask: Any) -> int:
    import numpy as np

    return int(np.argmax(np.asarray(mask))) + 1


def validate_tokens_file(path: Any, required: Sequence[str] | None = None) -> None:
    """A tokens.parquet that ``gmts stats`` and ``gmts figures`` can read, every column they read checked
    (one line naming the file and the column): the contract columns present (``required``, default all of
    them; every contract column the file has is checked either way); ids strings or whole numbers
    (``answer_id`` in every row); ``token`` text; ``position`` and ``token_id`` whole numbers in every row;
    the other numeric contract columns numbers (never text, booleans or a column of nothing but nulls),
    finite in every row (``grad_norm`` and ``grad_norm_logp`` may be NaN, or all null: not computed, never
    infinite); and every estimator column of the registry the file carries besides (``surprisal``,
    ``gmts_head`` ...: it is read as it is, not recomputed) numbers, never infinite. An estimator column with
    no value in any row is left out of the statistics with a warning naming it, never silently."""
    from pathlib import Path

    import pyarrow.parquet as pq

    path = Path(path)
    schema = _tokens_schema(path, required)
    read, scores = _check_token_column_types(path, schema)
    try:
        table = pq.read_table(path, columns=read)
    except Exception as e:
        raise _cannot_read_parquet(path, e) from None
    for c in read:
        _check_token_column_values(path, c, table.column(c), c in scores)


def _cannot_read_parquet(path: Any, e: Exception) -> GmtsError:
    """The one-line error for a file that pyarrow cannot read as parquet (``e``: what pyarrow raised)."""
    return GmtsError(f"{path}: cannot read parquet ({type(e).__name__}: {str(e).splitlines()[0][:200]})")


def _tokens_schema(path: Any, required: Sequence[str] | None) -> Any:
    """The arrow schema of the tokens file ``path``, once it is a readable parquet file with rows and the
    ``required`` contract columns (default all of them)."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise GmtsError(f"{path}: no such file (a run directory holds tokens.parquet)")
    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except Exception as e:  # pyarrow raises many types for files that are not parquet
        raise _cannot_read_parquet(path, e) from None
    required = TOKEN_COLUMNS if required is None else required
    missing = [c for c in required if c not in schema.names]
    if missing:
        raise GmtsError(f"{path}: missing contract column(s) {', '.join(missing)} (a tokens table written by "
                        "gmts probe has them all)")
    if meta.num_rows == 0:
        raise GmtsError(f"{path}: the tokens table has no rows")
    return schema


def _check_token_column_types(path: Any, schema: Any) -> tuple[list[str], list[str]]:
    """The type of every contract and estimator column the tokens file has, checked; ``(read, scores)``: the
    columns whose values are checked next (``answer_id`` and every number not all null) and the estimator
    columns besides the contract ones (read as they are, not recomputed)."""
    names = set(schema.names)
    for c in ID_COLUMNS:
        if c in names:
            _check_kind(path, c, schema.field(c).type, ("str", "int"), "ids (text or whole numbers)",
                        null_ok=c == "group_id")
    if "token" in names:
        _check_kind(path, "token", schema.field("token").type, ("str",), "text (each token's string)", null_ok=True)
    if "domain" in names:
        _check_kind(path, "domain", schema.field("domain").type, ("str",), "text (domain names)", null_ok=True)
    if "step" in names:
        _check_kind(path, "step", schema.field("step").type, ("int", "float", "str"), "steps (whole numbers or text)",
                    null_ok=True)
    numeric = [c for c in TOKEN_COLUMNS if c in names and c not in (*ID_COLUMNS, "token")]  # present: checked
    scores = [c for c in ESTIMATORS if c in names and c not in numeric]  # read as they are, not recomputed
    read = ["answer_id"] if "answer_id" in names else []
    for c in numeric + scores:
        whole = c in INTEGER_TOKEN_COLUMNS
        kind = _check_kind(path, c, schema.field(c).type, ("int",) if whole else ("int", "float"),
                           "integer" if whole else "numeric", null_ok=c in NULLABLE_TOKEN_COLUMNS)
        if kind != "null":
            read.append(c)
    return read, scores


def _check_token_column_values(path: Any, c: str, col: Any, score: bool) -> None:
    """The values of the tokens file's column ``c`` (``col``, an arrow column): no null unless it may be NaN,
    never infinite, NaN only where allowed; an estimator column (``score``) with no value is warned about."""
    import numpy as np

    nan_ok = c in NULLABLE_TOKEN_COLUMNS or score
    if col.null_count and not nan_ok and _arrow_kind(col.type) != "float":  # a float's null reads as NaN: below
        nulls = col.is_null().to_numpy(zero_copy_only=False)
        raise GmtsError(f"{path}: column '{c}' has {col.null_count} null value(s) (first at row {_first_row(nulls)}); "
                        "a tokens table written by gmts probe has a value in every row")
    if _arrow_kind(col.type) != "float":
        return
    v = col.to_numpy(zero_copy_only=False)
    bad = np.isinf(v) if nan_ok else ~np.isfinite(v)
    if bad.any():
        i = _first_row(bad)
        raise GmtsError(f"{path}: column '{c}' has {int(bad.sum())} {'infinite' if nan_ok else 'non-finite'} "
                        f"value(s) (first {v[i - 1]} at row {i}); a tokens table written by gmts probe has none")
    if score and np.isnan(v).all():
        import logging

        logging.getLogger("gmts_analysis.analysis.stats").warning(
            "%s: column '%s' has no value in any row: the estimator %s is left out of the statistics and "
            "figures", path, c, c)


def validate_run_dir(run_dir: Any) -> None:
    """What ``gmts stats`` and ``gmts figures`` read from a run directory, checked before any work:
    tokens.parquet (:func:`validate_tokens_file`: contract columns, types, finite values; integer
    positions; no (answer, position) row twice), answers.parquet when present (one row per answer;
    reward, advantage and loss_weight numeric and finite), and manifest.json and stats.json when
    present (JSON objects within :data:`gmts_analysis.util.io.MAX_JSON_BYTES`; the manifest's
    ``config`` an object). Each failure: one line naming the file and the field."""
    from pathlib import Path

    import pyarrow.parquet as pq

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
        validate_answers_file(ans)
    for name in ("manifest.json", "stats.json"):
        if (d / name).exists():
            obj = read_json_object(d / name)
            if name == "manifest.json" and "config" in obj and not isinstance(obj["config"], dict):
                raise GmtsError(f"{d / name}: field 'config' must be an object, got {type(obj['config']).__name__}")


#: answers.parquet columns gmts computes: numbers, finite in every row
ANSWER_NUMBERS = ("reward", "advantage", "loss_weight")


def validate_answers_file(path: Any) -> None:
    """An answers.parquet that the statistics and figures can read, each failure one line naming the file and
    the column: one row per answer (``answer_id`` in every row, text or whole numbers); ``reward``,
    ``advantage`` and ``loss_weight`` numeric and finite; ``group_id`` ids; ``domain`` text and ``step``
    whole numbers or text (both copied onto the tokens); ``prompt_ids`` / ``response_ids`` lists of token
    ids; ``length`` a whole number. The rollouts' own extra fields (``truncated`` ...) are read leniently
    where they are read."""
    import numpy as np
    import pyarrow.parquet as pq

    a = read_parquet(path)
    schema = pq.read_schema(path)
    kinds = {
        "answer_id": (("str", "int"), "ids (text or whole numbers)", False),
        "group_id": (("str", "int"), "ids (text or whole numbers)", True),
        "domain": (("str",), "text (domain names)", True),
        "step": (("int", "float", "str"), "steps (whole numbers or text)", True),
        "length": (("int",), "integer", False),
        "prompt_ids": (("int_list",), "lists of token ids", False),
        "response_ids": (("int_list",), "lists of token ids", False),
        **{c: (("int", "float"), "numeric", False) for c in ANSWER_NUMBERS},
    }
    for c, (allowed, what, null_ok) in kinds.items():
        if c in schema.names:
            _check_kind(path, c, schema.field(c).type, allowed, what, null_ok=null_ok)
    if "answer_id" in a.columns and a["answer_id"].isna().any():
        raise GmtsError(f"{path}: column 'answer_id' has {int(a['answer_id'].isna().sum())} null value(s) (first at "
                        f"row {_first_row(a['answer_id'].isna())}); an answers table written by gmts probe has an id "
                        "in every row")
    if "answer_id" in a.columns and a["answer_id"].duplicated().any():
        raise GmtsError(f"{path}: answer_id {a['answer_id'][a['answer_id'].duplicated()].iloc[0]!r} appears twice "
                        "(one row per answer)")
    for c in ANSWER_NUMBERS:
        if c not in a.columns:
            continue
        v = a[c].to_numpy(dtype=float)
        bad = ~np.isfinite(v)
        if bad.any():
            i = int(np.argmax(bad))
            raise GmtsError(f"{path}: column '{c}' has {int(bad.sum())} non-finite value(s) (first {v[i]} at row "
                            f"{i + 1}); an answers table written by gmts probe has none")


def validate_namespace(command: str, args: argparse.Namespace, checks: Mapping[str, Any] | None = None) -> None:
    """One pass over the parsed options of ``gmts <command>``, before any model, file or directory
    work: every option's declared ``check`` (``checks``: ``{dest: check}`` of the subcommand,
    :func:`gmts_analysis.options.parser.parser_checks`). What holds between the probe options
    (:func:`validate_options`) is checked once, where the job's settings are split into parts
    (:meth:`gmts_analysis.probing.settings.ProbeSettings.of`)."""

    for dest, value in vars(args).items():
        check = (checks or {}).get(dest)
        if check is not None and value is not None:
            check(flag(dest), value)
