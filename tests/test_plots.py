"""Figures: every figure function draws from the tables; render_all writes PNG and PDF with Agg."""

from __future__ import annotations

import numpy as np
import pytest
from _synthetic import make_run_dir, make_tables
from matplotlib.figure import Figure

from gmts_analysis.analysis.stats import compute_stats
from gmts_analysis.views import plots


@pytest.fixture(scope="module")
def tables():
    tokens, answers = make_tables(n_groups=4, group_size=4, seed=4)
    return tokens, answers, compute_stats(tokens, answers, n_boot=50, min_groups=1)


def test_figure_functions_return_figures(tables):
    tokens, _, stats = tables
    assert isinstance(plots.fig_within_vs_cross(tokens, stats), Figure)
    assert isinstance(plots.fig_group_answers(tokens), Figure)
    assert isinstance(plots.fig_pooled_hexbin(tokens), Figure)
    assert isinstance(plots.fig_topk_overlap(stats), Figure)
    assert plots.fig_update_fidelity(stats) is None  # not computed: no figure
    stats2 = dict(stats, update_fidelity={"all": {"cosine": 1.0, "norm_ratio": 1.0},
                                          "gmts": {"cosine": 0.8, "norm_ratio": 0.7},
                                          "random": {"cosine": 0.4, "norm_ratio": 0.5},
                                          "random_std": {"cosine": 0.1, "norm_ratio": 0.1}})
    fig = plots.fig_update_fidelity(stats2)
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels == ["all", "gmts", "random"]
    strip = plots.fig_token_strip(tokens)
    texts = {t.get_text() for t in strip.axes[0].texts}
    assert {"entropy", "grad_norm", "entropy keeps", "GMTS keeps"} <= texts


def test_decomposition_and_estimator_figures_draw_the_stats(tables):
    tokens, _, stats = tables
    fig = plots.fig_decomposition(stats)
    ax1, ax2 = fig.axes[:2]
    labels = [t.get_text() for t in ax1.get_xticklabels()]
    assert labels == [s for s in plots.DECOMPOSITION_ESTIMATORS if s in stats["cross_answer"]]
    texts = {t.get_text() for t in ax1.texts}
    for s in ("entropy", "gmts"):  # both Spearman values are written next to their points
        assert f"{stats['cross_answer'][s]['spearman']:.2f}" in texts
        assert f"{stats['cross_answer_informative'][s]['spearman']:.2f}" in texts
    bars = {t.get_text() for t in ax2.texts}
    assert f"{100 * stats['selection_waste']['batch']['entropy']['0.2']:.0f}%" in bars
    assert "version 2" in plots.fig_decomposition({"cross_answer": {"entropy": {}}}).axes[0].texts[0].get_text()
    assert plots.fig_decomposition_slices(stats) is None  # no domain or step in this table
    t2, a2 = make_tables(n_groups=4, group_size=3, seed=2, domains=("x", "y"))
    st2 = compute_stats(t2, a2, n_boot=20, min_groups=1)
    sl = plots.fig_decomposition_slices(st2)
    assert [t.get_text() for t in sl.axes[0].get_xticklabels()] == ["x", "y"]
    est = plots.fig_estimators(tokens, stats)
    ticks = [t.get_text() for t in est.axes[0].get_yticklabels()]
    from gmts_analysis.analysis.stats import estimator_table

    t = estimator_table(stats)
    t = t[t["estimator"] != "entropy"]  # the reference of the paired differences
    assert ticks == [f"{r} {s}" for r, s in zip(t["rank"].astype(str) + ".", t["estimator"])]


def test_pickers_follow_the_data(tables):
    tokens, _, _ = tables
    g = plots.pick_group(tokens)
    adv = tokens.loc[tokens["group_id"] == g, "advantage"]
    assert (adv > 0).any() and (adv < 0).any()
    a = plots.pick_answer(tokens)
    assert (tokens.loc[tokens["answer_id"] == a, "grad_norm"] > 0).any()


def test_group_answers_draws_one_series_per_answer(tables):
    tokens, _, _ = tables
    g = plots.pick_group(tokens)
    fig = plots.fig_group_answers(tokens, g)
    n_live = tokens[(tokens["group_id"] == g) & (tokens["grad_norm"] > 0)]["answer_id"].nunique()
    assert len(fig.axes[0].collections) == n_live
    assert fig.axes[0].get_xscale() == "log" and fig.axes[0].get_yscale() == "log"


def test_dollar_and_markup_tokens_do_not_break_text(tables):
    tokens, _, _ = tables
    t = tokens.copy()
    a = plots.pick_answer(t)
    idx = t.index[t["answer_id"] == a][:2]
    t.loc[idx, "token"] = ["$x^2$", "$\\frac{$"]
    fig = plots.fig_token_strip(t, a)
    import io

    fig.savefig(io.BytesIO(), format="png")  # mathtext would raise on "\\frac{" if parsed


def test_display_token():
    assert plots.display_token("a b\n") == "a␣b↵"
    assert plots.display_token("abcdefgh", 4) == "abc…"
    assert plots.display_token(None) == ""


