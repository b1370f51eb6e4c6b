"""gmts rl-report (issue 24): the referee's analysis on fabricated run records whose answers are known.

Every record here is written by :func:`fabricate` into tmp_path with the keys gmts rl writes (config,
steps, evals, final_pass1, timing_s, versions); nothing reads the live data directory."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from _adversarial import assert_one_line_error, run_cli

from gmts_analysis.analysis.paired import holm, paired_contrast, paired_t, sign_test, wilcoxon_signed_rank
from gmts_analysis.errors import GmtsError
from gmts_analysis.rl.arms_report import build_report, report_markdown, run_eval_se, verdict

SEEDS = list(range(8))
DOMAINS = ["arithmetic", "program"]
COMMON = {"policy": "tiny", "steps": 4, "domains": DOMAINS, "prompts_per_domain": 8, "lr": 0.0003,
          "normalizer": "all", "loss_agg": "token-mean", "max_grad_norm": 1.0, "temperature": 1.0, "eval_every": 2,
          "eval_prompts": 200, "final_eval_prompts": 1500, "diag_every": 4}
NOISE = [0.002, -0.001, 0.0015, -0.002, 0.001, 0.0, -0.0015, 0.0]  # small, mean 0


def _setting(name, arms, role="primary", rho=0.05, scope="batch", group_size=4, dyn=False, all_from=None):
    s = {"name": name, "role": role, "file": f"{name}.json", "rho": rho, "scope": scope, "group_size": group_size,
         "dynamic_sampling": dyn, "arms": arms}
    if all_from:
        s["all_from"] = all_from
    return s


def make_plan(settings, contrasts, seeds=SEEDS) -> dict:
    return {"title": "fabricated", "metric": "final pass@1", "seeds": seeds, "alpha": 0.05, "correction": "holm",
            "common": COMMON, "settings": settings, "contrasts": contrasts}


def _steps(setting: dict, arm: str, seed: int) -> list[dict]:
    """Per-step records with known values: zero-std share 0.25 + 0.05 * step, waste 0.1 for every arm but
    gmts (0.0), groups kept 12 of 16 under dynamic sampling; the last step carries the diagnostics."""
    out = []
    for step in range(1, COMMON["steps"] + 1):
        dyn = setting["dynamic_sampling"]
        rec = {"step": step, "reward_mean": 0.5, "frac_groups_zero_std": 0.25 + 0.05 * step, "n_groups": 16,
               "n_groups_kept": 12 if dyn else 16, "frac_tokens_zero_adv": 0.2,
               "waste": {"entropy": 0.1, "gmts": 0.0, "gmts_lgn": 0.0},
               "frac_selected_zero_adv": 0.0 if arm == "gmts" else 0.1}
        if step == COMMON["steps"]:
            sels = ("entropy", "gmts", "gmts_lgn", "random") + ((arm,) if arm.endswith("_inf") else ())
            rec["fidelity"] = {k: {"cosine": 0.9 + 0.01 * i, "norm_ratio": 0.8} for i, k in enumerate(sels)}
            rec["mass_capture"] = {k: 0.5 + 0.1 * i for i, k in enumerate(sels)}
        out.append(rec)
    if setting["dynamic_sampling"]:
        out.append({"step": COMMON["steps"] + 1, "n_groups": 16, "n_groups_kept": 0, "frac_groups_zero_std": 1.0,
                    "skipped": True})
    return out


def fabricate(root: Path, plan: dict, value, skip=(), config_patch=None) -> Path:
    """Write plan.json and every run record of ``plan`` under ``root``; ``value(setting, arm, seed)`` is the
    final pass@1 of both domains; ``skip``: ``(setting, arm, seed)`` not written; ``config_patch``:
    ``{(setting, arm, seed): {field: value}}`` written into that run's config."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "plan.json").write_text(json.dumps(plan))
    for s in plan["settings"]:
        rdir = root / (s["file"][:-5] + ".runs")
        rdir.mkdir(exist_ok=True)
        for arm in s["arms"]:
            for seed in plan["seeds"]:
                if (s["name"], arm, seed) in skip:
                    continue
                cfg = {**COMMON, "selection": arm, "seed": seed, "rho": s["rho"], "scope": s["scope"],
                       "group_size": s["group_size"], "dynamic_sampling": s["dynamic_sampling"], "advantage": "group",
                       "weight_decay": 0.0, "max_new_tokens": 96, "eval_seed": 12345, "diag_answers": 4,
                       "device": "cpu", "batch_size": 64, "extra": {}}
                cfg.update((config_patch or {}).get((s["name"], arm, seed), {}))
                p = float(value(s["name"], arm, seed))
                rec = {"config": cfg, "steps": _steps(s, arm, seed),
                       "evals": [{"step": 0, "pass1": {d: 0.4 for d in DOMAINS}, "pass1_mean": 0.4}],
                       "final_pass1": {d: p for d in DOMAINS}, "final_eval_prompts": 1500,
                       "timing_s": {"total": 1.0, "eval": 0.5, "diagnostics": 0.1, "train": 0.4},
                       "versions": {"gmts_analysis": "0.1.0"}}
                (rdir / f"{arm}-s{seed}.json").write_text(json.dumps(rec))
    return root


PRIMARY = [_setting("main", ["all", "entropy", "gmts"])]
PRIMARY_CONTRASTS = [{"setting": "main", "a": "gmts", "b": "entropy", "family": "primary", "question": "q"}]


def _constant_gain(setting, arm, seed):
    return 0.5 + (0.03 + NOISE[seed] if arm == "gmts" else 0.0) + (0.01 * seed if arm != "all" else 0.0)


# ----------------------------------------------------------------------------- the tests themselves


