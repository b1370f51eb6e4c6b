"""report.html: self-contained, escaped, ordered by disagreement, renders in a real headless browser."""

from __future__ import annotations

import re

import pytest
from _browser import Browser, find_browser
from _synthetic import make_run_dir

from gmts_analysis.core.selection import answer_disagreement
from gmts_analysis.views.report import MAX_ANSWERS, PAGE_SIZE, write_report

PLANT = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    # 12 groups x 4 answers = 48 answers (more than one page); a planted hostile token in answer 0
    return make_run_dir(tmp_path_factory.mktemp("report") / "run", n_groups=12, planted_token=PLANT,
                        domains=("math", "logic"), n_boot=50)


def test_report_is_self_contained(run):
    text = (run / "report.html").read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    refs = re.findall(r"""(?:src|href)\s*=\s*["']?([^"'\s>]+)""", text, flags=re.IGNORECASE)
    assert refs, "expected images and anchors"
    for r in refs:
        assert r.startswith(("data:", "#")), f"external reference {r[:60]}"
    assert not re.search(r"<link\b", text, flags=re.IGNORECASE)
    assert "https://" not in text and "http://" not in text
    assert text.count("data:image/png;base64,") >= 5


def test_model_text_is_escaped(run):
    text = (run / "report.html").read_text(encoding="utf-8")
    assert PLANT not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "synthetic <b>model</b>" not in text and "synthetic &lt;b&gt;model&lt;/b&gt;" in text
    assert text.count("<script>") == 1  # only the report's own script


def test_audit_order_and_limit(run):
    from gmts_analysis.views.plots import load_run

    text = (run / "report.html").read_text(encoding="utf-8")
    shown = re.findall(r'<div class="answer" data-aid="([^"]+)"', text)
    n = min(MAX_ANSWERS, 48)
    assert len(shown) == n and f"{n} of 48 answers" in text and f"{PAGE_SIZE} a page" in text
    d = answer_disagreement(load_run(run).tokens)
    assert shown == [str(a) for a in d["answer_id"].head(MAX_ANSWERS)]
    assert d["n_disagree"].is_monotonic_decreasing


def test_audit_says_what_it_leaves_out(run, tmp_path):
    text = write_report(run, out=tmp_path / "r.html", max_answers=10).read_text(encoding="utf-8")
    assert "10 of 48 answers" in text and "38 least disagreeing answers are not in this file" in text


def test_write_report_to_another_path(run, tmp_path):
    out = write_report(run, out=tmp_path / "r.html", max_answers=3)
    assert out == tmp_path / "r.html"
    assert len(re.findall(r'<div class="answer" ', out.read_text(encoding="utf-8"))) == 3


needs_browser = pytest.mark.skipif(find_browser() is None, reason="no chromium binary (see .ci/run)")


@needs_browser
def test_browser_checker_sees_errors(tmp_path):
    """The console checker itself must catch errors, exceptions and dialogs (else the next test proves nothing)."""
    bad = tmp_path / "bad.html"
    bad.write_text("<html><body><script>console.error('boom');alert(1);null.x;</script></body></html>")
    with Browser() as b:
        problems = b.open(bad).problems()
    text = " ".join(problems)
    assert "boom" in text and "dialog opened" in text and "uncaught" in text


