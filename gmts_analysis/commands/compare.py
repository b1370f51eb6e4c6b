"""``gmts compare RUN... | DIR``: every statistic of stats.json against step or checkpoint.

Takes run directories (each with stats.json and manifest.json), or a directory of runs
(such as ``gmts probe --model ckpt-100,ckpt-200,...`` writes), orders them by step
(manifest ``step``, else a number in the checkpoint path, else the given order), and writes
to --out: ``compare.parquet`` and ``compare.json`` (one row per run and statistic, with
95% CIs where stats.json has them), ``figures/*.png`` (statistic vs step, one line per
estimator) and a self-contained ``compare.html``. Runs made with different settings
(temperature, advantage, loss aggregation, clips, gradient-norm method, ...) are flagged on
stderr and in the outputs, never averaged together; the rollouts are an input (compared by
content, logged), not a setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.options import checks
from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl
from gmts_analysis.options.fields import opt

EXAMPLES = """examples:
  gmts compare runs/ckpt-100 runs/ckpt-200 runs/ckpt-300 --out runs/cmp
  gmts compare runs/series                       # a directory of runs; -> runs/compare-<time>/
  gmts compare runs/a runs/b --no-figures --output_dir cmp -q"""


@dataclass
class CompareOptions:
    """The flags of ``gmts compare`` (the runs are positional)."""

    out: str = opt(None, "output directory for compare.parquet, compare.json, figures/ and compare.html (TRL's "
                   "output_dir) (default: runs/compare-YYYYmmdd-HHMMSS)", group="output", metavar="DIR",
                   check=checks.output_path)
    overwrite: bool = opt(False, "replace an existing comparison that gmts wrote (a folder of other files is never "
                          "replaced)", group="output")
    no_figures: bool = opt(False, "skip the PNG figures (the HTML then has tables only)", group="output")


COMMAND = Command(
    "compare", job="gmts_analysis.commands.compare_job:compare", settings=(CompareOptions, RunControl), skip=("offline",),
    help="compare runs across training: every statistic vs step, with CIs, figures and an HTML page",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
    positionals=(Positional("runs", "RUN", "run directories, or one directory holding run directories", nargs="+"),),
)
register = COMMAND.register
