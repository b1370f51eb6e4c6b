"""The figures of a run, as entries, and writing them.

:data:`FIGURE_ENTRIES` holds every figure of a run once: its name, its draw function (of a
:class:`~gmts_analysis.analysis.runs.RunTables`), its report caption, its line in figures/README.md
and which runs it applies to. ``gmts figures``, the report (:mod:`gmts_analysis.views.report`), the
notebook API (``Run.figure``, ``figure_names``) and figures/README.md (generated between markers,
``tests/test_figure_entries.py``) read it; :data:`FIGURES` is its ``{name: draw}`` view.
Adding a figure: a ``fig_*`` function (in :mod:`gmts_analysis.views.plots` or its own module) and one
:class:`FigureEntry` here.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.figure import Figure

from gmts_analysis.analysis.runs import RunTables
from gmts_analysis.analysis.stats import run_rho_key
from gmts_analysis.errors import GmtsError
from gmts_analysis.util.io import atomic_write_bytes
from gmts_analysis.views.plots import (
    Run,
    fig_decomposition,
    fig_decomposition_slices,
    fig_estimators,
    fig_group_answers,
    fig_mass_capture,
    fig_pooled_hexbin,
    fig_topk_overlap,
    fig_update_fidelity,
    fig_within_vs_cross,
    load_run,
)
from gmts_analysis.views.plots_tokens import fig_token_strings
from gmts_analysis.views.token_strip import fig_token_strip

log = logging.getLogger("gmts_analysis.views.plots")


def run_rho(run: Run) -> float:
    """The keep fraction of a run (stats ``meta.rho``, the probe's ``--rho``; 0.2 for older runs)."""
    return float(run_rho_key(run.stats))


def _token_strings(run: Run) -> Figure | None:
    return fig_token_strings(run.tokens, rho=run_rho(run))


@dataclass(frozen=True)
class FigureEntry:
    """One figure of a run, registered once in :data:`FIGURE_ENTRIES` and read by ``gmts figures``, the report,
    :meth:`gmts_analysis.api.Run.figure` and figures/README.md.

    Attributes:
        name: the figure's name (its files are ``<name>.png`` and ``<name>.pdf``).
        draw: ``run -> Figure | None``: draws it from the run's tables (None: nothing to draw for this run;
            a :class:`GmtsError`: cannot be drawn, e.g. no statistics).
        caption: its caption in report.html.
        readme: its line in figures/README.md.
        applies: which runs have it.
    """

    name: str
    draw: Callable[[Run], Figure | None]
    caption: str
    readme: str
    applies: str = "every run"


#: every figure of a run, in the order the report and ``gmts figures`` draw them
FIGURE_ENTRIES: tuple[FigureEntry, ...] = (
    FigureEntry(
        'within_vs_cross', lambda r: fig_within_vs_cross(r.tokens, r.stats),
        caption=('Per-answer Spearman with ‖∇ log p‖ (same answers for every score; median with its interquartile '
                 'range, mean with its 95% CI) beside the Spearman with grad_norm over all tokens pooled, with 95% CIs.'),
        readme=('left: per-answer Spearman(score, ‖∇ log p‖) over the same informative answers for every score '
                '(points with seeded jitter; the median, the number the summary prints, written beside it with the '
                'interquartile range; the mean with its 95% CI; axis zoomed to the data); right: the pooled '
                'cross-answer Spearman(score, grad_norm) over all tokens (open) and informative tokens (filled); for '
                'entropy, the masked baseline entropy_inf, GMTS, 1 - p and gmts_lgn; second row: the same over the '
                'tokens with prob < 0.9; CIs from a cluster bootstrap over groups'),
        applies='every run'),
    FigureEntry(
        'decomposition', lambda r: fig_decomposition(r.stats),
        caption=('Across answers over all tokens vs over informative tokens (ω ≠ 0), and the share of each selection '
                 "spent on tokens without gradient: how much of a score's failure is wasted picks, how much magnitude."),
        readme=('the central figure beside it: cross-answer Spearman over all tokens (open) vs over informative '
                'tokens, ω ≠ 0 (filled), and the share of a top-20% selection spent on tokens with ω = 0 (batch and '
                'group scope), for entropy, GMTS, abs_omega (= \\|ω\\|, the coefficient alone), surprisal and '
                "logit_grad_norm, with 95% CIs: how much of a score's cross-answer failure is wasted picks and how "
                'much is magnitude'),
        applies='every run'),
    FigureEntry(
        'decomposition_slices', lambda r: fig_decomposition_slices(r.stats),
        caption=('Per domain (or step): the share of tokens without gradient (bars) and the cross-answer Spearman of '
                 'entropy and GMTS over all vs informative tokens, with 95% CIs.'),
        readme=("the same per domain: each domain's share of tokens with ω = 0 (bars) beside entropy's and GMTS's "
                'cross-answer Spearman over all vs informative tokens, with 95% CIs'),
        applies='runs with several domains (or steps)'),
    FigureEntry(
        'estimators', lambda r: fig_estimators(r.tokens, r.stats),
        caption=('Every per-token score ranked by agreement with the exact gradient: per-answer correlations (same '
                 'answers for every score) and the informative cross-answer correlation, with 95% CIs.'),
        readme=('every estimator ranked by agreement with the exact gradient (`estimators.csv` of the run, ties by '
                'paired CI), as its paired difference with entropy (same group resamples, 95% CI; filled when the CI '
                'excludes 0) on the within-answer mean, the informative cross-answer Spearman and the gradient mass '
                'captured; identities marked "= by construction"'),
        applies='every run'),
    FigureEntry(
        'group_answers', lambda r: fig_group_answers(r.tokens),
        caption=('One group: each answer is its own band of log entropy vs log grad_norm (marker: sign of the '
                 'advantage).'),
        readme=("one group's answers: log entropy vs log grad_norm, one colour per answer, marker by advantage sign "
                '(▲ A > 0, ▼ A < 0); answers with the same advantage share a band (|ω| = w |A|)'),
        applies='every run'),
    FigureEntry(
        'pooled_hexbin', lambda r: fig_pooled_hexbin(r.tokens),
        caption=('All tokens pooled: entropy vs grad_norm next to GMTS vs grad_norm.'),
        readme=('all tokens pooled: entropy vs grad_norm next to GMTS vs grad_norm (log-log hexbins of the tokens '
                'with both positive, the zero-gradient tokens as a red rug under the axis; Spearman over all tokens '
                'and over informative tokens in the titles)'),
        applies='every run'),
    FigureEntry(
        'topk_overlap', lambda r: fig_topk_overlap(r.stats),
        caption=("Overlap of each estimator's top-ρ tokens with the top-ρ by grad_norm; dotted: random."),
        readme=('\\|S_score ∩ S_true\\| / \\|S_true\\| vs the kept fraction ρ (S_true: the top by grad_norm among tokens '
                'with grad_norm > 0; groups without any left out), every estimator, batch and group scope, 95% CIs at'
                ' every ρ; dotted: random'),
        applies='every run'),
    FigureEntry(
        'mass_capture', lambda r: fig_mass_capture(r.stats),
        caption=("The grad_norm mass each score's top-ρ selection captures over what the true top-ρ by grad_norm "
                 'captures, vs ρ, with 95% CIs; dashed: the masked baselines.'),
        readme=('the grad_norm mass a top-ρ selection captures over what the true top-ρ captures, vs ρ, batch and '
                'group scope, with 95% CIs; dashed: the masked baselines entropy_inf and one_minus_prob_inf'),
        applies='every run'),
    FigureEntry(
        'update_fidelity', lambda r: fig_update_fidelity(r.stats),
        caption=("Cosine and norm ratio of the selected tokens' update vs the full policy gradient (ρ: the run's keep "
                 'fraction).'),
        readme=("cosine and norm ratio of the 20% selection's update vs the full policy gradient, with `all`, "
                '`oracle` and `random` references'),
        applies='runs whose probe computed update fidelity (--fidelity)'),
    FigureEntry(
        'token_strip', lambda r: fig_token_strip(r.tokens, rho=run_rho(r)),
        caption=("One answer's tokens coloured by entropy and by grad_norm, with the entropy and GMTS selections."),
        readme=('the answer where entropy and GMTS selections disagree most: tokens coloured by entropy and by '
                'grad_norm, and the tokens each selection keeps'),
        applies='every run'),
    FigureEntry(
        'token_strings', _token_strings,
        caption=('Which token strings carry the gradient mass, beside those entropy and GMTS select most (overall and '
                 'per domain; table: token_strings.csv).'),
        readme=('the token strings that carry the most gradient mass, beside those entropy and GMTS select most, '
                'overall and per domain (one row when the run has one domain; table: `token_strings.csv` of the run)'),
        applies='every run'),
)
#: ``{name: draw}`` of :data:`FIGURE_ENTRIES` (the names ``gmts figures`` writes)
FIGURES: dict[str, Callable[[Run], Figure | None]] = {e.name: e.draw for e in FIGURE_ENTRIES}
#: ``{name: caption}`` of :data:`FIGURE_ENTRIES` (report.html)
FIGURE_CAPTIONS: dict[str, str] = {e.name: e.caption for e in FIGURE_ENTRIES}


def readme_table() -> str:
    """The figures table of figures/README.md (generated between its markers)."""
    rows = ["| file | what it shows | runs |", "|---|---|---|"]
    rows += [f"| `{e.name}` | {e.readme} | {e.applies} |" for e in FIGURE_ENTRIES]
    return "\n".join(rows)



CREATOR = "gmts_analysis"


def save_figure(fig: Figure, stem: Path, formats: Sequence[str] = ("png", "pdf"), dpi: int = 150,
                title: str | None = None) -> list[Path]:
    """Write ``fig`` as ``stem.<fmt>`` for each format (Agg canvas, atomic); returns the paths.
    ``title``: also written into the file's metadata (``Title``), so a later run can tell its own
    figure from another file of that name (:func:`png_metadata`)."""
    import io as _io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    out = []
    for fmt in formats:
        buf = _io.BytesIO()
        # fixed metadata (no creation date), so two renders of one run are the same bytes
        meta = {"Creator": CREATOR} if fmt == "png" else {"Creator": CREATOR, "CreationDate": None}
        if title is not None:
            meta["Title"] = title
        fig.savefig(buf, format=fmt, dpi=dpi, metadata=meta)
        out.append(atomic_write_bytes(stem.with_suffix(f".{fmt}"), buf.getvalue()))
    return out


def png_metadata(path: str | os.PathLike) -> dict[str, str]:
    """The text chunks of a PNG file (``Creator``, ``Title`` of :func:`save_figure`); {} for a file
    that is not a readable PNG."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            return dict(getattr(im, "text", {}) or {}) if im.format == "PNG" else {}
    except (OSError, UnidentifiedImageError, ValueError):
        return {}


def figure_file_is_ours(path: str | os.PathLike) -> bool:
    """Whether a figure file was written by :func:`save_figure`: a PNG whose ``Creator`` text chunk, or a
    PDF whose info dictionary's ``/Creator``, is :data:`CREATOR`."""
    p = Path(path)
    if p.suffix == ".png":
        return png_metadata(p).get("Creator") == CREATOR
    try:
        with open(p, "rb") as f:  # matplotlib writes the info dictionary near the end
            f.seek(max(0, p.stat().st_size - (1 << 16)))
            tail = f.read()
    except OSError:
        return False
    return f"/Creator ({CREATOR})".encode() in tail


def render_all(run_dir: str | os.PathLike | Run, to: str | os.PathLike | None = None) -> list[Path]:
    """Render every figure of a run (a directory, or a run in memory) as PNG and PDF into ``to``
    (default RUN_DIR/figures).

    Figures that cannot be drawn (e.g. update fidelity when the probe did not compute it)
    are skipped with a log line. Returns the written paths.
    """
    run = run_dir if isinstance(run_dir, RunTables) else load_run(run_dir)
    if to is None and run.path is None:
        raise GmtsError("render_all: this run has no directory; say where to write the figures")
    out_dir = Path(to) if to is not None else run.path / "figures"
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, make in FIGURES.items():
        try:
            fig = make(run)
        except GmtsError as e:
            log.warning("figure %s skipped: %s", name, e)
            continue
        if fig is None:
            log.info("figure %s skipped (no data)", name)
            continue
        written += save_figure(fig, out_dir / name)
    return written


README_BEGIN = "<!-- gmts-figures:begin (generated from gmts_analysis/views/figures.py FIGURE_ENTRIES: do not edit) -->"
README_END = "<!-- gmts-figures:end -->"


def render_readme(text: str) -> str:
    """figures/README.md's ``text`` with its table (between the markers) generated from the entries."""
    head, rest = text.split(README_BEGIN, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_BEGIN}\n{readme_table()}\n{README_END}{tail}"


def write_readme(path: str | os.PathLike | None = None) -> bool:
    """Rewrite the generated table of figures/README.md; True when the file changed."""
    p = Path(path) if path is not None else Path(__file__).resolve().parents[2] / "figures" / "README.md"
    old = p.read_text(encoding="utf-8")
    new = render_readme(old)
    if new != old:
        p.write_text(new, encoding="utf-8")
    return new != old
