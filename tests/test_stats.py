"""Statistics (stats.json version 2) pinned to independent references: scipy for Spearman and
Kendall, explicit lists for top-k and waste, explicit resampling for the group bootstrap."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from _synthetic import make_tables
from scipy.stats import kendalltau, spearmanr

from gmts_analysis.analysis import stats as S
from gmts_analysis.core import rank
from gmts_analysis.core.selection import overlap, select_top
from gmts_analysis.util.io import to_json

RHO_KEYS = {"0.05", "0.1", "0.2", "0.3", "0.5"}
SUMMARY_KEYS = {"median", "mean", "q25", "q75", "n_answers", "ci_low", "ci_high"}
CROSS_KEYS = {"spearman", "kendall", "n_tokens", "ci_low", "ci_high"}
BLOCK_KEYS = {"zero_advantage", "cross_answer", "cross_answer_informative", "within_answer", "within_group",
              "topk_overlap", "topk_overlap_ci", "topk_scopes_excluded", "selection_waste", "selection_waste_ci",
              "update_fidelity"}
NEW_KEYS = {"mass_capture", "mass_capture_ci", "uncertain", "paired_difference", "paired_leader", "by_construction"}
ESTS = ["entropy", "gmts", "abs_omega", "surprisal"]


# ------------------------------------------------------------------------ a hand-built table


def hand_table() -> pd.DataFrame:
    """Four groups: g1 informative (one answer shorter than the minimum), g2 all rewards equal
    (omega = 0), g3 a group of one answer (A = 0), g4 informative with a constant-entropy answer
    and an answer with a constant target. Entropy has ties, also at the k-th value."""
    spec = [  # answer, group, omega, entropy, grad_norm_logp
        (0, "g1", 0.5, [1, 2, 2, 3, 5, 1], [1, 3, 2, 4, 6, 0.5]),
        (1, "g1", -0.25, [4, 1, 2, 2, 0.5, 3, 2], [5, 1, 2.5, 2, 1, 3, 2.2]),
        (2, "g1", -0.25, [2, 2, 1], [1, 2, 3]),  # shorter than MIN_TOKENS
        (3, "g2", 0.0, [6, 1, 2, 3, 4], [2, 1, 2, 3, 4]),
        (4, "g2", 0.0, [5, 5, 5, 1, 1, 2], [1, 2, 3, 4, 5, 6]),
        (5, "g3", 0.0, [3, 1, 4, 1, 5], [9, 1, 4, 1, 5]),  # a group of one answer
        (6, "g4", 0.1, [1, 1, 1, 1, 1], [1, 2, 3, 4, 5]),  # entropy constant inside the answer
        (7, "g4", -0.1, [0.2, 0.4, 0.6, 0.8, 1.0, 1.2], [1, 1, 1, 1, 1, 1]),  # constant target
    ]
    rows = []
    for aid, gid, om, ent, gnl in spec:
        for t, (e, g) in enumerate(zip(ent, gnl)):
            rows.append({"answer_id": aid, "group_id": gid, "position": t, "entropy": float(e),
                         "logprob": -0.3 * float(e) - 0.01 * t, "omega": om, "grad_norm_logp": float(g)})
    df = pd.DataFrame(rows)
    df["grad_norm"] = df["omega"].abs() * df["grad_norm_logp"]
    return df


@pytest.fixture(scope="module")
def hand():
    df = hand_table()
    return df, S.compute_stats(df, seed=0, n_boot=200, estimators=ESTS, min_groups=1)


def ref_select(df: pd.DataFrame, score: np.ndarray, rows: list[int], k: int) -> list[int]:
    """The first k of ``rows`` by score descending, ties by (answer_id, position): a plain sort."""
    key = sorted(rows, key=lambda i: (-score[i], df["answer_id"].iloc[i], df["position"].iloc[i]))
    return key[:k]


def ref_topk_waste(df: pd.DataFrame, s: str, rho: float, scope: str) -> tuple[float, float, int]:
    """(overlap, waste, excluded scopes) from explicit lists."""
    scopes = [list(range(len(df)))] if scope == "batch" else [
        list(np.flatnonzero((df["group_id"] == g).to_numpy())) for g in sorted(df["group_id"].unique())]
    score = df[s].to_numpy()
    gn = df["grad_norm"].to_numpy()
    inter = n_true = n_sel = wasted = excluded = 0
    for rows in scopes:
        k = math.ceil(rho * len(rows) - 1e-9)
        sel = ref_select(df, score, rows, k)
        n_sel += len(sel)
        wasted += sum(df["omega"].iloc[i] == 0 for i in sel)
        pos = [i for i in rows if gn[i] > 0]
        if not pos:
            excluded += 1
            continue
        true = ref_select(df, gn, pos, min(k, len(pos)))
        inter += len(set(sel) & set(true))
        n_true += len(true)
    return (inter / n_true if n_true else float("nan")), wasted / n_sel, excluded


def test_zero_advantage_counts(hand):
    df, st = hand
    za = st["zero_advantage"]
    zero = df["omega"] == 0
    assert za == {"answers": 3, "groups": 2, "tokens": int(zero.sum()), "token_share": zero.mean(),
                  "informative_units": int(df.loc[~zero, "group_id"].nunique())}
    assert st["meta"]["version"] == 4 and st["meta"]["ci_unit"] == "group"


def test_cross_answer_all_and_informative_match_scipy(hand):
    df, st = hand
    inf = df["omega"] != 0
    for s in ESTS:
        x = {"entropy": df["entropy"], "gmts": df["entropy"] * df["omega"].abs(), "abs_omega": df["omega"].abs(),
             "surprisal": -df["logprob"]}[s]
        for key, m in (("cross_answer", np.ones(len(df), bool)), ("cross_answer_informative", inf.to_numpy())):
            got = st[key][s]
            assert set(got) == CROSS_KEYS
            assert got["spearman"] == pytest.approx(spearmanr(x[m], df["grad_norm"][m]).statistic, abs=1e-12)
            assert got["kendall"] == pytest.approx(kendalltau(x[m], df["grad_norm"][m], variant="b").statistic,
                                                   abs=1e-12)
            assert got["n_tokens"] == int(m.sum())
            assert got["ci_low"] <= got["spearman"] <= got["ci_high"]


def test_within_answer_one_answer_set_for_every_estimator(hand):
    df, st = hand
    # eligible: informative, >= 5 tokens, non-constant grad_norm_logp -> answers 0, 1, 6
    expected = {}
    for a in (0, 1, 6):
        sub = df[df["answer_id"] == a]
        e = sub["entropy"]
        # answer 6: constant entropy -> 0
        expected[a] = 0.0 if e.nunique() == 1 else spearmanr(e, sub["grad_norm_logp"]).statistic
    v = np.array(list(expected.values()))
    for s in ("entropy", "gmts"):
        wa = st["within_answer"][s]
        assert set(wa) == SUMMARY_KEYS | {"weighted_tau", "top1"} and wa["n_answers"] == 3
        assert wa["mean"] == pytest.approx(v.mean()) and wa["median"] == pytest.approx(np.median(v))
        assert wa["q25"] == pytest.approx(np.quantile(v, 0.25)) and wa["q75"] == pytest.approx(np.quantile(v, 0.75))
    assert st["within_answer"]["abs_omega"]["n_answers"] == 3 and st["within_answer"]["abs_omega"]["mean"] == 0.0
    assert {st["within_answer"][s]["n_answers"] for s in ESTS} == {3}


def test_within_group_over_informative_groups(hand):
    df, st = hand
    vals = []
    for g in ("g1", "g4"):
        sub = df[df["group_id"] == g]
        vals.append(spearmanr(sub["entropy"], sub["grad_norm"]).statistic)
    wg = st["within_group"]["entropy"]
    assert set(wg) == SUMMARY_KEYS - {"n_answers"} | {"n_groups"}
    assert wg["n_groups"] == 2 and wg["mean"] == pytest.approx(np.mean(vals))


@pytest.mark.parametrize("scope", ["batch", "group"])
def test_topk_overlap_and_waste_against_explicit_lists(hand, scope):
    df, st = hand
    full = S.prepare_tokens(df)
    for s in ESTS:
        for rho in (0.05, 0.1, 0.2, 0.3, 0.5):
            ov, waste, excl = ref_topk_waste(full, s, rho, scope)
            rk = S.rho_key(rho)
            assert st["topk_overlap"][scope][s][rk] == pytest.approx(ov, abs=1e-12)
            assert st["selection_waste"][scope][s][rk] == pytest.approx(waste, abs=1e-12)
            assert st["topk_scopes_excluded"][scope] == excl
            ci = st["topk_overlap_ci"][scope][s][rk]
            assert ci["ci_low"] <= ci["ci_high"]
    assert st["topk_scopes_excluded"] == {"batch": 0, "group": 2}  # g2 (all rewards equal) and g3 (one answer)


def test_topk_by_hand_with_a_tie_at_the_kth_value():
    # one batch of 10 tokens, rho 0.2 -> k = 2; entropy 5, 4, 4, 4 ...: the 2nd pick is a tie broken by
    # (answer_id, position); grad_norm is 0 on answer 1 (omega 0)
    df = pd.DataFrame({
        "answer_id": [0] * 5 + [1] * 5, "group_id": ["g"] * 5 + ["h"] * 5, "position": list(range(5)) * 2,
        "entropy": [1.0, 4.0, 2.0, 3.0, 1.0, 5.0, 4.0, 4.0, 0.5, 0.1],
        "omega": [1.0] * 5 + [0.0] * 5, "grad_norm_logp": [1.0, 2.0, 5.0, 3.0, 4.0, 9.0, 9.0, 9.0, 9.0, 9.0],
    })
    st = S.compute_stats(df, n_boot=0, estimators=["entropy"])
    # S_entropy = {(1,0) entropy 5, (0,1) entropy 4 (first of the tied 4s)}; S_true = {(0,2), (0,4)}
    assert st["topk_overlap"]["batch"]["entropy"]["0.2"] == 0.0
    assert st["selection_waste"]["batch"]["entropy"]["0.2"] == 0.5
    # rho 0.3 -> k = 3: entropy keeps (1,0), (0,1), (1,1); S_true (0,2), (0,4), (0,3)
    assert st["selection_waste"]["batch"]["entropy"]["0.3"] == pytest.approx(2 / 3)
    # group scope: group h has no gradient at all -> excluded from overlap, counted
    assert st["topk_scopes_excluded"]["group"] == 1
    # group g alone, k = 1: entropy keeps (0,1) (4.0), S_true keeps (0,2) (5.0)
    assert st["topk_overlap"]["group"]["entropy"]["0.2"] == 0.0
    assert st["topk_overlap"]["group"]["entropy"]["0.5"] == pytest.approx(2 / 3)  # k=3: {1,3,2} vs {2,4,3}


def expand(df: pd.DataFrame, codes: np.ndarray, counts_row: np.ndarray) -> pd.DataFrame:
    """The table with every row of cluster c repeated counts_row[c] times (clusters in order)."""
    parts = [df[codes == c] for c in range(len(counts_row)) for _ in range(int(counts_row[c]))]
    return pd.concat(parts, ignore_index=True)


def test_group_bootstrap_equals_explicit_resampling(hand):
    df0, _ = hand
    df = S.prepare_tokens(df0)
    codes, units = S.unit_codes(df, "group")
    counts = S.multiplicities(len(units), 25, np.random.default_rng(4))
    inf = S.informative_mask(df)
    # pooled Spearman over informative tokens
    ok = inf
    lo, hi = S.cluster_bootstrap_spearman(df["entropy"].to_numpy()[ok], df["grad_norm"].to_numpy()[ok], codes[ok],
                                          counts)
    rs, tk, waste, means = [], [], [], []
    within = S.within_values(df, ["entropy"], "answer_id", S.TARGET_WITHIN, inf, unit_col="group_id")
    for b in range(counts.shape[0]):
        ex = expand(df, codes, counts[b])
        m = ex["omega"] != 0
        rs.append(spearmanr(ex["entropy"][m], ex["grad_norm"][m]).statistic)
        pos = ex["grad_norm"] > 0
        sel = select_top(ex, "entropy", 0.2, "group")
        true = select_top(ex, np.where(pos, ex["grad_norm"], np.nan), 0.2, "group") & pos
        tk.append((sel & true).sum() / true.sum() if true.sum() else np.nan)
        waste.append((sel & ~m.to_numpy()).sum() / sel.sum())
        w = [within["entropy"].iloc[j] for g in range(len(units)) for _ in range(int(counts[b, g]))
             for j in np.flatnonzero(within["unit"].to_numpy() == units[g])]
        means.append(np.mean(w) if w else np.nan)

    def q(v):
        v = np.asarray(v, float)
        v = v[np.isfinite(v)]
        return tuple(np.quantile(v, [0.025, 0.975]))

    assert (lo, hi) == pytest.approx(q(rs), abs=1e-10)
    cis = S.topk_waste_ci(df, ["entropy"], inf, codes, counts, rhos=[0.2])
    c = cis["topk_overlap_ci"]["group"]["entropy"]["0.2"]
    assert (c["ci_low"], c["ci_high"]) == pytest.approx(q(tk), abs=1e-10)
    c = cis["selection_waste_ci"]["group"]["entropy"]["0.2"]
    assert (c["ci_low"], c["ci_high"]) == pytest.approx(q(waste), abs=1e-10)
    from gmts_analysis.analysis.bootstrap import mean_summary

    summ = mean_summary(within["entropy"].to_numpy(), units.get_indexer(within["unit"]), counts, "n_answers")
    assert (summ["ci_low"], summ["ci_high"]) == pytest.approx(q(means), abs=1e-10)


def test_ci_unit_is_answer_only_when_every_group_has_one_answer():
    df = hand_table()
    assert S.cluster_unit(df) == "group"
    one = df.assign(group_id=df["answer_id"].map(lambda a: f"solo{a}"))
    st = S.compute_stats(one, n_boot=20, estimators=["entropy"], min_groups=1)
    assert st["meta"]["ci_unit"] == "answer" and st["meta"]["n_ci_units"] == 8
    assert S.cluster_unit(df.drop(columns="group_id")) == "answer"


# ------------------------------------------------------------------------ synthetic runs


@pytest.fixture(scope="module")
def tables():
    return make_tables(n_groups=6, group_size=4, seed=3, domains=("math", "code"))


@pytest.fixture(scope="module")
def stats(tables):
    return S.compute_stats(*tables, seed=0, n_boot=200, min_groups=1)


def test_spearman_and_kendall_match_scipy_with_ties_and_nans():
    x = np.array([1, 2, 2, 3, 5, 5, 5, np.nan, 0, 4], float)
    y = np.array([2, 1, 4, 4, 3, 9, 9, 1, np.nan, 0], float)
    ok = ~np.isnan(x) & ~np.isnan(y)
    assert S.spearman(x, y) == pytest.approx(spearmanr(x[ok], y[ok]).statistic, abs=1e-12)
    assert S.kendall_tau_b(x, y) == pytest.approx(kendalltau(x[ok], y[ok], variant="b").statistic, abs=1e-12)
    assert np.isnan(S.spearman(np.ones(5), np.arange(5.0)))
    assert np.isnan(S.kendall_tau_b(np.ones(5), np.arange(5.0)))
    assert np.isnan(S.spearman(np.array([1.0]), np.array([2.0])))
    # the minimum-tokens rule: 4 pairs are too few for a within correlation, 5 are enough
    assert np.isnan(rank.within_spearman([1, 2, 3, 4], [1, 3, 2, 4]))
    assert rank.within_spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(
        spearmanr([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]).statistic)


def test_per_cluster_spearman_is_the_same_definition():
    rng = np.random.default_rng(0)
    rows = []
    for a, n in [("a", 8), ("b", 6), ("short", 4), ("const", 7), ("flat_s", 6)]:
        for t in range(n):
            s = float(rng.integers(0, 4)) if a != "flat_s" else 1.0
            y = float(rng.normal()) if a != "const" else 2.0
            rows.append({"answer_id": a, "position": t, "s": s, "y": y})
    df = pd.DataFrame(rows)
    r = S.per_cluster_spearman(df, "s", "y")
    for a in ("a", "b"):
        sub = df[df["answer_id"] == a]
        assert r[a] == pytest.approx(spearmanr(sub["s"], sub["y"]).statistic, abs=1e-12)
        assert r[a] == pytest.approx(rank.within_spearman(sub["s"], sub["y"]), abs=1e-12)
    assert np.isnan(r["short"]) and np.isnan(r["const"]) and np.isnan(r["flat_s"])


def test_n_keep_one_home():
    import torch

    assert rank.n_keep(0.3, 10) == 3 and rank.n_keep(0.2, 7) == 2 and rank.n_keep(1.0, 5) == 5
    assert rank.n_keep(0.3, np.array([10, 7, 0])).tolist() == [3, 3, 0]
    assert rank.n_keep(0.3, torch.tensor([10, 7, 0])).tolist() == [3, 3, 0]


def test_cluster_bootstrap_spearman_equals_explicit_resampling():
    rng = np.random.default_rng(1)
    n_clusters, per = 7, 5
    codes = np.repeat(np.arange(n_clusters), per)
    x = rng.integers(0, 4, len(codes)).astype(float)  # many ties
    y = rng.normal(size=len(codes)) + 0.5 * x
    counts = S.multiplicities(n_clusters, 300, rng)
    explicit = []
    for b in range(counts.shape[0]):
        idx = np.concatenate([np.flatnonzero(codes == c) for c in range(n_clusters) for _ in range(int(counts[b, c]))])
        explicit.append(spearmanr(x[idx], y[idx]).statistic)
    explicit = np.array(explicit)
    explicit = explicit[~np.isnan(explicit)]
    lo, hi = S.cluster_bootstrap_spearman(x, y, codes, counts)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(explicit, [0.025, 0.975])), abs=1e-10)
    assert counts.sum(axis=1).tolist() == [n_clusters] * 300


def test_bootstrap_is_seeded_and_brackets_the_estimate(tables, stats):
    again = S.compute_stats(*tables, seed=0, n_boot=200, min_groups=1)
    assert to_json(again) == to_json(stats)
    other = S.compute_stats(*tables, seed=1, n_boot=200, min_groups=1)
    assert other["cross_answer"]["entropy"]["ci_low"] != stats["cross_answer"]["entropy"]["ci_low"]
    assert other["cross_answer"]["entropy"]["spearman"] == stats["cross_answer"]["entropy"]["spearman"]
    fixed = {e["key"] for e in stats["by_construction"]}
    for s in stats["meta"]["estimators"]:
        wa, wg = stats["within_answer"][s], stats["within_group"][s]
        assert f"within_answer.{s}" in fixed or wa["ci_low"] <= wa["mean"] <= wa["ci_high"]
        assert wg["ci_low"] <= wg["mean"] <= wg["ci_high"]
        for key in ("cross_answer", "cross_answer_informative"):
            ca = stats[key][s]
            if not np.isnan(ca["spearman"]):
                assert ca["ci_low"] <= ca["spearman"] <= ca["ci_high"]
        for scope in ("batch", "group"):
            for rk in RHO_KEYS:
                v, c = stats["topk_overlap"][scope][s][rk], stats["topk_overlap_ci"][scope][s][rk]
                assert c["ci_low"] - 1e-12 <= v <= c["ci_high"] + 1e-12
    assert stats["cross_answer"]["entropy"]["ci_high"] - stats["cross_answer"]["entropy"]["ci_low"] > 0


def test_stats_json_structure(tables, stats):
    ests = stats["meta"]["estimators"]
    assert {"entropy", "gmts", "abs_omega", "logit_grad_norm", "surprisal", "one_minus_prob", "rsi", "gmts_lgn",
            "head_grad_norm"} <= set(ests)
    assert set(stats) == {"meta", "reward_audit", "by_domain"} | BLOCK_KEYS | NEW_KEYS
    n_ans = {stats["within_answer"][s]["n_answers"] for s in ests}
    assert len(n_ans) == 1  # one answer set for every estimator
    for s in ests:
        assert set(stats["within_answer"][s]) == SUMMARY_KEYS | {"weighted_tau", "top1"}
        assert set(stats["cross_answer"][s]) == CROSS_KEYS == set(stats["cross_answer_informative"][s])
        assert set(stats["within_group"][s]) == SUMMARY_KEYS - {"n_answers"} | {"n_groups"}
        for scope in ("batch", "group"):
            assert set(stats["topk_overlap"][scope][s]) == RHO_KEYS == set(stats["selection_waste"][scope][s])
            for rk in RHO_KEYS:
                ci = stats["topk_overlap_ci"][scope][s][rk]
                assert set(ci) == {"ci_low", "ci_high"} and ci["ci_low"] <= ci["ci_high"]
                assert set(stats["selection_waste_ci"][scope][s][rk]) == {"ci_low", "ci_high"}
    meta = stats["meta"]
    assert meta["n_answers"] == 24 and meta["n_groups"] == 6 and meta["n_tokens"] == len(tables[0])
    assert meta["target"] == "grad_norm" and meta["n_boot"] == 200 and meta["seed"] == 0
    assert meta["version"] == 4 and meta["ci_unit"] == "group"
    assert set(stats["by_domain"]) == {"math", "code"}
    for blk in stats["by_domain"].values():
        assert BLOCK_KEYS <= set(blk)
        assert set(blk["topk_overlap"]["group"]["gmts"]) == RHO_KEYS
    parsed = json.loads(to_json(stats))  # strict JSON
    assert parsed["topk_overlap"]["batch"]["gmts"]["0.2"] == pytest.approx(stats["topk_overlap"]["batch"]["gmts"]["0.2"])


def test_topk_equals_selection_overlap_when_every_token_has_gradient(tables):
    tokens, answers = tables
    live = tokens[tokens["omega"] != 0].reset_index(drop=True)  # then S_true is the plain top-k by grad_norm
    st = S.compute_stats(live, answers, n_boot=0, estimators=["entropy", "gmts"])
    df = S.prepare_tokens(live, answers)
    for scope in ("batch", "group"):
        for rho in (0.05, 0.2, 0.5):
            for s in ("entropy", "gmts"):
                assert st["topk_overlap"][scope][s][S.rho_key(rho)] == overlap(df, s, rho, scope)


def test_the_papers_structure_is_measured(stats):
    # synthetic data: inside answers entropy tracks grad_norm_logp; across answers |omega| matters
    assert stats["within_answer"]["entropy"]["median"] > 0.7
    assert stats["cross_answer"]["gmts"]["spearman"] > stats["cross_answer"]["entropy"]["ci_high"]
    assert stats["topk_overlap"]["batch"]["gmts"]["0.2"] > stats["topk_overlap"]["batch"]["entropy"]["0.2"]
    assert stats["selection_waste"]["batch"]["gmts"]["0.2"] == 0.0  # gmts never picks omega = 0 first


def test_by_step_and_domain_from_answers_table():
    tokens, answers = make_tables(n_groups=3, group_size=3, seed=5, steps=2, domains=("a", "b"))
    st = S.compute_stats(tokens.drop(columns=["domain"]), answers, n_boot=50, min_groups=1)
    assert set(st["by_step"]) == {"0", "1"} and set(st["by_domain"]) == {"a", "b"}
    assert st["meta"]["batch_scope"] == "per step"
    assert st["by_step"]["0"]["n_answers"] == 9 and BLOCK_KEYS <= set(st["by_step"]["0"])
    ans_str = answers.assign(answer_id=answers["answer_id"].astype(str))  # ids typed differently
    st3 = S.compute_stats(tokens.drop(columns=["domain", "step"]), ans_str, n_boot=0)
    assert set(st3["by_step"]) == {"0", "1"} and st3["by_domain"]["a"]["n_tokens"] == st["by_domain"]["a"]["n_tokens"]
    st2 = S.compute_stats(tokens.drop(columns=["domain", "step"]), None, n_boot=0)
    assert "by_step" not in st2 and "by_domain" not in st2
    assert np.isnan(st2["cross_answer"]["entropy"]["ci_low"])


def test_nan_safe_on_degenerate_tables():
    tokens, answers = make_tables(n_groups=2, group_size=2, min_len=2, max_len=4, seed=2)
    tokens["entropy"] = 1.0  # constant estimator
    tokens = tokens.drop(columns=["gmts"])
    st = S.compute_stats(tokens, answers, n_boot=20, min_groups=1)
    assert st["within_answer"]["entropy"]["n_answers"] == 0  # every answer < 5 tokens
    assert np.isnan(st["cross_answer"]["entropy"]["spearman"])
    parsed = json.loads(to_json(st))
    assert parsed["cross_answer"]["entropy"]["spearman"] is None
    assert parsed["within_answer"]["entropy"]["median"] is None
    # no gradient norms at all (--grad-norm none): every correlation null, no exception
    t2, a2 = make_tables(n_groups=2, group_size=3, seed=1)
    t2["grad_norm_logp"] = np.nan
    t2["grad_norm"] = np.nan
    st2 = json.loads(to_json(S.compute_stats(t2, a2, n_boot=20, min_groups=1)))
    assert st2["cross_answer"]["gmts"]["spearman"] is None
    assert st2["topk_overlap"]["batch"]["gmts"]["0.2"] is None
    assert st2["topk_scopes_excluded"]["batch"] == 1
    with pytest.raises(Exception, match="position"):
        S.compute_stats(t2.drop(columns=["position"]))


def test_stats_table_and_estimator_ranking(stats):
    t = S.stats_table(stats)
    assert list(t["estimator"]) == stats["meta"]["estimators"]
    assert t.columns[0] == "estimator" and {"cross_ci_low", "cross_inf_spearman", "waste_batch"} <= set(t.columns)
    row = t.set_index("estimator").loc["gmts"]
    assert row["cross_spearman"] == stats["cross_answer"]["gmts"]["spearman"]
    e = S.estimator_table(stats)
    assert list(e.columns) == list(S.ESTIMATOR_TABLE_COLUMNS) and list(e["rank"]) == sorted(e["rank"])
    assert e["rank"].iloc[0] == 1
    assert set(e["estimator"]) == set(stats["meta"]["estimators"])
    by = e.set_index("estimator")
    best_within = max(stats["within_answer"][s]["mean"] for s in by.index)
    leader = stats["paired_leader"]["within_answer"]
    tied = {s for s in by.index if s == leader or stats["within_answer"][s]["mean"] == best_within
            or (stats["paired_difference"]["within_answer"][s][leader]["ci_low"] or 0) <= 0
            <= (stats["paired_difference"]["within_answer"][s][leader]["ci_high"] or 0)}
    assert set(by.index[by["rank_within"] == 1]) == tied
    score = by["rank_within"] + by["rank_cross_informative"]
    assert list(score.loc[e["estimator"]]) == sorted(score)  # ordered by the sum of the two ranks


def test_findings_are_generated_from_the_numbers(stats):
    from gmts_analysis.analysis.summary import findings, summary_text

    words = findings(stats)
    za = stats["zero_advantage"]
    assert words[0].startswith(f"{za['tokens']:,} of {stats['meta']['n_tokens']:,} tokens")
    ent = stats["cross_answer"]["entropy"]["spearman"]
    assert f"{ent:.2f}" in words[1]
    text = summary_text(stats, ["math", "code"])
    assert "math" in text and f"{stats['cross_answer_informative']['gmts']['spearman']:+.3f}" in text


def test_gmts_stats_rewrites_a_version_1_directory(tmp_path, tables):
    from gmts_analysis.cli import main
    from gmts_analysis.util.io import atomic_write_json, atomic_write_parquet, read_json

    tokens, answers = tables
    atomic_write_parquet(tmp_path / "tokens.parquet", tokens)
    atomic_write_parquet(tmp_path / "answers.parquet", answers)
    fid = {"all": {"cosine": 1.0, "norm_ratio": 1.0}, "gmts": {"cosine": 0.9, "norm_ratio": 0.8}}
    v1 = {"meta": {"n_boot": 1000, "ci_method": "percentile bootstrap resampling answers"},
          "within_answer": {"entropy": {"median": 0.9, "n_answers": 24}},
          "cross_answer": {"entropy": {"spearman": 0.5}}, "topk_overlap_ci": {},
          "update_fidelity": fid, "by_domain": {"math": {"update_fidelity": fid}}}
    atomic_write_json(tmp_path / "stats.json", v1)
    assert not S.is_current(v1)
    assert main(["stats", str(tmp_path), "--n-boot", "50", "-q"]) == 0
    st = read_json(tmp_path / "stats.json")
    assert S.is_current(st) and st["meta"]["ci_unit"] == "group" and BLOCK_KEYS <= set(st)
    assert st["update_fidelity"] == fid  # kept: it needs the model
    assert st["by_domain"]["math"]["update_fidelity"] == fid
    assert st["by_domain"]["code"]["update_fidelity"] == {}
    assert st["meta"]["n_boot"] == 50
    table = pd.read_csv(tmp_path / "estimators.csv")
    assert list(table.columns) == list(S.ESTIMATOR_TABLE_COLUMNS)
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert main(["stats", str(tmp_path), "--n-boot", "-1"]) == 2


def test_the_runs_rho_joins_the_grid_and_the_words():
    from gmts_analysis.analysis.summary import findings

    df = hand_table()
    st = S.compute_stats(df, n_boot=0, estimators=["entropy", "gmts"], rho=0.25)
    assert st["meta"]["rhos"] == ["0.05", "0.1", "0.2", "0.25", "0.3", "0.5"] and S.run_rho_key(st) == "0.25"
    ov, waste, _ = ref_topk_waste(S.prepare_tokens(df), "entropy", 0.25, "batch")
    assert st["topk_overlap"]["batch"]["entropy"]["0.25"] == pytest.approx(ov)
    assert st["selection_waste"]["batch"]["entropy"]["0.25"] == pytest.approx(waste)
    assert any("top-25% batch selection" in w for w in findings(st))