def test_render_all_and_command(tmp_path):
    run = make_run_dir(tmp_path / "run", figures=False, report=False, n_boot=50, domains=("math", "logic"))
    paths = plots.render_all(run)
    names = {p.name for p in paths}
    for stem in plots.FIGURES:
        for ext in ("png", "pdf"):
            assert f"{stem}.{ext}" in names
    for p in paths:
        assert p.parent == run / "figures" and p.stat().st_size > 1000
        head = p.read_bytes()[:8]
        assert head.startswith(b"\x89PNG") if p.suffix == ".png" else head.startswith(b"%PDF")
    from gmts_analysis.cli import main

    out = tmp_path / "paper"
    assert main(["figures", str(run), "--to", str(out), "-q"]) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(names)
    # the second render is the same bytes (no unseeded jitter, no creation date)
    assert [p.name for p in paths if p.read_bytes() != (out / p.name).read_bytes()] == []
    assert {"estimators.png", "mass_capture.pdf", "within_vs_cross.png"} <= names
    assert main(["figures", str(tmp_path / "missing")]) == 2


def test_render_all_without_stats_json(tmp_path):
    run = make_run_dir(tmp_path / "run", figures=False, report=False, n_boot=20)
    (run / "stats.json").unlink()
    paths = plots.render_all(run, to=tmp_path / "f")
    assert {p.stem for p in paths} == set(plots.FIGURES) - {"update_fidelity", "decomposition_slices"}  # no slices
    assert np.all([p.stat().st_size > 0 for p in paths])


def test_rl_figure_renders_to_the_same_bytes_twice(tmp_path):
    from gmts_analysis.rl.plots import plot_final_pass1

    res = {"summary": {"all": {"mean": {"values": [0.2, 0.3]}}, "gmts": {"mean": {"values": [0.25, 0.35]}}},
           "seeds": [0, 1], "initial_pass1": {"x": 0.1}}
    p1 = plot_final_pass1({"cond": res}, tmp_path / "r1.png").read_bytes()
    assert p1 == plot_final_pass1({"cond": res}, tmp_path / "r2.png").read_bytes()


def test_hexbin_draws_what_it_names_and_within_vs_cross_has_the_uncertain_row(tables):
    tokens, _, stats = tables
    fig = plots.fig_pooled_hexbin(tokens)
    title = fig.axes[0].get_title()
    assert "over all tokens" in title and "informative tokens" in title
    n_zero = int((tokens["grad_norm"] == 0).sum())
    if n_zero:
        assert f"{n_zero} with zero gradient (red rug)" in title
    wc = plots.fig_within_vs_cross(tokens, stats)
    assert len(wc.axes) == (4 if stats.get("uncertain", {}).get("within_answer") else 2)


# --- issue #31's figure defects, each drawn and measured -----------------------------------------------------


def _boxes(fig, texts):
    r = fig.canvas.get_renderer()
    return [t.get_window_extent(r) for t in texts if t.get_text() and t.get_visible()]


def _overlapping(boxes) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def _draw(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    return fig


def test_within_vs_cross_titles_fit_labels_do_not_meet_and_it_shows_medians(tables):
    from gmts_analysis.analysis.stats_types import Statistics

    tokens, _, stats = tables
    fig = _draw(plots.fig_within_vs_cross(tokens, stats))
    page = fig.bbox
    for ax in fig.axes:  # every panel title lies inside the figure (the uncertain row's was clipped)
        for b in _boxes(fig, [ax.title]):
            assert page.x0 - 1 <= b.x0 and b.x1 <= page.x1 + 1, ax.get_title()
    for ax in fig.axes:  # the values written beside the points never run into each other
        assert not _overlapping(_boxes(fig, ax.texts)), [t.get_text() for t in ax.texts]
    st = Statistics.coerce(stats)
    within = fig.axes[0]  # the numbers written are the medians the summary prints, and the legend says so
    written = {t.get_text() for t in within.texts}
    for s in plots.WITHIN_CROSS_ESTIMATORS:
        e = st.within_answer.get(s)
        if e is not None and np.isfinite(e.median):
            assert f"{e.median:.3f}" in written
    legend = " ".join(t.get_text() for t in fig.legends[0].get_texts())
    assert "median over answers" in legend and "mean over answers (95% CI)" in legend


def test_estimators_axis_labels_fit_and_every_score_has_its_own_colour(tables):
    from gmts_analysis.core.scores import SCORE_COLORS, NameView, score_color

    tokens, _, stats = tables
    fig = _draw(plots.fig_estimators(tokens, stats))
    for ax in fig.axes:
        assert not _overlapping(_boxes(fig, ax.get_xticklabels())), [t.get_text() for t in ax.get_xticklabels()]
    names = list(NameView(lambda s: True))  # every registered score
    assert set(names) <= set(SCORE_COLORS), "a built-in score without its colour"
    colours = [score_color(s) for s in names]
    assert len(set(colours)) == len(colours), dict(zip(names, colours))  # entropy_inf was gmts_head's red
    assert score_color("oracle") not in colours and score_color("my_score", 0) not in colours


def test_mass_capture_claims_cis_only_where_it_draws_them(tables):
    """Issue 46: mass_capture.png's title said "95% CIs" for a run without any (too small for an interval, or
    --n-boot 0: ``mass_capture_ci`` empty), drawing none."""
    from matplotlib.collections import LineCollection

    _, _, stats = tables

    def bars(fig) -> int:  # error bars drawn with a finite extent
        segs = [s for ax in fig.axes for c in ax.collections if isinstance(c, LineCollection) for s in c.get_segments()]
        return sum(1 for s in segs if np.isfinite(s).all() and len(s) > 1 and s[0][1] != s[1][1])

    with_ci = plots.fig_mass_capture(stats)
    assert "95% CIs" in with_ci._suptitle.get_text() and bars(with_ci) > 0
    none = plots.fig_mass_capture(dict(stats, mass_capture_ci={}))
    assert "95% CI" not in none._suptitle.get_text() and "no interval" in none._suptitle.get_text()
    assert bars(none) == 0
