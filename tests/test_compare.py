"""gmts compare: three hand-built runs with a known trend come out ordered by checkpoint with the
trend and CIs in the table; a settings mismatch is flagged (outputs and stderr); figures and a
self-contained, escaped HTML page are written; bad input is a one-line error."""

from __future__ import annotations

import json
import logging
import math

import pandas as pd
import pytest

from gmts_analysis.views.compare import compare_runs, flatten_stats, run_step, stat_rows, write_comparison

ESTIMATORS = ("entropy", "gmts", "gmts_lgn")


def _stats(k: int) -> dict:
    """A stats.json (version-2 keys) whose values move linearly with k."""
    s: dict = {"meta": {"ci_unit": "group", "n_boot": 100}, "zero_advantage": {"answers": 2 + k, "groups": k,
               "tokens": 10 * k, "token_share": 0.1 * k}}
    for blk in ("cross_answer", "cross_answer_informative"):
        s[blk] = {e: {"spearman": 0.5 + 0.1 * k + 0.01 * i, "kendall": 0.3, "n_tokens": 100,
                      "ci_low": 0.45 + 0.1 * k + 0.01 * i, "ci_high": 0.55 + 0.1 * k + 0.01 * i}
                  for i, e in enumerate(ESTIMATORS)}
    s["within_answer"] = {e: {"median": 0.9, "mean": 0.8 - 0.1 * k, "q25": 0.7, "q75": 0.95, "n_answers": 10,
                              "ci_low": 0.75 - 0.1 * k, "ci_high": 0.85 - 0.1 * k} for e in ESTIMATORS}
    s["selection_waste"] = {"batch": {e: {"0.05": 0.2 * k if e == "entropy" else 0.0, "0.2": 0.1 * k}
                                      for e in ESTIMATORS}}
    s["selection_waste_ci"] = {"batch": {e: {"0.2": {"ci_low": 0.1 * k - 0.05, "ci_high": 0.1 * k + 0.05}}
                                         for e in ESTIMATORS}}
    s["update_fidelity"] = {"gmts": {"cosine": 0.9, "norm_ratio": 0.8}, "all": {"cosine": 1.0, "norm_ratio": 1.0}}
    return s


def _manifest(model: str, **cfg) -> dict:
    base = {"model": model, "rollouts": "r.jsonl", "out": "/somewhere", "temperature": 1.0, "advantage": "group",
            "loss_agg": "token-mean", "clip_low": 0.2, "clip_high": 0.28, "grad_norm": "exact", "seed": 0,
            "quiet": True}
    base.update(cfg)
    return {"config": base, "model_path": model, "versions": {}}


def _write(d, stats, manifest):
    d.mkdir(parents=True)
    (d / "stats.json").write_text(json.dumps(stats))
    (d / "manifest.json").write_text(json.dumps(manifest))
    return d


def _three(tmp_path):
    root = tmp_path / "runs"
    # written out of order; the checkpoint numbers in the model path give the steps
    for k, step in [(2, 300), (0, 100), (1, 200)]:
        _write(root / f"probe-{chr(99 - k)}", _stats(k), _manifest(f"/ckpts/checkpoint-{step}"))
    return root


