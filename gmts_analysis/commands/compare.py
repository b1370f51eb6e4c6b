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

from gmts_analysis.errors import GmtsError
from gmts_analysis.options import checks
from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl, default_out
from gmts_analysis.options.fields import opt
from gmts_analysis.util.io import check_ours, check_output_location, staged_directory

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


def compare(runs: list[str], opts: CompareOptions, control: RunControl) -> int:
    """Compare the run directories ``runs`` into ``opts.out`` (module docstring)."""
    import logging
    from pathlib import Path

    from gmts_analysis.views.compare import compare_runs, write_comparison  # deferred: pandas

    log = logging.getLogger("gmts_analysis.views.compare")
    if opts.out is None:
        opts.out = default_out("compare")
    out = check_output_location(opts.out, whole_dir=False)
    for r in runs:  # never write into a run directory (its own files, and a later --overwrite refusal)
        rp = Path(r).expanduser().resolve()
        if (rp / "stats.json").is_file() and (out == rp or rp in out.parents):
            raise GmtsError(f"--out {opts.out}: is inside the run directory {r}; write the comparison elsewhere")
    check_ours(out, "compare")  # a directory of someone else's files is never written into or replaced
    if out.is_dir() and any(out.iterdir()) and not opts.overwrite:  # refused before the runs are read
        raise GmtsError(f"--out {opts.out}: holds a previous comparison (pass --overwrite to replace it)")
    cmp = compare_runs(runs)
    # an existing comparison is replaced whole, and only with --overwrite when it is provably ours
    with staged_directory(out, overwrite=opts.overwrite, kind="compare") as tmp:
        paths = write_comparison(cmp, tmp, figures=not opts.no_figures)
    log.info("compared %d runs (%s: %s), %d statistics, %d settings mismatch(es); wrote %d files to %s",
             len(cmp.runs), cmp.x_label, ", ".join(str(r["x"]) for r in cmp.runs),
             cmp.table["statistic"].nunique(), len(cmp.mismatches), len(paths), opts.out)
    return 0


COMMAND = Command(
    "compare", job=compare, settings=(CompareOptions, RunControl), skip=("offline",),
    help="compare runs across training: every statistic vs step, with CIs, figures and an HTML page",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
    positionals=(Positional("runs", "RUN", "run directories, or one directory holding run directories", nargs="+"),),
)
register = COMMAND.register
