"""Tampered columns of a run directory (issue #38): every column ``gmts stats`` and ``gmts figures`` read is
checked when the run is read, and a column of nothing but nulls (parquet's null type), text, booleans, NaN or
infinities where gmts writes numbers is one ``gmts: error:`` line naming the file and the column, exit 2, no
traceback. Before #38 a typed-null ``entropy`` was accepted by ``gmts stats`` (the entropy estimator dropped
without a word) and ``gmts figures`` died with "unexpected TypeError: ufunc 'isfinite' not supported".

The shipped example run is the untampered input (no probe needed)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _adversarial import assert_one_line_error, run_cli

from gmts_analysis.core.estimators import ESTIMATORS
from gmts_analysis.probing.tables import TOKEN_COLUMNS
from gmts_analysis.probing.validate import NULLABLE_TOKEN_COLUMNS

EXAMPLE = Path(__file__).resolve().parent.parent / "gmts_analysis" / "data" / "example_run"
NUMERIC = [c for c in TOKEN_COLUMNS if c not in ("answer_id", "group_id", "token")]


def _run_copy(dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in EXAMPLE.iterdir():
        if f.is_file() and f.suffix in (".parquet", ".json"):
            shutil.copy(f, dst / f.name)
    return dst


def _set_column(path: Path, col: str, make) -> None:
    """Replace (or add) column ``col`` of a parquet file by ``make(n_rows)``."""
    t = pq.read_table(path)
    arr = make(t.num_rows)
    i = t.schema.get_field_index(col)
    pq.write_table(t.set_column(i, col, arr) if i >= 0 else t.append_column(col, arr), path)


def _nan(n: int) -> pa.Array:
    return pa.array(np.full(n, np.nan))


def _inf(n: int) -> pa.Array:
    return pa.array(np.r_[np.ones(n - 1), np.inf])


def _text(n: int) -> pa.Array:
    return pa.array(["0.5"] * n)


def _first_null(n: int) -> pa.Array:
    return pa.array([None] + list(range(n - 1)), pa.int64())


#: (file, column, tampered values, what the error says after the column's name)
CASES = {
    **{f"{c}_typed_null": ("tokens.parquet", c, pa.nulls, "holds no values") for c in NUMERIC
       if c not in NULLABLE_TOKEN_COLUMNS},
    **{f"{c}_text": ("tokens.parquet", c, _text, "must be") for c in NUMERIC},
    **{f"{c}_all_nan": ("tokens.parquet", c, _nan, "has") for c in NUMERIC
       if c not in NULLABLE_TOKEN_COLUMNS + ("position", "token_id")},
    **{f"{c}_infinite": ("tokens.parquet", c, _inf, "has") for c in NUMERIC if c not in ("position", "token_id")},
    **{f"estimator_{c}_{k}": ("tokens.parquet", c, f, w) for c in ESTIMATORS if c not in TOKEN_COLUMNS
       for k, f, w in (("typed_null", pa.nulls, "holds no values"), ("text", _text, "must be numeric"),
                       ("infinite", _inf, "has 1 infinite"))},
    "entropy_booleans": ("tokens.parquet", "entropy", lambda n: pa.array([True] * n), "must be numeric, got bool"),
    "token_id_one_null": ("tokens.parquet", "token_id", _first_null, "has 1 null value(s) (first at row 1)"),
    "position_floats": ("tokens.parquet", "position", lambda n: pa.array(np.arange(n) + 0.5), "must be integer"),
    "answer_id_typed_null": ("tokens.parquet", "answer_id", pa.nulls, "holds no values"),
    "answer_id_floats": ("tokens.parquet", "answer_id", lambda n: pa.array(np.arange(n) + 0.5), "must be ids"),
    "token_numbers": ("tokens.parquet", "token", lambda n: pa.array(np.arange(n)), "must be text"),
    "domain_numbers": ("tokens.parquet", "domain", lambda n: pa.array(np.arange(n)), "must be text"),
    "answers_reward_typed_null": ("answers.parquet", "reward", pa.nulls, "holds no values"),
    "answers_advantage_text": ("answers.parquet", "advantage", _text, "must be numeric"),
    "answers_loss_weight_infinite": ("answers.parquet", "loss_weight", _inf, "has"),
    "answers_answer_id_typed_null": ("answers.parquet", "answer_id", pa.nulls, "holds no values"),
    "answers_answer_id_one_null": ("answers.parquet", "answer_id",
                                   lambda n: pa.array([None] + [f"a{i}" for i in range(n - 1)]), "has 1 null value(s)"),
    "answers_response_ids_text": ("answers.parquet", "response_ids", _text, "must be lists of token ids"),
    "answers_prompt_ids_floats": ("answers.parquet", "prompt_ids", lambda n: pa.array([[0.5]] * n), "must be lists"),
    "answers_domain_numbers": ("answers.parquet", "domain", lambda n: pa.array(np.arange(n)), "must be text"),
    "answers_length_text": ("answers.parquet", "length", _text, "must be integer"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_tampered_column_is_one_line_naming_file_and_column(case, tmp_path):
    name, col, make, says = CASES[case]
    d = _run_copy(tmp_path / "run")
    _set_column(d / name, col, make)
    needle = f"{d / name}: column '{col}' {says}"
    for args in (["stats", str(d), "--n-boot", "0", "--out", str(tmp_path / "s.json"), "-q"],
                 ["figures", str(d), "--to", str(tmp_path / "figs"), "-q"]):
        line = assert_one_line_error(*run_cli(args), needle)
        assert "unexpected" not in line
    from gmts_analysis.analysis.runs import read_run
    from gmts_analysis.errors import GmtsError

    with pytest.raises(GmtsError, match=f"column '{col}'"):  # the API's reader (gmts.load_run) too
        read_run(d, compute_missing_stats=False)


def test_grad_norm_not_computed_as_a_null_column_reads_as_nan(tmp_path):
    """``grad_norm`` / ``grad_norm_logp`` may be null (not computed): read as NaN floats, which the figures
    take (before #38 a typed-null grad_norm passed the check and the figures died on isfinite)."""
    from gmts_analysis.analysis.runs import read_run

    d = _run_copy(tmp_path / "run")
    for c in NULLABLE_TOKEN_COLUMNS:
        _set_column(d / "tokens.parquet", c, pa.nulls)
    tokens = read_run(d, compute_missing_stats=False).tokens
    for c in NULLABLE_TOKEN_COLUMNS:
        assert tokens[c].dtype == np.float64 and tokens[c].isna().all()


def test_an_estimator_column_with_no_value_is_left_out_loudly(tmp_path, caplog):
    """An estimator column of NaN (rsi where every entropy is 0) is no error, but never dropped silently:
    a warning names the file, the column and the estimator, and stats.json lists the others."""
    import json

    d = _run_copy(tmp_path / "run")
    _set_column(d / "tokens.parquet", "rsi", _nan)
    with caplog.at_level(logging.WARNING):
        rc, err = run_cli(["stats", str(d), "--n-boot", "0", "--out", str(tmp_path / "s.json"), "-q"])
    assert rc == 0, err
    said = caplog.text + err
    assert f"{d / 'tokens.parquet'}: column 'rsi' has no value in any row: the estimator rsi is left out" in said
    ests = json.loads((tmp_path / "s.json").read_text())["meta"]["estimators"]
    assert "rsi" not in ests and "entropy" in ests


#: what the never-called ``validate_tokens_table`` checked (issue 46: deleted), each caught on the file by
#: ``validate_tokens_file`` through every reader of a run directory: (tamper, what the error says)
TABLE_CHECKS = {
    "missing_entropy": (lambda t: t.drop(["entropy"]), "missing contract column(s) entropy"),
    "no_rows": (lambda t: t.slice(0, 0), "the tokens table has no rows"),
    "grad_norm_text": (lambda t: t.set_column(t.schema.get_field_index("grad_norm"), "grad_norm",
                                              pa.array(["x"] * t.num_rows)), "column 'grad_norm' must be"),
}


@pytest.mark.parametrize("case", sorted(TABLE_CHECKS))
def test_what_validate_tokens_table_checked_is_caught_on_the_file(case, tmp_path):
    tamper, says = TABLE_CHECKS[case]
    d = _run_copy(tmp_path / "run")
    pq.write_table(tamper(pq.read_table(d / "tokens.parquet")), d / "tokens.parquet")
    needle = f"{d / 'tokens.parquet'}: {says}"
    for args in (["stats", str(d), "--n-boot", "0", "--out", str(tmp_path / "s.json"), "-q"],
                 ["figures", str(d), "--to", str(tmp_path / "figs"), "-q"]):
        assert "unexpected" not in assert_one_line_error(*run_cli(args), needle)
    if case != "missing_entropy":  # the API's reader needs only answer_id and position (it recomputes the rest)
        from gmts_analysis.analysis.runs import read_run
        from gmts_analysis.errors import GmtsError

        with pytest.raises(GmtsError, match=says.replace("(", r"\(").replace(")", r"\)")):
            read_run(d, compute_missing_stats=False)


def test_every_public_validator_is_called():
    """Issue 46: ``validate_tokens_table`` was defined and documented but never called (the checks ran on the
    file instead, by ``validate_tokens_file``). Each public function of probing/validate.py has a caller."""
    import ast

    pkg = Path(__file__).resolve().parent.parent / "gmts_analysis"
    source = pkg / "probing" / "validate.py"
    public = [n.name for n in ast.parse(source.read_text()).body
              if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
    called: set[str] = set()
    for f in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                fn = node.func
                called.add(fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", ""))
    assert [n for n in public if n not in called] == []