def test_three_runs_known_trend(tmp_path):
    cmp = compare_runs([_three(tmp_path)])
    assert cmp.x_label == "step" and [r["x"] for r in cmp.runs] == [100, 200, 300]
    assert {r["x_source"] for r in cmp.runs} == {"checkpoint path"}
    assert cmp.mismatches == [] and {r["settings"] for r in cmp.runs} == {"A"}
    t = cmp.table
    for e, i in zip(ESTIMATORS, range(3)):
        d = t[t["statistic"] == f"cross_answer_informative.{e}.spearman"].sort_values("x")
        assert list(d["x"]) == [100, 200, 300]
        assert d["value"].tolist() == pytest.approx([0.5 + 0.01 * i, 0.6 + 0.01 * i, 0.7 + 0.01 * i])
        assert d["ci_low"].tolist() == pytest.approx([0.45 + 0.01 * i, 0.55 + 0.01 * i, 0.65 + 0.01 * i])
        assert (d["estimator"] == e).all() and (d["series"] == "cross_answer_informative.*.spearman").all()
        w = t[t["statistic"] == f"within_answer.{e}.mean"].sort_values("x")
        assert w["value"].tolist() == pytest.approx([0.8, 0.7, 0.6])  # falls as training goes on
        assert w["ci_high"].tolist() == pytest.approx([0.85, 0.75, 0.65])
    z = t[t["statistic"] == "zero_advantage.token_share"].sort_values("x")
    assert z["value"].tolist() == pytest.approx([0.0, 0.1, 0.2]) and z["estimator"].eq("").all()
    sw = t[t["statistic"] == "selection_waste.batch.entropy.0.2"].sort_values("x")
    assert sw["value"].tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert sw["ci_low"].tolist() == pytest.approx([-0.05, 0.05, 0.15])  # from selection_waste_ci
    assert not t["statistic"].str.startswith("selection_waste_ci").any()
    # the median has no CI (the CI is of the mean); counts are statistics too, without CIs
    med = t[t["statistic"] == "within_answer.gmts.median"]
    assert med["ci_low"].isna().all()
    # every numeric leaf of stats.json is in the table (minus the CI leaves)
    n_leaves = sum(1 for p in flatten_stats(_stats(0)) if p[-1] not in ("ci_low", "ci_high"))
    assert t["statistic"].nunique() == n_leaves


def test_outputs_files_figures_and_html(tmp_path):
    cmp = compare_runs([_three(tmp_path)])
    out = tmp_path / "cmp"
    write_comparison(cmp, out)
    back = pd.read_parquet(out / "compare.parquet")
    assert len(back) == len(cmp.table)
    js = json.loads((out / "compare.json").read_text())
    assert js["x_label"] == "step" and len(js["rows"]) == len(cmp.table) and js["settings_mismatch"] == []
    pngs = sorted(p.name for p in (out / "figures").glob("*.png"))
    assert "cross_answer_informative.all.spearman.png" in pngs and "selection_waste.batch.all.0.2.png" in pngs
    assert all((out / "figures" / p).stat().st_size > 2000 for p in pngs)
    page = (out / "compare.html").read_text()
    assert page.count("data:image/png;base64,") == len(pngs)
    assert "http://" not in page and "https://" not in page and "<script" not in page


def test_settings_mismatch_flagged_and_text_escaped(tmp_path, caplog):
    root = _three(tmp_path)
    _write(root / "probe-z", _stats(3), _manifest("/ckpts/checkpoint-400<script>", temperature=0.7,
                                                  grad_norm="sketch"))
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.views.compare"):
        cmp = compare_runs([root])
    keys = {m["key"] for m in cmp.mismatches}
    assert keys == {"temperature", "grad_norm"}
    temp = next(m for m in cmp.mismatches if m["key"] == "temperature")
    assert temp["values"]["probe-z"] == 0.7 and temp["values"]["probe-a"] == 1.0
    groups = {r["run"]: r["settings"] for r in cmp.runs}
    assert groups["probe-z"] != groups["probe-a"] == groups["probe-b"]
    assert any("different settings" in r.message and "temperature" in r.message for r in caplog.records)
    out = tmp_path / "cmp"
    write_comparison(cmp, out, figures=False)
    page = (out / "compare.html").read_text()
    assert "different settings" in page and "&lt;script&gt;" in page and "<script" not in page
    assert json.loads((out / "compare.json").read_text())["settings_mismatch"]


def test_step_sources_and_order_fallback(tmp_path):
    assert run_step({"step": 7, "config": {"model": "x/checkpoint-9"}}) == (7, "manifest")
    assert run_step({"config": {"model": "runs/ckpt_250"}}) == (250, "checkpoint path")
    assert run_step({"model_path": "/a/global_step40/actor", "config": {}}) == (40, "checkpoint path")
    assert run_step({"config": {"model": "small"}}) == (None, "order")
    a = _write(tmp_path / "zz", _stats(0), _manifest("small"))
    b = _write(tmp_path / "aa", _stats(1), _manifest("tiny"))
    cmp = compare_runs([a, b])  # given order, not name order
    assert cmp.x_label == "run" and [r["run"] for r in cmp.runs] == ["zz", "aa"]


