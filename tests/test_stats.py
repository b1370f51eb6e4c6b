"""Statistics pinned to independent references (scipy) and the stats.json contract (SPEC section 6)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from _synthetic import make_tables
from scipy.stats import kendalltau, spearmanr

from gmts_analysis import stats as S
from gmts_analysis.io import to_json
from gmts_analysis.selection import overlap

RHO_KEYS = {"0.05", "0.1", "0.2", "0.3", "0.5"}
SUMMARY_KEYS = {"median", "mean", "q25", "q75", "n_answers", "ci_low", "ci_high"}
CROSS_KEYS = {"spearman", "kendall", "n_tokens", "ci_low", "ci_high"}


@pytest.fixture(scope="module")
def tables():
    return make_tables(n_groups=6, group_size=4, seed=3, domains=("math", "code"))


@pytest.fixture(scope="module")
def stats(tables):
    return S.compute_stats(*tables, seed=0, n_boot=300)


def test_spearman_and_kendall_match_scipy_with_ties_and_nans():
    x = np.array([1, 2, 2, 3, 5, 5, 5, np.nan, 0, 4], float)
    y = np.array([2, 1, 4, 4, 3, 9, 9, 1, np.nan, 0], float)
    ok = ~np.isnan(x) & ~np.isnan(y)
    assert S.spearman(x, y) == pytest.approx(spearmanr(x[ok], y[ok]).statistic, abs=1e-12)
    assert S.kendall_tau_b(x, y) == pytest.approx(kendalltau(x[ok], y[ok], variant="b").statistic, abs=1e-12)
    assert np.isnan(S.spearman(np.ones(5), np.arange(5.0)))
    assert np.isnan(S.kendall_tau_b(np.ones(5), np.arange(5.0)))
    assert np.isnan(S.spearman(np.array([1.0]), np.array([2.0])))


def test_per_answer_spearman_matches_scipy_and_skips_undefined():
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
    assert np.isnan(r["short"]) and np.isnan(r["const"]) and np.isnan(r["flat_s"])
    summary = S.summarise(r, np.random.default_rng(0), 200)
    assert summary["n_answers"] == 2
    assert summary["median"] == pytest.approx(np.median(r.dropna()))


def test_cross_answer_matches_scipy(tables, stats):
    tokens, _ = tables
    for s in ("entropy", "gmts", "surprisal"):
        ref = spearmanr(tokens[s], tokens["grad_norm"]).statistic
        assert stats["cross_answer"][s]["spearman"] == pytest.approx(ref, abs=1e-10)
        tau = kendalltau(tokens[s], tokens["grad_norm"], variant="b").statistic
        assert stats["cross_answer"][s]["kendall"] == pytest.approx(tau, abs=1e-10)
        assert stats["cross_answer"][s]["n_tokens"] == len(tokens)


def test_cluster_bootstrap_equals_explicit_resampling():
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
    again = S.compute_stats(*tables, seed=0, n_boot=300)
    assert to_json(again) == to_json(stats)
    other = S.compute_stats(*tables, seed=1, n_boot=300)
    assert other["cross_answer"]["entropy"]["ci_low"] != stats["cross_answer"]["entropy"]["ci_low"]
    assert other["cross_answer"]["entropy"]["spearman"] == stats["cross_answer"]["entropy"]["spearman"]
    for s in stats["meta"]["estimators"]:
        wa, ca, wg = stats["within_answer"][s], stats["cross_answer"][s], stats["within_group"][s]
        assert wa["ci_low"] <= wa["mean"] <= wa["ci_high"]
        assert ca["ci_low"] <= ca["spearman"] <= ca["ci_high"]
        assert wg["ci_low"] <= wg["mean"] <= wg["ci_high"]
        assert ca["ci_high"] - ca["ci_low"] > 0


def test_stats_json_structure(tables, stats):
    ests = stats["meta"]["estimators"]
    assert {"entropy", "gmts", "logit_grad_norm", "surprisal", "one_minus_prob", "rsi", "gmts_lgn",
            "head_grad_norm"} <= set(ests)
    assert set(stats) == {"meta", "within_answer", "cross_answer", "within_group", "topk_overlap",
                          "topk_overlap_ci", "update_fidelity", "by_domain"}
    for s in ests:
        assert set(stats["within_answer"][s]) == SUMMARY_KEYS
        assert set(stats["cross_answer"][s]) == CROSS_KEYS
        assert set(stats["within_group"][s]) == SUMMARY_KEYS - {"n_answers"} | {"n_groups"}
        for scope in ("batch", "group"):
            assert set(stats["topk_overlap"][scope][s]) == RHO_KEYS
            ci = stats["topk_overlap_ci"][scope][s]["0.2"]
            assert set(ci) == {"ci_low", "ci_high"} and ci["ci_low"] <= ci["ci_high"]
    assert set(stats["topk_overlap"]) == {"batch", "group"}
    meta = stats["meta"]
    assert meta["n_answers"] == 24 and meta["n_groups"] == 6 and meta["n_tokens"] == len(tables[0])
    assert meta["target"] == "grad_norm" and meta["n_boot"] == 300 and meta["seed"] == 0
    assert set(stats["by_domain"]) == {"math", "code"}
    for blk in stats["by_domain"].values():
        assert {"within_answer", "cross_answer", "within_group", "topk_overlap", "update_fidelity"} <= set(blk)
        assert set(blk["topk_overlap"]["group"]["gmts"]) == RHO_KEYS
    parsed = json.loads(to_json(stats))  # strict JSON
    assert parsed["topk_overlap"]["batch"]["gmts"]["0.2"] == pytest.approx(stats["topk_overlap"]["batch"]["gmts"]["0.2"])


def test_topk_values_match_selection_overlap(tables, stats):
    df = S.prepare_tokens(*tables)
    for scope in ("batch", "group"):
        for rho in (0.05, 0.2, 0.5):
            for s in ("entropy", "gmts"):
                assert stats["topk_overlap"][scope][s][S.rho_key(rho)] == overlap(df, s, rho, scope)


def test_the_papers_structure_is_measured(stats):
    # synthetic data: inside answers entropy tracks grad_norm_logp; across answers |omega| matters
    assert stats["within_answer"]["entropy"]["median"] > 0.7
    assert stats["cross_answer"]["gmts"]["spearman"] > stats["cross_answer"]["entropy"]["ci_high"]
    assert stats["topk_overlap"]["batch"]["gmts"]["0.2"] > stats["topk_overlap"]["batch"]["entropy"]["0.2"]


def test_by_step_and_domain_from_answers_table():
    tokens, answers = make_tables(n_groups=3, group_size=3, seed=5, steps=2, domains=("a", "b"))
    st = S.compute_stats(tokens.drop(columns=["domain"]), answers, n_boot=50)
    assert set(st["by_step"]) == {"0", "1"} and set(st["by_domain"]) == {"a", "b"}
    assert st["meta"]["batch_scope"] == "per step"
    assert st["by_step"]["0"]["n_answers"] == 9
    ans_str = answers.assign(answer_id=answers["answer_id"].astype(str))  # ids typed differently
    st3 = S.compute_stats(tokens.drop(columns=["domain", "step"]), ans_str, n_boot=0)
    assert set(st3["by_step"]) == {"0", "1"} and st3["by_domain"]["a"]["n_tokens"] == st["by_domain"]["a"]["n_tokens"]
    st2 = S.compute_stats(tokens.drop(columns=["domain", "step"]), None, n_boot=0)
    assert "by_step" not in st2 and "by_domain" not in st2
    assert st2["cross_answer"]["entropy"]["ci_low"] is not None and np.isnan(st2["cross_answer"]["entropy"]["ci_low"])


def test_nan_safe_on_degenerate_tables():
    tokens, answers = make_tables(n_groups=2, group_size=2, min_len=2, max_len=4, seed=2)
    tokens["entropy"] = 1.0  # constant estimator
    tokens = tokens.drop(columns=["gmts"])
    st = S.compute_stats(tokens, answers, n_boot=20)
    assert st["within_answer"]["entropy"]["n_answers"] == 0  # every answer < 5 tokens
    assert np.isnan(st["cross_answer"]["entropy"]["spearman"])
    parsed = json.loads(to_json(st))
    assert parsed["cross_answer"]["entropy"]["spearman"] is None
    assert parsed["within_answer"]["entropy"]["median"] is None
    # no gradient norms at all (--grad-norm none): every correlation null, no exception
    t2, a2 = make_tables(n_groups=2, group_size=3, seed=1)
    t2["grad_norm_logp"] = np.nan
    t2["grad_norm"] = np.nan
    st2 = json.loads(to_json(S.compute_stats(t2, a2, n_boot=20)))
    assert st2["cross_answer"]["gmts"]["spearman"] is None
    assert st2["topk_overlap"]["batch"]["gmts"]["0.2"] is None
    with pytest.raises(Exception, match="position"):
        S.compute_stats(t2.drop(columns=["position"]))


def test_stats_table_is_tidy(stats):
    t = S.stats_table(stats)
    assert list(t["estimator"]) == stats["meta"]["estimators"]
    assert t.columns[0] == "estimator" and "cross_ci_low" in t.columns and "topk_batch" in t.columns
    row = t.set_index("estimator").loc["gmts"]
    assert row["cross_spearman"] == stats["cross_answer"]["gmts"]["spearman"]


def test_gmts_stats_command(tmp_path, tables):
    from gmts_analysis.cli import main
    from gmts_analysis.io import atomic_write_json, atomic_write_parquet, read_json

    tokens, answers = tables
    atomic_write_parquet(tmp_path / "tokens.parquet", tokens)
    atomic_write_parquet(tmp_path / "answers.parquet", answers)
    fid = {"all": {"cosine": 1.0, "norm_ratio": 1.0}, "gmts": {"cosine": 0.9, "norm_ratio": 0.8}}
    atomic_write_json(tmp_path / "stats.json", {"update_fidelity": fid, "by_domain": {"math": {"update_fidelity": fid}}})
    assert main(["stats", str(tmp_path), "--n-boot", "50", "-q"]) == 0
    st = read_json(tmp_path / "stats.json")
    assert st["update_fidelity"] == fid  # kept: it needs the model
    assert st["by_domain"]["math"]["update_fidelity"] == fid
    assert st["by_domain"]["code"]["update_fidelity"] == {}
    assert st["meta"]["n_boot"] == 50 and "within_answer" in st
    assert main(["stats", str(tmp_path / "nope")]) == 2
    assert main(["stats", str(tmp_path), "--n-boot", "-1"]) == 2


def test_topk_bootstrap_equals_explicit_resampling():
    tokens, answers = make_tables(n_groups=3, group_size=3, min_len=5, max_len=9, seed=2, steps=2)
    df = S.prepare_tokens(tokens, answers)
    codes, uniq = pd.factorize(df["answer_id"])
    counts = S.multiplicities(len(uniq), 8, np.random.default_rng(0)).astype(np.float32)
    from gmts_analysis.selection import selection_order

    for scope in ("batch", "group"):
        tp = S._KeepPlan(*selection_order(df, "grad_norm", scope), codes)
        order, sid = selection_order(df, "entropy", scope)
        ep = S._KeepPlan(order, sid, codes)
        inv = np.empty(len(df), dtype=int)
        inv[order] = np.arange(len(df))
        for b in range(counts.shape[0]):
            expanded = pd.concat([df[codes == c] for c in range(len(uniq)) for _ in range(int(counts[b, c]))],
                                 ignore_index=True)
            true = tp.kept(counts[b : b + 1], 0.2)
            sel = ep.kept(counts[b : b + 1], 0.2)[:, inv[tp.order]]
            got = float(np.minimum(sel, true).sum(dtype=np.float64) / true.sum(dtype=np.float64))
            assert got == pytest.approx(overlap(expanded, "entropy", 0.2, scope), abs=1e-9)