def test_paired_tests_known_values():
    assert sign_test([0.01] * 8) == pytest.approx(2 / 256) == 0.0078125
    assert wilcoxon_signed_rank(np.arange(1, 9) * 0.01) == pytest.approx(2 / 256)
    d7 = [-0.001] + [0.01 * k for k in range(2, 9)]  # 7 of 8 positive, the negative the smallest
    assert sign_test(d7) == pytest.approx(2 * 9 / 256)
    assert wilcoxon_signed_rank(d7) == pytest.approx(2 * 2 / 256)  # T+ = 35 or 36: 2 of 256 patterns, two-sided
    assert sign_test([0.0, 1.0, 2.0, 3.0]) == pytest.approx(0.25)  # zeros dropped: 3 of 3
    assert sign_test([0.0, 0.0]) == 1.0 and wilcoxon_signed_rank([0.0, 0.0]) == 1.0


def test_paired_tests_against_scipy_and_brute_force():
    from scipy import stats

    rng = np.random.default_rng(3)
    for n in (3, 5, 8, 12):
        d = rng.normal(0.01, 0.02, n)
        t = paired_t(d)
        ref = stats.ttest_1samp(d, 0.0)
        assert t["p"] == pytest.approx(ref.pvalue, rel=1e-10)
        lo, hi = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=stats.sem(d))
        assert (t["ci_low"], t["ci_high"]) == pytest.approx((lo, hi), rel=1e-10)
        assert wilcoxon_signed_rank(d) == pytest.approx(stats.wilcoxon(d, method="exact").pvalue, rel=1e-10)
        assert sign_test(d) == pytest.approx(stats.binomtest(int((d > 0).sum()), n).pvalue, rel=1e-10)
    # ties and zeros: the exact permutation distribution, enumerated here independently
    d = np.array([0.02, 0.02, -0.01, 0.0, 0.03, -0.02, 0.01, 0.02])
    x = d[d != 0]
    r = stats.rankdata(np.abs(x))
    t_obs = r[x > 0].sum()
    e = r.sum() / 2
    hits = sum(abs(sum(ri for ri, s in zip(r, signs) if s) - e) >= abs(t_obs - e) - 1e-9
               for signs in itertools.product([0, 1], repeat=len(x)))
    assert wilcoxon_signed_rank(d) == pytest.approx(hits / 2 ** len(x))


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 of m = 3: 3 x 0.01 = 0.03; max(0.03, 2 x 0.03) = 0.06; max(0.06, 1 x 0.04) = 0.06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm([0.4, float("nan")]) == pytest.approx([0.8, 1.0])
    assert holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped, and never below an earlier one


def test_word_rule():
    st = {"n": 8, "mean": 0.02, "p": 0.03, "p_holm": 0.09, "ci_low": 0.001, "ci_high": 0.04}
    assert verdict("a", "b", st, "primary", 0.05) == ("not_distinguishable", "a and b are not distinguishable with 8 seeds")
    assert verdict("a", "b", {**st, "p_holm": 0.04}, "primary", 0.05)[1] == "a beats b"
    assert verdict("a", "b", {**st, "mean": -0.02, "ci_low": -0.04, "ci_high": -0.001, "p_holm": 0.01},
                   "primary", 0.05)[1] == "b beats a"
    assert verdict("a", "b", {**st, "p_holm": 0.01, "ci_low": -0.001}, "primary", 0.05)[0] == "not_distinguishable"
    code, words = verdict("a", "b", st, "exploratory", 0.05)  # unadjusted p decides, never "beats"
    assert code == "above_unadjusted" and "beats" not in words and "exploratory" in words


def test_constant_gain_beats(tmp_path):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    rep = build_report(data)
    c = rep["contrasts"][0]
    assert (c["a"], c["b"], c["family"], c["status"], c["n"]) == ("gmts", "entropy", "primary", "reported", 8)
    assert c["mean"] == pytest.approx(0.03, abs=1e-12)
    assert c["p_sign"] == pytest.approx(0.0078125) and c["p_wilcoxon"] == pytest.approx(0.0078125)
    assert c["wins_a"] == 8 and c["ci_low"] > 0 and c["p_holm"] == pytest.approx(c["p"])  # a family of one
    assert c["verdict"] == "beats" and c["words"] == "gmts beats entropy"
    se = math.sqrt(2 * (0.5 + 0.01 * 0) * (0.5 - 0.01 * 0) / 1500) / 2  # seed 0 of entropy: p = 0.5
    assert rep["settings"][0]["results"]["entropy"]["eval_se"][0] == pytest.approx(se)
    assert "evaluation SE of one seed's difference" in c["sentence"]
    assert "gmts beats entropy" in report_markdown(rep)


def test_symmetric_differences_not_distinguishable(tmp_path):
    diffs = [0.02, -0.02, 0.01, -0.01, 0.03, -0.03, 0.005, -0.005]
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS),
                     lambda s, a, seed: 0.5 + (diffs[seed] if a == "gmts" else 0.0))
    rep = build_report(data)
    c = rep["contrasts"][0]
    assert c["mean"] == pytest.approx(0.0, abs=1e-12) and c["wins_a"] == c["wins_b"] == 4
    assert c["verdict"] == "not_distinguishable"
    assert c["words"] == "gmts and entropy are not distinguishable with 8 seeds"
    md = report_markdown(rep)
    assert "not distinguishable with 8 seeds" in md and "tied" not in md and " tie " not in md


