"""``gmts merge RUN_DIR``: finish a probe run whose answers are all probed.

A torchrun probe merges on rank 0 by itself. This command is for the other cases: rank 0
died after every chunk was recorded, or the parts were made by separate jobs. It reads the
run's ``run.json`` (model, rollouts, configuration), checks they still match, gathers
the parts (or the chunk records), and writes tokens.parquet, answers.parquet,
stats.json, manifest.json (and figures and report) in place of the work area.
Its exit status is ``gmts probe``'s: 3 when the run dropped answers still out of memory after the back-off.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.options import checks
from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl
from gmts_analysis.options.fields import opt

EXAMPLES = """examples:
  gmts merge runs/big                       # rank 0 died after every chunk was recorded
  gmts merge runs/big --no-figures --fidelity off"""


@dataclass
class MergeOptions:
    """The flags of ``gmts merge`` (None: as the probe command said)."""

    device: str = opt("auto", "device for the model (manifest, fidelity)", group="gradient engine", metavar="DEVICE",
                      check=checks.device)
    figures: bool = opt(None, "", flag_off="--no-figures",
                        help_off="skip figures and report (default: as the probe command said)", group="output")
    fidelity: str = opt(None, "update fidelity of selections (default: as the probe command said)",
                        choices=("auto", "on", "off"), group="output")


COMMAND = Command(
    "merge", job="gmts_analysis.commands.merge_job:merge", settings=(MergeOptions, RunControl), skip=("offline",),
    help="merge the parts of an unfinished probe run into its final tables and statistics",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
    positionals=(Positional("run_dir", "RUN_DIR", "the probe's --out directory"),),
)
register = COMMAND.register
