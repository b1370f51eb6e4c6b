"""The inline notebook heatmap: hover fields, escaping (script, bidi, control), disagreement order."""

from __future__ import annotations

import re

import numpy as np
import pytest
from _synthetic import make_tables
from scipy.stats import rankdata

from gmts_analysis.errors import GmtsError
from gmts_analysis.views.notebook_view import TokenView, rank_disagreement, render_tokens_html, safe_text, show

PLANT = "<script>alert(1)</script>\u202egnp.exe"


@pytest.fixture(scope="module")
def tables():
    tokens, answers = make_tables(n_groups=4, group_size=4, seed=3, planted_token=PLANT)
    return tokens, answers


def _titles(html_text: str) -> list[str]:
    return re.findall(r'title="([^"]*)"', html_text)


def test_hover_fields_on_policy(tables):
    tokens, answers = tables
    h = render_tokens_html(tokens, answers, n=3)
    titles = _titles(h)
    assert titles
    for label in ("entropy", "grad_norm", "gmts", "omega", "logprob", "entropy keeps", "GMTS keeps"):
        assert all(label in t for t in titles), label
    for label in ("ratio", "ref_logprob", "KL term", "clipped"):  # on-policy: no such columns
        assert label not in h
    assert len(re.findall(r'class="gmts-t"', h)) == tokens[tokens["answer_id"].isin(
        rank_disagreement(tokens).head(3)["answer_id"])].shape[0]


def test_hover_fields_off_policy(tables):
    tokens, answers = tables
    t = tokens.copy()
    rng = np.random.default_rng(0)
    t["ratio"] = np.exp(rng.normal(0, 0.3, len(t)))
    t["ref_logprob"] = t["logprob"] + rng.normal(0, 0.1, len(t))
    t["kl_k3"] = np.exp(t["ref_logprob"] - t["logprob"]) - (t["ref_logprob"] - t["logprob"]) - 1
    t["clipped"] = t["ratio"] > 1.28
    h = render_tokens_html(t, answers, n=2)
    for label in ("ratio", "ref_logprob", "KL term (k3)", "clipped yes", "clipped no"):
        assert label in h, label
    # the value shown is the row's own value (4 significant digits)
    row = t[t["answer_id"] == rank_disagreement(t).iloc[0]["answer_id"]].sort_values("position").iloc[0]
    assert f"ratio {row['ratio']:.4g}" in _titles(h)[0]


def test_escaping(tables):
    tokens, answers = tables
    h = render_tokens_html(tokens, answers, n=len(answers))
    assert "<script" not in h.lower()
    assert "\u202e" not in h and "⟨U+202E⟩" in h
    assert "&lt;script&gt;" in h
    # every control / format character is shown, never emitted
    assert safe_text("a\x00b\u2066c\u200fd e\n") == "a⟨U+0000⟩b⟨U+2066⟩c⟨U+200F⟩d␣e↵"
    assert safe_text('"\'&') == "&quot;&#x27;&amp;"


def test_rank_disagreement_matches_explicit_loop(tables):
    tokens, _ = tables
    d = rank_disagreement(tokens, informative_first=False)
    re_ = rankdata(tokens["entropy"]) / len(tokens)
    rg = rankdata(tokens["gmts"]) / len(tokens)
    diff = np.abs(re_ - rg)
    for aid, v in zip(d["answer_id"], d["rank_disagreement"]):
        assert v == pytest.approx(diff[(tokens["answer_id"] == aid).to_numpy()].mean(), abs=1e-12)
    assert d["rank_disagreement"].is_monotonic_decreasing
    # informative answers first: the all-zero-omega answers come after every informative one
    d2 = rank_disagreement(tokens)
    inf = d2["informative"].to_numpy()
    assert not (np.diff(inf.astype(int)) > 0).any()


def test_order_and_options(tables):
    tokens, answers = tables
    top = rank_disagreement(tokens).head(2)["answer_id"].tolist()
    h = render_tokens_html(tokens, answers, n=2)
    assert re.findall(r"<b>answer (\d+)</b>", h) == [str(a) for a in top]
    h2 = render_tokens_html(tokens, answers, answer_ids=[5, 1], max_tokens=4)
    assert re.findall(r"<b>answer (\d+)</b>", h2) == ["5", "1"]
    assert "first 4 of" in h2 and h2.count('class="gmts-t"') == 8
    with pytest.raises(GmtsError):
        render_tokens_html(tokens, answers, answer_ids=[10_000])
    with pytest.raises(GmtsError):
        render_tokens_html(tokens, answers, colour="surprise")
    # selections marked: top-rho of the batch by entropy = underlined tokens
    h_all = render_tokens_html(tokens, answers, n=len(answers), max_tokens=10_000, rho=0.1)
    n_under = h_all.count("border-bottom:3px solid #1f77b4")
    assert n_under == int(np.ceil(0.1 * len(tokens) - 1e-9))