def test_missing_seed_cuts_the_setting_and_those_borrowing_its_all(tmp_path):
    settings = [_setting("main", ["all", "entropy", "gmts"]),
                _setting("wide", ["entropy", "gmts"], role="secondary", rho=0.1, all_from="main"),
                _setting("other", ["entropy", "gmts"], role="secondary", rho=0.2)]
    contrasts = PRIMARY_CONTRASTS + [{"setting": "*", "a": "*", "b": "*", "family": "exploratory"}]
    data = fabricate(tmp_path / "d", make_plan(settings, contrasts), _constant_gain, skip={("main", "all", 3)})
    rep = build_report(data)
    st = {s["name"]: s for s in rep["settings"]}
    assert st["main"]["status"] == st["wide"]["status"] == "cut"
    assert st["main"]["missing"] == ["main.runs/all-s3.json"] == st["wide"]["missing"]
    assert "results" not in st["main"] and st["main"]["n_runs_found"] == 23
    assert st["other"]["status"] == "complete"
    assert rep["contrasts"][0]["status"] == "cut" and "mean" not in rep["contrasts"][0]
    # "*" expands over the complete settings only: one pair in `other`, none from the cut ones
    assert [(c["setting"], c["a"], c["b"]) for c in rep["contrasts"][1:]] == [("other", "gmts", "entropy")]
    md = report_markdown(rep)
    assert "main (primary; rho 0.05, batch scope, groups of 4): **cut**, 23 of 24 runs found" in md
    assert "not reported, the setting is cut" in md


def test_star_expands_every_other_pair_once_with_all_borrowed(tmp_path):
    settings = [_setting("main", ["all", "entropy", "gmts", "random"]),
                _setting("wide", ["entropy", "gmts"], role="secondary", rho=0.1, all_from="main")]
    contrasts = [{"setting": "main", "a": "entropy", "b": "all", "family": "primary"},
                 {"setting": "*", "a": "*", "b": "*", "family": "exploratory"}]
    rep = build_report(fabricate(tmp_path / "d", make_plan(settings, contrasts), _constant_gain))
    pairs = [(c["setting"], c["a"], c["b"], c["family"]) for c in rep["contrasts"]]
    assert pairs[0] == ("main", "entropy", "all", "primary")
    main = [p for p in pairs[1:] if p[0] == "main"]
    assert len(main) == 5 and ("main", "entropy", "all", "exploratory") not in main  # C(4, 2) - 1
    assert [p[1:3] for p in pairs if p[0] == "wide"] == [("entropy", "all"), ("gmts", "all"), ("gmts", "entropy")]
    wide = next(s for s in rep["settings"] if s["name"] == "wide")
    assert wide["results"]["all"]["source"] == "main"
    expl = [c for c in rep["contrasts"] if c["family"] == "exploratory"]
    assert all(c["p_holm"] is None and c["verdict"] != "beats" for c in expl)


def test_holm_in_the_report_over_every_planned_primary(tmp_path):
    settings = [_setting("main", ["all", "entropy", "gmts"]), _setting("gone", ["entropy", "gmts"], role="x")]
    contrasts = [{"setting": "main", "a": "gmts", "b": "entropy", "family": "primary"},
                 {"setting": "main", "a": "entropy", "b": "all", "family": "primary"},
                 {"setting": "gone", "a": "gmts", "b": "entropy", "family": "primary"}]
    rng = np.random.default_rng(0)
    noise = {k: rng.normal(0, 0.01) for k in itertools.product(["all", "entropy", "gmts"], SEEDS)}
    data = fabricate(tmp_path / "d", make_plan(settings, contrasts),
                     lambda s, a, seed: 0.5 + (0.01 if a == "gmts" else 0) + noise[(a, seed)],
                     skip={("gone", "gmts", 0)})
    rep = build_report(data)
    p = [c.get("p") for c in rep["contrasts"]]
    assert rep["contrasts"][2]["status"] == "cut"
    # by hand: m = 3 (the cut one counts as p = 1)
    lo, hi = sorted(p[:2])
    adj_lo, adj_hi = min(1, 3 * lo), max(min(1, 3 * lo), min(1, 2 * hi))
    got = {c["p"]: c["p_holm"] for c in rep["contrasts"][:2]}
    assert got[lo] == pytest.approx(adj_lo) and got[hi] == pytest.approx(adj_hi)


def test_mechanism_from_the_steps(tmp_path):
    settings = [_setting("main", ["all", "entropy", "gmts"]),
                _setting("dyn", ["all", "entropy", "gmts"], role="second", group_size=8, dyn=True)]
    rep = build_report(fabricate(tmp_path / "d", make_plan(settings, PRIMARY_CONTRASTS), _constant_gain))
    m = {s["name"]: s["mechanism"] for s in rep["settings"]}
    assert m["main"]["gmts"]["zero_adv_groups"] == pytest.approx(np.mean([0.3, 0.35, 0.4, 0.45]))
    assert m["main"]["gmts"]["waste"] == 0.0 and m["main"]["entropy"]["waste"] == pytest.approx(0.1)
    assert m["main"]["gmts"]["mass_capture"] == pytest.approx(0.6) and m["main"]["gmts"]["cosine"] == pytest.approx(0.91)
    assert math.isnan(m["main"]["all"]["mass_capture"])  # the diagnostics do not score `all`
    assert m["main"]["gmts"]["groups_kept"] == 1.0
    assert m["dyn"]["gmts"]["groups_kept"] == pytest.approx((4 * 0.75 + 0.0) / 5)  # the skipped step kept 0
    assert m["dyn"]["gmts"]["skipped_steps"] == 1.0
    assert m["dyn"]["gmts"]["zero_adv_tokens"] == pytest.approx(0.2)  # skipped steps have no tokens


def test_eval_se_uses_final_eval_prompts_or_eval_prompts():
    rec = {"config": {"domains": ["a", "b"], "final_eval_prompts": 0, "eval_prompts": 100},
           "final_pass1": {"a": 0.5, "b": 0.2}}
    assert run_eval_se(rec) == pytest.approx(math.sqrt(0.25 / 100 + 0.16 / 100) / 2)
    rec["config"]["final_eval_prompts"] = 400
    assert run_eval_se(rec) == pytest.approx(math.sqrt(0.25 / 400 + 0.16 / 400) / 2)


