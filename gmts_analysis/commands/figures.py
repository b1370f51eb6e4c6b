"""``gmts figures RUN_DIR [--to DIR]``: render the figures of a run directory (PNG and PDF).

Reads RUN_DIR/tokens.parquet and stats.json (computed when absent) and writes every
figure as PNG and PDF into RUN_DIR/figures, or DIR with --to. With --report, also
rewrites RUN_DIR/report.html with the new figures.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.options import checks
from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl
from gmts_analysis.options.fields import opt

EXAMPLES = """examples:
  gmts figures runs/mine                    # runs/mine/figures/*.png and *.pdf
  gmts figures runs/mine --to /tmp/figs
  gmts figures runs/mine --report --max-answers 50"""


@dataclass
class FiguresOptions:
    """The flags of ``gmts figures`` (the run directory is positional)."""

    to: str = opt(None, "output folder (default RUN_DIR/figures)", group="output", metavar="DIR",
                  check=checks.output_path)
    report: bool = opt(False, "also rewrite RUN_DIR/report.html (default: off)", group="output")
    max_answers: int = opt(None, "answers in the report's audit view, most disagreeing first (default: 200)",
                           group="output", metavar="N", check=checks.int_at_least(1))


COMMAND = Command(
    "figures", job="gmts_analysis.commands.figures_job:figures", settings=(FiguresOptions, RunControl), skip=("offline",),
    help="render the figures of a run directory (PNG and PDF)",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
    positionals=(Positional("run_dir", "RUN_DIR", "a probe's output directory (with tokens.parquet)"),),
)
register = COMMAND.register
