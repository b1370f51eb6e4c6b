"""``gmts stats RUN_DIR``: recompute stats.json from tokens.parquet (no model needed).

Reads RUN_DIR/tokens.parquet (and answers.parquet when present), recomputes every
statistic that needs no model, keeps the update_fidelity blocks of the existing
stats.json (they need the model; the probe computes them), and writes RUN_DIR/stats.json
(the current version: a run directory written by an older version is brought up to date)
and RUN_DIR/estimators.csv (the estimator ranking) atomically.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from gmts_analysis.options.config import ExamplesHelpFormatter, add_run_control

if TYPE_CHECKING:
    from gmts_analysis.analysis.stats_types import Statistics

EXAMPLES = """examples:
  gmts stats runs/mine                      # rewrites runs/mine/stats.json and estimators.csv
  gmts stats runs/mine --n-boot 0 --out /tmp/stats.json
  gmts stats data/example_run --seed 1 --threads 1 --out /tmp/s1.json"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stats",
        help="recompute stats.json of a run directory from its tokens table",
        description=__doc__.split("\n\n", 1)[1],
        epilog=EXAMPLES, formatter_class=ExamplesHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a probe's output directory (with tokens.parquet)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the CIs (default 1000; 0: no CIs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    p.add_argument("--uncertain-below", type=float, default=None, metavar="PROB",
                   help="the uncertain-token view keeps tokens with prob below this (default: the run's "
                   "manifest value, else 0.9)")
    p.add_argument("--out", default=None, help="write the JSON here instead of RUN_DIR/stats.json "
                   "(estimators.csv beside it)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --out file that gmts did not write (default: refuse it)")
    add_run_control(p)
    p.set_defaults(func=run)


#: fewer bootstrap units than this: the intervals are printed with a warning
MIN_CI_UNITS = 10


def warn_few_groups(stats: Statistics | dict) -> bool:
    """Log a warning when the intervals of ``stats`` come from fewer than :data:`MIN_CI_UNITS` groups
    (a cluster bootstrap over 2 groups gives "0.95 [0.95, 0.95]"); returns whether it warned."""
    import logging

    from gmts_analysis.analysis.stats_types import Statistics

    meta = Statistics.coerce(stats).meta
    n, n_boot = meta.n_groups, meta.n_boot or 0
    if not isinstance(n, int) or n >= MIN_CI_UNITS or n_boot <= 0:
        return False
    logging.getLogger("gmts_analysis.analysis.stats").warning(
        "the intervals come from %d %s(s), fewer than %d: bootstrap CIs over so few groups are too narrow "
        "to trust (sample more prompts)", n, meta.ci_unit or "group", MIN_CI_UNITS)
    return True


def run(args: argparse.Namespace) -> int:
    import logging
    import time
    from pathlib import Path

    from gmts_analysis.analysis.runs import manifest_rho, manifest_uncertain_below
    from gmts_analysis.analysis.stats import compute_statistics, is_current, kept_fidelity, write_stats
    from gmts_analysis.analysis.summary import summary_text
    from gmts_analysis.errors import GmtsError
    from gmts_analysis.util.io import read_json, read_parquet

    log = logging.getLogger("gmts_analysis.analysis.stats")
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise GmtsError(f"{run_dir}: no such run directory")
    if args.n_boot < 0:
        raise GmtsError(f"--n-boot must be >= 0, got {args.n_boot}")
    from gmts_analysis.probing.validate import validate_run_dir

    validate_run_dir(run_dir)  # every contract column (no estimator silently dropped), answers, manifest
    if args.out:
        from gmts_analysis.util.io import check_output_file, check_output_location, read_json_object

        if Path(args.out).is_dir():
            raise GmtsError(f"--out {args.out}: is a directory; expected a file name (e.g. stats.json)")
        check_output_file(args.out, "--out", lambda p: "meta" in read_json_object(p) and "estimators" in
                          read_json_object(p)["meta"], overwrite=args.overwrite,
                          inputs={f"{run_dir}/{n}": run_dir / n for n in ("tokens.parquet", "answers.parquet",
                                                                         "manifest.json")})
        check_output_location(Path(args.out).parent, flag=f"--out {args.out}: directory", whole_dir=False)
    tokens = read_parquet(run_dir / "tokens.parquet")
    answers = read_parquet(run_dir / "answers.parquet") if (run_dir / "answers.parquet").exists() else None
    old = read_json(run_dir / "stats.json") if (run_dir / "stats.json").exists() else {}
    if not isinstance(old, dict):
        old = {}
    if old and not is_current(old):
        log.info("%s/stats.json is an older version: rewriting it in the current one", run_dir)

    t0 = time.perf_counter()
    manifest = read_json(run_dir / "manifest.json") if (run_dir / "manifest.json").exists() else {}
    below = args.uncertain_below if args.uncertain_below is not None else manifest_uncertain_below(manifest)
    stats = compute_statistics(tokens, answers, seed=args.seed, n_boot=args.n_boot, rho=manifest_rho(manifest),
                               uncertain_below=below, **kept_fidelity(old))
    paths = write_stats(run_dir, stats, json_path=args.out)
    m = stats.meta
    log.info(
        "stats of %d tokens, %d answers, %d estimators in %.1f s -> %s",
        m.n_tokens, m.n_answers, len(m.estimators), time.perf_counter() - t0, ", ".join(map(str, paths)),
    )
    warn_few_groups(stats)
    if not args.quiet:
        log.info("%s", summary_text(stats))
    return 0
