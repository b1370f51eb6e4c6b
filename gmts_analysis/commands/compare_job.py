"""``gmts compare``: what it does (declared in :mod:`gmts_analysis.commands.compare`)."""

from __future__ import annotations

import logging
from pathlib import Path

from gmts_analysis.commands.compare import CompareOptions
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import RunControl, default_out
from gmts_analysis.util.io import check_ours, check_output_location, staged_directory
from gmts_analysis.views.compare import compare_runs, write_comparison


def compare(runs: list[str], opts: CompareOptions, control: RunControl) -> int:
    """Compare the run directories ``runs`` into ``opts.out`` (:mod:`gmts_analysis.commands.compare`)."""
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
