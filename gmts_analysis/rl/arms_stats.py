"""The arms comparison's analysis (docs/studies/referee.md sections 7 and 7.1): from the checked run records to the report dict.

- :func:`build_report`: completeness per setting (a setting missing any run of any arm and plan seed is
  *cut*, listed with the missing files, and never reported on fewer seeds), the per-arm results, every
  planned paired contrast (``"*"`` expanded to every other pair of a complete setting, exploratory and
  unadjusted) with its t interval, t / sign / Wilcoxon p, Holm over the family ``primary``, and the
  verdict of the word rule (:func:`verdict`), and the mechanism per setting and arm (:func:`mechanism`).
- :func:`learning_phase`: per complete setting, the learning phase (exploratory, unadjusted): each arm's mean
  pass@1 at every evaluation step all its runs share, the setting's contrasts at the intermediate steps and
  on the mean training reward.
- :func:`pooled_view`: the exploratory pooled view of an earlier experiment and this one.

The paired statistics themselves are :mod:`gmts_analysis.analysis.paired`'s.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gmts_analysis.analysis.paired import heterogeneity, holm, paired_contrast, paired_t, welch_difference
from gmts_analysis.errors import GmtsError
from gmts_analysis.rl.arms_plan import (
    BLOCK_TAG,
    GENERATOR,
    SETTING_FIELDS,
    _config_defaults,
    _prior_index,
    _shown,
    check_run,
    expected_config,
    final_prompts,
    load_plan,
    repeats_of,
    run_eval_se,
    run_final_pass1,
    setting_arms,
)
from gmts_analysis.rl.arms_text import contrast_sentence
from gmts_analysis.rl.config import run_path
from gmts_analysis.util.io import read_json

# ----------------------------------------------------------------------------- mechanism


def _mean(values: Sequence[Any]) -> float:
    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return float(np.mean(v)) if v else float("nan")


def run_mechanism(rec: dict) -> dict[str, float]:
    """One run's mechanism numbers: over its logged steps the mean share of groups with all-equal rewards
    (``zero_adv_groups``), of response tokens with A = 0 (``zero_adv_tokens``), of its own selection's
    picks with A = 0 (``waste``, ``frac_selected_zero_adv``), of groups kept by dynamic sampling
    (``groups_kept``) and the number of steps skipped (no group kept); at its last diagnostic step
    (``diag_step``) the mass capture and the update fidelity (``cosine``, ``norm_ratio``) of its own
    selection (NaN for ``all``, which the diagnostics do not score)."""
    arm = rec["config"]["selection"]
    steps = rec.get("steps", [])
    diag = [s for s in steps if isinstance(s.get("fidelity"), dict) or isinstance(s.get("mass_capture"), dict)]
    last = diag[-1] if diag else {}
    fid = (last.get("fidelity") or {}).get(arm) or {}
    return {
        "zero_adv_groups": _mean([s.get("frac_groups_zero_std") for s in steps]),
        "zero_adv_tokens": _mean([s.get("frac_tokens_zero_adv") for s in steps if not s.get("skipped")]),
        "waste": _mean([s.get("frac_selected_zero_adv") for s in steps if not s.get("skipped")]),
        "groups_kept": _mean([s["n_groups_kept"] / s["n_groups"] for s in steps
                              if s.get("n_groups") and s.get("n_groups_kept") is not None]),
        "skipped_steps": float(sum(1 for s in steps if s.get("skipped"))),
        "diag_step": float(last["step"]) if "step" in last else float("nan"),
        "mass_capture": _mean([(last.get("mass_capture") or {}).get(arm)]),
        "cosine": _mean([fid.get("cosine")]),
        "norm_ratio": _mean([fid.get("norm_ratio")]),
    }


def mechanism(runs: Sequence[dict]) -> dict[str, float]:
    """:func:`run_mechanism` averaged over ``runs`` (the seeds of one arm), with ``n_runs``."""
    per = [run_mechanism(r) for r in runs]
    out = {k: _mean([p[k] for p in per]) for k in per[0]} if per else {}
    out["n_runs"] = len(per)
    return out


# ----------------------------------------------------------------------------- contrasts


def verdict(a: str, b: str, stats: dict, family: str, alpha: float) -> tuple[str, str]:
    """``(code, words)`` of the word rule. Primary: ``beats`` only when the Holm-adjusted p is below
    ``alpha`` and the 95% CI excludes 0 (the sign of the mean says who beats whom). Exploratory (no
    adjustment): ``above_unadjusted`` under the same rule with the unadjusted p, said to be unconfirmed.
    Otherwise ``not_distinguishable``: "A and B are not distinguishable with N seeds" (never "tied")."""
    n = stats["n"]
    p = stats.get("p_holm") if family == "primary" else stats.get("p")
    lo, hi, m = stats.get("ci_low"), stats.get("ci_high"), stats.get("mean")
    ok = p is not None and not math.isnan(p) and p < alpha and lo is not None and not math.isnan(lo) \
        and (lo > 0 or hi < 0)
    if not ok:
        return "not_distinguishable", f"{a} and {b} are not distinguishable with {n} seeds"
    win, lose = (a, b) if m > 0 else (b, a)
    if family == "primary":
        return "beats", f"{win} beats {lose}"
    return "above_unadjusted", f"{win} is above {lose} (exploratory, unadjusted: not a confirmed difference)"


def _expand(plan: dict, complete: dict[str, bool]) -> list[dict]:
    """The planned contrasts, the explicit ones first in plan order, then each ``"*"`` entry expanded
    over the complete settings (every pair not already listed, ``a`` the later arm of the plan's order)."""
    by_name = {s["name"]: s for s in plan["settings"]}
    out, seen = [], set()
    for c in plan["contrasts"]:
        if "*" not in (c["setting"], c["a"], c["b"]):
            out.append({**{k: c.get(k) for k in ("setting", "a", "b", "family", "question")}, "expanded": False})
            seen.add((c["setting"], frozenset((c["a"], c["b"]))))
    for c in plan["contrasts"]:
        if "*" not in (c["setting"], c["a"], c["b"]):
            continue
        names = [s["name"] for s in plan["settings"]] if c["setting"] == "*" else [c["setting"]]
        for name in names:
            if not complete.get(name):
                continue
            arms = setting_arms(by_name[name])
            for j, x in enumerate(arms):
                for y in arms[:j]:
                    a, b = x, y
                    if c["a"] != "*" and c["a"] not in (a, b) or c["b"] != "*" and c["b"] not in (a, b):
                        continue
                    if c["a"] == b or c["b"] == a:  # orient as the entry says
                        a, b = b, a
                    key = (name, frozenset((a, b)))
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append({"setting": name, "a": a, "b": b, "family": c["family"],
                                "question": c.get("question"), "expanded": True})
    return out


# ----------------------------------------------------------------------------- the report


def _rel(p: Path, data_dir: Path) -> str:
    """``p`` relative to the data directory when it lies under it (the report names files portably)."""
    try:
        return p.relative_to(data_dir).as_posix()
    except ValueError:
        return p.as_posix()


def _read_records(plan: dict, data_dir: Path, plan_path: Path) -> dict[tuple[str, str, int], dict | None]:
    """``{(setting, arm, seed): record or None}``: every run file the plan names, read and checked once
    against the plan (a borrowed ``all`` is read where it lives)."""
    records: dict[tuple[str, str, int], dict | None] = {}
    for s in plan["settings"]:
        want = expected_config(plan, s)
        for arm in s["arms"]:
            for seed in plan["seeds"]:
                p = run_path(data_dir / s["file"], arm, seed)
                rec = None
                if p.is_file():
                    rec = read_json(p)
                    check_run(rec, p, want, arm, seed, plan_path)
                records[(s["name"], arm, seed)] = rec
    return records


def _se_one_and_mean(var: Sequence[float]) -> tuple[float, float]:
    """From per-seed evaluation variances: the SE of one seed (RMS over seeds) and the SE of the mean
    over seeds."""
    return float(math.sqrt(np.mean(var))), float(math.sqrt(np.sum(var)) / len(var))


def _arm_result(source: str, runs: list[dict], seeds: list[int], repeat_of: list[str | None]) -> dict[str, Any]:
    """One arm of a complete setting: per-seed final pass@1 and evaluation SE, their mean, SD over seeds,
    the evaluation SE of one run (RMS) and of the mean, the per-domain means, and per seed the earlier run
    it repeats (None: fresh)."""
    fin = [run_final_pass1(r) for r in runs]
    se = [run_eval_se(r) for r in runs]
    return {
        "source": source, "seeds": seeds, "final_pass1": fin, "eval_se": se, "repeat_of": repeat_of,
        "mean": float(np.mean(fin)), "sd": float(np.std(fin, ddof=1)) if len(fin) > 1 else float("nan"),
        **dict(zip(("eval_se_run", "eval_se_mean"), _se_one_and_mean(np.square(se)))),
        "per_domain": {d: float(np.mean([r["final_pass1"][d] for r in runs])) for d in runs[0]["config"]["domains"]},
        "final_eval_prompts": final_prompts(runs[0]["config"]),
    }


def _source(s: dict, plan: dict, arm: str) -> dict:
    """The setting whose runs of ``arm`` setting ``s`` reports: the one its ``all_from`` names for a
    borrowed ``all``, else ``s`` itself."""
    by_name = {x["name"]: x for x in plan["settings"]}
    return by_name[s["all_from"]] if arm == "all" and s.get("all_from") else s


def _arm_runs(s: dict, plan: dict, records: dict) -> dict[str, list[dict]]:
    """``{arm: [run record of each plan seed, in plan order]}`` of a complete setting ``s``."""
    return {a: [records[(_source(s, plan, a)["name"], a, seed)] for seed in plan["seeds"]] for a in setting_arms(s)}


def _setting_block(s: dict, plan: dict, records: dict, data_dir: Path, repeats: dict) -> dict[str, Any]:
    """A setting of the report: ``cut`` with its missing run files, or ``complete`` with every arm's
    results and mechanism (a borrowed ``all`` from the setting its ``all_from`` names), the evaluation
    seeds its runs used (one: every arm and seed saw the same prompts) and, per arm, the seeds whose run
    repeats an earlier one (``repeats``: :func:`repeats_of`)."""
    seeds = list(plan["seeds"])

    def source(arm: str) -> dict:
        return _source(s, plan, arm)

    arms = setting_arms(s)
    missing = [_rel(run_path(data_dir / source(a)["file"], a, seed), data_dir) for a in arms for seed in seeds
               if records[(source(a)["name"], a, seed)] is None]
    n_exp = len(arms) * len(seeds)
    block: dict[str, Any] = {"name": s["name"], "role": s["role"], "file": s["file"],
                             **{k: s[k] for k in SETTING_FIELDS}, "all_from": s.get("all_from"),
                             "arms": arms, "n_runs_expected": n_exp, "n_runs_found": n_exp - len(missing),
                             "missing": missing}
    if missing:
        block["status"] = "cut"
        return block
    block["status"] = "complete"
    block["results"], block["mechanism"] = {}, {}
    eval_seeds = set()
    for a in arms:
        keys = [(source(a)["name"], a, seed) for seed in seeds]
        runs = [records[k] for k in keys]
        block["results"][a] = _arm_result(source(a)["name"], runs, seeds, [repeats.get(k) for k in keys])
        block["mechanism"][a] = mechanism(runs)
        eval_seeds |= {r["config"].get("eval_seed", _config_defaults()["eval_seed"]) for r in runs}
    block["eval_seeds"] = sorted(eval_seeds)
    return block


def _contrast_row(c: dict, settings: dict[str, dict], checked: bool) -> dict[str, Any]:
    """One contrast ``a - b``: ``cut`` when its setting is, else the paired statistics over seeds, the
    evaluation SE of one seed's difference (RMS over seeds) and of the mean difference, and the evidence:
    ``fresh`` (no run of either arm repeats an earlier run), ``pooled`` (some seeds do: their lists, and the
    statistics of the fresh seeds alone in ``fresh_only``) or ``unchecked`` (``checked``: the plan names
    its earlier runs)."""
    row: dict[str, Any] = dict(c)
    s = settings[c["setting"]]
    if s["status"] != "complete":
        row["status"] = "cut"
        return row
    ra, rb = s["results"][c["a"]], s["results"][c["b"]]
    (fa, sa), (fb, sb) = (ra["final_pass1"], ra["eval_se"]), (rb["final_pass1"], rb["eval_se"])
    row["status"] = "reported"
    row.update(paired_contrast(fa, fb))
    row["differences"] = [x - y for x, y in zip(fa, fb)]
    row["eval_se_diff"], row["eval_se_mean_diff"] = _se_one_and_mean([x * x + y * y for x, y in zip(sa, sb)])
    row["p_holm"] = None
    seeds = ra["seeds"]
    reps = list(zip(ra["repeat_of"], rb["repeat_of"]))
    row["seeds_fresh"] = [sd for sd, (x, y) in zip(seeds, reps) if not x and not y]
    row["seeds_repeat_both"] = [sd for sd, (x, y) in zip(seeds, reps) if x and y]
    row["seeds_repeat_one"] = [sd for sd, (x, y) in zip(seeds, reps) if bool(x) != bool(y)]
    row["repeated_from"] = sorted({Path(f).parent.as_posix() for pair in reps for f in pair if f})
    if not checked:
        row["evidence"] = "unchecked"
    elif len(row["seeds_fresh"]) == len(seeds):
        row["evidence"] = "fresh"
    else:
        row["evidence"] = "pooled"
        keep = [i for i, sd in enumerate(seeds) if sd in row["seeds_fresh"]]
        row["fresh_only"] = paired_contrast([fa[i] for i in keep], [fb[i] for i in keep]) if keep else None
    return row


def _judge(contrasts: list[dict], alpha: float) -> int:
    """Holm over every planned primary contrast (one whose setting is cut counts with p = 1:
    conservative), then each reported contrast's verdict and sentence; returns the number of primary
    contrasts."""
    primary = [r for r in contrasts if r["family"] == "primary"]
    adj = holm([r.get("p", 1.0) if r["status"] == "reported" else 1.0 for r in primary])
    for r, p in zip(primary, adj):
        if r["status"] == "reported":
            r["p_holm"] = p
    for r in contrasts:
        if r["status"] == "reported":
            r["verdict"], r["words"] = verdict(r["a"], r["b"], r, r["family"], alpha)
            r["sentence"] = contrast_sentence(r)
    return len(primary)


# ----------------------------------------------------------------------------- the learning phase (exploratory)

#: the words of an intermediate step at which every paired difference is exactly 0
IDENTICAL_AT_START = "identical by construction (every arm starts from the same model and is evaluated on the same prompts)"
IDENTICAL = "identical on every seed"


def run_pass1_at(rec: dict, step: int) -> float:
    """A run's pass@1 at evaluation ``step`` (its ``evals`` entry), mean over its config's domains, as
    :func:`run_final_pass1` takes the final one."""
    e = next(e for e in rec["evals"] if e["step"] == step)
    return float(np.mean([e["pass1"][d] for d in rec["config"]["domains"]]))


def run_reward_mean(rec: dict) -> float | None:
    """A run's mean training reward over its logged steps (``steps[*].reward_mean``, null ones left out);
    None when it logged none."""
    v = [float(s["reward_mean"]) for s in rec.get("steps", []) if s.get("reward_mean") is not None]
    return float(np.mean(v)) if v else None


def shared_eval_steps(runs: Sequence[dict]) -> list[int]:
    """The evaluation steps every run of ``runs`` has (the intersection, as the learning curves take it)."""
    return sorted(set.intersection(*[{int(e["step"]) for e in r.get("evals", [])} for r in runs])) if runs else []


def _final_step(runs: Sequence[dict]) -> int:
    """The last training step of the runs (their config's ``steps``): the evaluation there is the final one,
    which the planned contrasts already report."""
    return max(int(r["config"].get("steps", _config_defaults()["steps"])) for r in runs)


def _mean_ci(values: Sequence[float]) -> dict[str, Any]:
    """``{n, mean, sd, ci_low, ci_high, values}``: the mean over seeds and its 95% t interval."""
    t = paired_t(values)
    return {**{k: t[k] for k in ("n", "mean", "sd", "ci_low", "ci_high")}, "values": [float(x) for x in values]}


def _exploratory(a: str, b: str, xa: Sequence[float], xb: Sequence[float], alpha: float) -> dict[str, Any]:
    """The paired contrast ``a - b`` of per-seed values, exploratory: statistics, differences, verdict."""
    row: dict[str, Any] = {"status": "reported", **paired_contrast(xa, xb),
                           "differences": [float(x - y) for x, y in zip(xa, xb)]}
    row["verdict"], row["words"] = verdict(a, b, row, "exploratory", alpha)
    return row


def learning_phase(runs: dict[str, list[dict]], contrasts: Sequence[dict], alpha: float) -> dict[str, Any]:
    """The learning phase of one complete setting (exploratory and unadjusted throughout).

    ``runs``: ``{arm: [run record per seed, plan order]}``; ``contrasts``: the setting's reported contrast
    rows (named and ``"*"``-expanded). Returns ``family`` ("exploratory"), ``steps`` (the evaluation steps
    every run of every arm has), ``final_step`` (the runs' last training step), ``intermediate_steps`` (the
    shared steps before it), ``pass1`` (``{arm: [{step, n, mean, sd, ci_low, ci_high, values}]}``: the mean
    over seeds of the pass@1 mean over domains and its 95% t interval, at every shared step, the final one
    included), ``reward`` (``{arm: {n, mean, sd, ci_low, ci_high, values}}`` of each run's mean training
    reward, or None where some run logged none) and ``contrasts``: per contrast ``{a, b, planned_family,
    expanded, family, steps, reward}``; ``steps`` one entry per intermediate step, either ``status``
    "identical" (every paired difference exactly 0: ``n``, ``mean`` 0, ``words``; step 0 is identical by
    construction) or "reported" with :func:`~gmts_analysis.analysis.paired.paired_contrast`'s fields,
    ``differences``, ``verdict`` and ``words`` (:func:`verdict`, family exploratory); ``reward`` the same
    contrast of the runs' mean training reward, or None where either arm has a run without one."""
    every = [r for rs in runs.values() for r in rs]
    steps = shared_eval_steps(every)
    final = _final_step(every) if every else 0
    inter = [s for s in steps if s < final]
    at = {a: {s: [run_pass1_at(r, s) for r in rs] for s in steps} for a, rs in runs.items()}
    rew = {a: [run_reward_mean(r) for r in rs] for a, rs in runs.items()}
    logged = {a: all(x is not None for x in v) for a, v in rew.items()}
    rows = []
    for c in contrasts:
        a, b = c["a"], c["b"]
        per_step = []
        for s in inter:
            xa, xb = at[a][s], at[b][s]
            if all(x == y for x, y in zip(xa, xb)):
                per_step.append({"step": s, "status": "identical", "n": len(xa), "mean": 0.0,
                                 "words": IDENTICAL_AT_START if s == 0 else IDENTICAL})
            else:
                per_step.append({"step": s, **_exploratory(a, b, xa, xb, alpha)})
        rows.append({"a": a, "b": b, "planned_family": c["family"], "expanded": c["expanded"], "family": "exploratory",
                     "steps": per_step,
                     "reward": _exploratory(a, b, rew[a], rew[b], alpha) if logged[a] and logged[b] else None})
    return {
        "family": "exploratory", "steps": steps, "final_step": final, "intermediate_steps": inter,
        "pass1": {a: [{"step": s, **_mean_ci(at[a][s])} for s in steps] for a in runs},
        "reward": {a: _mean_ci(v) for a, v in rew.items()} if all(logged.values()) else None,
        "contrasts": rows,
    }


def check_data_dir(data_dir: str | Path) -> Path:
    """``data_dir`` as a Path, refused (one line) when it is not a directory."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise GmtsError(f"{data_dir}: not a directory (give the directory holding plan.json and the settings' runs)")
    return data_dir


def build_report(data_dir: str | Path, plan_path: str | Path | None = None, with_pool: bool = True) -> dict:
    """Everything ``gmts rl-report`` writes, as one JSON-ready dict (see the module docstring):
    ``generator``, ``plan`` (its path, title, metric, seeds, alpha, correction), ``settings``
    (status ``complete`` | ``cut``, missing run files, arms with per-seed final pass@1 and evaluation
    SE, mechanism, and ``trajectory``: the learning phase, exploratory, :func:`learning_phase`), ``contrasts``
    (every planned contrast; those of cut settings with status ``cut``), and with the plan's ``pool_with`` (and ``with_pool``) ``pooled`` (:func:`pooled_view`)."""
    data_dir = check_data_dir(data_dir)
    plan_path = Path(plan_path) if plan_path is not None else data_dir / "plan.json"
    plan = load_plan(plan_path)
    records = _read_records(plan, data_dir, plan_path)
    checked = "prior_runs" in plan
    repeats = repeats_of(records, _prior_index(plan, data_dir, plan_path)) if checked else {}
    settings = {s["name"]: _setting_block(s, plan, records, data_dir, repeats) for s in plan["settings"]}
    complete = {name: b["status"] == "complete" for name, b in settings.items()}
    contrasts = [_contrast_row(c, settings, checked) for c in _expand(plan, complete)]
    n_primary = _judge(contrasts, plan["alpha"])
    by_name = {x["name"]: x for x in plan["settings"]}
    for name, block in settings.items():
        if block["status"] == "complete":
            mine = [c for c in contrasts if c["setting"] == name and c["status"] == "reported"]
            block["trajectory"] = learning_phase(_arm_runs(by_name[name], plan, records), mine, plan["alpha"])
    report = {
        "generator": GENERATOR,
        "plan": {"path": plan_path.as_posix(), "title": plan.get("title"), "metric": plan.get("metric"),
                 "seeds": list(plan["seeds"]), "alpha": plan["alpha"], "correction": plan.get("correction", "holm"),
                 "n_primary": n_primary, "prior_runs": list(plan.get("prior_runs", [])) if checked else None,
                 "block_tag": plan.get("block_tag", BLOCK_TAG)},
        "data_dir": data_dir.as_posix(),
        "settings": list(settings.values()),
        "contrasts": contrasts,
        "n_repeated_runs": len(repeats),
    }
    if with_pool and plan.get("pool_with"):
        report["pooled"] = pooled_view(report, plan["pool_with"], data_dir)
    return report


# ----------------------------------------------------------------------------- the pooled view


def held_on_replication(earlier: dict, here: dict) -> str:
    """Whether an earlier experiment's verdict on a contrast held here (both oriented ``a - b``):
    ``no_claim`` (the earlier one found no difference), ``held`` (here ``beats`` with the same sign),
    ``held_exploratory`` (here above, unadjusted, same sign), ``reversed`` (here a difference of the other
    sign) or ``not_confirmed`` (here not distinguishable)."""
    if earlier["verdict"] == "not_distinguishable":
        return "no_claim"
    if here["verdict"] == "not_distinguishable":
        return "not_confirmed"
    if (here["mean"] > 0) != (earlier["mean"] > 0):
        return "reversed"
    return "held" if here["verdict"] == "beats" else "held_exploratory"


def _side(r: dict, sign: float = 1.0) -> dict[str, Any]:
    """One experiment's numbers of a contrast in the pooled view (``sign`` -1 flips ``a - b``)."""
    lo, hi = (r["ci_low"], r["ci_high"]) if sign > 0 else (-r["ci_high"], -r["ci_low"])
    fo = r.get("fresh_only")
    return {"n": r["n"], "mean": sign * r["mean"], "se": r["se"], "ci_low": lo, "ci_high": hi, "p": r["p"],
            "p_holm": r.get("p_holm"), "family": r["family"], "verdict": r["verdict"], "words": r["words"],
            "evidence": r.get("evidence"), "n_fresh": len(r.get("seeds_fresh", [])),
            "fresh_only_mean": sign * fo["mean"] if fo else None, "fresh_only_n": fo["n"] if fo else 0,
            "differences": [sign * x for x in r["differences"]]}


def pooled_view(report: dict, pool: dict, data_dir: Path) -> dict[str, Any]:
    """The exploratory pooled view of the plan's ``pool_with``: for every reported contrast of the named
    settings that the earlier experiment (``pool_with.data_dir``, relative to ``data_dir``) also reports,
    this experiment's and the earlier one's mean paired difference, both pooled over their seeds (paired
    tests over all of them, unadjusted), the difference between the two experiments (Welch), Cochran's Q
    and I^2 of the two means, and whether the earlier verdict held here (:func:`held_on_replication`)."""
    other_dir = data_dir / pool["data_dir"]
    other = build_report(other_dir, with_pool=False)
    o_set = {s["name"]: s for s in other["settings"]}
    o_rows = {(r["setting"], r["a"], r["b"]): r for r in other["contrasts"] if r["status"] == "reported"}
    rows = []
    for c in report["contrasts"]:
        if c["setting"] not in pool["settings"] or c["status"] != "reported":
            continue
        if o_set.get(c["setting"], {}).get("status") != "complete":
            continue
        o, sign = o_rows.get((c["setting"], c["a"], c["b"])), 1.0
        if o is None:
            o, sign = o_rows.get((c["setting"], c["b"], c["a"])), -1.0
        if o is None:
            continue
        here, earlier = _side(c), _side(o, sign)
        both = here["differences"] + earlier["differences"]
        pooled = paired_contrast(both, [0.0] * len(both))
        rows.append({
            "setting": c["setting"], "a": c["a"], "b": c["b"], "family": c["family"], "expanded": c["expanded"],
            "here": here, "earlier": earlier, "pooled": pooled,
            "difference": welch_difference(here["differences"], earlier["differences"]),
            "heterogeneity": heterogeneity([here["mean"], earlier["mean"]], [here["se"], earlier["se"]]),
            "held": held_on_replication({"verdict": earlier["verdict"], "mean": earlier["mean"]}, c),
        })
    eval_here = sorted({x for s in report["settings"] if s["name"] in pool["settings"] for x in s.get("eval_seeds", [])})
    eval_other = sorted({x for s in other["settings"] if s["name"] in pool["settings"] for x in s.get("eval_seeds", [])})
    return {"data_dir": _shown(other_dir), "plan": _shown(Path(other["plan"]["path"])), "settings": list(pool["settings"]),
            "seeds_here": report["plan"]["seeds"], "seeds_earlier": other["plan"]["seeds"],
            "eval_seeds_here": eval_here, "eval_seeds_earlier": eval_other, "note": pool.get("note"), "rows": rows}