@needs_browser
def test_report_renders_in_headless_chromium(run, tmp_path):
    with Browser() as b:
        page = b.open(run / "report.html")
        assert page.problems() == []
        assert page.eval("document.title").startswith("gmts report")
        assert page.eval("document.querySelectorAll('.answer').length") == min(MAX_ANSWERS, 48)
        visible = "Array.from(document.querySelectorAll('.answer')).filter(e => !e.hidden).length"
        assert page.eval(visible) == PAGE_SIZE  # paged
        assert page.eval("document.getElementById('pageinfo').textContent").startswith(f"answers 1-{PAGE_SIZE} of 48")
        page.eval("document.getElementById('next').click()")
        assert page.eval("document.getElementById('pageinfo').textContent").startswith(f"answers {PAGE_SIZE + 1}-")
        page.eval("var s=document.getElementById('search'); s.value='prompt of group g3:'; "
                  "s.dispatchEvent(new Event('input'))")
        assert page.eval(visible) == 4  # the four answers of group g3
        page.eval("var s=document.getElementById('search'); s.value=''; s.dispatchEvent(new Event('input'))")
        assert page.eval("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        assert page.eval("document.querySelectorAll('figure img').length") >= 5
        # the planted token is shown as text, not executed
        assert page.eval(f"Array.from(document.querySelectorAll('.t')).some(e => e.textContent === {PLANT!r})")
        page.eval("document.querySelector('.toks .t').click()")
        details = page.eval("document.getElementById('details').textContent")
        assert "entropy" in details and "GMTS keeps" in details and "answer" in details
        page.eval("document.querySelector('input[value=n]').click()")
        assert page.eval("document.querySelector('.toks .t').style.background").startswith("rgba(214, 39, 40")
        shot = page.screenshot(tmp_path / "report.png")
        assert shot.stat().st_size > 10_000
        assert page.problems() == []


def test_report_without_figures_manifest_or_gradients(tmp_path):
    """A bare run (tokens only, no gradient norms, no manifest, no figures) still gets a full report."""
    import numpy as np
    from _synthetic import make_tables

    from gmts_analysis.util.io import atomic_write_parquet
    from gmts_analysis.views.plots import render_all

    tokens, _ = make_tables(n_groups=2, group_size=3, seed=9)
    tokens["grad_norm_logp"] = np.nan
    tokens["grad_norm"] = np.nan
    atomic_write_parquet(tmp_path / "tokens.parquet", tokens)
    assert render_all(tmp_path)  # what can be drawn is drawn
    import shutil

    shutil.rmtree(tmp_path / "figures")
    text = write_report(tmp_path).read_text(encoding="utf-8")
    assert "No manifest.json" in text and text.count("data:image/png;base64,") >= 3
    assert len(re.findall(r'<div class="answer" ', text)) == 6


def test_report_says_what_the_run_shows(run):
    from gmts_analysis.analysis.runs import read_run
    from gmts_analysis.analysis.summary import findings
    from gmts_analysis.views.report import render_report

    html = render_report(run)
    st = read_run(run).stats
    assert 'id="findings"' in html and "Estimators ranked by agreement" in html
    import html as _html

    for sentence in findings(st):  # every generated sentence, escaped
        assert _html.escape(sentence, quote=True) in html


def test_getting_started_results_block_is_generated_from_the_example_run():
    """The toy run's block (the README's until issue 48) now lives in docs/getting_started.md."""
    import json
    from pathlib import Path

    from gmts_analysis.analysis.summary import README_BEGIN, README_END, readme_block

    root = Path(__file__).resolve().parent.parent
    run = root / "data" / "example_run"
    if not (run / "stats.json").exists():
        pytest.skip("no example run")
    stats = json.loads((run / "stats.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    readme = (root / "docs" / "getting_started.md").read_text()
    block = readme[readme.index(README_BEGIN): readme.index(README_END) + len(README_END)]
    assert block == readme_block(stats, manifest.get("domains"))


def test_quick_demo_block_is_generated_from_the_real_model_run():
    """The quick-demo block (docs/studies/smollm2.md, the README's until issue 48) is the committed 8-group
    SmolLM2 run's, rendered by the summary."""
    import json
    from pathlib import Path

    from gmts_analysis.analysis.summary import readme_block, readme_markers

    root = Path(__file__).resolve().parent.parent
    run = root / "data" / "smollm2_run"
    stats = json.loads((run / "stats.json").read_text())
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["grad_norm_method"] == "exact" and manifest["n_loop_answers"] == 0  # the engine on every answer
    begin, end = readme_markers("smollm2-135m", "data/smollm2_run/stats.json")
    readme = (root / "docs" / "studies" / "smollm2.md").read_text()
    block = readme[readme.index(begin): readme.index(end) + len(end)]
    assert block == readme_block(stats, manifest.get("domains"), "smollm2-135m", "data/smollm2_run/stats.json")


def test_smollm2_study_page_blocks_are_the_study():
    """The headline is the SmolLM2 study (issue #28), its generated blocks on docs/studies/smollm2.md (issue 48): at least 96 groups of 4, at least 90% of the answers
    finished, exact on every answer; its summary block is rendered from its stats.json, and its contrasts block is
    primary.md, which is the planned family read again from the committed stats files."""
    import importlib.util
    import json
    from pathlib import Path

    import pandas as pd

    from gmts_analysis.analysis.planned import family, markdown
    from gmts_analysis.analysis.summary import readme_block, readme_markers
    from gmts_analysis.util.markers import find_block

    root = Path(__file__).resolve().parent.parent
    study = root / "data" / "smollm2_study"
    spec = importlib.util.spec_from_file_location("smollm2_study_report",
                                                  root / "benchmarks" / "smollm2_study_report.py")
    study_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study_report)
    stats = json.loads((study / "run" / "stats.json").read_text())
    manifest = json.loads((study / "run" / "manifest.json").read_text())
    answers = pd.read_parquet(study / "run" / "answers.parquet")
    assert manifest["grad_norm_methods"] == {"exact": len(answers)} and manifest["n_loop_answers"] == 0
    assert answers["group_id"].nunique() >= 96 and answers.groupby("group_id").size().min() >= 4
    assert 1 - answers["truncated"].mean() >= 0.9
    assert stats["reward_audit"]["verifier"] == "math_boxed" and stats["meta"]["n_groups"] == 96
    readme = (root / "docs" / "studies" / "smollm2.md").read_text()
    begin, end = readme_markers("smollm2-study", "data/smollm2_study/run/stats.json")
    block = readme[readme.index(begin): readme.index(end) + len(end)]
    assert block == readme_block(stats, manifest.get("domains"), "smollm2-study", "data/smollm2_study/run/stats.json")
    texts = []
    for name, d in (("primary: math_boxed", study / "run"), ("sensitivity: math (fallback)", study / "math"),
                    ("sensitivity: truncated masked", study / "masked")):
        p005 = study / "stats_rho0.05.json" if d.name == "run" else d / "stats_rho0.05.json"
        by_rho = {"0.2": json.loads((d / "stats.json").read_text()), "0.05": json.loads(p005.read_text())}
        texts.append(markdown(family(by_rho, study_report.SMOLLM2_STUDY), name))
    primary = (study / "primary.md").read_text()
    assert primary == "\n\n".join(texts) + "\n"
    a, b, c, _ = find_block(readme, "gmts-results:smollm2-study-contrasts")
    assert readme[b:c].strip("\n") == primary.rstrip("\n")
    # the README's headline figure is this study's (the front page shows it; issue 48)
    front = (root / "README.md").read_text()
    assert "](data/smollm2_study/run/figures/within_vs_cross.png)" in front