@pytest.mark.parametrize("field, bad", [("lr", 0.001), ("scope", "group"), ("final_eval_prompts", 200),
                                         ("dynamic_sampling", True), ("domains", ["arithmetic"]), ("seed", 5)])
def test_config_mismatch_is_one_line_naming_file_and_field(tmp_path, field, bad):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain,
                     config_patch={("main", "gmts", 2): {field: bad}})
    line = assert_one_line_error(*run_cli(["rl-report", str(data), "--out", str(tmp_path / "o"), "-q"]),
                                 "gmts-s2.json", f"config.{field}")
    assert "plan" in line
    assert not (tmp_path / "o").exists()


def test_plan_errors_name_the_field(tmp_path):
    plan = make_plan(PRIMARY, [{"setting": "main", "a": "gmts", "b": "nope", "family": "primary"}])
    data = fabricate(tmp_path / "d", plan, _constant_gain)
    with pytest.raises(GmtsError, match=r"plan.json: contrasts\[0\]\.b: 'nope' is not an arm"):
        build_report(data)
    plan["contrasts"][0] = {"setting": "main", "a": "gmts", "b": "entropy", "family": "confirmatory"}
    (data / "plan.json").write_text(json.dumps(plan))
    assert_one_line_error(*run_cli(["rl-report", str(data), "--out", str(tmp_path / "o")]), "contrasts[0].family")


def test_cli_writes_deterministic_outputs_and_rewrites_only_between_markers(tmp_path):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    doc = tmp_path / "doc.md"
    before, after = "# Title\n\nkept text\n<!-- gmts-rl-referee:begin -->", "<!-- gmts-rl-referee:end -->\ntail\n"
    doc.write_text(before + "\nold generated text\n" + after)
    out = tmp_path / "o"
    rc, err = run_cli(["rl-report", str(data), "--out", str(out), "--update", str(doc)])
    assert rc == 0, err
    assert "gmts beats entropy" in err
    assert sorted(p.name for p in out.iterdir()) == ["rl_forest.png", "rl_report.json", "rl_report.md"]
    text = doc.read_text()
    assert text.startswith(before + "\n") and text.endswith("\n" + after) and "old generated text" not in text
    body = text[len(before) + 1: -len(after) - 1]
    assert body == report_markdown(json.loads((out / "rl_report.json").read_text())).strip("\n")
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, err = run_cli(["rl-report", str(data), "--out", str(out), "--update", str(doc), "-q"])  # ours: replaced
    assert rc == 0, err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first  # same bytes
    assert doc.read_text() == text


def test_update_file_without_markers_is_refused_before_anything_is_written(tmp_path):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    good, bad = tmp_path / "good.md", tmp_path / "bad.md"
    good.write_text("<!-- gmts-rl-referee:begin -->\nx\n<!-- gmts-rl-referee:end -->\n")
    bad.write_text("# no markers here\n<!-- gmts-rl-referee:begin -->\n")
    assert_one_line_error(*run_cli(["rl-report", str(data), "--out", str(tmp_path / "o"), "--update", str(good),
                                    str(bad)]), "bad.md", "gmts-rl-referee:end")
    assert good.read_text().endswith("\nx\n<!-- gmts-rl-referee:end -->\n") and not (tmp_path / "o").exists()


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_update_file_is_one_line_before_anything_is_written(tmp_path, kind):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    target = tmp_path / "doc.md"
    if kind == "directory":
        target.mkdir()
    assert_one_line_error(*run_cli(["rl-report", str(data), "--out", str(tmp_path / "o"), "--update", str(target)]),
                          "--update", "doc.md", "no such file" if kind == "missing" else "is a directory")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["rl_report.json", "rl_report.md", "rl_forest.png"])
def test_foreign_output_file_is_refused(tmp_path, name):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    out = tmp_path / "o"
    out.mkdir()
    foreign = out / name
    if name.endswith(".png"):  # a real PNG, but not our forest plot
        from matplotlib.figure import Figure

        Figure(figsize=(1, 1)).savefig(foreign, format="png")
    else:
        foreign.write_text('{"generator": "someone else"}\n' if name.endswith(".json") else "# my notes\n")
    content = foreign.read_bytes()
    assert_one_line_error(*run_cli(["rl-report", str(data), "--out", str(out)]), name, "not written by gmts")
    assert foreign.read_bytes() == content and sorted(p.name for p in out.iterdir()) == [name]


def test_default_out_is_the_data_dir_and_no_run_is_touched(tmp_path):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    runs = {p: p.read_bytes() for p in (data / "main.runs").iterdir()}
    rc, err = run_cli(["rl-report", str(data), "-q"])
    assert rc == 0, err
    assert (data / "rl_report.md").read_text().startswith("<!-- generated by gmts rl-report")
    assert {p: p.read_bytes() for p in (data / "main.runs").iterdir()} == runs


def test_paired_contrast_counts():
    c = paired_contrast([0.5, 0.6, 0.7], [0.5, 0.5, 0.8])
    assert (c["wins_a"], c["wins_b"], c["ties"], c["n"]) == (1, 1, 1, 3)


def test_update_short_block_holds_the_planned_contrasts_only(tmp_path):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _constant_gain)
    doc = tmp_path / "README.md"
    doc.write_text("intro\n<!-- gmts-rl-referee:begin short -->\nold\n<!-- gmts-rl-referee:end -->\n")
    out = tmp_path / "o"
    rc, err = run_cli(["rl-report", str(data), "--out", str(out), "--update", str(doc), "-q"])
    assert rc == 0, err
    report = json.loads((out / "rl_report.json").read_text())
    short = report_markdown(report, short=True)
    assert short != report_markdown(report) and "**Mechanism**" not in short and "gmts beats entropy" in short
    assert doc.read_text() == "intro\n<!-- gmts-rl-referee:begin short -->\n" + short + "<!-- gmts-rl-referee:end -->\n"


