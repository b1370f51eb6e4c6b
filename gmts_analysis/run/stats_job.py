"""The job of ``gmts stats RUN_DIR``: recompute a run's statistics from its tables, or re-score it.

:func:`run_stats` is the one function the command calls, with its typed settings, each part named for what it
sets: :class:`StatsSettings` (the statistics: bootstrap, seed, the views' thresholds), :class:`RescoreSettings`
(new rewards: a verifier, a rewards file or TRL's truncation mask; any of them turns the job into a re-scoring)
and :class:`StatsOutput` (where the result goes), declared in :mod:`gmts_analysis.run.stats_settings` (light:
``gmts --help`` reads them; this module is imported only when the command runs). The statistics read pandas, so
this module imports them at its top; a re-scoring also loads torch, imported there only.

Recomputing reads RUN_DIR/tokens.parquet (and answers.parquet when present), keeps the update_fidelity blocks
of the existing stats.json (they need the model) and writes stats.json and estimators.csv atomically.
Re-scoring (:func:`gmts_analysis.run.rescore.rescore`) writes a new run directory to ``--out``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from gmts_analysis.analysis.runs import manifest_rho, manifest_uncertain_below, read_run
from gmts_analysis.analysis.stats import compute_statistics, is_current, kept_fidelity, write_stats
from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.analysis.summary import summary_text, too_small
from gmts_analysis.core.vocabulary import MIN_GROUPS as MIN_CI_UNITS
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import RunControl
from gmts_analysis.probing.validate import validate_run_dir
from gmts_analysis.readers.verifiers import resolve_verifier
from gmts_analysis.run.stats_settings import RescoreSettings, StatsOutput, StatsSettings
from gmts_analysis.util import io
from gmts_analysis.util.io import check_output_file, check_output_location, read_json, read_json_object, read_parquet

log = logging.getLogger("gmts_analysis.analysis.stats")

def warn_few_groups(stats: Statistics | dict) -> bool:
    """Log a warning when the intervals of ``stats`` come from fewer than :data:`MIN_CI_UNITS` groups
    (a cluster bootstrap over 2 groups gives "0.95 [0.95, 0.95]"); returns whether it warned."""
    st = Statistics.coerce(stats)
    meta = st.meta
    n, n_boot = meta.n_groups, meta.n_boot or 0
    if not isinstance(n, int) or n >= MIN_CI_UNITS or n_boot <= 0 or too_small(st) is not None:
        return False  # too small for any interval: the summary says so (meta.min_groups)
    log.warning(
        "the intervals come from %d %s(s), fewer than %d: bootstrap CIs over so few groups are too narrow "
        "to trust (sample more prompts)", n, meta.ci_unit or "group", MIN_CI_UNITS)
    return True


def run_stats(source: str, stats: StatsSettings, rescore: RescoreSettings, output: StatsOutput,
              control: RunControl) -> int:
    """Recompute the statistics of the run directory ``source``, or re-score it when ``rescore`` asks for new
    rewards (module docstring). Returns the exit code (0)."""
    run_dir = Path(source)
    if not run_dir.is_dir():
        raise GmtsError(f"{run_dir}: no such run directory")
    validate_run_dir(run_dir)  # every contract column (no estimator silently dropped), answers, manifest
    if rescore.asked:
        return _rescore(stats, rescore, output, control, run_dir, source)
    return _recompute(stats, output, control, run_dir)


def _recompute(settings: StatsSettings, output: StatsOutput, control: RunControl, run_dir: Path) -> int:
    """stats.json (and estimators.csv) of ``run_dir`` from its tables, written in place or to ``output.out``."""
    out = output.out
    if out:
        if Path(out).is_dir():
            raise GmtsError(f"--out {out}: is a directory; expected a file name (e.g. stats.json)")
        check_output_file(out, "--out", lambda p: "meta" in read_json_object(p) and "estimators" in
                          read_json_object(p)["meta"], overwrite=output.overwrite,
                          inputs={f"{run_dir}/{n}": run_dir / n for n in ("tokens.parquet", "answers.parquet",
                                                                         "manifest.json")})
        check_output_location(Path(out).parent, flag=f"--out {out}: directory", whole_dir=False)
    tokens = read_parquet(run_dir / "tokens.parquet")
    answers = read_parquet(run_dir / "answers.parquet") if (run_dir / "answers.parquet").exists() else None
    old = read_json(run_dir / "stats.json") if (run_dir / "stats.json").exists() else {}
    if not isinstance(old, dict):
        old = {}
    if old and not is_current(old):
        log.info("%s/stats.json is an older version: rewriting it in the current one", run_dir)

    t0 = time.perf_counter()
    manifest = read_json(run_dir / "manifest.json") if (run_dir / "manifest.json").exists() else {}
    below = settings.uncertain_below if settings.uncertain_below is not None else manifest_uncertain_below(manifest)
    rho = settings.rho if settings.rho is not None else manifest_rho(manifest)
    stats = compute_statistics(tokens, answers, seed=settings.seed, n_boot=settings.n_boot, rho=rho,
                               uncertain_below=below, **kept_fidelity(old))
    paths = write_stats(run_dir, stats, json_path=out)
    m = stats.meta
    log.info(
        "stats of %d tokens, %d answers, %d estimators in %.1f s -> %s",
        m.n_tokens, m.n_answers, len(m.estimators), time.perf_counter() - t0, ", ".join(map(str, paths)),
    )
    warn_few_groups(stats)
    if not control.quiet:
        log.info("%s", summary_text(stats))
    return 0


def _rescore(settings: StatsSettings, new: RescoreSettings, output: StatsOutput, control: RunControl,
             run_dir: Path, source: str) -> int:
    """``gmts stats RUN --verifier/--rewards/--mask-truncated-completions --out NEW``: a re-scored run directory."""
    from gmts_analysis.run.finalize import write_run_dir  # deferred: torch
    from gmts_analysis.run.rescore import rescore  # deferred: torch

    if new.verifier is not None:
        resolve_verifier(new.verifier)  # an unknown name or a missing package, before any work
    if new.rewards is not None:
        io.check_regular_file(new.rewards, "--rewards")
    if not output.out:
        raise GmtsError("re-scoring writes a new run directory: give --out DIR (the source run is left as it is)")
    out = Path(output.out)
    if out.resolve() == run_dir.resolve():
        raise GmtsError(f"--out {out}: is the source run; re-scoring writes a new run directory")
    io.check_output_location(out, {"RUN_DIR": run_dir})
    io.check_ours(out)
    run = read_run(run_dir, compute_missing_stats=False)
    rescored = rescore(run, verifier=new.verifier, rewards=new.rewards,
                       mask_truncated_completions=new.mask_truncated_completions, seed=settings.seed,
                       n_boot=settings.n_boot, source=source, rho=settings.rho)
    write_run_dir(rescored, out, figures=not output.no_figures, overwrite=output.overwrite)
    st = Statistics.coerce(rescored.stats)
    log.info("re-scored run -> %s", out)
    warn_few_groups(st)
    if not control.quiet:
        print(summary_text(st))
    return 0
