"""``gmts merge``: what it does (declared in :mod:`gmts_analysis.commands.merge`)."""

from __future__ import annotations

import sys

from gmts_analysis.commands.merge import MergeOptions
from gmts_analysis.commands.probe_job import exit_status
from gmts_analysis.options.config import RunControl
from gmts_analysis.run.sharding import merge_run


def merge(run_dir: str, opts: MergeOptions, control: RunControl) -> int:
    """Merge; the exit status of :func:`gmts_analysis.commands.probe.exit_status` (3: answers dropped still
    out of memory, the line saying so printed)."""
    out = merge_run(run_dir, device=opts.device, figures=opts.figures, fidelity=opts.fidelity,
                    quiet=control.quiet)
    print(f"wrote {out}", file=sys.stderr)
    return exit_status([out])