# ----------------------------------------------------------------------------- issue 30: fresh seeds, CRN, pooled view


def _gain(delta, noise=NOISE):
    """``value`` of :func:`fabricate`: gmts = entropy + delta + noise[seed index], all = entropy."""
    def value(setting, arm, seed):
        return 0.5 + 0.01 * (seed % 8) + ((delta + noise[seed % len(noise)]) if arm == "gmts" else 0.0)
    return value


def _copy_runs(src: Path, dst: Path, names) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    for n in names:
        (dst / n).write_bytes((src / n).read_bytes())


def test_runs_repeating_earlier_runs_are_named_and_the_fresh_seeds_reported_alone(tmp_path):
    # the "pilot": seeds 0-4 of gmts and entropy, the very same training runs (same steps)
    first = fabricate(tmp_path / "first", make_plan(PRIMARY, PRIMARY_CONTRASTS), _gain(0.03))
    pilot = tmp_path / "pilot.runs"
    _copy_runs(first / "main.runs", pilot, [f"{a}-s{s}.json" for a in ("gmts", "entropy") for s in range(5)])
    # seed 5 of gmts in the pilot ran otherwise (another trajectory): not a repeat
    rec = json.loads((first / "main.runs" / "gmts-s5.json").read_text())
    rec["steps"][0]["reward_mean"] = 0.25
    (pilot / "gmts-s5.json").write_text(json.dumps(rec))
    plan = {**make_plan(PRIMARY, PRIMARY_CONTRASTS), "prior_runs": ["../pilot.runs"]}
    data = fabricate(tmp_path / "d", plan, _gain(0.03))
    rep = build_report(data)
    assert rep["n_repeated_runs"] == 10
    gm = rep["settings"][0]["results"]["gmts"]
    assert [bool(x) for x in gm["repeat_of"]] == [True] * 5 + [False] * 3
    assert gm["repeat_of"][0] == (tmp_path / "pilot.runs" / "gmts-s0.json").as_posix()
    c = rep["contrasts"][0]
    assert c["evidence"] == "pooled" and c["seeds_fresh"] == [5, 6, 7] and c["seeds_repeat_both"] == [0, 1, 2, 3, 4]
    want = paired_contrast([0.5 + 0.01 * s + 0.03 + NOISE[s] for s in (5, 6, 7)], [0.5 + 0.01 * s for s in (5, 6, 7)])
    assert c["fresh_only"]["mean"] == pytest.approx(want["mean"]) and c["fresh_only"]["n"] == 3
    assert "pilot and confirmation pooled: 5 of 8 seeds repeat earlier runs (5 in both arms, 0 in one arm" in c["sentence"]
    assert "confirmed on fresh seeds" not in c["sentence"]
    md = report_markdown(rep)
    assert "| 3/8 |" in md and "10 runs repeat earlier runs" in md and "main gmts seeds 0, 1, 2, 3, 4" in md


def test_fresh_seeds_say_confirmed_and_an_unchecked_plan_says_so(tmp_path):
    first = fabricate(tmp_path / "first", make_plan(PRIMARY, PRIMARY_CONTRASTS), _gain(0.03))
    fresh_plan = {**make_plan(PRIMARY, PRIMARY_CONTRASTS, seeds=list(range(100, 108))), "prior_runs": ["../first/main.runs"]}
    rep = build_report(fabricate(tmp_path / "d", fresh_plan, _gain(0.03)))
    c = rep["contrasts"][0]
    assert c["verdict"] == "beats" and c["evidence"] == "fresh" and rep["n_repeated_runs"] == 0
    assert c["sentence"].endswith("gmts beats entropy; confirmed on fresh seeds (no run of the 8 seeds repeats an earlier run).")
    assert "no run repeats an earlier one: every seed is fresh" in report_markdown(rep)
    unchecked = build_report(first)
    assert unchecked["contrasts"][0]["evidence"] == "unchecked"
    assert "seed provenance not checked" in unchecked["contrasts"][0]["sentence"]
    assert "fresh seeds" not in unchecked["contrasts"][0]["sentence"]


def test_prior_runs_that_is_no_folder_is_one_line(tmp_path):
    plan = {**make_plan(PRIMARY, PRIMARY_CONTRASTS), "prior_runs": ["../nowhere.runs"]}
    data = fabricate(tmp_path / "d", plan, _gain(0.03))
    with pytest.raises(GmtsError, match="prior_runs: '../nowhere.runs' is not a folder"):
        build_report(data)
    (data / "plan.json").write_text(json.dumps({**plan, "prior_runs": "../x"}))
    with pytest.raises(GmtsError, match="prior_runs: expected a list"):
        build_report(data)


def test_common_random_numbers_are_stated_and_a_mixed_evaluation_is_flagged(tmp_path):
    data = fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _gain(0.03))
    md = report_markdown(build_report(data))
    assert "Common random numbers: within each setting every arm and seed is evaluated on the same held-out prompts" in md
    assert "(evaluation seed 12345)" in md and "overstate" in md
    mixed = fabricate(tmp_path / "m", make_plan(PRIMARY, PRIMARY_CONTRASTS), _gain(0.03),
                      config_patch={("main", "gmts", 3): {"eval_seed": 7}})
    rep = build_report(mixed)
    assert rep["settings"][0]["eval_seeds"] == [7, 12345]
    md = report_markdown(rep)
    assert "**Not common random numbers**" in md and "main: 7, 12345" in md and "Common random numbers: within" not in md


