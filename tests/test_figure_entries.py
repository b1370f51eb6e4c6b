"""Figures as entries (issue 29 item 4): one FigureEntry per figure (name, draw, caption, README line,
which runs) read by gmts figures, the report, the notebook API and figures/README.md."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_figure_has_a_caption_and_a_readme_line():
    from gmts_analysis.views.figures import FIGURE_CAPTIONS, FIGURE_ENTRIES, FIGURES

    names = [e.name for e in FIGURE_ENTRIES]
    assert names == ["within_vs_cross", "decomposition", "decomposition_slices", "estimators", "group_answers",
                     "pooled_hexbin", "topk_overlap", "mass_capture", "update_fidelity", "token_strip",
                     "token_strings"]
    assert list(FIGURES) == names == list(FIGURE_CAPTIONS)
    for e in FIGURE_ENTRIES:
        assert e.caption.strip() and e.readme.strip() and e.applies.strip(), e.name


def test_figures_readme_is_current():
    from gmts_analysis.views.figures import render_readme

    text = (ROOT / "figures" / "README.md").read_text(encoding="utf-8")
    assert render_readme(text) == text, (
        "figures/README.md is out of date: python -c \"from gmts_analysis.views.figures import write_readme; "
        "write_readme()\"")


def test_the_readers_use_the_entries():
    import gmts_analysis.api as api
    from gmts_analysis.views import plots
    from gmts_analysis.views.figures import FIGURES

    assert api.figure_names() == list(FIGURES)
    assert plots.FIGURES is FIGURES and plots.render_all is __import__(
        "gmts_analysis.views.figures", fromlist=["render_all"]).render_all
