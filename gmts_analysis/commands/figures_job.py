"""``gmts figures``: what it does (declared in :mod:`gmts_analysis.commands.figures`)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

from gmts_analysis.commands.figures import FiguresOptions
from gmts_analysis.errors import GmtsError
from gmts_analysis.options.config import RunControl
from gmts_analysis.probing.validate import validate_run_dir
from gmts_analysis.util.io import check_output_location
from gmts_analysis.views import figures as figure_files  # render_all through its module: tests replace it there
from gmts_analysis.views.figures import FIGURES, figure_file_is_ours
from gmts_analysis.views.report import MAX_ANSWERS, write_report


def _check_figures_dir(to) -> None:
    """--to: absent, empty, or a folder gmts has drawn figures into before. A figure file there (a name
    gmts writes) is replaced only when its metadata proves gmts wrote it (``Creator`` of
    :func:`~gmts_analysis.views.figures.save_figure`); other files are never touched, and are refused
    in a folder without any figure of ours (someone else's folder: not mixed with figures)."""
    if not to.is_dir():
        return
    names = {f"{n}.{ext}" for n in FIGURES for ext in ("png", "pdf")}
    present = sorted(c for c in to.iterdir() if c.name in names)
    not_ours = [c.name for c in present if not figure_file_is_ours(c)]
    if not_ours:
        raise GmtsError(f"--to {to}: {not_ours[0]} was not written by gmts (no gmts_analysis creator in its "
                        "metadata); gmts never replaces it: choose another directory for the figures")
    foreign = sorted(c.name for c in to.iterdir() if c.name not in names and not re.match(r"^\..+\.tmp$", c.name))
    if foreign and not present:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise GmtsError(f"--to {to}: holds files that gmts did not write ({', '.join(foreign[:3])}{more}); "
                        "choose an empty or new directory for the figures")


def figures(run_dir: str, opts: FiguresOptions, control: RunControl) -> int:
    """Render the figures of ``run_dir`` (:mod:`gmts_analysis.commands.figures`)."""
    log = logging.getLogger("gmts_analysis.views.plots")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise GmtsError(f"{run_dir}: no such run directory")
    if opts.max_answers is not None and opts.max_answers < 1:
        raise GmtsError(f"--max-answers must be >= 1, got {opts.max_answers}")
    validate_run_dir(run_dir)  # tokens, answers, manifest and stats.json, before any figure
    if opts.to is not None:
        check_output_location(opts.to, flag="--to", whole_dir=False)
        _check_figures_dir(Path(opts.to))
    paths = figure_files.render_all(run_dir, to=opts.to)
    log.info("wrote %d files to %s", len(paths), paths[0].parent if paths else opts.to or run_dir / "figures")
    if opts.report:
        n = MAX_ANSWERS if opts.max_answers is None else opts.max_answers
        if n < 1:
            raise GmtsError(f"--max-answers must be >= 1, got {n}")
        log.info("wrote %s", write_report(run_dir, max_answers=n))
    return 0
