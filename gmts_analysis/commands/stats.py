"""``gmts stats RUN_DIR``: recompute stats.json from tokens.parquet (no model needed).

Reads RUN_DIR/tokens.parquet (and answers.parquet when present), recomputes every
statistic that needs no model, keeps the update_fidelity blocks of the existing
stats.json (they need the model; the probe computes them), and writes RUN_DIR/stats.json
(the current version: a run directory written by an older version is brought up to date)
and RUN_DIR/estimators.csv (the estimator ranking) atomically.

With --verifier NAME, --rewards FILE or --mask-truncated-completions it re-scores the run instead
(no model, no probing: the gradient norm of log p does not depend on the rewards): advantages, omega,
grad_norm, the scores and every statistic are recomputed and a new run directory is written to --out,
its manifest and stats.json recording the source run and the new rewards (rescored_from).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gmts_analysis.analysis.runs import manifest_rho, manifest_uncertain_below, read_run
from gmts_analysis.analysis.stats_types import Statistics
from gmts_analysis.analysis.summary import summary_text, too_small
from gmts_analysis.core.vocabulary import DEFAULT_N_BOOT, DEFAULT_RHO, DEFAULT_UNCERTAIN_BELOW, check_rho
from gmts_analysis.errors import GmtsError
from gmts_analysis.options import checks
from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl
from gmts_analysis.options.fields import opt
from gmts_analysis.probing.validate import validate_run_dir
from gmts_analysis.readers.verifiers import resolve_verifier
from gmts_analysis.util import io
from gmts_analysis.util.io import check_output_file, check_output_location, read_json, read_json_object, read_parquet

EXAMPLES = """examples:
  gmts stats runs/mine --n-boot 0 --out /tmp/stats.json                  # rewrites, or writes elsewhere
  gmts stats data/smollm2_run --verifier math --out runs/smollm2_math      # re-scored: math's fallback
  gmts stats runs/mine --mask-truncated-completions --out runs/mine_masked  # TRL's mask, no probing"""


#: what a re-scoring flag adds to its help
_RESCORE = "writes a new run directory to --out"


@dataclass
class StatsOptions:
    """The flags of ``gmts stats`` (the run directory is positional; ``--threads`` and ``-q`` are
    :class:`~gmts_analysis.options.config.RunControl`'s)."""

    n_boot: int = opt(DEFAULT_N_BOOT, f"bootstrap resamples for the CIs (default {DEFAULT_N_BOOT}; 0: no CIs)",
                      group="output", metavar="RESAMPLES", check=checks.int_at_least(0))
    seed: int = opt(0, "seed of the bootstrap (default 0)", metavar="INT", check=checks.seed)
    uncertain_below: float = opt(None, "the uncertain-token view keeps tokens with prob below this (default: the "
                                 f"run's manifest value, else {DEFAULT_UNCERTAIN_BELOW})", group="RL objective",
                                 metavar="PROB", check=checks.probability)
    rho: float = opt(None, "the keep fraction the paired differences and the headline quote (default: the run's "
                     f"manifest value, else {DEFAULT_RHO})", group="RL objective", metavar="FRACTION",
                     check=checks.rho)
    out: str = opt(None, "write the JSON here instead of RUN_DIR/stats.json (estimators.csv beside it); with "
                   "--verifier, --rewards or --mask-truncated-completions: the new run directory", group="output",
                   metavar="DIR", check=checks.output_path)
    verifier: str = opt(None, "re-score: new rewards from this verifier (math_boxed, math, a toy domain, or "
                        f"module:function) on the run's response texts; {_RESCORE}", group="inputs", metavar="NAME",
                        check=checks.verifier)
    rewards: str = opt(None, "re-score: new rewards from a JSONL ({answer_id, reward} per line) or CSV (answer_id, "
                       f"reward) file, every answer once; {_RESCORE}", group="inputs", metavar="FILE",
                       check=checks.input_file)
    mask_truncated_completions: bool = opt(False, "re-score: truncated answers get loss weight 0 (TRL's "
                                           f"mask_truncated_completions); {_RESCORE}", group="RL objective")
    no_figures: bool = opt(False, "re-score: skip the figures and report", group="output")
    overwrite: bool = opt(False, "replace an existing --out file that gmts did not write (default: refuse it)",
                          group="output")


#: fewer bootstrap units than this: the intervals are printed with a warning (one number for every view)
from gmts_analysis.core.vocabulary import MIN_GROUPS as MIN_CI_UNITS  # noqa: E402