def test_the_two_evaluation_ses_have_two_names_and_the_forest_legend_uses_the_mean_one(tmp_path):
    from gmts_analysis.rl.arms_report import SE_MEAN_DIFF, SE_ONE_DIFF
    from gmts_analysis.rl.plots import forest_legend_labels

    rep = build_report(fabricate(tmp_path / "d", make_plan(PRIMARY, PRIMARY_CONTRASTS), _gain(0.03)))
    c = rep["contrasts"][0]
    assert c["eval_se_mean_diff"] == pytest.approx(c["eval_se_diff"] / math.sqrt(8))  # equal SEs: RMS / sqrt(n)
    bar = forest_legend_labels(rep)[3]
    assert bar == "+-1.96 evaluation SE of the mean difference over 8 seeds" == "+-1.96 " + SE_MEAN_DIFF.format(n=8)
    assert SE_ONE_DIFF not in bar and "one seed" not in bar
    assert f"{SE_ONE_DIFF} {c['eval_se_diff']:.3f}, evaluation SE of the mean difference over 8 seeds " \
           f"{c['eval_se_mean_diff']:.3f})" in c["sentence"]
    md = report_markdown(rep)
    assert "| eval SE (one seed's diff) |" in md and "| eval SE (diff) |" not in md


def test_welch_difference_and_heterogeneity_known_values():
    from scipy import stats

    from gmts_analysis.analysis.paired import heterogeneity, welch_difference

    x, y = [0.01, 0.02, 0.015, 0.005, 0.012], [0.03, 0.025, 0.04, 0.035]
    w = welch_difference(x, y)
    ref = stats.ttest_ind(x, y, equal_var=False)
    assert w["diff"] == pytest.approx(np.mean(x) - np.mean(y)) and w["p"] == pytest.approx(ref.pvalue, rel=1e-10)
    assert w["ci_low"] < w["diff"] < w["ci_high"] < 0
    h = heterogeneity([0.01, 0.03], [0.005, 0.005])  # equal weights: fixed mean 0.02, Q = 2 * (0.01/0.005)^2 = 8
    assert h["fixed_mean"] == pytest.approx(0.02) and h["q"] == pytest.approx(8.0) and h["df"] == 1.0
    assert h["p"] == pytest.approx(stats.chi2.sf(8.0, 1)) and h["i2"] == pytest.approx(7 / 8)
    assert h["fixed_se"] == pytest.approx(0.005 / math.sqrt(2))
    same = heterogeneity([0.02, 0.02], [0.01, 0.002])
    assert same["q"] == 0.0 and same["i2"] == 0.0 and same["p"] == pytest.approx(1.0)
    assert math.isnan(heterogeneity([0.01, 0.02], [0.0, 0.01])["q"])


def _two_experiments(tmp_path, delta_here, noise_here=NOISE):
    earlier_plan = make_plan(PRIMARY, PRIMARY_CONTRASTS)
    earlier = fabricate(tmp_path / "earlier", earlier_plan, _gain(0.03))
    seeds = list(range(100, 110))
    noise = list(noise_here) + [0.001, -0.001]
    plan = {**make_plan(PRIMARY, PRIMARY_CONTRASTS, seeds=seeds), "prior_runs": ["../earlier/main.runs"],
            "pool_with": {"data_dir": "../earlier", "settings": ["main"]}, "block_tag": "gmts-rl-replication"}

    def value(setting, arm, seed):
        i = seed - 100
        return 0.5 + 0.01 * (i % 8) + ((delta_here + noise[i]) if arm == "gmts" else 0.0)
    return earlier, fabricate(tmp_path / "here", plan, value), noise


def test_pooled_view_numbers_and_the_earlier_claim_held_on_fresh_seeds(tmp_path):
    from scipy import stats

    _, here, noise = _two_experiments(tmp_path, 0.02)
    rep = build_report(here)
    pv = rep["pooled"]
    assert pv["seeds_here"] == list(range(100, 110)) and pv["seeds_earlier"] == SEEDS
    assert pv["data_dir"] == (tmp_path / "earlier").as_posix()  # not .../here/../earlier
    row = next(r for r in pv["rows"] if (r["a"], r["b"]) == ("gmts", "entropy"))
    d_here = [0.02 + n for n in noise]
    d_earlier = [0.03 + n for n in NOISE]
    assert row["here"]["mean"] == pytest.approx(np.mean(d_here)) and row["earlier"]["mean"] == pytest.approx(np.mean(d_earlier))
    assert row["pooled"]["n"] == 18 and row["pooled"]["mean"] == pytest.approx(np.mean(d_here + d_earlier))
    assert row["pooled"]["p"] == pytest.approx(stats.ttest_1samp(d_here + d_earlier, 0.0).pvalue, rel=1e-9)
    assert row["difference"]["diff"] == pytest.approx(np.mean(d_here) - np.mean(d_earlier))
    se_h, se_e = np.std(d_here, ddof=1) / math.sqrt(10), np.std(d_earlier, ddof=1) / math.sqrt(8)
    fe = (np.mean(d_here) / se_h**2 + np.mean(d_earlier) / se_e**2) / (1 / se_h**2 + 1 / se_e**2)
    q = (np.mean(d_here) - fe) ** 2 / se_h**2 + (np.mean(d_earlier) - fe) ** 2 / se_e**2
    assert row["heterogeneity"]["q"] == pytest.approx(q) and row["heterogeneity"]["i2"] == pytest.approx(max(0, (q - 1) / q))
    assert row["held"] == "held" and row["here"]["evidence"] == "fresh"
    md = report_markdown(rep)
    assert 'The earlier claim "gmts beats entropy" held on fresh seeds.' in md
    assert "**Pooled view** (exploratory: pilot and confirmation pooled)" in md
    assert "gmts beats entropy; confirmed on fresh seeds" in md
    assert "Pooled view" in report_markdown(rep, short=True)


