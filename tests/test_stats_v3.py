"""Third-version statistics (docs/definitions.md, statistics) against explicit computations on
hand-built tables: scipy's weightedtau, hand sums of mass capture, an uncertain subset with a
known rho, paired differences recomputed by explicit resampling, identities labelled."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr, weightedtau
from test_stats import expand, hand_table

from gmts_analysis.analysis import stats as S
from gmts_analysis.core.estimators import add_estimator_columns
from gmts_analysis.core.selection import select_top

ESTS = ["entropy", "entropy_inf", "gmts", "abs_omega", "surprisal", "one_minus_prob", "one_minus_prob_inf"]


def table() -> pd.DataFrame:
    df = hand_table()
    df["prob"] = np.exp(df["logprob"])
    return df


@pytest.fixture(scope="module")
def st():
    return S.compute_stats(table(), seed=3, n_boot=60, estimators=ESTS, uncertain_below=0.5, min_groups=1)


def test_masked_baselines_are_the_score_times_the_informative_indicator():
    df = add_estimator_columns(pd.DataFrame({"entropy": [1.0, 2.0, 3.0, 4.0], "prob": [0.5, 0.2, 0.1, 0.9],
                                             "omega": [0.0, 0.5, np.nan, -0.1]}))
    assert list(df["entropy_inf"]) == [0.0, 2.0, 0.0, 4.0]
    assert list(df["one_minus_prob_inf"]) == pytest.approx([0.0, 0.8, 0.0, 0.1])


def test_weighted_tau_and_top1_match_scipy_per_answer(st):
    df = S.prepare_tokens(table())
    within = S.within_values(df, ESTS, "answer_id", S.TARGET_WITHIN, S.informative_mask(df))
    for s in ("entropy", "surprisal", "abs_omega"):
        wts, tops = [], []
        for aid in within["answer_id"]:
            a = df[df["answer_id"] == aid]
            x, y = a[s].to_numpy(), a["grad_norm_logp"].to_numpy()
            wts.append(weightedtau(x, y).statistic if np.ptp(x) > 0 and np.ptp(y) > 0 else 0.0)
            top = x == x.max()
            tops.append((top & (y == y.max())).sum() / top.sum())
        assert st["within_answer"][s]["weighted_tau"] == pytest.approx(np.mean(wts), abs=1e-12)
        assert st["within_answer"][s]["top1"] == pytest.approx(np.mean(tops), abs=1e-12)
    # abs_omega is constant in an answer: no ranking, and its top-1 is the share of a random tie-break
    assert st["within_answer"]["abs_omega"]["weighted_tau"] == 0.0


def test_mass_capture_is_a_ratio_of_hand_sums(st):
    df = S.prepare_tokens(table())
    gn = df["grad_norm"].to_numpy()
    pos = gn > 0
    for scope in ("batch", "group"):
        for rho in (0.05, 0.2, 0.5):
            true = select_top(df, np.where(pos, gn, np.nan), rho, scope) & pos
            for s in ("entropy", "gmts", "entropy_inf"):
                sel = select_top(df, s, rho, scope)
                want = gn[sel].sum() / gn[true].sum()
                assert st["mass_capture"][scope][s][S.rho_key(rho)] == pytest.approx(want, abs=1e-12)
                ci = st["mass_capture_ci"][scope][s][S.rho_key(rho)]
                assert ci["ci_low"] <= ci["ci_high"]


def test_uncertain_block_is_the_statistics_of_the_subset(st):
    df = S.prepare_tokens(table())
    keep = df["prob"] < 0.5
    u = st["uncertain"]
    assert st["meta"]["uncertain_below"] == 0.5
    assert u["n_tokens"] == int(keep.sum()) and u["token_share"] == pytest.approx(keep.mean())
    assert u["mass_share"] == pytest.approx(df["grad_norm"][keep].sum() / df["grad_norm"].sum())
    sub = df[keep]
    for s in ("entropy", "surprisal"):
        assert u["cross_answer"][s]["spearman"] == pytest.approx(spearmanr(sub[s], sub["grad_norm"]).statistic)
        inf = sub[sub["omega"] != 0]
        assert u["cross_answer_informative"][s]["spearman"] == pytest.approx(
            spearmanr(inf[s], inf["grad_norm"]).statistic)
    assert set(u) >= {"within_answer", "cross_answer", "cross_answer_informative", "topk_overlap", "mass_capture",
                      "n_tokens", "token_share", "mass_share"}


def test_uncertain_subset_with_a_known_rho():
    # certain tokens (prob 0.99) rank the wrong way round; uncertain ones rank perfectly
    rows = []
    for g in range(4):
        for a in range(2):
            for t in range(6):
                unc = t < 3
                gnl = float(t + 1)
                ent = gnl if unc else 10.0 - gnl
                rows.append({"answer_id": f"{g}-{a}", "group_id": g, "position": t, "entropy": ent,
                             "logprob": np.log(0.5 if unc else 0.99), "omega": (0.5 if a else -0.5) * (g + 1),
                             "grad_norm_logp": gnl})
    df = pd.DataFrame(rows)
    df["prob"] = np.exp(df["logprob"])
    out = S.compute_stats(df, n_boot=0, estimators=["entropy"])
    assert out["uncertain"]["n_tokens"] == 24 and out["uncertain"]["token_share"] == 0.5
    inf = df[df["prob"] < 0.9]
    want = spearmanr(inf["entropy"], inf["grad_norm_logp"] * inf["omega"].abs()).statistic
    assert out["uncertain"]["cross_answer"]["entropy"]["spearman"] == pytest.approx(want)
    assert out["cross_answer"]["entropy"]["spearman"] < want


def test_paired_difference_equals_explicit_resampling():
    df0 = table()
    B, seed = 40, 5
    st = S.compute_stats(df0, seed=seed, n_boot=B, estimators=ESTS, rho=0.2, min_groups=1)
    df = S.prepare_tokens(df0)
    codes, units = S.unit_codes(df, "group")
    counts = S.multiplicities(len(units), B, S.block_rng(seed, "all", "clusters"))  # the block's resamples
    within = S.within_values(df, ESTS, "answer_id", S.TARGET_WITHIN, S.informative_mask(df), unit_col="group_id")
    d_cross, d_mass, d_within = [], [], []
    for b in range(B):
        ex = expand(df, codes, counts[b])
        m = ex["omega"] != 0
        d_cross.append(spearmanr(ex["gmts"][m], ex["grad_norm"][m]).statistic
                       - spearmanr(ex["entropy"][m], ex["grad_norm"][m]).statistic)
        gn = ex["grad_norm"].to_numpy()
        pos = gn > 0
        true = select_top(ex, np.where(pos, gn, np.nan), 0.2, "batch") & pos
        with np.errstate(invalid="ignore"):  # a resample without gradient: NaN, left out as in the stats
            mass = {s: gn[select_top(ex, s, 0.2, "batch")].sum() / gn[true].sum() for s in ("gmts", "entropy_inf")}
        d_mass.append(mass["gmts"] - mass["entropy_inf"])
        w = {s: [within[s].iloc[j] for g in range(len(units)) for _ in range(int(counts[b, g]))
                 for j in np.flatnonzero(within["unit"].to_numpy() == units[g])] for s in ("surprisal", "entropy")}
        d_within.append(np.mean(w["surprisal"]) - np.mean(w["entropy"]) if w["entropy"] else np.nan)

    def check(got, draws, point):
        v = np.asarray(draws, float)
        v = v[np.isfinite(v)]
        assert got["diff"] == pytest.approx(point, abs=1e-12)
        assert (got["ci_low"], got["ci_high"]) == pytest.approx(tuple(np.quantile(v, [0.025, 0.975])), abs=1e-10)
        assert got["p_le_0"] == pytest.approx(np.mean(v <= 0))

    pdiff = st["paired_difference"]
    check(pdiff["cross_answer_informative"]["gmts"]["entropy"], d_cross,
          st["cross_answer_informative"]["gmts"]["spearman"] - st["cross_answer_informative"]["entropy"]["spearman"])
    check(pdiff["mass_capture"]["gmts"]["entropy_inf"], d_mass,
          st["mass_capture"]["batch"]["gmts"]["0.2"] - st["mass_capture"]["batch"]["entropy_inf"]["0.2"])
    check(pdiff["within_answer"]["surprisal"]["entropy"], d_within,
          st["within_answer"]["surprisal"]["mean"] - st["within_answer"]["entropy"]["mean"])
    leader = st["paired_leader"]["topk_overlap"]
    assert st["topk_overlap"]["batch"][leader]["0.2"] == max(st["topk_overlap"]["batch"][s]["0.2"] for s in ESTS)
    assert all(leader in pdiff["topk_overlap"][s] for s in ESTS if s != leader)


def test_identities_are_labelled_without_a_ci(st):
    entries = {e["key"]: e for e in st["by_construction"]}
    assert all(set(e) == {"key", "equals", "why"} for e in st["by_construction"])
    # |omega| is constant inside every answer here: gmts and entropy_inf rank an answer like entropy
    assert entries["within_answer.gmts"]["equals"] == "within_answer.entropy"
    assert entries["within_answer.entropy_inf"]["equals"] == "within_answer.entropy"
    assert st["within_answer"]["gmts"]["mean"] == st["within_answer"]["entropy"]["mean"]
    d = st["paired_difference"]["within_answer"]["gmts"]["entropy"]
    assert "paired_difference.within_answer.gmts.entropy" in entries and np.isnan(d["ci_low"]) and d["diff"] == 0
    assert entries["cross_answer_informative.entropy_inf"]["equals"] == "cross_answer_informative.entropy"
    d = st["paired_difference"]["cross_answer_informative"]["entropy_inf"]["entropy"]
    assert d["diff"] == 0 and np.isnan(d["ci_low"])
    # group scope: a group has signal everywhere or nowhere, so every score wastes the same share
    shares = {st["selection_waste"]["group"][s]["0.2"] for s in ESTS}
    assert len(shares) == 1 and all(f"selection_waste.group.{s}.0.2" in entries for s in ESTS)
    # a waste of 0 that is 0 by construction carries no CI; entropy's waste is measured
    for key in entries:
        if key.startswith("selection_waste.batch."):
            _, scope, s, rk = key.split(".", 3)
            assert st["selection_waste"][scope][s][rk] == 0 and np.isnan(st["selection_waste_ci"][scope][s][rk]["ci_low"])
    assert not any(k.startswith("selection_waste.batch.entropy.") for k in entries)


def test_tied_ranks_follow_the_paired_ci():
    vals = {"a": 0.9, "b": 0.89, "c": 0.5, "d": float("nan")}
    paired = {"b": {"a": {"diff": -0.01, "ci_low": -0.03, "ci_high": 0.01}},
              "c": {"a": {"diff": -0.4, "ci_low": -0.5, "ci_high": -0.3}}}
    assert S.tied_ranks(vals, paired) == {"a": 1, "b": 1, "c": 3, "d": 4}
    paired["b"]["a"]["ci_high"] = -0.001
    assert S.tied_ranks(vals, paired)["b"] == 2
