"""The words of a run follow its paired uncertainty: "beats" only where the paired CI excludes 0,
identities never stated as findings, small slices flagged; README blocks under named markers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gmts_analysis.analysis import stats as S
from gmts_analysis.analysis.summary import compare, findings, readme_block, summary_table, summary_text, update_readme


def noise_table(n_groups: int = 8, seed: int = 1, zero_groups: int = 0) -> pd.DataFrame:
    """Groups of 4 answers with |omega| equal everywhere (0 in the first ``zero_groups``) and
    scores unrelated to the gradient."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_groups):
        for a in range(4):
            for t in range(8):
                rows.append({"answer_id": f"{g}-{a}", "group_id": g, "position": t, "entropy": rng.random(),
                             "logprob": np.log(rng.uniform(0.05, 0.95)),
                             "omega": 0.0 if g < zero_groups else (0.5 if a % 2 else -0.5),
                             "grad_norm_logp": rng.random(), "domain": "d0" if g % 2 else "d1"})
    df = pd.DataFrame(rows)
    df["prob"] = np.exp(df["logprob"])
    return df


def test_compare_words_follow_the_paired_ci():
    block = {"paired_difference": {"within_answer": {
        "a": {"b": {"diff": 0.02, "ci_low": 0.01, "ci_high": 0.03, "p_le_0": 0.0},
              "c": {"diff": 0.02, "ci_low": -0.01, "ci_high": 0.05, "p_le_0": 0.2}},
        "d": {"b": {"diff": -0.02, "ci_low": -0.03, "ci_high": -0.01, "p_le_0": 1.0}},
        "e": {"b": {"diff": 0.0, "ci_low": float("nan"), "ci_high": float("nan"), "p_le_0": float("nan")}}}},
        "by_construction": [{"key": "paired_difference.within_answer.e.b", "equals": 0, "why": "..."}]}
    assert compare(block, "within_answer", "a", "b", 12).startswith("a beats b by +0.020 [+0.010, +0.030]")
    assert compare(block, "within_answer", "b", "a", 12).startswith("a beats b")  # the other way round
    assert compare(block, "within_answer", "d", "b", 12).startswith("b beats d by +0.020 [+0.010, +0.030]")
    assert compare(block, "within_answer", "a", "c", 12) == ("a and c are not distinguishable with 12 groups "
                                                            "(a - c = +0.020 [-0.010, +0.050])")
    assert compare(block, "within_answer", "e", "b", 12) == "e equals b by construction"
    assert compare(block, "within_answer", "x", "y", 12) == ""


def test_summary_never_says_beats_when_the_paired_ci_straddles_0():
    st = S.compute_stats(noise_table(), seed=0, n_boot=200, estimators=["entropy", "entropy_inf", "gmts",
                                                                        "one_minus_prob"], min_groups=1)
    # the premise: every paired CI the words could use includes 0
    for blk in (st, st["uncertain"]):
        for stat, per_s in blk["paired_difference"].items():
            for s, per_ref in per_s.items():
                for ref, d in per_ref.items():
                    lo, hi = d["ci_low"], d["ci_high"]
                    assert np.isnan(lo) or lo <= 0 <= hi, (stat, s, ref, d)
    text = summary_text(st)
    assert "beats" not in text
    assert "not distinguishable with 8 groups" in text
    assert "one checkpoint and one sampling seed" in text and "Only 8 groups" in text


def test_identities_are_not_findings():
    st = S.compute_stats(noise_table(zero_groups=2), seed=0, n_boot=50, estimators=["entropy", "entropy_inf", "gmts"], min_groups=1)
    keys = {e["key"] for e in st["by_construction"]}
    assert "selection_waste.batch.gmts.0.2" in keys and "within_answer.gmts" in keys
    words = " ".join(findings(st))
    assert "gmts 0%" not in words and "entropy_inf, gmts: none, by construction" in words
    # within answers gmts ranks like entropy by construction: said so, never as a statistical tie
    assert "gmts leads (" in words and "identical to it by construction: entropy, entropy_inf" in words


def test_small_slices_are_flagged():
    st = S.compute_stats(noise_table(), seed=0, n_boot=0, estimators=["entropy", "gmts"])
    table = summary_table(st)
    assert "d0*" in table and "fewer than 10 groups: d0 (4), d1 (4)" in table


def test_named_readme_blocks_render_side_by_side():
    st = S.compute_stats(noise_table(), seed=0, n_boot=0, estimators=["entropy", "gmts"])
    readme = ("# x\n" + readme_block({"meta": {}}) + "\ntext\n"
              "<!-- gmts-results:smollm2:begin (old) -->\nold\n<!-- gmts-results:smollm2:end -->\nend\n")
    out = update_readme(readme, st, name="smollm2", source="runs/smollm2/stats.json")
    assert "old" not in out and out.endswith("end\n") and out.count("gmts-results:smollm2:begin") == 1
    assert "generated from runs/smollm2/stats.json" in out and summary_text(st) in out
    out2 = update_readme(out, st)  # the original block is left where it is and replaced alone
    assert out2.index("gmts-results:begin") < out2.index("gmts-results:smollm2:begin")
    with pytest.raises(ValueError, match="markers"):
        update_readme(readme, st, name="other")
    with pytest.raises(ValueError, match="block name"):
        update_readme(readme, st, name="a b")