def test_pooled_view_says_when_the_earlier_claim_did_not_hold(tmp_path):
    symmetric = [0.01, -0.01, 0.02, -0.02, 0.015, -0.015, 0.005, -0.005]
    _, here, _ = _two_experiments(tmp_path, 0.0, symmetric)
    rep = build_report(here)
    row = next(r for r in rep["pooled"]["rows"] if (r["a"], r["b"]) == ("gmts", "entropy"))
    assert row["held"] == "not_confirmed" and row["here"]["verdict"] == "not_distinguishable"
    assert row["difference"]["ci_high"] < 0  # the two experiments differ
    assert 'The earlier claim "gmts beats entropy" did not hold on fresh seeds (here: gmts and entropy are not distinguishable with 10 seeds)' in report_markdown(rep)
    # an exploratory pair orientated the other way in the earlier report is flipped, not dropped
    rows = {(r["a"], r["b"]): r for r in rep["pooled"]["rows"]}
    assert set(rows) == {(c["a"], c["b"]) for c in rep["contrasts"]}


def test_held_on_replication_rule():
    from gmts_analysis.rl.arms_report import held_on_replication as held

    beat = {"verdict": "beats", "mean": 0.01}
    assert held(beat, {"verdict": "beats", "mean": 0.02}) == "held"
    assert held(beat, {"verdict": "above_unadjusted", "mean": 0.02}) == "held_exploratory"
    assert held(beat, {"verdict": "beats", "mean": -0.02}) == "reversed"
    assert held(beat, {"verdict": "not_distinguishable", "mean": 0.02}) == "not_confirmed"
    assert held({"verdict": "not_distinguishable", "mean": 0.0}, {"verdict": "beats", "mean": 0.02}) == "no_claim"


def test_update_uses_the_plans_block_tag_and_leaves_the_referee_block(tmp_path):
    _, here, _ = _two_experiments(tmp_path, 0.02)
    doc = tmp_path / "doc.md"
    text = ("<!-- gmts-rl-referee:begin -->\nreferee\n<!-- gmts-rl-referee:end -->\n"
            "<!-- gmts-rl-replication:begin -->\nold\n<!-- gmts-rl-replication:end -->\n")
    doc.write_text(text)
    rc, err = run_cli(["rl-report", str(here), "--out", str(tmp_path / "o"), "--update", str(doc), "-q"])
    assert rc == 0, err
    new = doc.read_text()
    assert new.startswith("<!-- gmts-rl-referee:begin -->\nreferee\n<!-- gmts-rl-referee:end -->\n")
    assert "\nold\n" not in new and "confirmed on fresh seeds" in new
    only_referee = tmp_path / "ref.md"
    only_referee.write_text("<!-- gmts-rl-referee:begin -->\nx\n<!-- gmts-rl-referee:end -->\n")
    assert_one_line_error(*run_cli(["rl-report", str(here), "--out", str(tmp_path / "o2"), "--update",
                                    str(only_referee)]), "ref.md", "gmts-rl-replication:end")


# ----------------------------------------------------------------------------- the learning phase (exploratory)

TRAJ_SEEDS = [0, 1, 2]
#: pass@1 (mean over domains) at step 5: entropy 0.50, 0.51, 0.52; gmts above it by 0.03, 0.05, 0.04 (mean 0.04)
AT5 = {"entropy": [0.50, 0.51, 0.52], "gmts": [0.53, 0.56, 0.56]}
#: each run's training reward at steps 1-4 is base + 0.01 * step (mean base + 0.025): gmts - entropy 0.10, 0.09, 0.08
REWARD_BASE = {"entropy": [0.50, 0.52, 0.54], "gmts": [0.60, 0.61, 0.62]}


def _trajectory_data(root: Path, drop=None) -> Path:
    """2 arms x 3 seeds, 10 steps, evaluations at steps 0 (0.4 everywhere), 5 (:data:`AT5`, the two domains
    0.02 either side of it) and 10; ``drop``: ``(arm, seed, step)`` whose evaluation is left out."""
    plan = make_plan([_setting("main", ["entropy", "gmts"])], PRIMARY_CONTRASTS, seeds=TRAJ_SEEDS)
    plan["common"] = {**COMMON, "steps": 10, "eval_every": 5}
    patch = {("main", a, s): {"steps": 10, "eval_every": 5} for a in ("entropy", "gmts") for s in TRAJ_SEEDS}
    data = fabricate(root, plan, lambda st, arm, seed: 0.6 + (0.01 if arm == "gmts" else 0.0), config_patch=patch)
    for arm in ("entropy", "gmts"):
        for i, seed in enumerate(TRAJ_SEEDS):
            p = data / "main.runs" / f"{arm}-s{seed}.json"
            rec = json.loads(p.read_text())
            x5 = AT5[arm][i]
            x10 = 0.55 + 0.01 * i + (0.01 if arm == "gmts" else 0.0)
            rec["evals"] = [{"step": st, "pass1": {"arithmetic": x + 0.02, "program": x - 0.02}, "pass1_mean": x}
                            for st, x in ((0, 0.4), (5, x5), (10, x10)) if (arm, seed, st) != drop]
            for st in rec["steps"]:
                st["reward_mean"] = REWARD_BASE[arm][i] + 0.01 * st["step"]
            p.write_text(json.dumps(rec))
    return data


