"""``gmts merge RUN_DIR``: finish a probe run whose answers are all probed.

A torchrun probe merges on rank 0 by itself. This command is for the other cases: rank 0
died after every chunk was recorded, or the parts were made by separate jobs. It reads the
run's ``run.json`` (model, rollouts, configuration), checks they still match, gathers
the parts (or the chunk records), and writes tokens.parquet, answers.parquet,
stats.json, manifest.json (and figures and report) in place of the work area.
"""

from __future__ import annotations

import argparse
import sys

from gmts_analysis.options.config import ExamplesHelpFormatter, add_run_control

EXAMPLES = """examples:
  gmts merge runs/big                       # rank 0 died after every chunk was recorded
  gmts merge runs/big --no-figures --fidelity off"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "merge",
        help="merge the parts of an unfinished probe run into its final tables and statistics",
        description=__doc__.split("\n\n", 1)[1],
        epilog=EXAMPLES, formatter_class=ExamplesHelpFormatter,
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the probe's --out directory")
    p.add_argument("--device", default="auto", help="device for the model (manifest, fidelity) (default: auto)")
    p.add_argument("--no-figures", dest="figures", action="store_false", default=None,
                   help="skip figures and report (default: as the probe command said)")
    p.add_argument("--fidelity", default=None, choices=("auto", "on", "off"),
                   help="update fidelity of selections (default: as the probe command said)")
    add_run_control(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gmts_analysis.run.sharding import merge_run

    out = merge_run(args.run_dir, device=args.device, figures=args.figures, fidelity=args.fidelity,
                    quiet=args.quiet)
    print(f"wrote {out}", file=sys.stderr)
    return 0
