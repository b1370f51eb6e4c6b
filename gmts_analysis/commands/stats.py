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

from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl
from gmts_analysis.run.stats_settings import RescoreSettings, StatsOutput, StatsSettings

EXAMPLES = """examples:
  gmts stats runs/mine --n-boot 0 --out /tmp/stats.json                  # rewrites, or writes elsewhere
  gmts stats data/smollm2_run --verifier math --out runs/smollm2_math      # re-scored: math's fallback
  gmts stats runs/mine --mask-truncated-completions --out runs/mine_masked  # TRL's mask, no probing"""


COMMAND = Command(
    "stats", job="gmts_analysis.run.stats_job:run_stats", settings=(StatsSettings, RescoreSettings, StatsOutput, RunControl), skip=("offline",),
    help="recompute stats.json of a run directory from its tokens table",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
    positionals=(Positional("run_dir", "RUN_DIR", "a probe's output directory (with tokens.parquet)"),),
)
register = COMMAND.register
