"""``gmts stats RUN_DIR``: recompute stats.json from tokens.parquet (no model needed).

Reads RUN_DIR/tokens.parquet (and answers.parquet when present), recomputes every
statistic of SPEC section 6 that needs no model, keeps the update_fidelity blocks of
the existing stats.json (they need the model; the probe computes them), and writes
RUN_DIR/stats.json atomically.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "stats",
        help="recompute stats.json of a run directory from its tokens table",
        description=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="a probe's output directory (with tokens.parquet)")
    p.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples for the CIs (default 1000; 0: no CIs)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    p.add_argument("--out", default=None, help="write here instead of RUN_DIR/stats.json")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars; only warnings and errors on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging
    import time
    from pathlib import Path

    from gmts_analysis.errors import GmtsError
    from gmts_analysis.io import atomic_write_json, read_json, read_parquet
    from gmts_analysis.stats import compute_stats

    log = logging.getLogger("gmts_analysis.stats")
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise GmtsError(f"{run_dir}: no such run directory")
    if args.n_boot < 0:
        raise GmtsError(f"--n-boot must be >= 0, got {args.n_boot}")
    from gmts_analysis.validate import validate_tokens_file

    validate_tokens_file(run_dir / "tokens.parquet")  # every contract column: no estimator silently dropped
    tokens = read_parquet(run_dir / "tokens.parquet")
    answers = read_parquet(run_dir / "answers.parquet") if (run_dir / "answers.parquet").exists() else None
    old = read_json(run_dir / "stats.json") if (run_dir / "stats.json").exists() else {}
    if not isinstance(old, dict):
        old = {}

    def fid(section: str) -> dict:
        return {k: v.get("update_fidelity") for k, v in (old.get(section) or {}).items() if isinstance(v, dict)}

    t0 = time.perf_counter()
    stats = compute_stats(
        tokens, answers, seed=args.seed, n_boot=args.n_boot,
        fidelity=old.get("update_fidelity") or None,
        fidelity_by_domain=fid("by_domain"), fidelity_by_step=fid("by_step"),
    )
    out = Path(args.out) if args.out else run_dir / "stats.json"
    atomic_write_json(out, stats)
    m = stats["meta"]
    log.info(
        "stats of %d tokens, %d answers, %d estimators in %.1f s -> %s",
        m["n_tokens"], m["n_answers"], len(m["estimators"]), time.perf_counter() - t0, out,
    )
    for s in ("entropy", "gmts"):
        if s in stats["cross_answer"]:
            wa, ca = stats["within_answer"][s], stats["cross_answer"][s]
            log.info("  %-8s within-answer median rho %s | cross-answer rho %s", s, _f(wa["median"]), _f(ca["spearman"]))
    return 0


def _f(x) -> str:
    import math

    return "n/a" if x is None or math.isnan(x) else f"{x:+.3f}"