def test_generic_stats_any_estimator():
    rows = stat_rows({"cross_answer": {"my_score": {"spearman": 0.3, "ci_low": 0.1, "ci_high": 0.5}},
                      "new_block": {"my_score": {"value": 2.0, "ci_low": 1.0, "ci_high": 3.0}}}, ["my_score"])
    by = {r["statistic"]: r for r in rows}
    assert by["cross_answer.my_score.spearman"]["ci_high"] == 0.5
    assert by["new_block.my_score.value"]["ci_low"] == 1.0 and by["new_block.my_score.value"]["series"] == "new_block.*.value"
    assert math.isnan(rows[0]["ci_low"]) is False


def test_cli_end_to_end_and_bad_input(tmp_path, capsys):
    from gmts_analysis.cli import main

    root = _three(tmp_path)
    assert main(["compare", str(root), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    assert (tmp_path / "o" / "compare.html").exists()
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gmts: error:") and "missing" in err[0]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "stats.json").write_text("{not json")
    (bad / "manifest.json").write_text("{}")
    assert main(["compare", str(bad), "--out", str(tmp_path / "o3")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stats.json" in err[0]


def test_probe_over_checkpoints_one_run_each_and_the_comparison(tmp_path, capsys):
    """gmts probe --model DIR (a directory of checkpoints): one run per checkpoint on the same
    rollouts, steps from the checkpoint names, the comparison in OUT/compare; and the same with a
    comma-separated --model list."""
    from gmts_analysis.cli import main
    from gmts_analysis.toy.testing import save_tiny_model

    ck = tmp_path / "ckpts"
    for step, seed in [(20, 1), (10, 0)]:
        save_tiny_model("qwen2", ck / f"checkpoint-{step}", seed=seed)
    rows = []
    for g in range(2):
        for a in range(3):
            rows.append({"prompt_ids": [1, 5 + g, 7, 9], "response_ids": [10 + a, 11, 12 + g, 13, 14, 2],
                         "reward": float((a + g) % 2), "group_id": f"g{g}"})
    roll = tmp_path / "r.jsonl"
    roll.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "series"
    rc = main(["probe", "--model", str(ck), "--rollouts", str(roll), "--out", str(out), "--no-figures", "--quiet",
              "--fidelity", "off"])
    assert rc == 0
    for step in (10, 20):
        m = json.loads((out / f"checkpoint-{step}" / "manifest.json").read_text())
        assert m["step"] == step and m["checkpoint"].endswith(f"checkpoint-{step}")
        assert (out / f"checkpoint-{step}" / "stats.json").exists()
    js = json.loads((out / "compare" / "compare.json").read_text())
    assert js["x_label"] == "step" and [r["x"] for r in js["runs"]] == [10, 20]
    assert {r["x_source"] for r in js["runs"]} == {"manifest"} and js["settings_mismatch"] == []
    # two different models on the same rollouts: the statistics differ between the runs
    t = pd.read_parquet(out / "compare" / "compare.parquet")
    g = t[t["statistic"] == "cross_answer.entropy.spearman"].sort_values("x")["value"].tolist()
    assert len(g) == 2 and g[0] != g[1]
    # a comma-separated list gives the same steps
    out2 = tmp_path / "series2"
    models = f"{ck / 'checkpoint-10'},{ck / 'checkpoint-20'}"
    assert main(["probe", "--model", models, "--rollouts", str(roll), "--out", str(out2), "--no-figures", "-q",
                 "--fidelity", "off"]) == 0
    js2 = json.loads((out2 / "compare" / "compare.json").read_text())
    assert [r["x"] for r in js2["runs"]] == [10, 20]


def test_identical_runs_compare_equal_inputs_apart_from_settings(tmp_path, caplog):
    """Two identical `gmts run`s: their rollouts live in their own directories (different paths, same
    content), other --out, other threads: no settings mismatch. Other rollouts content is an input
    difference (logged, in runs[i]['inputs']), not a setting."""
    import logging

    fp = {"rollouts_sha256": "ab" * 32}
    a = _manifest("/m", rollouts="/runs/a/rollouts.jsonl", out="/runs/a", threads=1, aliases={})
    b = _manifest("/m", rollouts="/runs/b/rollouts.jsonl", out="/runs/b", threads=2, aliases={"--group-size": "x"})
    _write(tmp_path / "a", _stats(0), {**a, "run_fingerprint": fp})
    _write(tmp_path / "b", _stats(0), {**b, "run_fingerprint": fp})
    cmp = compare_runs([tmp_path / "a", tmp_path / "b"])
    assert cmp.mismatches == [] and {r["settings"] for r in cmp.runs} == {"A"}
    assert [r["inputs"] for r in cmp.runs] == [fp, fp]
    _write(tmp_path / "c", _stats(1), {**b, "run_fingerprint": {"rollouts_sha256": "cd" * 32}})
    with caplog.at_level(logging.INFO, logger="gmts_analysis.views.compare"):
        cmp = compare_runs([tmp_path / "a", tmp_path / "c"])
    assert cmp.mismatches == [] and "probed different rollouts" in caplog.text


def test_series_figure_whole_number_axis_and_one_colour_per_score(tmp_path):
    """Issue #31: the run axis showed 0.5, 1.5, ...; entropy and head_grad_norm were both blue."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from gmts_analysis.core.scores import score_color
    from gmts_analysis.views.compare import series_figure

    rows = [{"run": f"r{x}", "x": x, "statistic": f"cross_answer.{e}.spearman", "block": "cross_answer",
             "estimator": e, "series": "cross_answer.*.spearman", "value": 0.1 * x + 0.01 * len(e), "ci_low": None,
             "ci_high": None, "settings": "A"} for x in (0, 1, 2) for e in ("entropy", "head_grad_norm", "gmts")]
    fig = series_figure(pd.DataFrame(rows), "cross_answer.*.spearman", "run")
    FigureCanvasAgg(fig).draw()
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    colours = {ln.get_label(): ln.get_color() for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert colours == {e: score_color(e) for e in ("entropy", "head_grad_norm", "gmts")}
    assert len(set(colours.values())) == 3


def test_a_setting_an_old_run_does_not_record_is_its_default(tmp_path):
    """An older run lacks uncertain_below (its default, 0.9, was used): it matches a newer run that records
    0.9 (no false mismatch), and a run made with another value is still flagged."""
    root = tmp_path / "runs"
    _write(root / "old", _stats(0), _manifest("/ckpts/checkpoint-100"))
    _write(root / "new", _stats(1), _manifest("/ckpts/checkpoint-200", uncertain_below=0.9))
    cmp = compare_runs([root])
    assert cmp.mismatches == [] and {r["settings"] for r in cmp.runs} == {"A"}
    _write(root / "other", _stats(2), _manifest("/ckpts/checkpoint-300", uncertain_below=0.5))
    cmp = compare_runs([root])
    assert [m["key"] for m in cmp.mismatches] == ["uncertain_below"]
    assert cmp.mismatches[0]["values"] == {"old": 0.9, "new": 0.9, "other": 0.5}


def test_the_base_model_without_a_step_is_step_0_wherever_listed(tmp_path, caplog):
    """A series of checkpoints with the base model added (no step in its name) puts the base at step 0, given
    first or last; before, the warning 'some runs have no step' made every run fall back to the given order."""
    base = _write(tmp_path / "base", _stats(0), _manifest("/models/SmolLM2-135M-Instruct"))
    c1 = _write(tmp_path / "c1", _stats(1), _manifest("/out/checkpoint-10"))
    c3 = _write(tmp_path / "c3", _stats(2), _manifest("/out/checkpoint-30"))
    for order in ([base, c1, c3], [c3, c1, base]):
        caplog.clear()
        cmp = compare_runs(order)
        assert cmp.x_label == "step" and [(r["run"], r["x"]) for r in cmp.runs] == [("base", 0), ("c1", 10),
                                                                                     ("c3", 30)]
        assert "no step" not in " ".join(r.message for r in caplog.records if r.levelname == "WARNING")
    two = _write(tmp_path / "other", _stats(0), _manifest("small"))  # two runs without a step: the given order
    assert compare_runs([c1, base, two]).x_label == "run"


def _small(k: int) -> dict:
    """A run too small for an interval (4 groups, 3 informative, 10 needed): no CI anywhere, as stats.json has it."""
    s = _stats(k)
    s["meta"].update({"n_groups": 4, "n_ci_units": 4, "min_groups": 10, "n_answers": 8, "n_tokens": 100})
    s["zero_advantage"].update({"groups": 1, "informative_units": 3})
    for blk in ("cross_answer", "cross_answer_informative", "within_answer"):
        for v in s[blk].values():
            v["ci_low"] = v["ci_high"] = None
    del s["selection_waste_ci"]
    return s


def test_small_runs_carry_their_caution_and_claim_no_interval(tmp_path, caplog):
    """#36: the comparison's header said "value [95% CI]" and its y-axis "95% CI band" with no interval drawn
    (every run too small for one), and it gave no "too small" caution where each run's own summary does."""
    from gmts_analysis.views.compare import series_figure

    root = tmp_path / "runs"
    for k, step in [(0, 1), (1, 2)]:
        _write(root / f"checkpoint-{step}", _small(k), _manifest(f"/ckpts/checkpoint-{step}"))
    with caplog.at_level(logging.WARNING, logger="gmts_analysis.views.compare"):
        cmp = compare_runs([root])
    out = tmp_path / "cmp"
    write_comparison(cmp, out)
    page = (out / "compare.html").read_text()
    assert "value [95% CI]" not in page and "values only: no run has an interval" in page
    caution = ("Too small to compare: 3 informative groups (of 4), fewer than the 10 a bootstrap interval needs "
               "(meta.min_groups)")
    assert "<b>Too small to compare</b> (every run)" in page and html_escape(caution) in page
    assert "none: too small (3 informative of 4, 10 needed)" in page
    assert "0.500\u2020" in page  # cross_answer.entropy.spearman of the first run, marked a point estimate
    ax = series_figure(cmp.table, "cross_answer_informative.*.spearman", cmp.x_label, cmp.figure_estimators,
                       list(cmp.too_small)).axes[0]
    assert ax.get_ylabel() == "value (no interval)" and "too small for an interval" in ax.get_title()
    assert not ax.collections  # no band, no bars
    assert cmp.too_small == {"checkpoint-1": caution, "checkpoint-2": caution}
    assert json.loads((out / "compare.json").read_text())["too_small"] == cmp.too_small
    assert sum("Too small to compare" in r.message for r in caplog.records) == 2
    # the run summary's own words
    from gmts_analysis.analysis.summary import findings, too_small_caution

    assert too_small_caution(_small(0)) == caution and any(s.startswith(caution) for s in findings(_small(0)))


def html_escape(text: str) -> str:
    import html

    return html.escape(text)


def test_intervals_are_shown_and_figures_draw_the_headline_estimators(tmp_path):
    """#36: the table shows each value's 95% CI where stats.json has it, every figure draws it (bars and band),
    and a figure draws the few headline estimators (Score.headline) while the table keeps every one."""
    from gmts_analysis.core.scores import HEADLINE_SCORES
    from gmts_analysis.views.compare import series_figure

    cmp = compare_runs([_three(tmp_path)])
    assert cmp.too_small == {}
    heads = [e for e in ESTIMATORS if e in HEADLINE_SCORES]
    assert cmp.figure_estimators == heads and len(heads) < len(ESTIMATORS)
    out = tmp_path / "cmp"
    write_comparison(cmp, out)
    page = (out / "compare.html").read_text()
    assert "value [95% CI] where the run has one" in page and "Too small to compare" not in page
    assert "<td>0.500 [0.450, 0.550]</td>" in page  # cross_answer.entropy.spearman of the first run
    assert all(f"cross_answer.{e}.spearman" in page for e in ESTIMATORS)  # the table: every estimator
    assert json.loads((out / "compare.json").read_text())["figure_estimators"] == heads
    fig = series_figure(cmp.table, "cross_answer_informative.*.spearman", cmp.x_label, cmp.figure_estimators)
    ax = fig.axes[0]
    drawn = {ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert drawn == set(heads)
    assert ax.get_ylabel() == "value (bars, band: 95% CI)"
    assert len(ax.collections) == 2 * len(heads)  # per estimator: its error bars and its band
    assert "1 more in compare.html's table" in ax.get_title()


def _series_rows(xs, values: dict, series: str = "cross_answer.*.spearman") -> pd.DataFrame:
    """Rows of one series: ``values[estimator]`` one value per x (None: NaN), no interval."""
    return pd.DataFrame([{"run": f"step-{x:05d}", "x": x, "statistic": series.replace("*", e), "block": "cross_answer",
                          "estimator": e, "series": series, "value": v, "ci_low": None, "ci_high": None,
                          "settings": "A"} for e, vs in values.items() for x, v in zip(xs, vs)])


def test_series_figure_title_fits_inside_the_figure():
    """Issue 46: the second title line (the too-small runs, the estimators left out) was cut at both edges."""
    from gmts_analysis.views.compare import series_figure

    xs = list(range(0, 100, 10))
    table = _series_rows(xs, {e: [0.1 * i for i in range(len(xs))] for e in ("entropy", "entropy_inf", "gmts",
                                                                              "surprisal", "rsi")})
    fig = series_figure(table, "cross_answer.*.spearman", "step", ["entropy", "entropy_inf", "gmts"],
                        too_small=[f"step-{x:05d}" for x in xs])
    renderer = fig.canvas.get_renderer()
    title = fig.axes[0].title
    assert "too small for an interval" in title.get_text() and "2 more in compare.html" in title.get_text()
    box, page = title.get_window_extent(renderer), fig.bbox
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and box.y1 <= page.y1, (box, page)


def test_series_figure_shows_identical_lines_and_says_so():
    """Issue 46: entropy_inf was listed in the legend but hidden under the identical gmts line, with nothing
    saying so. The later of two identical lines is dashed with hollow square markers and labelled."""
    from gmts_analysis.views.compare import series_figure

    table = _series_rows([0, 10, 20], {"entropy": [0.1, 0.2, 0.3], "entropy_inf": [None, 0.9, 0.95],
                                       "gmts": [None, 0.9, 0.95]})
    ax = series_figure(table, "cross_answer.*.spearman", "step").axes[0]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["entropy", "entropy_inf", "gmts (identical to entropy_inf)"]
    twin = next(ln for ln in ax.get_lines() if ln.get_label().startswith("gmts"))
    assert twin.get_linestyle() == "--"
    squares = [ln for ln in ax.get_lines() if ln.get_marker() == "s" and len(ln.get_xdata())]
    assert squares and all(ln.get_markerfacecolor() == "none" for ln in squares)
    different = _series_rows([0, 10, 20], {"entropy_inf": [None, 0.9, 0.95], "gmts": [None, 0.9, 0.96]})
    labels = [t.get_text() for t in series_figure(different, "cross_answer.*.spearman", "step").axes[0]
              .get_legend().get_texts()]
    assert labels == ["entropy_inf", "gmts"]


@pytest.mark.parametrize("xs", [[0, 10], [0, 10, 30], list(range(0, 500, 20))])
def test_series_figure_ticks_only_at_checkpoints(xs):
    """Issue 46: the x axis had ticks at steps with no checkpoint (9.45, 9.60, ... around a lone step 10 whose
    step 0 was NaN; 0, 5, 10, ... for steps 0, 10, 30). Every tick is a run's x, the axis spans every run."""
    from gmts_analysis.views.compare import MAX_X_TICKS, series_figure

    values = [None] + [0.5] * (len(xs) - 1)  # step 0 undefined, as in a run without mixed rewards
    ax = series_figure(_series_rows(xs, {"entropy": values, "gmts": values}), "cross_answer.*.spearman",
                       "step").axes[0]
    major, minor = list(ax.get_xticks()), list(ax.get_xticks(minor=True))
    assert set(major) <= set(xs) and set(minor) <= set(xs), (major, minor)
    assert major[0] == xs[0] and major[-1] == xs[-1] and len(major) <= MAX_X_TICKS
    assert ax.get_xlim()[0] < xs[0] and ax.get_xlim()[1] > xs[-1]