def warn_few_groups(stats: Statistics | dict) -> bool:
    """Log a warning when the intervals of ``stats`` come from fewer than :data:`MIN_CI_UNITS` groups
    (a cluster bootstrap over 2 groups gives "0.95 [0.95, 0.95]"); returns whether it warned."""
    import logging

    st = Statistics.coerce(stats)
    meta = st.meta
    n, n_boot = meta.n_groups, meta.n_boot or 0
    if not isinstance(n, int) or n >= MIN_CI_UNITS or n_boot <= 0 or too_small(st) is not None:
        return False  # too small for any interval: the summary says so (meta.min_groups)
    logging.getLogger("gmts_analysis.analysis.stats").warning(
        "the intervals come from %d %s(s), fewer than %d: bootstrap CIs over so few groups are too narrow "
        "to trust (sample more prompts)", n, meta.ci_unit or "group", MIN_CI_UNITS)
    return True


def stats(source: str, args: StatsOptions, control: RunControl) -> int:
    """Recompute the statistics of the run directory ``source``, or re-score it (module docstring).
    ``args``: the command's typed options."""
    import logging
    import time

    from gmts_analysis.analysis.stats import (  # deferred: pandas
        compute_statistics,
        is_current,
        kept_fidelity,
        write_stats,
    )

    log = logging.getLogger("gmts_analysis.analysis.stats")
    run_dir = Path(source)
    if not run_dir.is_dir():
        raise GmtsError(f"{run_dir}: no such run directory")
    if args.n_boot < 0:
        raise GmtsError(f"--n-boot must be >= 0, got {args.n_boot}")
    validate_run_dir(run_dir)  # every contract column (no estimator silently dropped), answers, manifest
    if args.verifier is not None or args.rewards is not None or args.mask_truncated_completions:
        return _rescore(args, control, run_dir, source)
    if args.out:
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
    if args.rho is not None:
        check_rho(args.rho, "--rho", error=GmtsError)
    rho = args.rho if args.rho is not None else manifest_rho(manifest)
    stats = compute_statistics(tokens, answers, seed=args.seed, n_boot=args.n_boot, rho=rho,
                               uncertain_below=below, **kept_fidelity(old))
    paths = write_stats(run_dir, stats, json_path=args.out)
    m = stats.meta
    log.info(
        "stats of %d tokens, %d answers, %d estimators in %.1f s -> %s",
        m.n_tokens, m.n_answers, len(m.estimators), time.perf_counter() - t0, ", ".join(map(str, paths)),
    )
    warn_few_groups(stats)
    if not control.quiet:
        log.info("%s", summary_text(stats))
    return 0


def _rescore(args: StatsOptions, control: RunControl, run_dir: Path, source: str) -> int:
    """``gmts stats RUN --verifier/--rewards/--mask-truncated-completions --out NEW``: a re-scored run directory."""
    import logging

    from gmts_analysis.run.finalize import write_run_dir  # deferred: torch, pandas
    from gmts_analysis.run.rescore import rescore  # deferred: pandas

    if args.verifier is not None:
        resolve_verifier(args.verifier)  # an unknown name or a missing package, before any work
    if args.rewards is not None:
        io.check_regular_file(args.rewards, "--rewards")
    if not args.out:
        raise GmtsError("re-scoring writes a new run directory: give --out DIR (the source run is left as it is)")
    out = Path(args.out)
    if out.resolve() == run_dir.resolve():
        raise GmtsError(f"--out {out}: is the source run; re-scoring writes a new run directory")
    io.check_output_location(out, {"RUN_DIR": run_dir})
    io.check_ours(out)
    run = read_run(run_dir, compute_missing_stats=False)
    new = rescore(run, verifier=args.verifier, rewards=args.rewards,
                  mask_truncated_completions=args.mask_truncated_completions, seed=args.seed, n_boot=args.n_boot,
                  source=source, rho=args.rho)
    write_run_dir(new, out, figures=not args.no_figures, overwrite=args.overwrite)
    st = Statistics.coerce(new.stats)
    logging.getLogger("gmts_analysis.analysis.stats").info("re-scored run -> %s", out)
    warn_few_groups(st)
    if not control.quiet:
        print(summary_text(st))
    return 0


COMMAND = Command(
    "stats", job=stats, settings=(StatsOptions, RunControl), skip=("offline",),
    help="recompute stats.json of a run directory from its tokens table",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
    positionals=(Positional("run_dir", "RUN_DIR", "a probe's output directory (with tokens.parquet)"),),
)
register = COMMAND.register