def test_learning_phase_pass1_at_every_shared_step_and_the_contrast_at_the_intermediate_ones(tmp_path):
    from scipy import stats

    rep = build_report(_trajectory_data(tmp_path / "d"))
    tr = rep["settings"][0]["trajectory"]
    assert (tr["family"], tr["steps"], tr["final_step"], tr["intermediate_steps"]) == ("exploratory", [0, 5, 10], 10, [0, 5])
    g5 = tr["pass1"]["gmts"][1]
    assert g5["step"] == 5 and g5["n"] == 3 and g5["values"] == pytest.approx(AT5["gmts"])
    assert g5["mean"] == pytest.approx(np.mean(AT5["gmts"]), abs=1e-12)
    lo, hi = stats.t.interval(0.95, 2, loc=np.mean(AT5["gmts"]), scale=stats.sem(AT5["gmts"]))
    assert (g5["ci_low"], g5["ci_high"]) == pytest.approx((lo, hi), rel=1e-9)
    assert [e["mean"] for e in tr["pass1"]["entropy"]] == pytest.approx([0.4, 0.51, 0.56])
    (c,) = tr["contrasts"]
    assert (c["a"], c["b"], c["planned_family"], c["family"], c["expanded"]) == ("gmts", "entropy", "primary",
                                                                               "exploratory", False)
    assert [s["step"] for s in c["steps"]] == [0, 5]  # the final step is the planned contrast's
    s0, s5 = c["steps"]
    assert s0["status"] == "identical" and s0["n"] == 3 and s0["mean"] == 0.0
    assert s0["words"].startswith("identical by construction")
    assert s5["status"] == "reported" and s5["n"] == 3 and s5["mean"] == pytest.approx(0.04, abs=1e-12)
    assert s5["differences"] == pytest.approx([0.03, 0.05, 0.04], abs=1e-12)
    assert (s5["wins_a"], s5["wins_b"], s5["ties"]) == (3, 0, 0)
    ref = paired_contrast(AT5["gmts"], AT5["entropy"])
    assert (s5["ci_low"], s5["ci_high"], s5["p"]) == pytest.approx((ref["ci_low"], ref["ci_high"], ref["p"]))
    assert (s5["verdict"], s5["words"]) == verdict("gmts", "entropy", ref, "exploratory", 0.05)
    assert s5["verdict"] == "above_unadjusted" and s5.get("p_holm") is None
    r = c["reward"]
    assert r["status"] == "reported" and r["n"] == 3 and r["mean"] == pytest.approx(0.09, abs=1e-12)
    assert r["differences"] == pytest.approx([0.10, 0.09, 0.08], abs=1e-12) and r["verdict"] == "above_unadjusted"
    assert tr["reward"]["entropy"]["mean"] == pytest.approx(np.mean(REWARD_BASE["entropy"]) + 0.025, abs=1e-12)
    # the primary family is untouched: one contrast, of the final pass@1
    assert [(x["family"], x["n"]) for x in rep["contrasts"]] == [("primary", 3)]
    assert rep["contrasts"][0]["mean"] == pytest.approx(0.01, abs=1e-12)


def test_a_run_missing_an_evaluation_step_takes_the_step_out_of_the_intersection(tmp_path):
    rep = build_report(_trajectory_data(tmp_path / "d", drop=("gmts", 1, 5)))
    tr = rep["settings"][0]["trajectory"]
    assert tr["steps"] == [0, 10] and tr["intermediate_steps"] == [0]
    assert [e["step"] for e in tr["pass1"]["entropy"]] == [0, 10]
    assert [s["step"] for s in tr["contrasts"][0]["steps"]] == [0]
    assert "| 5 |" not in report_markdown(rep)


def test_learning_phase_table_is_added_after_the_existing_sections(tmp_path):
    rep = build_report(_trajectory_data(tmp_path / "d"))
    md = report_markdown(rep)
    before = json.loads(json.dumps(rep))
    for s in before["settings"]:
        del s["trajectory"]
    old = report_markdown(before)  # every section the report had before the learning phase
    assert "**Learning phase**" not in old and md.startswith(old.rstrip("\n") + "\n\n**Learning phase**")
    section = md.split("**Learning phase**", 1)[1]
    assert "| step | entropy | gmts | gmts - entropy |" in section
    assert ("| 0 | 0.400 [0.400, 0.400] | 0.400 [0.400, 0.400] | identical by construction |") in section
    assert "| 5 | 0.510 [" in section and "| +0.040 [+0.015, +0.065] gmts above entropy (unadj.) |" in section
    assert "| 10 (final) | 0.560 [" in section and "final: planned contrasts above |" in section
    assert "| training reward (mean over steps) | 0.545 [" in section and "| +0.090 [" in section
    assert " beats " not in section
    assert "**Learning phase**" not in report_markdown(rep, short=True)


@pytest.mark.parametrize("tamper,field", [
    (lambda ev: ev[1]["pass1"].update(program="abc"), "evals[1].pass1.program: expected a finite number"),
    (lambda ev: ev[1]["pass1"].update(program=1.5), "evals[1].pass1.program: expected a share in [0, 1]"),
    (lambda ev: ev[1]["pass1"].pop("program"), "evals[1].pass1.program: missing"),
    (lambda ev: ev[1].update(step=2.5), "evals[1].step: expected a whole number"),
    (lambda ev: ev[2].update(step=5), "evals[2].step: step 5 is evaluated twice"),
    (lambda ev: ev.__setitem__(1, "x"), "evals[1]: expected an object"),
])
def test_a_bad_evaluation_entry_is_one_line_naming_file_and_field(tmp_path, tamper, field):
    data = _trajectory_data(tmp_path / "d")
    p = data / "main.runs" / "gmts-s1.json"
    rec = json.loads(p.read_text())
    tamper(rec["evals"])
    p.write_text(json.dumps(rec))
    with pytest.raises(GmtsError) as e:
        build_report(data)
    assert "gmts-s1.json" in str(e.value) and field in str(e.value) and "\n" not in str(e.value)
