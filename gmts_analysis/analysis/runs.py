"""A run's tables in memory, and the contract files of a run directory (docs/definitions.md section 8).

:class:`RunTables` holds what a probe produces: ``tokens`` (one row per response token),
``answers`` (one row per answer), ``stats`` (the stats.json dict; ``statistics`` the same typed,
:class:`gmts_analysis.analysis.stats_types.Statistics`), ``manifest`` and, with
``--grad-groups``, ``grad_groups``. :func:`read_run` reads it back from a directory and
:func:`write_tables` writes its contract files. Figures and the report are drawn from it
by :mod:`gmts_analysis.views.plots` and :mod:`gmts_analysis.views.report`; the public
:class:`gmts_analysis.api.Run` adds ``save``, ``figures`` and ``report`` on top.

Values are kept exactly as a directory gives them back: ``stats`` and ``manifest`` are
JSON-normalised (NaN -> ``None``), list cells (``prompt_ids``, ``response_ids``) are
Python lists of ints, so that ``read_run(d)`` equals the run that wrote ``d``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.settings import RunSettings
from gmts_analysis.probing.validate import validate_answers_file, validate_tokens_file
from gmts_analysis.util import io
from gmts_analysis.util.io import read_json_object, read_parquet, to_json
from gmts_analysis.util.resources import example_run_dir

if TYPE_CHECKING:
    import pandas as pd

CONTRACT_FILES = ("tokens.parquet", "answers.parquet", "stats.json", "manifest.json")
LIST_COLUMNS = ("prompt_ids", "response_ids")


def json_normalise(obj: Any) -> Any:
    """``obj`` as stats.json / manifest.json give it back (NaN and inf -> None, numpy -> Python)."""
    return json.loads(to_json(obj))


def _lists(df: "pd.DataFrame | None") -> "pd.DataFrame | None":
    """List cells as Python lists of ints (parquet gives numpy arrays back)."""
    if df is None:
        return None
    for c in LIST_COLUMNS:
        if c in df.columns:
            df[c] = [None if v is None else [int(x) for x in v] for v in df[c]]
    return df


@dataclass(eq=False)
class RunTables:
    """The tables and dicts of one run (docs/definitions.md sections 2, 6 and 8).

    tokens: one row per response token; answers: one row per answer; stats: the stats.json
    dict; manifest: the run's metadata; grad_groups: per-layer/module norms or ``None``;
    path: the directory it was read from or saved to (``None`` for a run only in memory).
    """

    tokens: "pd.DataFrame"
    answers: "pd.DataFrame | None" = None
    stats: dict = field(default_factory=dict)
    manifest: dict = field(default_factory=dict)
    grad_groups: "pd.DataFrame | None" = None
    path: Path | None = None

    @property
    def statistics(self) -> "Statistics":
        """``stats`` as typed :class:`gmts_analysis.analysis.stats_types.Statistics` (attributes in place of
        string paths). Built once per ``stats`` dict and kept: assigning ``run.stats`` a new dict builds it
        again; after editing the dict in place, assign a copy (``run.stats = dict(run.stats)``) for the
        edit to show."""
        built = self.__dict__.get("_statistics")  # (the dict it was built from, the Statistics); not a field
        if built is None or built[0] is not self.stats:
            built = self.__dict__["_statistics"] = (self.stats, Statistics.coerce(self.stats))
        return built[1]

    def equals(self, other: "RunTables") -> bool:
        """Same tables (values and dtypes), same stats and manifest; ``path`` is ignored."""
        def same(a: Any, b: Any) -> bool:
            if a is None or b is None:
                return a is None and b is None
            return a.shape == b.shape and list(a.columns) == list(b.columns) and a.equals(b)

        return (same(self.tokens, other.tokens) and same(self.answers, other.answers)
                and same(self.grad_groups, other.grad_groups)
                and self.stats == other.stats and self.manifest == other.manifest)

    def __eq__(self, other: object) -> bool:
        """``run == other``: :meth:`equals` (so ``gmts.load_run(run.save(d)) == run``)."""
        if not isinstance(other, RunTables):
            return NotImplemented
        return self.equals(other)

    __hash__ = None  # mutable tables: not hashable

    def __repr__(self) -> str:
        n_ans = 0 if self.answers is None else len(self.answers)
        where = f", path={str(self.path)!r}" if self.path is not None else ""
        return f"{type(self).__name__}({len(self.tokens)} tokens, {n_ans} answers{where})"


def read_run(run_dir: str | os.PathLike, compute_missing_stats: bool = True) -> RunTables:
    """Read tokens/answers parquet, stats.json, manifest.json (and grad_groups.parquet) of a run directory.

    stats.json is computed (and not written) when absent or of an older version, and
    ``compute_missing_stats`` (its update_fidelity blocks kept). Raises :class:`GmtsError` when the directory or its
    tokens.parquet is missing, or a column the statistics and figures read is of the wrong type, null or not
    finite (:func:`gmts_analysis.probing.validate.validate_tokens_file`, ``validate_answers_file``).
    """
    from gmts_analysis.analysis.stats import (  # deferred: pandas
        compute_stats,
        is_current,
        kept_fidelity,
        prepare_tokens,
    )

    path = Path(run_dir)
    if not path.is_dir():
        raise GmtsError(f"{path}: no such run directory")
    if not (path / "tokens.parquet").exists():
        raise GmtsError(f"{path}: not a run directory (no tokens.parquet)")
    validate_tokens_file(path / "tokens.parquet", required=("answer_id", "position"))  # each column it has: its type
    if (path / "answers.parquet").exists():
        validate_answers_file(path / "answers.parquet")
    answers = _lists(read_parquet(path / "answers.parquet")) if (path / "answers.parquet").exists() else None
    tokens = prepare_tokens(read_parquet(path / "tokens.parquet"), answers)
    groups = read_parquet(path / "grad_groups.parquet") if (path / "grad_groups.parquet").exists() else None
    stats = read_json_object(path / "stats.json") if (path / "stats.json").exists() else {}
    manifest = read_json_object(path / "manifest.json") if (path / "manifest.json").exists() else {}
    if compute_missing_stats and not is_current(stats):  # absent, or an older version: `gmts stats` rewrites it
        stats = json_normalise(compute_stats(tokens, answers, rho=manifest_rho(manifest),
                                                  uncertain_below=manifest_uncertain_below(manifest),
                                                  **kept_fidelity(stats)))
    return RunTables(tokens=tokens, answers=answers, stats=stats, manifest=manifest, grad_groups=groups, path=path)


def default_run_dir() -> Path:
    """``$GMTS_RUN_DIR``, else the shipped example run (:func:`gmts_analysis.util.resources.example_run_dir`)."""
    env = os.environ.get("GMTS_RUN_DIR")
    return Path(env) if env else example_run_dir()


def load_run(run_dir: str | os.PathLike | None = None, compute_missing_stats: bool = True) -> RunTables:
    """Read a run directory (default: :func:`default_run_dir`) with :func:`read_run`.

    stats.json is computed (and not written) when absent and ``compute_missing_stats``.
    """
    path = Path(run_dir) if run_dir is not None else default_run_dir()
    if not path.is_dir():
        raise GmtsError(f"{path}: no such run directory (set GMTS_RUN_DIR or pass a path)")
    return read_run(path, compute_missing_stats)


def manifest_uncertain_below(manifest: Any) -> float:
    """The uncertain-token threshold a run was made with (manifest ``config.uncertain_below``; old runs'
    default applied by :class:`~gmts_analysis.options.settings.RunSettings`)."""
    return float(RunSettings.from_manifest(manifest).uncertain_below)


def manifest_rho(manifest: Any) -> float:
    """The keep fraction a run was made with (manifest ``config.rho``; old runs' default applied by
    :class:`~gmts_analysis.options.settings.RunSettings`)."""
    return float(RunSettings.from_manifest(manifest).rho)


def write_tables(run_dir: str | os.PathLike, run: RunTables) -> list[Path]:
    """Write the contract files (and grad_groups.parquet) of ``run`` into ``run_dir``, each atomically."""
    d = Path(run_dir)
    out = [io.atomic_write_parquet(d / "tokens.parquet", run.tokens)]
    if run.answers is not None:
        out.append(io.atomic_write_parquet(d / "answers.parquet", run.answers))
    if run.grad_groups is not None:
        out.append(io.atomic_write_parquet(d / "grad_groups.parquet", run.grad_groups))
    from gmts_analysis.analysis.stats import write_stats  # deferred: pandas

    out += write_stats(d, run.stats)  # stats.json and the estimator ranking estimators.csv
    out.append(io.atomic_write_json(d / "manifest.json", run.manifest))
    return out