def test_show_uses_run_rho_and_repr(tables):
    tokens, answers = tables

    class R:  # anything with tokens/answers/manifest (the API's Run, plots.Run)
        pass

    r = R()
    r.tokens, r.answers, r.manifest = tokens, answers, {"config": {"rho": 0.05}}
    v = show(r, n=1)
    assert isinstance(v, TokenView) and v._repr_html_() == v.html
    assert "top 0.05" in v.html


def test_off_policy_fields_end_to_end(tiny_model_dirs, tmp_path):
    """A probe given old and reference log-probs: ratio, clip state, reference log-prob and k3 KL in the
    tokens table (checked against the definitions), on hover in report.html and in the inline view."""
    import json

    import pandas as pd
    from conftest import make_rollouts

    from gmts_analysis.cli import main

    r = make_rollouts(tmp_path / "r.jsonl")
    rng = np.random.default_rng(1)
    rows = [json.loads(x) for x in r.read_text().splitlines()]
    for row in rows:
        n = len(row["response_ids"])
        row["old_logprobs"] = (-rng.uniform(0.5, 6.0, n)).tolist()
        row["ref_logprobs"] = (-rng.uniform(0.5, 6.0, n)).tolist()
    r.write_text("".join(json.dumps(x) + "\n" for x in rows))
    out = tmp_path / "run"
    assert main(["probe", "--model", str(tiny_model_dirs["qwen2"]), "--rollouts", str(r), "--out", str(out),
                 "--device", "cpu", "-q", "--grad-norm", "none", "--fidelity", "off", "--epsilon", "0.2",
                 "--epsilon_high", "0.28"]) == 0
    t = pd.read_parquet(out / "tokens.parquet")
    old = np.concatenate([x["old_logprobs"] for x in rows])
    ref = np.concatenate([x["ref_logprobs"] for x in rows])
    by_id = {x["answer_id"]: i for i, x in enumerate(rows)}
    t = t.sort_values(["answer_id", "position"], key=lambda c: c.map(by_id) if c.name == "answer_id" else c)
    ratio = np.exp(t["logprob"].to_numpy() - old)
    np.testing.assert_allclose(t["ratio"].to_numpy(), ratio, rtol=1e-9)
    np.testing.assert_allclose(t["ref_logprob"].to_numpy(), ref, rtol=0, atol=0)
    x = ref - t["logprob"].to_numpy()
    np.testing.assert_allclose(t["kl_k3"].to_numpy(), np.exp(x) - x - 1, rtol=1e-12)
    A = t["advantage"].to_numpy()
    flat = ((A > 0) & (ratio > 1.28)) | ((A < 0) & (ratio < 0.8))
    assert (t["clipped"].to_numpy() == flat).all() and flat.any() and (~flat).any()
    assert (t.loc[t["clipped"], "omega"] == 0).all()  # a clipped token carries no policy gradient (kl_beta 0)
    html_text = (out / "report.html").read_text(encoding="utf-8")
    for label in ('data-label="ratio"', 'data-label="ref logprob"', 'data-label="KL term (k3)"',
                  'data-label="clipped"', "data-ra=", "data-rl=", "data-kl=", 'data-cl="yes"', 'data-cl="no"'):
        assert label in html_text, label
    view = render_tokens_html(t, None, n=3)
    for label in ("ratio", "ref_logprob", "KL term (k3)", "clipped"):
        assert label in view


def test_run_show_and_repr_html(tables, tmp_path):
    """The API's Run displays itself in a notebook: a header and the heatmap, with the run's rho."""
    from gmts_analysis.analysis.stats import compute_stats
    from gmts_analysis.api import Run

    tokens, answers = tables
    run = Run(tokens=tokens, answers=answers, stats=compute_stats(tokens, answers, n_boot=0, rho=0.1),
              manifest={"config": {"rho": 0.1}})
    h = run._repr_html_()
    assert h.startswith("<div><b>Run(") and 'class="gmts-view"' in h and "top 0.1" in h
    assert "<script" not in h.lower() and "\u202e" not in h
    v = run.show(2, colour="entropy")
    assert len(re.findall(r"<b>answer ", v.html)) == 2 and "Background: entropy" in v.html
